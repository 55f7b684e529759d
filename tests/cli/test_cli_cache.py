"""``ucstage cache ...`` end to end: real folders, FUSE, moto; JSON contracts and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.parts import tmpfs, unique
from ucstage.cli import cli
from ucstage.cli.cache import command as cache_group

WARM_KEYS = {"source", "cache_dir", "namespace", "slice", "files", "bytes", "fetched",
             "fetched_bytes", "already_cached", "already_cached_bytes", "failed", "refused",
             "seconds", "mb_per_s"}


def run(*args: str, code: int = 0) -> Any:
    """Invoke the CLI in-process; parse JSON output when asked for."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args else result.output


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "vol"
    for i in range(10):
        path = root / f"d{i % 2}" / f"f{i}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes([i]) * (100 + i))
    return root


def test_every_cache_command_has_help_with_an_example() -> None:
    assert set(cache_group.commands) == {"warm", "lazy", "status", "verify", "clear", "prune"}
    for name in cache_group.commands:
        out = run("cache", name, "--help")
        assert "Example" in out and "--json" in out, name


def test_warm_json_resume_and_status(src: Path) -> None:
    first = run("cache", "warm", str(src), "--json")
    assert set(first) == WARM_KEYS
    assert (first["files"], first["fetched"], first["already_cached"]) == (10, 10, 0)
    assert first["bytes"] == sum(100 + i for i in range(10)) and first["failed"] == []
    cached = Path(first["namespace"], "d1", "f3.bin")
    assert cached.read_bytes() == bytes([3]) * 103
    again = run("cache", "warm", str(src), "--json")
    assert (again["fetched"], again["already_cached"]) == (0, 10)
    status = run("cache", "status", "--json")
    assert status["entries"] == 10 and status["bytes"] == first["bytes"]
    ns = status["namespaces"][0]
    assert ns["source"] == ns["url"] == str(src) and status["free_bytes"] > 0
    human = run("cache", "warm", str(src))
    assert "already cached 10" in human


def test_lazy_writes_a_manifest_and_copies_nothing(src: Path) -> None:
    data = run("cache", "lazy", str(src), "--json")
    assert data["files"] == 10 and os.path.isdir(data["namespace"])
    assert os.listdir(data["namespace"]) == []
    from ucstage import manifest

    m = manifest.load(data["manifest"])
    assert m.fingerprint == data["fingerprint"] and len(m.entries) == 10
    warmed = run("cache", "warm", data["manifest"], "--json")  # a manifest is a SOURCE too
    assert warmed["fetched"] == 10
    human = run("cache", "lazy", str(src))
    assert "UCSTAGE_CACHE_DIR=" in human
    assert "from ucstage import VolumeDataset" in human
    assert f"paths = VolumeDataset({data['manifest']!r})" in human
    assert "LocalCache" not in human and "m.entries[i]" not in human


def test_lazy_refuses_a_folder_as_output(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "lazy", str(src),
                             "-o", str(out)], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "is a folder" in result.stderr and "Traceback" not in result.stderr
    assert "unexpected" not in result.stderr
    assert os.listdir(out) == [] and not list(tmp_path.glob(".manifest-*"))


def test_rank_and_node_slices_are_the_shard_plan_slots(src: Path) -> None:
    plan = run("shard-plan", str(src), "-w", "4", "-k", "2", "--shuffle", "--seed", "3", "--json")
    for args, ranks in ((["--rank", "1"], [1]),
                        (["--node-rank", "1", "--nproc-per-node", "2"], [2, 3])):
        run("cache", "clear")
        warmed = run("cache", "warm", str(src), *args, "-w", "4", "-k", "2", "--shuffle",
                     "--seed", "3", "--json")
        want = sorted({f for s in plan["slots"] if s["rank"] in ranks for f in s["files"]})
        ns = Path(warmed["namespace"])
        got = sorted(str(p.relative_to(ns)) for p in ns.rglob("*.bin"))
        assert got == want and warmed["fetched"] == len(want)
        assert warmed["slice"]["ranks"] == ranks


def test_slice_options_are_validated(src: Path) -> None:
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--rank", "0"])
    assert result.exit_code == 2 and "--world-size" in result.output
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--node-rank", "1", "-w", "2",
                                      "-k", "1", "--nproc-per-node", "2"])
    assert result.exit_code == 2 and "outside --world-size" in result.output
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--shuffle", "--epoch", "2"])
    assert result.exit_code == 2 and "need --rank or --node-rank" in result.output


def test_verify_finds_stale_and_corrupt_entries(src: Path) -> None:
    warmed = run("cache", "warm", str(src), "--json")
    clean = run("cache", "verify", str(src), "--checksum", "--json")
    assert clean["clean"] and clean["sources"][0]["ok"] == 10
    target = src / "d0" / "f2.bin"
    target.write_bytes(b"x" * 102)
    os.utime(target, (time.time() + 5, time.time() + 5))
    stale = run("cache", "verify", str(src), "--json", code=1)
    assert [x["path"] for x in stale["sources"][0]["stale"]] == ["d0/f2.bin"]
    run("cache", "warm", str(src), "--json")  # refreshes the stale entry
    assert run("cache", "verify", "--json")["clean"]  # no SOURCE: every cached source
    cached = Path(warmed["namespace"], "d1", "f5.bin")
    cached.write_bytes(b"\0" * 105)  # same size, wrong bytes: only a checksum sees it
    assert run("cache", "verify", str(src), "--json")["clean"]
    bad = run("cache", "verify", str(src), "--checksum", "--json", code=1)
    assert [x["path"] for x in bad["sources"][0]["corrupt"]] == ["d1/f5.bin"]
    assert bad["sources"][0]["removed"] == ["d1/f5.bin"]


def test_verify_removes_corrupt_copies_and_its_hint_is_true(src: Path) -> None:
    warmed = run("cache", "warm", str(src), "--json")
    cached = Path(warmed["namespace"], "d1", "f5.bin")
    cached.write_bytes(b"\0" * 105)  # same size, stamp intact
    result = CliRunner().invoke(cli, ["cache", "verify", str(src), "--checksum"])
    assert result.exit_code == 1
    assert "d1/f5.bin: content differs from the source (sha256); removed" in result.output
    assert f"1 cached file was corrupt and removed; `ucstage cache warm {src}` refetches " \
           "them" in result.output
    assert not cached.exists()  # never served again
    rewarmed = run("cache", "warm", str(src), "--json")  # the hint holds: warm refetches it
    assert (rewarmed["fetched"], rewarmed["already_cached"]) == (1, 9)
    assert cached.read_bytes() == bytes([5]) * 105
    assert run("cache", "verify", str(src), "--checksum", "--json")["clean"]
    target = src / "d0" / "f2.bin"  # stale: the source changed; warm refreshes it too
    target.write_bytes(b"x" * 102)
    os.utime(target, (time.time() + 5, time.time() + 5))
    result = CliRunner().invoke(cli, ["cache", "verify", str(src)])
    assert result.exit_code == 1
    assert "1 cached file is stale (the source changed);" in result.output
    assert "cached files are" not in result.output
    assert run("cache", "warm", str(src), "--json")["fetched"] == 1
    assert run("cache", "verify", str(src), "--json")["clean"]


def test_clear_and_status_refuse_a_typo_but_not_a_deleted_source(src: Path,
                                                                 tmp_path: Path) -> None:
    typo = str(tmp_path / "vlo")
    for cmd in ("clear", "status"):
        result = CliRunner().invoke(cli, ["cache", cmd, typo])
        assert result.exit_code == 2, result.output
        assert f"nothing cached for {typo} (and {typo} does not exist)" in result.output
    run("cache", "warm", str(src), "--json")
    for path in sorted(src.rglob("*"), reverse=True):  # the volume is deleted
        path.rmdir() if path.is_dir() else path.unlink()
    src.rmdir()
    status = run("cache", "status", str(src), "--json")
    assert status["entries"] == 10 and len(status["namespaces"]) == 1
    assert "10 files" in run("cache", "status", str(src))
    cleared = run("cache", "clear", str(src), "--json")
    assert (cleared["files"], len(cleared["namespaces"])) == (10, 1)
    other = tmp_path / "other"  # exists, nothing cached: still fine
    other.mkdir()
    assert "removed 0 files (0 B) from 0 cached sources" in run("cache", "clear", str(other))


def test_usage_lines_show_optional_sources() -> None:
    for name in ("verify", "status", "clear"):
        assert f"cache {name} [OPTIONS] [SOURCE]\n" in run("cache", name, "--help"), name
    for name in ("warm", "lazy"):  # SOURCE or --manifest is required there
        assert f"cache {name} [OPTIONS] SOURCE\n" in run("cache", name, "--help"), name


def test_clear_one_source_or_all(src: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_bytes(b"x" * 50)
    run("cache", "warm", str(src), "--json")
    run("cache", "warm", str(other), "--json")
    frozen = Path(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "manifests")
    frozen.mkdir(parents=True, exist_ok=True)  # where VolumeDataset freezes listings
    (frozen / "abc.json").write_text("{}")
    one = run("cache", "clear", str(other), "--json")
    assert (one["files"], one["bytes"], len(one["namespaces"])) == (1, 50, 1)
    assert run("cache", "status", "--json")["entries"] == 10
    assert (frozen / "abc.json").exists()  # clearing one source keeps shared listings
    everything = run("cache", "clear", "--json")
    assert everything["files"] == 10 and run("cache", "status", "--json")["entries"] == 0
    assert not frozen.exists()


def test_prune_respects_the_lease_and_the_cap(src: Path) -> None:
    run("cache", "warm", str(src), "--json")
    kept = run("cache", "prune", "--max-bytes", "500", "--json", code=1)  # all just handed out
    assert kept["files_removed"] == 0 and kept["bytes_in_use"] == kept["bytes_before"]
    pruned = run("cache", "prune", "--max-bytes", "500", "--lease", "0", "--json")
    assert pruned["bytes_after"] <= 500 and pruned["files_removed"] >= 5
    assert run("cache", "status", "--json")["bytes"] == pruned["bytes_after"]


def test_prune_right_after_warm_hints_at_the_lease(src: Path) -> None:
    run("cache", "warm", str(src), "--json")
    result = CliRunner().invoke(cli, ["cache", "prune", "--max-bytes", "500"])
    assert result.exit_code == 1
    assert "removed 0 files" in result.output
    assert "a freshly copied file counts as just used" in result.output
    assert "hint: `--lease 0`" in result.output


def test_warm_names_failed_files_and_exits_1(src: Path, tmp_path: Path) -> None:
    data = run("cache", "lazy", str(src), "--json")
    (src / "d1" / "f7.bin").unlink()  # gone after the listing was frozen
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", data["manifest"],
                             "--json"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    summary = json.loads(result.stdout)
    assert [f["path"] for f in summary["failed"]] == ["d1/f7.bin"] and summary["fetched"] == 9
    assert "d1/f7.bin" in result.stderr and "Traceback" not in result.stderr


def test_disk_full_exits_1_naming_the_folder(tmp_path: Path) -> None:
    mnt = tmp_path / "tiny"
    with tmpfs(str(mnt), "size=1m"):
        big = tmp_path / "big"
        big.mkdir()
        for i in range(3):
            (big / f"{i}.bin").write_bytes(os.urandom(512 * 1024))
        env = {**os.environ, "UCSTAGE_CACHE_DIR": str(mnt / "cache")}
        result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", str(big)],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 1
        assert str(mnt / "cache") in result.stderr and "1.5 MiB" in result.stderr
        leftovers = [p for p in mnt.rglob("*.bin")] + [p for p in mnt.rglob("*ucstage-part")]
        assert leftovers == []


def test_foreign_cache_root_exits_2(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(shared)}
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "status"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and "writable by other users" in result.stderr
    assert "chmod 700" in result.stderr and os.listdir(shared) == []


def test_unsafe_keys_are_refused_with_a_warning(moto) -> None:  # type: ignore[no-untyped-def]
    prefix = unique("cli")
    moto.filesystem().pipe({f"ucstage-test/{prefix}/ok.bin": b"ok",
                            f"ucstage-test/{prefix}/a/../../../../etc/evil": b"evil"})
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm",
                             f"s3://ucstage-test/{prefix}", "--json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["fetched"] == 1
    assert [r["path"] for r in summary["refused"]] == ["a/../../../../etc/evil"]
    assert "skipped a/../../../../etc/evil" in result.stderr
    assert not os.path.exists("/etc/evil")


def test_progress_bar_shows_files_and_bytes(src: Path) -> None:
    from io import StringIO

    from rich.console import Console

    from ucstage.cache import LocalCache
    from ucstage.cli.progress import progress_bar
    from ucstage.manifest import snapshot

    buffer = StringIO()
    m = snapshot(str(src))
    with progress_bar(True, "warming",
                      console=Console(file=buffer, force_terminal=True, width=150)) as bar:
        report = LocalCache().warm(m.volume(), m.entries, callback=bar)
    text = buffer.getvalue()
    assert report.fetched == 10 and "10/10 files" in text and "1.0 kB" in text


def test_bench_progress_shows_one_line_per_run(src: Path) -> None:
    """The same bar draws bench: each run is a phase with its own description."""
    from io import StringIO

    from rich.console import Console

    from ucstage import bench
    from ucstage.cli.progress import progress_bar
    from ucstage.manifest import snapshot

    buffer = StringIO()
    with progress_bar(True, transient=False,
                      console=Console(file=buffer, force_terminal=True, width=150)) as bar:
        bench.run(snapshot(str(src)), workers=[1, 2], modes=["direct"], callback=bar)
    text = buffer.getvalue()
    assert "1/2 direct x1" in text and "2/2 direct x2" in text and "10/10 files" in text


def test_failed_files_are_printed_even_off_a_terminal() -> None:
    from io import StringIO

    from rich.console import Console

    from ucstage.cli.progress import progress_bar

    buffer = StringIO()
    with progress_bar(False, console=Console(file=buffer, width=150)) as bar:
        bar.set_size(10, items=2)
        bar.item_done("a.bin", "fetched")
        bar.item_done("b.bin", "failed", "Input/output error")
    assert buffer.getvalue().strip() == "failed b.bin: Input/output error"


def test_rerun_progress_counts_files_already_cached(src: Path) -> None:
    """Files found valid up front are items done too: a rerun ends at 10/10."""
    from io import StringIO

    from rich.console import Console

    from ucstage.cache import LocalCache
    from ucstage.cli.progress import progress_bar
    from ucstage.manifest import snapshot

    m = snapshot(str(src))
    LocalCache().warm(m.volume(), m.entries)
    buffer = StringIO()
    with progress_bar(True, "warming",
                      console=Console(file=buffer, force_terminal=True, width=150)) as bar:
        report = LocalCache().warm(m.volume(), m.entries, callback=bar)
    assert report.already_cached == 10 and "10/10 files" in buffer.getvalue()


def test_verify_without_source_lists_every_source(src: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.bin").write_bytes(b"x" * 50)
    run("cache", "warm", str(src), "--json")
    run("cache", "warm", str(other), "--json")
    data = run("cache", "verify", "--json")
    assert sorted(s["source"] for s in data["sources"]) == sorted([str(src), str(other)])
    assert data["clean"] and [s["checked"] for s in data["sources"]] in ([10, 1], [1, 10])
    from ucstage.cache import LocalCache

    assert data == LocalCache().verify().to_json()  # the CLI only renders the library's document
    human = run("cache", "verify")
    assert f"{other}: 1 checked, 1 ok" in human and f"{src}: 10 checked, 10 ok" in human


def test_library_errors_are_shown_as_this_commands_flags(src: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The library says max_bytes; the CLI's one mapper says --max-bytes."""
    from ucstage.cache import LocalCache
    from ucstage.errors import CacheError

    with pytest.raises(CacheError, match=r"^max_bytes must be 0 or more, got -1$"):
        LocalCache().prune(-1)
    # The size parser refuses "-1" before the library sees it; let it through
    # to check the library's message on its way out of the CLI.
    monkeypatch.setattr("ucstage.cli.cache.parse_size", int)
    result = CliRunner().invoke(cli, ["cache", "prune", "--max-bytes", "-1"])
    assert result.exit_code == 2
    assert "error: --max-bytes must be 0 or more, got -1" in result.output
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--max-bytes", "500"])
    assert result.exit_code == 1, result.output
    assert "more than the cache cap" in result.output
    assert "hint: raise --max-bytes, or warm fewer files (--include, --rank)" in result.output
