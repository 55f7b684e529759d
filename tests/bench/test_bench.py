"""``ucstage bench`` on real parts: an rclone FUSE mount and a moto S3 server.

No test asserts on wall-clock speed (shared machines are noisy); they check
what was counted, what was left on disk, and what the user sees.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.parts import REPO, rclone_mount, tmpfs, unique, wait_synced
from ucstage import bench, snapshot
from ucstage.bench.report import RunResult
from ucstage.bench.sampling import recommend, sample
from ucstage.cli import cli
from ucstage.cli.args import parse_modes, parse_workers
from ucstage.errors import FetchFailed, InvalidArgument
from ucstage.progress import Callback
from ucstage.volumes import FileEntry

SIZES = [0, 1, 4096, 100_000, 300_000, 1_500_000, 5_000_000, 65_536]


def _write_tree(root: str, sizes: list[int] = SIZES) -> dict[str, int]:
    """Files of mixed sizes (an empty one, one spanning buffers) in two folders."""
    written = {}
    for i, size in enumerate(sizes):
        rel = f"{'a' if i % 2 else 'b'}/f{i:02d}.bin"
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as fh:
            fh.write(os.urandom(size))
        written[rel] = size
    return written


@pytest.fixture
def fuse_tree(fuse_volume: tuple[str, str]) -> tuple[str, dict[str, int]]:
    """(path through the FUSE mount, {relpath: size}) of a fresh tree."""
    backing, mnt = fuse_volume
    key = unique("bench")
    written = _write_tree(os.path.join(backing, key))
    source = os.path.join(mnt, key)
    wait_synced(os.path.join(backing, key), source)
    return source, written


def _leftovers(folder: str) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def _user_cache_untouched() -> None:
    root = os.environ["UCSTAGE_CACHE_DIR"]
    assert _leftovers(root) == [], f"bench wrote into the user's cache {root}"


class Recorder(Callback):
    """Every progress call, grouped by the description that opened its phase."""

    def __init__(self) -> None:
        self.phases: dict[str, dict[str, Any]] = {}
        self.order: list[str] = []
        self.threads: set[int] = set()
        self.current: dict[str, Any] | None = None

    def set_description(self, text: str) -> None:
        self.threads.add(threading.get_ident())
        assert text not in self.phases, f"phase {text!r} started twice"
        self.order.append(text)
        self.current = self.phases[text] = {"size": None, "bytes": 0,
                                            "items": defaultdict(list)}

    def set_size(self, size: int, items: int | None = None) -> None:
        self.threads.add(threading.get_ident())
        assert self.current is not None, "set_size before set_description"
        self.current["size"] = (size, items)

    def relative_update(self, inc: int = 1) -> None:
        self.threads.add(threading.get_ident())
        assert self.current is not None and inc > 0
        self.current["bytes"] += inc

    def item_done(self, name: str, status: str, error: str = "") -> None:
        self.threads.add(threading.get_ident())
        assert self.current is not None
        self.current["items"][status].append(name)


@pytest.mark.fuse
def test_every_mode_and_worker_count_counts_every_byte(fuse_tree, tmp_path) -> None:
    source, written = fuse_tree
    scratch = str(tmp_path / "scratch")
    seen = Recorder()
    report = bench.run(snapshot(source), workers=[1, 2, 3], modes=["warm", "direct", "cold"],
                       scratch_dir=scratch, callback=seen)

    assert report.modes == ["direct", "cold", "warm"]  # warm needs cold's cache: measured last
    assert [(r.mode, r.workers) for r in report.results] == [
        (m, k) for m in ("direct", "cold", "warm") for k in (1, 2, 3)]
    total = sum(written.values())
    assert (report.sample_files, report.sample_bytes) == (len(written), total)
    for r in report.results:
        assert (r.files, r.bytes, r.complete) == (len(written), total, True), r
        assert r.seconds > 0 and r.mb_per_s > 0 and r.files_per_s > 0
        assert 0 < r.p50_ms <= r.p95_ms <= r.p99_ms
    rec = report.recommendation
    assert rec.mode == "cold" and rec.workers in (1, 2, 3)
    assert set(rec.by_mode) == {"direct", "cold", "warm"}
    assert rec.warm_vs_direct is not None and rec.warm_vs_direct > 0
    timed = any(r.seconds >= bench.NOISY_SECONDS for r in report.results if r.mode == "direct")
    told = timed and not rec.direct_page_cache
    assert (rec.bottleneck in ("volume", "local")) if told else rec.bottleneck is None
    # One progress phase per run, in run order, each reaching its end, all
    # from the calling thread (so what the callback raises stops the bench).
    assert seen.order == [f"{i + 1}/9 {m} x{k}" for i, (m, k) in
                          enumerate((m, k) for m in ("direct", "cold", "warm") for k in (1, 2, 3))]
    for text, phase in seen.phases.items():
        assert phase["size"] == (total, len(written)), text
        assert phase["bytes"] == total, text
        assert sorted(phase["items"]["read"]) == sorted(written), text
    assert seen.threads == {threading.get_ident()}
    assert _leftovers(scratch) == []
    _user_cache_untouched()


@pytest.mark.s3
def test_direct_and_cold_from_s3(moto, tmp_path) -> None:
    key = unique("bench")
    fs = moto.filesystem()
    sizes = {f"d/f{i}.bin": size for i, size in enumerate([10, 200_000, 4_500_000])}
    for rel, size in sizes.items():
        fs.pipe_file(f"ucstage-test/{key}/{rel}", os.urandom(size))
    report = bench.run(snapshot(f"s3://ucstage-test/{key}"), workers=[1, 2],
                       modes=["direct", "cold", "warm"], scratch_dir=str(tmp_path))
    assert len(report.results) == 6
    for r in report.results:
        assert (r.files, r.bytes) == (3, sum(sizes.values())), r
    assert _leftovers(str(tmp_path)) == []


@pytest.mark.fuse
def test_cli_json_schema_and_plot(fuse_tree, tmp_path) -> None:
    from PIL import Image

    source, written = fuse_tree
    png = tmp_path / "out" / "bench.png"
    png.parent.mkdir()  # a missing folder is an error (test_bad_input_exits_2_with_one_line)
    result = CliRunner().invoke(
        cli, ["bench", source, "--workers", "1,2", "--json", "--plot", str(png),
              "--scratch-dir", str(tmp_path / "scratch")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("format", "format_version", "source", "sample", "modes", "workers", "results",
                "recommended_workers", "recommended_mode", "recommended_by_mode", "best",
                "speedup_warm_vs_direct", "speedup_cold_vs_direct", "bottleneck", "caching",
                "stopped_early", "max_seconds", "seconds", "notes", "plot"):
        assert key in data, key
    assert data["format"] == "ucstage.bench" and data["format_version"] == 1
    # Fewer files than the default sample's 500: it takes them all.
    assert data["sample"]["files"] == len(written) and data["sample"]["by"] == "default"
    assert len(data["results"]) == 6
    for row in data["results"]:
        assert set(row) >= {"mode", "workers", "files", "bytes", "seconds", "files_per_s",
                            "mb_per_s", "p50_ms", "p95_ms", "p99_ms", "complete", "page_cache"}
        assert row["bytes"] == sum(written.values())
    assert data["recommended_workers"] in (1, 2)
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] >= 400 and image.size[1] >= 300
    assert _leftovers(str(tmp_path / "scratch")) == []


@pytest.mark.fuse
def test_cli_table_and_recommendation(fuse_tree, tmp_path) -> None:
    source, _ = fuse_tree
    result = CliRunner().invoke(cli, ["bench", source, "-k", "1,2", "-m", "direct,warm",
                                      "--scratch-dir", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "mode" in out and "MiB/s" in out and "p99 ms" in out and "MB/s" not in out
    assert "→ use" in out and "DataLoader worker" in out and "warm cache vs direct" in out
    assert "reading the source directly" in out
    assert _leftovers(str(tmp_path)) == []


def test_files_sample_is_deterministic_and_in_listing_order() -> None:
    entries = [FileEntry(f"x/{i:04d}.bin", 1000 + i, "v") for i in range(500)]
    first = sample(entries, files=40, seed=0)
    assert first == sample(entries, files=40, seed=0)
    assert len(first) == 40 and len(set(first)) == 40
    assert first == sorted(first, key=lambda e: e.path)  # listing order, not rank order
    assert first != sample(entries, files=40, seed=1)
    # A bigger sample extends a smaller one: the same ranking, cut later.
    assert set(first) <= set(sample(entries, files=80, seed=0))
    # Independent of where the volume is listed from: only paths and the seed matter.
    assert set(sample(list(reversed(entries)), files=40)) == set(first)
    by_bytes = sample(entries, max_bytes=50_000)
    assert sum(e.size for e in by_bytes) >= 50_000
    assert sum(e.size for e in by_bytes) - max(e.size for e in by_bytes) < 50_000 or \
        len(by_bytes) == 1
    assert sample(entries) == entries  # the default sample: 500 files or fewer
    assert sample(entries, files="all") == entries


@pytest.mark.fuse
def test_cli_files_sample_matches_library(fuse_tree, tmp_path) -> None:
    source, written = fuse_tree
    args = ["bench", source, "--files", "3", "-k", "2", "-m", "direct", "--json", "--seed", "7"]
    runs = []
    for _ in range(2):
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        runs.append(json.loads(result.stdout))
    expected = sample(snapshot(source).entries, files=3, seed=7)
    for data in runs:
        assert data["sample"] == {"files": 3, "bytes": sum(e.size for e in expected),
                                  "listed_files": len(written),
                                  "listed_bytes": sum(written.values()), "by": "files",
                                  "seed": 7}
        assert data["results"][0]["bytes"] == sum(e.size for e in expected)


@pytest.mark.parametrize("args, message", [
    (["--workers", "0"], "--workers 0 is DataLoader num_workers=0"),
    (["--workers", "0,2", "-m", "direct,cold"], "only the loader mode measures"),
    (["--workers", "a"], "--workers must be whole numbers >= 0"),
    (["--workers", "1,,2"], "--workers must be whole numbers >= 0"),
    (["--workers", "-1"], "--workers must be whole numbers >= 0"),
    (["--files", "some"], "takes a number of files or 'all'"),
    (["--modes", "direct,fast"], "unknown mode 'fast'"),
    (["--files", "0"], "--files must be at least 1"),
    (["--files", "2", "--sample-bytes", "1M"], "give --files or --sample-bytes, not both"),
    (["--sample-bytes", "lots"], "cannot read size 'lots'"),
    (["--max-seconds", "0"], "--max-seconds must be positive, got 0"),
    (["--max-seconds", "-1"], "--max-seconds must be positive, got -1"),
    (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    (["--sample-bytes", "0"], "--sample-bytes must be at least 1 byte, got 0"),
    (["--modes", ","], "--modes is empty; choose from direct, cold, warm, loader"),
    (["--plot", "chart.jpg"], "--plot writes a PNG"),
    (["--scratch-dir", "/nonexistent/ucstage/x"], "/nonexistent/ucstage does not exist"),
    (["--plot", "/nonexistent/ucstage/x.png"], "folder /nonexistent/ucstage does not exist"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, message) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 10)
    result = CliRunner().invoke(cli, ["bench", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "`" not in lines[0], "a parameter name was not said as the flag"
    assert "Traceback" not in result.output and result.stdout == ""
    assert not any(name.startswith("ucstage-bench-") for name in os.listdir(tmp_path))
    assert not os.path.exists("/nonexistent/ucstage")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_seconds": -1}, "max_seconds must be positive, got -1"),
    ({"max_seconds": 0.0}, "max_seconds must be positive, got 0"),
    ({"workers": "1,2"}, "workers must be a sequence of ints such as [1, 2, 4, 8], got '1,2'"),
    ({"workers": 4}, "workers must be a sequence of ints"),
    ({"workers": [2, 0]}, "workers 0 is DataLoader num_workers=0"),
    ({"workers": [2, -1], "modes": ["loader"]}, "workers must be ints >= 0, got -1"),
    ({"files": "some"}, "files must be a number of files or 'all', got 'some'"),
    ({"workers": [1, "2"]}, "workers must be positive ints, got '2'"),
    ({"workers": []}, "workers is empty"),
    ({"modes": "direct,warm"}, "unknown mode 'direct,warm' in `modes`"),  # a str is one mode
    ({"modes": ["warm", None]}, "modes[1] must be a str, got NoneType None"),
    ({"modes": ["direct", "fast"]}, "unknown mode 'fast' in `modes`"),
    ({"modes": [" "]}, "modes is empty"),
    ({"batch_size": 0}, "batch_size must be at least 1, got 0"),
    ({"files": 0}, "files must be at least 1, got 0"),
    ({"sample_bytes": 0}, "sample_bytes must be at least 1 byte, got 0"),
    ({"files": 1, "sample_bytes": 10}, "give `files` or sample_bytes, not both"),
])
def test_library_errors_name_parameters_not_flags(tmp_path, kwargs, message) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(b"x" * 10)
    listing = snapshot(str(tmp_path / "src"))
    with pytest.raises(InvalidArgument) as info:
        bench.run(listing, scratch_dir=str(tmp_path / "scratch"), **kwargs)
    assert message in info.value.message
    assert "--" not in info.value.message + info.value.hint
    assert not (tmp_path / "scratch").exists()  # refused before anything was made


def test_sample_names_its_own_parameters() -> None:
    entries = [FileEntry("a.bin", 10, "v")]
    with pytest.raises(InvalidArgument, match="give `files` or max_bytes, not both"):
        sample(entries, files=1, max_bytes=5)
    with pytest.raises(InvalidArgument, match="max_bytes must be at least 1 byte, got 0"):
        sample(entries, max_bytes=0)


def test_cli_lists_become_what_the_library_takes() -> None:
    assert parse_workers("4, 1,2,4") == [1, 2, 4]
    assert parse_modes("warm, Direct,,loader") == ["direct", "warm", "loader"]
    assert parse_workers("2,0") == [0, 2]  # 0: the loader's num_workers=0
    with pytest.raises(InvalidArgument, match="--workers must be whole numbers >= 0"):
        parse_workers("1,-2")
    with pytest.raises(InvalidArgument, match="--workers is empty"):
        parse_workers(" ")


def test_scratch_disk_too_small_is_refused_in_each_ones_words(tmp_path) -> None:
    src = tmp_path / "src"
    _write_tree(str(src))  # 7 MB of files
    with tmpfs(str(tmp_path / "small"), "size=1m") as small:
        with pytest.raises(InvalidArgument) as info:
            bench.run(snapshot(str(src)), workers=[1], modes=["cold"], scratch_dir=small)
        assert "copy the sample" in info.value.message
        assert info.value.hint == ("bench a smaller sample with `files` or sample_bytes, "
                                   "or point scratch_dir at a bigger disk")
        result = CliRunner().invoke(cli, ["bench", str(src), "-k", "1", "-m", "cold",
                                          "--scratch-dir", small])
        assert result.exit_code == 2, result.output
        assert ("hint: bench a smaller sample with --files or --sample-bytes, or point "
                "--scratch-dir at a bigger disk") in result.stderr
        assert os.listdir(small) == []


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch) -> None:
    (tmp_path / "f.bin").write_bytes(b"x" * 10)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    result = CliRunner().invoke(cli, ["bench", str(tmp_path), "--plot", str(tmp_path / "c.png")])
    assert result.exit_code == 2
    assert "--plot needs matplotlib" in result.stderr
    assert "pip install 'ucstage[plot]'" in result.stderr


def test_read_error_removes_the_temporary_cache(tmp_path) -> None:
    src, scratch = tmp_path / "src", tmp_path / "scratch"
    written = _write_tree(str(src))
    listing = snapshot(str(src))
    os.unlink(src / next(iter(written)))  # listed, then gone: the read fails
    with pytest.raises(FetchFailed):
        bench.run(listing, workers=[2], modes=["cold", "warm"], scratch_dir=str(scratch))
    assert _leftovers(str(scratch)) == []
    _user_cache_untouched()


def test_interrupt_removes_the_temporary_cache(tmp_path) -> None:
    src, scratch = tmp_path / "src", tmp_path / "scratch"
    written = _write_tree(str(src))

    class Interrupt(Recorder):
        def relative_update(self, inc: int = 1) -> None:
            super().relative_update(inc)
            assert _leftovers(str(scratch)) != []  # the cache exists while it runs
            raise KeyboardInterrupt

    seen = Interrupt()
    with pytest.raises(KeyboardInterrupt):
        bench.run(snapshot(str(src)), workers=[1], modes=["cold", "warm"],
                  scratch_dir=str(scratch), callback=seen)
    assert seen.order == ["1/2 cold x1"]
    assert 0 < seen.phases["1/2 cold x1"]["bytes"] <= sum(written.values())
    assert _leftovers(str(scratch)) == []


def test_warm_without_cold_fills_the_cache_first_as_its_own_phase(tmp_path) -> None:
    src, scratch = tmp_path / "src", tmp_path / "scratch"
    written = _write_tree(str(src))
    seen = Recorder()
    report = bench.run(snapshot(str(src)), workers=[2, 1], modes=["warm"],
                       scratch_dir=str(scratch), callback=seen)
    total = sum(written.values())
    assert [(r.mode, r.workers, r.files, r.bytes) for r in report.results] == [
        ("warm", 1, len(written), total), ("warm", 2, len(written), total)]
    # The fill happens once, before the first warm run, with the most workers.
    assert seen.order == ["1/2 filling warm cache", "1/2 warm x1", "2/2 warm x2"]
    fill = seen.phases["1/2 filling warm cache"]
    assert fill["size"] == (total, len(written)) and fill["bytes"] == total
    assert sorted(fill["items"]["fetched"]) == sorted(written)
    for text in seen.order[1:]:
        assert sorted(seen.phases[text]["items"]["read"]) == sorted(written), text
    assert not any("cached before" in n for n in report.notes)
    assert _leftovers(str(scratch)) == []
    _user_cache_untouched()


@pytest.mark.fuse
def test_ctrl_c_on_the_command_stops_cleanly(tmp_path) -> None:
    """A real SIGINT to `ucstage bench` reading a throttled FUSE mount."""
    backing, mnt, scratch = tmp_path / "backing", tmp_path / "mnt", tmp_path / "scratch"
    # 16 MiB at 512 KiB/s: rclone's token bucket lets the first 4 MiB through at
    # once, so the bench needs well over 20 s and is still reading when the
    # signal comes, however slowly this machine started it.
    _write_tree(str(backing), [256 * 1024] * 64)
    with rclone_mount(str(backing), str(mnt), "--bwlimit", "512k"):
        proc = subprocess.Popen(
            [sys.executable, "-m", "ucstage", "bench", str(mnt), "-k", "1", "-m", "cold,warm",
             "--scratch-dir", str(scratch)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Signalled once the cold run copies into its cache (a sample file,
            # or its temp file, is in the scratch folder): the bench is reading.
            deadline = time.monotonic() + 120
            while not any(p.is_file() for p in scratch.rglob("*.bin*")):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the bench never copied into its cache"
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert _leftovers(str(scratch)) == []


@pytest.mark.fuse
def test_max_seconds_bounds_the_run_and_marks_cut_runs(tmp_path) -> None:
    backing, mnt, scratch = tmp_path / "backing", tmp_path / "mnt", tmp_path / "scratch"
    _write_tree(str(backing), [128 * 1024] * 16)
    with rclone_mount(str(backing), str(mnt), "--bwlimit", "256k"):
        report = bench.run(snapshot(str(mnt)), workers=[1, 2], modes=["direct", "cold", "warm"],
                           max_seconds=1.5, scratch_dir=str(scratch))
    assert report.stopped_early
    assert any(not r.complete for r in report.results)
    for r in report.results:
        assert r.bytes == r.files * 128 * 1024  # only whole files are counted
    assert _leftovers(str(scratch)) == []


def _r(mode: str, workers: int, mb: float, seconds: float = 1.0) -> RunResult:
    return RunResult(mode, workers, 10, int(mb * 1e6 * seconds), seconds, 10 / seconds, mb,
                     1.0, 2.0, 3.0, True)


def test_recommendation_is_the_fewest_workers_within_10_percent() -> None:
    results = [_r("direct", 1, 50), _r("direct", 2, 95), _r("direct", 4, 100),
               _r("direct", 8, 98), _r("cold", 1, 40), _r("cold", 4, 81), _r("cold", 8, 89),
               _r("warm", 1, 900), _r("warm", 8, 1000)]
    rec = recommend(results)
    assert rec.by_mode == {"direct": 2, "cold": 4, "warm": 1}
    assert (rec.mode, rec.workers, rec.best_workers, rec.best_mb_per_s) == ("cold", 4, 8, 89)
    assert rec.warm_vs_direct == pytest.approx(10.0)
    assert rec.cold_vs_direct == pytest.approx(0.89)
    assert rec.bottleneck == "volume"
    local = recommend([_r("direct", 1, 1000), _r("warm", 1, 1100)])
    assert (local.mode, local.bottleneck) == ("direct", "local")
    # A sample read directly in a blink says nothing about the volume.
    blink = recommend([_r("direct", 1, 100, seconds=0.01), _r("warm", 1, 900, seconds=0.001)])
    assert blink.warm_vs_direct == pytest.approx(9.0) and blink.bottleneck is None
    assert recommend([]).workers is None


@pytest.mark.fuse
def test_loader_mode_reads_every_file_through_dataloader_workers(fuse_tree, tmp_path) -> None:
    pytest.importorskip("torch")
    source, written = fuse_tree
    scratch = str(tmp_path / "scratch")
    report = bench.run(snapshot(source), workers=[1, 2], modes=["loader"], batch_size=3,
                       scratch_dir=scratch)
    assert [(r.mode, r.workers) for r in report.results] == [("loader", 1), ("loader", 2)]
    for r in report.results:
        assert (r.files, r.bytes, r.complete) == (len(written), sum(written.values()), True)
        assert 0 < r.p50_ms <= r.p99_ms
    assert report.recommendation.mode == "loader" and report.batch_size == 3
    assert _leftovers(scratch) == []
    _user_cache_untouched()


def test_remote_volume_script_serves_a_mount_and_tears_everything_down(tmp_path) -> None:
    """scripts/remote-volume.sh end to end: bench reads its FUSE mount, then nothing is left."""
    import shutil

    from tests.common.parts import fuse_available, require

    require(os.geteuid() == 0, "the emulated remote volume needs root (ip netns, tc)")
    require(shutil.which("ip") is not None and shutil.which("tc") is not None,
            "iproute2 is not installed")
    require(*fuse_available())
    script = os.path.join(REPO, "scripts",
                          "remote-volume.sh")
    inner = ('echo "NS=$UCSTAGE_REMOTE_NS MNT=$UCSTAGE_REMOTE_MNT" >&2; '
             f'{sys.executable} -m ucstage bench "$UCSTAGE_REMOTE_MNT/small" -m direct,cold '
             f'-k 1,3 --json --scratch-dir {tmp_path}/scratch')
    proc = subprocess.run([script, "--small", "6x4K", "--large", "none", "--delay", "1ms",
                           "--rate", "100mbit", "--", "sh", "-c", inner],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert [(r["mode"], r["workers"], r["files"], r["bytes"]) for r in data["results"]] == [
        (m, k, 6, 6 * 4096) for m in ("direct", "cold") for k in (1, 3)]
    line = next(x for x in proc.stderr.splitlines() if x.startswith("NS="))
    ns, mnt = (part.split("=", 1)[1] for part in line.split())
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert ns not in netns
    assert not os.path.ismount(mnt) and not os.path.exists(os.path.dirname(mnt))
    assert _leftovers(str(tmp_path / "scratch")) == []


# ---------------------------------------------------------------- the default sample


def _listing(n: int, size: int, folders: int = 100) -> list[FileEntry]:
    per = -(-n // folders)
    return [FileEntry(f"d{i // per:03d}/{i:06d}.jpg", size, "v") for i in range(n)]


def test_default_sample_is_spread_over_the_whole_listing() -> None:
    entries = _listing(48_112, 100_000)
    chosen = sample(entries)
    assert len(chosen) == bench.DEFAULT_SAMPLE_FILES == 500
    assert chosen == sample(entries, seed=0) != sample(entries, seed=1)
    assert chosen == sorted(chosen, key=lambda e: e.path) and len(set(chosen)) == 500
    # Every folder in proportion, not the first folder: ~5 files from each of 100.
    per_folder = defaultdict(int)
    for e in chosen:
        per_folder[e.path.split("/")[0]] += 1
    assert len(per_folder) == 100 and set(per_folder.values()) <= {4, 5, 6}
    # Evenly spaced: one stride apart (48112 / 500 = 96.2 listing positions).
    where = [entries.index(e) for e in chosen[:50]]
    assert {b - a for a, b in itertools.pairwise(where)} <= {96, 97}


def test_default_sample_stops_at_2_gib_and_stays_spread() -> None:
    entries = _listing(10_000, 64 * 2**20)  # 625 GiB: 2 GiB is 32 files
    chosen = sample(entries, seed=3)
    assert len(chosen) == 32 and sum(e.size for e in chosen) <= bench.DEFAULT_SAMPLE_BYTES
    folders = {e.path.split("/")[0] for e in chosen}
    assert "d000" in folders or "d001" in folders or "d002" in folders
    assert any(f >= "d095" for f in folders)  # the end of the listing too
    mixed = [FileEntry(f"m/{i:04d}", (3 * 2**30 if i == 7 else 2**20), "v") for i in range(20)]
    assert sum(e.size for e in sample(mixed)) <= bench.DEFAULT_SAMPLE_BYTES
    assert len(sample([FileEntry("big", 5 * 2**30, "v")])) == 1  # one file, whatever its size
    assert sample([]) == []


def _flat_tree(root: str, n: int, size: int = 2000) -> None:
    for i in range(n):
        folder = os.path.join(root, f"d{i // 100:02d}")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"f{i:04d}.bin"), "wb") as fh:
            fh.write(b"x" * size)


def test_cli_without_a_sample_option_reads_the_default_sample(tmp_path) -> None:
    src = tmp_path / "src"
    _flat_tree(str(src), 640)
    result = CliRunner().invoke(cli, ["bench", str(src), "-m", "direct", "-k", "1", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sample"]["by"] == "default" and data["sample"]["files"] == 500
    assert data["sample"]["listed_files"] == 640 and data["results"][0]["files"] == 500
    human = CliRunner().invoke(cli, ["bench", str(src), "-m", "direct", "-k", "1"],
                               catch_exceptions=False)
    assert "sampled 500 of 640 files" in human.stdout
    assert "at most 500 files or 2.0 GiB" in human.stdout and "--files all" in human.stdout
    every = CliRunner().invoke(cli, ["bench", str(src), "-m", "direct", "-k", "1", "--files",
                                     "all", "--json"], catch_exceptions=False)
    data = json.loads(every.stdout)
    assert data["sample"]["by"] == "all" and data["results"][0]["files"] == 640
    helptext = CliRunner().invoke(cli, ["bench", "--help"]).output
    assert "500 files or 2 GiB" in " ".join(helptext.split())


# ---------------------------------------------------------------- advice and its words


def test_loader_takes_zero_workers_and_thread_modes_skip_it(tmp_path) -> None:
    pytest.importorskip("torch")
    src = tmp_path / "src"
    _flat_tree(str(src), 12)
    report = bench.run(snapshot(str(src)), workers=[0, 2], modes=["direct", "loader"],
                       batch_size=4, scratch_dir=str(tmp_path / "scratch"))
    assert [(r.mode, r.workers, r.files) for r in report.results] == [
        ("direct", 2, 12), ("loader", 0, 12), ("loader", 2, 12)]
    assert any("0 workers ran in loader mode only" in n for n in report.notes)
    result = CliRunner().invoke(cli, ["bench", str(src), "--loader", "-m", "direct", "-k",
                                      "0,2", "-b", "4", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [(r["mode"], r["workers"]) for r in json.loads(result.stdout)["results"]] == [
        ("direct", 2), ("loader", 0), ("loader", 2)]


def _report(results: list[RunResult]) -> bench.BenchReport:
    return bench.BenchReport(
        source="src", sample_files=10, sample_bytes=1000, listed_files=10, listed_bytes=1000,
        sampled_by="default", seed=0, modes=sorted({r.mode for r in results}),
        workers=sorted({r.workers for r in results}), results=results,
        recommendation=recommend(results), max_seconds=None, seconds=1.0, stopped_early=False)


def _human(report: bench.BenchReport) -> str:
    from rich.console import Console

    from ucstage.cli.bench import _render

    console = Console(width=400, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    _render(console, report)
    return console.export_text()


def test_recommendation_speaks_of_dataloader_workers_and_what_caching_does() -> None:
    slow_cold = [_r("direct", 1, 50), _r("direct", 4, 100), _r("cold", 1, 30), _r("cold", 4, 60),
                 _r("warm", 1, 105), _r("warm", 4, 110)]
    rec = recommend(slow_cold)
    assert (rec.mode, rec.workers, rec.bottleneck, rec.caching) == ("cold", 4, "local", "no_help")
    text = _human(_report(slow_cold))
    assert "→ use 4 DataLoader workers (num_workers=4)" in text
    assert "worker (cold)" not in text and "workers (cold)" not in text
    assert "caching will not help this source" in text
    assert "57.2 MiB/s at 4" in text  # 60 MB/s, said in MiB/s
    # The volume is the bottleneck, but the first epoch pays for the copy.
    later = [_r("direct", 1, 50), _r("cold", 1, 30), _r("warm", 1, 900)]
    assert recommend(later).caching == "later_epochs"
    assert "caching will not help the first epoch" in _human(_report(later))
    assert recommend([_r("direct", 1, 50), _r("cold", 1, 60), _r("warm", 1, 900)]).caching == \
        "helps"
    one = _human(_report([_r("direct", 1, 50)]))
    assert "use 1 DataLoader worker (num_workers=1)" in one
    zero = _human(_report([_r("loader", 0, 50), _r("loader", 2, 40)]))
    assert "use num_workers=0 (the main process reads)" in zero


def test_direct_reads_from_the_page_cache_are_called_so(tmp_path) -> None:
    """The first direct run reads the disk; the second finds the files in memory."""
    from ucstage.bench.pagecache import resident_share

    src = tmp_path / "src"
    _flat_tree(str(src), 40, size=256 * 1024)
    paths = [str(p) for p in src.rglob("*.bin")]
    for path in paths:  # write back, then ask the kernel to drop the clean pages
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    share = resident_share(paths)
    if share is None or share >= bench.report.PAGE_CACHED:
        pytest.skip(f"this filesystem keeps the pages in memory ({share})")
    report = bench.run(snapshot(str(src)), workers=[1, 2], modes=["direct"], files="all")
    first, second = report.results
    assert first.page_cache is not None and not first.page_cached
    assert second.page_cached and second.page_cache == pytest.approx(1.0)
    assert any(n.startswith("direct x2 read files that were already in the OS page cache")
               for n in report.notes)
    assert _report([first, second]).results[1].to_json()["page_cache"] == 1.0
    text = _human(report)
    assert "† read from the OS page cache" in text


def test_a_page_cached_best_direct_run_gives_no_bottleneck_verdict() -> None:
    cached = RunResult("direct", 2, 10, 10**9, 1.0, 10.0, 1000.0, 1.0, 2.0, 3.0, True, 1.0)
    rec = recommend([_r("direct", 1, 100), cached, _r("warm", 1, 1100)])
    assert rec.direct_page_cache and rec.bottleneck is None
    assert "says nothing about the volume" in _human(_report([_r("direct", 1, 100), cached,
                                                              _r("warm", 1, 1100)]))


def test_log_axis_is_labelled_at_1_2_5_steps() -> None:
    from ucstage.bench.plot import log_ticks

    assert log_ticks(11.3, 4965) == [10, 20, 50, 100, 200, 500, 1000, 2000, 5000]
    assert log_ticks(100, 100) == [50, 100, 200]
    assert log_ticks(0.03, 0.04) == pytest.approx([0.02, 0.05])


def test_loader_takes_the_shuffle_scope_options(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    from ucstage.bench import loadermode as loader_mod

    src = tmp_path / "src"
    _flat_tree(str(src), 6)
    made: list[tuple[bool, int, str, int | None]] = []
    real = loader_mod.VolumeDataset

    def recording(*args: Any, **kwargs: Any) -> Any:
        ds = real(*args, **kwargs)
        made.append((ds.shuffle, ds.seed, ds.shuffle_scope, ds.nproc_per_node))
        return ds

    monkeypatch.setattr(loader_mod, "VolumeDataset", recording)
    result = CliRunner().invoke(cli, ["bench", str(src), "-m", "loader", "-k", "0", "--seed", "5",
                                      "--shuffle", "--shuffle-scope", "global",
                                      "--nproc-per-node", "1", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert made == [(True, 5, "global", 1)]
    for extra, message in ((["-m", "loader", "--nproc-per-node", "2"],
                            "--nproc-per-node must be 1 here, got 2"),
                           (["-m", "direct", "--shuffle"], "they need --loader"),
                           (["-m", "loader", "--shuffle-scope", "node"],
                            "--shuffle-scope only matters with --shuffle")):
        result = CliRunner().invoke(cli, ["bench", str(src), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)


def test_a_local_folder_is_said_to_be_local_and_gets_no_verdict(tmp_path, fuse_tree) -> None:
    """Issue 30 item 12: the demo's bench of a local folder ended with `cold
    cache vs direct: 0.01x`, which means nothing when both read local disk."""
    src = tmp_path / "local"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.bin").write_bytes(bytes([i]) * 5000)
    result = CliRunner().invoke(cli, ["bench", str(src), "-m", "direct,cold", "-k", "1"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "the source is a folder on a local disk (" in out
    assert "the cache-vs-direct comparison is not meaningful" in out
    assert "no cache-vs-direct verdict: the source is on a local disk" in out
    assert "cold cache vs direct:" not in out
    doc = json.loads(CliRunner().invoke(cli, ["bench", str(src), "-m", "direct", "-k", "1",
                                              "--json"]).stdout)
    assert any("folder on a local disk" in n for n in doc["notes"])
    mounted, _ = fuse_tree  # a FUSE mount is remote: no such note
    remote = json.loads(CliRunner().invoke(cli, ["bench", mounted, "-m", "direct", "-k", "1",
                                                 "--files", "2", "--json"]).stdout)
    assert not any("local disk" in n for n in remote["notes"])
