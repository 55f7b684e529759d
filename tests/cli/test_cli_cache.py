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

from tests.common.parts import readable, small_tree, tmpfs, unique
from ucstage.cli import cli
from ucstage.cli.cache import command as cache_group

WARM_KEYS = {"source", "cache_dir", "namespace", "slice", "files", "bytes", "fetched",
             "fetched_bytes", "already_cached", "already_cached_bytes", "failed", "refused",
             "unreadable", "seconds", "mb_per_s", "evicted_files", "evicted_bytes", "evicted_sources",
             "engine", "jobs", "jobs_auto", "checks", "checksum_mismatches", "etags_not_md5", "hedged", "timeouts"}


def run(*args: str, code: int = 0) -> Any:
    """Invoke the CLI in-process; parse JSON output when asked for."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args else result.output


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return Path(small_tree(tmp_path / "vol", files=10, folders=2))


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


def test_lazy_writes_columnar_by_default_and_json_on_request(src: Path, tmp_path: Path) -> None:
    from ucstage import manifest

    columnar = run("cache", "lazy", str(src), "--json")["manifest"]
    assert columnar.endswith(".manifest.arrow")
    with open(columnar, "rb") as fh:
        assert fh.read(6) == b"ARROW1"  # an Arrow IPC file, memory-mapped by every reader
    as_json = run("cache", "lazy", str(src), "--format", "json", "--json")["manifest"]
    assert as_json.endswith(".manifest.json")
    with open(as_json, encoding="utf-8") as fh:
        assert json.load(fh)["fingerprint"] == manifest.load(columnar).fingerprint
    named = run("cache", "lazy", str(src), "-o", str(tmp_path / "t.manifest.arrow"), "--json")
    assert named["manifest"] == str(tmp_path / "t.manifest.arrow")


def test_lazy_output_is_columnar_unless_a_json_name_or_format_asks(src: Path,
                                                                    tmp_path: Path) -> None:
    from ucstage import manifest

    plain = run("cache", "lazy", str(src), "-o", str(tmp_path / "out.manifest"), "--json")
    assert plain["manifest"] == str(tmp_path / "out.manifest")
    with open(plain["manifest"], "rb") as fh:
        assert fh.read(6) == b"ARROW1"  # no suffix: columnar, as without -o
    assert manifest.load(plain["manifest"]).fingerprint == plain["fingerprint"]
    named = run("cache", "lazy", str(src), "-o", str(tmp_path / "x.json"), "--json")
    with open(named["manifest"], encoding="utf-8") as fh:
        assert json.load(fh)["fingerprint"] == plain["fingerprint"]  # .json: JSON
    asked = run("cache", "lazy", str(src), "-o", str(tmp_path / "y.manifest"), "--format",
                "json", "--json")
    with open(asked["manifest"], encoding="utf-8") as fh:
        assert json.load(fh)["fingerprint"] == plain["fingerprint"]
    help_text = " ".join(run("cache", "lazy", "--help").split())
    assert "unless --format json or a name ending in .json" in help_text


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
    plan = run("shard-plan", str(src), "-w", "4", "-k", "2", "--shuffle", "--seed", "3",
               "--shuffle-scope", "global", "--nproc-per-node", "2", "--json")
    for args, ranks in ((["--rank", "1"], [1]),
                        (["--node-rank", "1", "--nproc-per-node", "2"], [2, 3])):
        run("cache", "clear", "--yes")
        warmed = run("cache", "warm", str(src), *args, "-w", "4", "-k", "2", "--shuffle",
                     "--seed", "3", "--shuffle-scope", "global", "--json")
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
    # --seed/--epoch without --shuffle change nothing: refused, as shard-plan does.
    for extra in (["--seed", "3"], ["--epoch", "1"], ["--seed", "0"],
                  ["--rank", "0", "-w", "2", "-k", "1", "--epoch", "2"]):
        result = CliRunner().invoke(cli, ["cache", "warm", str(src), *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert "error: --seed/--epoch only matter with --shuffle" in result.output, extra
        assert not list(Path(os.environ["UCSTAGE_CACHE_DIR"]).glob("*/d0"))  # nothing copied


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
    everything = run("cache", "clear", "--yes", "--json")
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
    assert summary["failed"][0]["retryable"] is False
    assert "d1/f7.bin" in result.stderr and "Traceback" not in result.stderr
    # A missing file fails the same way on a rerun: no "rerun to retry" (item 15).
    assert "rerun to retry" not in result.stderr
    assert ("hint: they are missing, unreadable or not regular files at the source, so a "
            "rerun fails the same way until the source is fixed") in result.stderr


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


def test_a_refused_root_is_never_suggested_for_deletion(tmp_path: Path) -> None:
    """The root may be the user's own data (a mistyped variable): no `rm`."""
    data = tmp_path / "my-photos.jpg"
    data.write_bytes(b"not a folder")
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(data)}
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "status"],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert "rm " not in result.stderr and "UCSTAGE_CACHE_DIR" in result.stderr
    assert data.read_bytes() == b"not a folder"


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
    from ucstage.cli.bars import progress_bar
    from ucstage.manifest import snapshot

    buffer = StringIO()
    m = snapshot(str(src))
    with progress_bar(True, "warming",
                      console=Console(file=buffer, force_terminal=True, width=150)) as bar:
        report = LocalCache().warm(m.volume(), m.entries, callback=bar)
    text = buffer.getvalue()
    assert report.fetched == 10 and "10/10 files" in text
    # IEC units, as in every summary (rich's own columns say kB and MB/s).
    assert "1.0 KiB/1.0 KiB" in text and "KiB/s" in text and "kB" not in text


def test_bench_progress_shows_one_line_per_run(src: Path) -> None:
    """The same bar draws bench: each run is a phase with its own description."""
    from io import StringIO

    from rich.console import Console

    from ucstage import bench
    from ucstage.cli.bars import progress_bar
    from ucstage.manifest import snapshot

    buffer = StringIO()
    with progress_bar(True, transient=False,
                      console=Console(file=buffer, force_terminal=True, width=150)) as bar:
        bench.run(snapshot(str(src)), workers=[1, 2], modes=["direct"], callback=bar)
    text = buffer.getvalue()
    assert "1/2 direct x1" in text and "2/2 direct x2" in text and "10/10 files" in text


def test_off_a_terminal_progress_is_a_line_every_interval() -> None:
    """Item 11: in a log, a line with files, bytes, rate and time left every
    interval (here 0.02 s instead of 10 s), whatever the command's bar setting;
    no bar drawing, and failures are counted, not listed (the report lists them)."""
    from io import StringIO

    from rich.console import Console

    from ucstage.cli.bars import progress_bar

    buffer = StringIO()
    log = Console(file=buffer, width=150)  # not a terminal
    with progress_bar(False, "warming", console=log, interval=0.02) as bar:
        bar.set_size(4 * 1024 * 1024, items=4)
        bar.relative_update(1024 * 1024)
        bar.item_done("a.bin", "fetched")
        bar.item_done("b.bin", "failed", "Input/output error")
        deadline = time.monotonic() + 30
        while "warming: 2/4 files, 1 failed, 1.0 MiB/4.0 MiB (25%)" not in buffer.getvalue():
            assert time.monotonic() < deadline, buffer.getvalue()
            time.sleep(0.01)
    text = buffer.getvalue()
    assert "\x1b" not in text and "\r" not in text  # plain lines, no bar
    assert "b.bin" not in text and "Input/output error" not in text
    assert bar.statuses == {"fetched": 1, "failed": 1} and bar.bytes_done == 1024 * 1024


def test_progress_line_says_rate_and_time_left() -> None:
    """The line's rate is over the last interval; ETA from it (a fake clock)."""
    from io import StringIO

    from rich.console import Console

    from ucstage.cli.bars import LogLines

    now = [100.0]
    lines = LogLines(Console(file=StringIO()), "warming", clock=lambda: now[0])
    assert lines.line() is None  # nothing to say before the total is known
    lines.set_size(10 * 1024 * 1024, items=10)
    lines.relative_update(3 * 1024 * 1024)  # e.g. files already cached
    for name in ("a", "b", "c"):
        lines.item_done(name, "cached")
    now[0] += 10
    assert lines.line() == ("warming: 3/10 files, 3.0 MiB/10.0 MiB (30%), 307.2 KiB/s, "
                            "ETA 0:00:23")
    lines.relative_update(1024 * 1024)
    lines.item_done("d", "fetched")
    now[0] += 10  # 1 MiB in the last 10 s: the ETA follows the recent rate
    assert lines.line() == ("warming: 4/10 files, 4.0 MiB/10.0 MiB (40%), 102.4 KiB/s, "
                            "ETA 0:01:00")
    now[0] += 10
    assert lines.line().endswith("0 B/s, ETA -")  # type: ignore[union-attr]
    lines.relative_update(6 * 1024 * 1024)
    now[0] += 10
    assert lines.line().endswith("(100%), 614.4 KiB/s, done")  # type: ignore[union-attr]


def test_each_failed_file_is_printed_once(src: Path) -> None:
    """Item 15: the report lists a failed file; the progress display does not
    repeat it (on a terminal or in a log), whether stdout and stderr are one
    stream or two."""
    data = run("cache", "lazy", str(src), "--json")
    (src / "d1" / "f7.bin").unlink()
    result = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm",
                             data["manifest"]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    both = result.stdout + result.stderr
    assert both.count("failed d1/f7.bin: cannot copy d1/f7.bin") == 1, both
    assert "1 of 10 files failed: d1/f7.bin" in result.stderr


def test_rerun_progress_counts_files_already_cached(src: Path) -> None:
    """Files found valid up front are items done too: a rerun ends at 10/10."""
    from io import StringIO

    from rich.console import Console

    from ucstage.cache import LocalCache
    from ucstage.cli.bars import progress_bar
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
    assert f"{other}: 1 file checked, 1 ok" in human and f"{src}: 10 files checked, 10 ok" in human


def test_library_errors_are_shown_as_this_commands_flags(src: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The library says max_bytes; the CLI's one mapper says --max-bytes."""
    from ucstage.cache import LocalCache
    from ucstage.errors import CacheError

    with pytest.raises(CacheError, match=r"^max_bytes must be 0 or more, got -1$"):
        LocalCache().prune(-1)
    # The size parser refuses "-1" before the library sees it; let it through
    # to check the library's message on its way out of the CLI.
    monkeypatch.setattr("ucstage.cli.args.parse_size", int)  # where size flags are parsed
    result = CliRunner().invoke(cli, ["cache", "prune", "--max-bytes", "-1"])
    assert result.exit_code == 2
    assert "error: --max-bytes must be 0 or more, got -1" in result.output
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--max-bytes", "500"])
    assert result.exit_code == 1, result.output
    assert "more than the cache cap" in result.output
    assert "hint: raise --max-bytes, or warm fewer files (--include, --rank)" in result.output


def test_transient_failures_suggest_a_rerun(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only failures a rerun can fix (retries ran out on I/O errors) hint at one."""
    import errno

    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Flaky(MemoryFileSystem):
        protocol = "flakycli"

        @classmethod
        def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
            if isinstance(path, str) and path.startswith("flakycli://"):
                path = path[len("flakycli://"):]
            return super()._strip_protocol(path)

        def _open(self, path, mode="rb", **kwargs):  # type: ignore[no-untyped-def]
            if os.path.basename(path).startswith("eio"):
                raise OSError(errno.EIO, "Input/output error (injected)")
            if os.path.basename(path).startswith("gone"):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory (injected)")
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("flakycli", Flaky, clobber=True)
    from ucstage.cache import LocalCache

    # No 0.2 s backoff doubling three times in a test.
    monkeypatch.setitem(LocalCache.__init__.__kwdefaults__, "backoff", 0.001)  # type: ignore[index]
    key = unique("flaky")
    store = MemoryFileSystem()
    for name in ("ok.bin", "eio.bin"):
        store.pipe_file(f"/{key}/{name}", b"x" * 10)
    result = CliRunner().invoke(cli, ["cache", "warm", f"flakycli://{key}", "--jobs", "1"])
    assert result.exit_code == 1
    assert "hint: rerun to retry just those; the rest are cached" in result.output
    # Issue 30 item 8: the failed file is not counted as warmed; plurals agree.
    assert "Warmed 1 of 2 files (10 B of 20 B) in " in result.output
    assert "fetched 1 (10 B" in result.output and "failed 1" in result.output
    assert "1 copy in flight (--jobs)" in result.output
    store.pipe_file(f"/{key}/gone.bin", b"x" * 10)
    result = CliRunner().invoke(cli, ["cache", "warm", f"flakycli://{key}"])
    assert result.exit_code == 1
    assert "hint: rerun to retry the 1 that failed on transient errors; the others" \
        in result.output


def test_warm_says_what_it_evicted(src: Path, tmp_path: Path) -> None:
    """Item 5: --max-bytes evicts other sources' files; the summary and --json say so."""
    other = tmp_path / "other"
    other.mkdir()
    for i in range(8):
        (other / f"o{i}.bin").write_bytes(b"o" * 1000)
    run("cache", "warm", str(other), "--json")
    past = time.time() - 600  # handed out long ago: out of the lease, first to go
    for p in Path(os.environ["UCSTAGE_CACHE_DIR"]).rglob("o*.bin"):
        os.utime(p, (past, past))
    data = run("cache", "warm", str(src), "--max-bytes", "8000", "--json")
    assert data["fetched"] == 10 and data["evicted_files"] >= 2
    assert data["evicted_bytes"] == 1000 * data["evicted_files"]
    left = len(list(Path(os.environ["UCSTAGE_CACHE_DIR"]).rglob("o*.bin")))
    assert data["evicted_files"] == 8 - left
    assert data["evicted_sources"] == [{"source": str(other), "namespace": data[
        "evicted_sources"][0]["namespace"], "files": 8 - left, "bytes": 1000 * (8 - left)}]
    run("cache", "clear", "--yes")
    run("cache", "warm", str(other), "--json")
    for p in Path(os.environ["UCSTAGE_CACHE_DIR"]).rglob("o*.bin"):
        os.utime(p, (past, past))
    human = run("cache", "warm", str(src), "--max-bytes", "8000")
    evicted = 8 - len(list(Path(os.environ["UCSTAGE_CACHE_DIR"]).rglob("o*.bin")))
    kib = f"{evicted * 1000 / 1024:.1f} KiB"
    assert f"evicted {evicted} cached files ({kib}) to stay under the cap of 7.8 KiB:" in human
    assert f"  {other}: {evicted} files ({kib})" in human


def _pty_run(args: list[str], answer: bytes | None, env: dict[str, str]) -> tuple[int, str]:
    """Run ucstage with stdin (and stderr) on a pseudo-terminal, as a person
    would; type ``answer`` once asked. Returns the exit code and what showed."""
    import pty

    main, child = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ucstage", *args], stdin=child,
                            stdout=subprocess.PIPE, stderr=child, env=env)
    os.close(child)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, seen
            if readable(main, 0.05):
                try:
                    seen += os.read(main, 4096)
                except OSError:
                    break
            if answer is not None and b"[y/N]" in seen:
                os.write(main, answer)
                answer = None
        out = proc.stdout.read().decode() if proc.stdout else ""
        proc.wait(60)
        while readable(main, 0):
            try:
                chunk = os.read(main, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(main)
    return proc.returncode, seen.decode(errors="replace") + out


def test_clear_everything_asks_on_a_terminal(src: Path) -> None:
    """Item 6: no SOURCE on a terminal: ask; --yes or a script: go ahead."""
    env = dict(os.environ)
    run("cache", "warm", str(src), "--json")
    code, shown = _pty_run(["cache", "clear"], b"n\n", env)
    assert code == 0, shown
    assert "Remove 10 cached files (1.0 KiB) of 1 source from" in shown and "[y/N]" in shown
    assert "nothing removed" in shown
    assert run("cache", "status", "--json")["entries"] == 10
    code, shown = _pty_run(["cache", "clear"], b"y\n", env)
    assert code == 0 and "removed 10 files (1.0 KiB) from 1 cached source" in shown, shown
    run("cache", "warm", str(src), "--json")
    code, shown = _pty_run(["cache", "clear", "--yes"], None, env)  # never asks
    assert code == 0 and "[y/N]" not in shown and "removed 10 files" in shown, shown
    run("cache", "warm", str(src), "--json")
    code, shown = _pty_run(["cache", "clear", str(src)], None, env)  # one source: no question
    assert code == 0 and "[y/N]" not in shown and "removed 10 files" in shown, shown
    run("cache", "warm", str(src), "--json")
    assert "removed 10 files" in run("cache", "clear", "--yes")  # a script, told: clears
    locks = Path(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "locks")
    assert list(locks.iterdir()) == []  # the lock files went with their namespaces


def test_a_volumes_source_is_found_after_its_root_changed(tmp_path: Path) -> None:
    """Item 7: status, verify and clear find `/Volumes/...` as status shows it,
    whatever UCSTAGE_VOLUMES_ROOT says now."""
    first = tmp_path / "first"
    vol = first / "main" / "ml" / "imgs"
    vol.mkdir(parents=True)
    for i in range(5):
        (vol / f"{i}.jpg").write_bytes(bytes([i]) * 100)
    env = {**os.environ, "UCSTAGE_VOLUMES_ROOT": str(first)}

    def ucstage(*args: str, code: int = 0, root: str = str(tmp_path / "second")) -> str:
        result = subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                                text=True, timeout=60,
                                env={**env, "UCSTAGE_VOLUMES_ROOT": root})
        assert result.returncode == code, result.stdout + result.stderr
        return result.stdout

    ucstage("cache", "warm", "/Volumes/main/ml/imgs", root=str(first))
    status = json.loads(ucstage("cache", "status", "--json"))
    assert [n["source"] for n in status["namespaces"]] == ["/Volumes/main/ml/imgs"]
    one = json.loads(ucstage("cache", "status", "/Volumes/main/ml/imgs", "--json"))
    assert one["entries"] == 5 and one["namespaces"][0]["url"] == str(vol)
    checked = json.loads(ucstage("cache", "verify", "/Volumes/main/ml/imgs", "--json"))
    assert checked["clean"] and [(s["source"], s["ok"]) for s in checked["sources"]] == [
        ("/Volumes/main/ml/imgs", 5)]
    cleared = json.loads(ucstage("cache", "clear", "dbfs:/Volumes/main/ml/imgs", "--json"))
    assert (cleared["files"], len(cleared["namespaces"])) == (5, 1)
    assert json.loads(ucstage("cache", "status", "--json"))["entries"] == 0


def test_lazy_recipe_names_every_variable_the_job_needs(tmp_path: Path) -> None:
    """Item 7: run the printed recipe in an environment holding only what it
    names: the job finds the files, through the same cache."""
    pytest.importorskip("torch")
    root = tmp_path / "volumes"
    vol = root / "c" / "s" / "v"
    vol.mkdir(parents=True)
    for i in range(4):
        (vol / f"{i}.bin").write_bytes(bytes([i]) * 10)
    cache_dir = tmp_path / "mycache"
    env = {**os.environ, "UCSTAGE_VOLUMES_ROOT": str(root), "UCSTAGE_CACHE_DIR": str(cache_dir),
           "UCSTAGE_CACHE_MAX_BYTES": "1G"}
    shown = subprocess.run([sys.executable, "-m", "ucstage", "cache", "lazy", "/Volumes/c/s/v"],
                           capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0, shown.stderr
    recipe = shown.stdout.split("In the training job (same node, same user):\n", 1)[1]
    exports = [line.strip() for line in recipe.splitlines() if line.strip().startswith("export ")]
    code = "\n".join(line.strip() for line in recipe.splitlines()
                     if line.strip() and not line.strip().startswith(("export ", "#")))
    assert exports == [f"export UCSTAGE_VOLUMES_ROOT={root}",
                       f"export UCSTAGE_CACHE_DIR={cache_dir}",
                       "export UCSTAGE_CACHE_MAX_BYTES=1G"]
    job = code + "\nprint(sorted(open(p, 'rb').read() for p in paths))\n"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("UCSTAGE_")}
    for line in exports:
        name, value = line[len("export "):].split("=", 1)
        clean[name] = value
    ran = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True,
                         timeout=120, env=clean)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == str(sorted(bytes([i]) * 10 for i in range(4)))
    assert len(list(cache_dir.rglob("*.bin"))) == 4  # through the cache the recipe named
    data = json.loads(subprocess.run(
        [sys.executable, "-m", "ucstage", "cache", "lazy", "/Volumes/c/s/v", "--json"],
        capture_output=True, text=True, timeout=60, env=env).stdout)
    assert data["env"] == {"UCSTAGE_VOLUMES_ROOT": str(root),
                           "UCSTAGE_CACHE_DIR": str(cache_dir),
                           "UCSTAGE_CACHE_MAX_BYTES": "1G"}


def test_a_bad_cap_variable_is_named(src: Path) -> None:
    """Item 15: `UCSTAGE_CACHE_MAX_BYTES='garbage'` says which setting is bad."""
    env = {**os.environ, "UCSTAGE_CACHE_MAX_BYTES": "garbage"}
    for args in (["cache", "warm", str(src)], ["cache", "status"]):
        result = subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                                text=True, timeout=60, env=env)
        assert result.returncode == 2, result.stderr
        assert "error: UCSTAGE_CACHE_MAX_BYTES='garbage' is not a size" in result.stderr
        assert "hint: set it to e.g. 500M or 20G, or unset it" in result.stderr
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--max-bytes", "lots"])
    assert result.exit_code == 2 and "error: --max-bytes: cannot read size 'lots'" in \
        result.output


def test_node_scope_warms_the_nodes_whole_share_and_says_so(src: Path) -> None:
    """Under --shuffle and the node scope, --node-rank and --rank warm the node's
    files of every epoch: those of every epoch's shard-plan, whatever --epoch."""
    job = ["-w", "4", "-k", "2", "--nproc-per-node", "2", "--shuffle", "--seed", "3"]
    share = set()
    for epoch in range(3):
        plan = run("shard-plan", str(src), *job, "--epoch", str(epoch), "--json")
        files = {f for s in plan["slots"] if s["node"] == 1 for f in s["files"]}
        assert not share or files == share
        share = files
    for args in (["--node-rank", "1"], ["--rank", "3"]):
        run("cache", "clear", "--yes")
        result = CliRunner().invoke(cli, ["cache", "warm", str(src), *args, *job, "--epoch",
                                          "4", "--json"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "note: --epoch is ignored under the node shuffle scope" in result.stderr
        assert "warming node 1's whole share (ranks 2..3): 5 files" in result.stderr
        warmed = json.loads(result.stdout)
        ns = Path(warmed["namespace"])
        assert sorted(str(p.relative_to(ns)) for p in ns.rglob("*.bin")) == sorted(share)
        assert warmed["slice"]["node_share"] is True and warmed["slice"]["nodes"] == [1]
        assert warmed["slice"]["shuffle_scope"] == "node"
        assert warmed["slice"]["nproc_per_node"] == 2
    run("cache", "clear", "--yes")
    out = run("cache", "warm", str(src), "--node-rank", "0", *job)
    assert "node 0's whole share (ranks 0..1), which serves every epoch" in out


def test_a_node_share_over_the_cap_is_refused_before_copying(src: Path) -> None:
    job = ["-w", "4", "-k", "2", "--nproc-per-node", "2", "--shuffle"]
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--node-rank", "0", *job,
                                      "--max-bytes", "200"], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    assert "node 0's whole share (ranks 0..1) does not fit" in result.output
    assert "more than the cache cap" in result.output
    assert "every epoch" in result.output
    assert not list(Path(os.environ["UCSTAGE_CACHE_DIR"]).rglob("*.bin"))  # nothing copied
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--rank", "0", "-w", "3", "-k",
                                      "1", "--nproc-per-node", "2", "--shuffle"])
    assert result.exit_code == 2 and "not a multiple of --nproc-per-node 2" in result.output


def test_a_script_clears_everything_only_when_told(src: Path) -> None:
    """Issue 30 item 3: `cache clear $UNSET` in a script (stdin not a terminal)
    must not clear every source; --yes does."""
    run("cache", "warm", str(src), "--json")
    result = CliRunner().invoke(cli, ["cache", "clear"], input="")
    assert result.exit_code == 2, result.output
    assert "no SOURCE given: pass --yes to clear every cached source" in result.output
    empty = CliRunner().invoke(cli, ["cache", "clear", ""], input="")  # an empty $VARIABLE
    assert empty.exit_code == 2 and "the source is empty" in empty.output
    both = CliRunner().invoke(cli, ["cache", "clear", str(src), "--yes"])
    assert both.exit_code == 2 and "give it or SOURCE, not both" in both.output
    assert run("cache", "status", "--json")["entries"] == 10  # nothing was removed
    assert "removed 10 files" in run("cache", "clear", "--yes")


def _invoke80(*args: str) -> Any:
    """The CLI as an 80-column terminal shows it."""
    return CliRunner().invoke(cli, list(args), env={"COLUMNS": "80"})


def test_verify_without_source_checks_every_source_and_names_the_vanished(
        src: Path, tmp_path: Path) -> None:
    """Issue 30 item 1: a vanished source does not stop verify; it is
    reported as gone, with `cache clear SOURCE` as the way out."""
    gone = tmp_path / "gone"
    gone.mkdir()
    (gone / "x.bin").write_bytes(b"x" * 5)
    run("cache", "warm", str(gone), "--json")
    run("cache", "warm", str(src), "--json")
    (gone / "x.bin").unlink()
    gone.rmdir()
    result = _invoke80("cache", "verify")
    assert result.exit_code == 1, result.output
    assert f"{src}: 10 files checked, 10 ok, 0 not cached; 0 stale, 0 corrupt" in result.output
    assert f"{gone}: gone (source {gone} does not exist" in result.output
    assert f"error: 1 cached source no longer exists: {gone}" in result.output
    assert f"`ucstage cache clear {gone}` removes its copies" in " ".join(result.output.split())
    assert "UCSTAGE_VOLUMES_ROOT" not in result.output  # a local path: no /Volumes hint
    data = run("cache", "verify", "--json", code=1)
    by_source = {s["source"]: s for s in data["sources"]}
    assert by_source[str(gone)]["vanished"].startswith(f"source {gone} does not exist")
    assert by_source[str(src)]["ok"] == 10 and by_source[str(src)]["vanished"] is None
    run("cache", "clear", str(gone))  # the hint holds
    assert run("cache", "verify", "--json")["clean"]


def test_verify_reports_orphans_and_fix_removes_them(src: Path) -> None:
    """Issue 30 item 14: a source file deleted after warming leaves an orphan copy."""
    warmed = run("cache", "warm", str(src), "--json")
    (src / "d0" / "f2.bin").unlink()
    result = _invoke80("cache", "verify", str(src))
    assert result.exit_code == 0, result.output  # nothing stale: an orphan is only space
    assert "9 files checked, 9 ok" in result.output
    assert "1 orphan (cached, the source file is gone; `ucstage cache verify --fix` " \
           "removes them): d0/f2.bin" in " ".join(result.output.split())
    assert Path(warmed["namespace"], "d0", "f2.bin").exists()  # reported, not removed
    fixed = run("cache", "verify", "--fix", "--json")  # every source, as without SOURCE
    assert fixed["sources"][0]["orphans"] == fixed["sources"][0]["orphans_removed"] == ["d0/f2.bin"]
    assert not Path(warmed["namespace"], "d0", "f2.bin").exists()
    assert run("cache", "status", "--json")["entries"] == 9
    assert run("cache", "verify", str(src), "--json")["sources"][0]["orphans"] == []
    # A filtered listing is not the whole source: nothing is called an orphan.
    (src / "d1" / "f5.bin").unlink()
    part = run("cache", "verify", str(src), "--include", "d0/*", "--json")
    assert part["sources"][0]["orphans"] == []


def test_verify_shows_a_local_file_s_version_as_a_time(src: Path) -> None:
    """Issue 30 item 8: a stale entry's versions read as times, not raw mtimes."""
    run("cache", "warm", str(src), "--json")
    target = src / "d0" / "f2.bin"
    os.utime(target, (1796151838.235907, 1796151838.235907))
    result = _invoke80("cache", "verify", str(src))
    assert result.exit_code == 1
    shown = " ".join(result.output.split())
    assert "source is now 102 bytes, modified 2026-12-01 19:03:58.235907 UTC; cached 102 " \
           "bytes, modified 20" in shown
    assert "1796151838" not in result.output


def test_a_refused_warm_leaves_no_empty_entry_in_status(src: Path) -> None:
    """Issue 30 item 13: `cache warm --max-bytes` refused (exit 1) left a
    `vol 0 0 B` source in `cache status`."""
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--max-bytes", "500"])
    assert result.exit_code == 1 and "more than the cache cap" in result.output
    status = run("cache", "status", "--json")
    assert status["namespaces"] == [] and status["entries"] == 0
    assert "nothing cached" in run("cache", "verify")
    # A source already cached keeps its entry when a later warm is refused.
    run("cache", "warm", str(src), "--include", "d0/*", "--json")
    result = CliRunner().invoke(cli, ["cache", "warm", str(src), "--max-bytes", "500"])
    assert result.exit_code == 1
    assert [n["source"] for n in run("cache", "status", "--json")["namespaces"]] == [str(src)]


@pytest.mark.parametrize("width", [80, 100, 160])
def test_the_warm_bar_is_one_line_at_any_width(width: int) -> None:
    """Issue 30 item 9: at 80 columns rich folded the bar's cells onto a
    second line (121 two-line redraws). A real rich terminal console, drawn
    into a buffer."""
    import io
    import re

    from rich.console import Console

    from ucstage.cli.bars import progress_bar

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width, color_system=None)
    with progress_bar(True, "warming", console=console) as cb:
        cb.set_size(123_456_789_012, items=200_000)
        cb.relative_update(5_555_555_555)
        for _ in range(1_234):
            cb.item_done("f", "fetched")
        cb.item_done("g", "failed")
    frame = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue()).split("\r")[-1]
    assert frame.count("\n") == 1 and frame.endswith("\n"), repr(frame)  # one line
    line = frame.rstrip("\n")
    assert len(line) <= width, (len(line), line)
    assert line.startswith("warming ")
    assert "1,235/200,000 files, 1 failed" in line and "5.2 GiB/115.0 GiB" in line  # never cut
