"""Leases that follow the reader, waiting for room, scan-aware eviction and the
run counters (cache/leases.py, cache/policy.py, cache/runstats.py), on a real
local folder and real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.common.parts import REPO
from ucstage.cache import LocalCache, runstats
from ucstage.cache.leases import Reader, check_window
from ucstage.cache.policy import is_scan
from ucstage.cache.space import charging
from ucstage.errors import CacheFull
from ucstage.manifest import snapshot


def _source(tmp_path: Path, n: int, size: int = 1000) -> tuple:  # type: ignore[type-arg]
    src = tmp_path / "src"
    src.mkdir()
    for i in range(n):
        (src / f"f{i:02d}.bin").write_bytes(bytes([i]) * size)
    m = snapshot(str(src))
    return m.volume(), list(m.entries)


def _wait_for(check, what: str, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_held_file_is_never_evicted_and_a_full_cap_waits_for_the_reader(tmp_path: Path) -> None:
    """The cap is full of files a reader holds: a fetch waits (instead of
    CacheFull) until the reader moves on, then evicts what it let go."""
    vol, (a, b, c) = _source(tmp_path, 3)
    cache = LocalCache(tmp_path / "cache", max_bytes=2500, lease_seconds=0, wait_seconds=60)
    reader = Reader()
    fetch = reader.fetcher(cache.at(vol), cache.at(vol).fetch)
    pa, pb = fetch(a), fetch(b)
    assert reader.held == 2
    done: list[object] = []
    waiter = Reader(runstats.counters(str(cache.root), "t", 0))

    def third() -> None:
        try:
            with charging(waiter):
                done.append(cache.fetch(vol, c))
        except BaseException as exc:
            done.append(exc)

    thread = threading.Thread(target=third, daemon=True)
    thread.start()
    # Both files are held, so the copy cannot reserve: it waits for room (the
    # waiter's counters say so as the wait starts), with no result.
    _wait_for(lambda: done or runstats.read_run(str(cache.root), "t").waits == 1,
              "the fetch to wait for room")
    assert done == [] and thread.is_alive()
    assert Path(pa).read_bytes() == bytes([0]) * 1000
    reader.release(pa)  # the consumer moved past a
    thread.join(30)
    assert done and isinstance(done[0], str), done
    assert cache.lookup(vol, a) is None  # a went, b (still held) stayed
    assert Path(pb).exists() and cache.space.recorded_bytes() <= 2500
    stats = runstats.read_run(str(cache.root), "t")
    assert stats.wait_s > 0 and stats.evictions == 1 and stats.evicted_bytes == 1000
    reader.close()


def test_the_wait_is_bounded_and_the_error_says_why(tmp_path: Path) -> None:
    vol, (a, b, c) = _source(tmp_path, 3)
    cache = LocalCache(tmp_path / "cache", max_bytes=2500, lease_seconds=0, wait_seconds=0.3)
    reader = Reader()
    fetch = reader.fetcher(cache.at(vol), cache.at(vol).fetch)
    fetch(a), fetch(b)
    with pytest.raises(CacheFull, match=r"handed to readers.*f02.bin needs .*waited") as info:
        cache.fetch(vol, c)
    assert "read_ahead" in info.value.hint
    reader.close()
    assert cache.fetch(vol, c)  # let go: now it fits


def test_a_file_larger_than_the_cap_fails_at_once_even_with_a_long_wait(tmp_path: Path) -> None:
    vol, (a,) = _source(tmp_path, 1, size=3000)
    cache = LocalCache(tmp_path / "cache", max_bytes=2500, wait_seconds=3600)
    start = time.monotonic()
    with pytest.raises(CacheFull, match="larger than the whole cache cap"):
        cache.fetch(vol, a)
    assert time.monotonic() - start < 60  # not the hour: no waiting at all


def test_the_window_check_names_the_window_and_the_cap_needed() -> None:
    with pytest.raises(CacheFull, match="larger than the whole cache cap") as big:
        check_window(1000, readers=1, depth=1, largest=1001, largest_name="x.bin")
    assert big.value.message.startswith("x.bin is")
    with pytest.raises(CacheFull, match=r"4 readers x 7 files held each") as info:
        check_window(10_000, readers=4, depth=7, largest=1000)
    assert "28,000" in info.value.hint or "27.3 KiB" in info.value.hint
    check_window(28_000, readers=4, depth=7, largest=1000)  # fits: nothing raised
    check_window(None, readers=4, depth=7, largest=10**12)


def test_consumed_files_go_most_recently_consumed_first_after_stale_ordinary_ones(
        tmp_path: Path) -> None:
    """Scan files: the one consumed last goes first (the resident set stays).
    Ordinary files out of their lease go before any scan file."""
    vol, entries = _source(tmp_path, 6)
    cache = LocalCache(tmp_path / "cache", max_bytes=5000, lease_seconds=5)
    ordinary = cache.fetch(vol, entries[5])  # a plain caller's file...
    past = time.time() - 60
    os.utime(ordinary, (past, past))  # ...handed out long ago: out of its lease
    reader = Reader()
    fetch = reader.fetcher(cache.at(vol), cache.at(vol).fetch)
    paths = [fetch(e) for e in entries[:4]]
    for path in paths:  # consumed in order: f03 last
        reader.release(path)
    assert all(is_scan(os.stat(p).st_atime_ns) for p in paths)
    # The cap is full (5 x 1,000 bytes). A small file needs room: one file
    # goes, and it is the stale ordinary one, not a scan file.
    (tmp_path / "src" / "g.bin").write_bytes(b"g" * 250)
    small = next(e for e in snapshot(str(tmp_path / "src")).entries if e.path == "g.bin")
    cache.fetch(vol, small)
    assert cache.lookup(vol, entries[5]) is None
    assert all(os.path.exists(p) for p in paths)
    # Next, among scan files, the most recently consumed goes (g is leased).
    cache.fetch(vol, entries[4])
    assert not os.path.exists(paths[3])
    assert all(os.path.exists(p) for p in paths[:3]) and cache.lookup(vol, small)


def test_a_plain_caller_turns_a_consumed_file_back_into_a_leased_lru_file(
        tmp_path: Path) -> None:
    vol, (a, b, c) = _source(tmp_path, 3)
    cache = LocalCache(tmp_path / "cache", max_bytes=2500, lease_seconds=3600, wait_seconds=0)
    reader = Reader()
    pa = reader.fetcher(cache.at(vol), cache.at(vol).fetch)(a)
    reader.release(pa)
    assert is_scan(os.stat(pa).st_atime_ns)
    assert cache.lookup(vol, a) == pa  # handed to an ordinary caller
    assert not is_scan(os.stat(pa).st_atime_ns)
    cache.fetch(vol, b)
    with pytest.raises(CacheFull):  # both in their time lease now: nothing to evict
        cache.fetch(vol, c)


COUNT = r"""
import sys
from ucstage.cache import runstats
c = runstats.counters(sys.argv[1], "job", int(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    c.add(hits=1, hit_bytes=10)
c.add(misses=2, miss_bytes=30, evictions=1, evicted_bytes=7)
c.flush()
"""


def test_run_counters_add_up_across_processes_and_status_shows_the_last_run(
        tmp_path: Path) -> None:
    root = str(LocalCache(tmp_path / "cache").root)
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-c", COUNT, root, str(rank), str(n)], env=env)
             for rank, n in ((0, 5), (1, 7), (1, 1))]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    every = runstats.read_run(root, "job")
    assert (every.hits, every.misses, every.evictions, every.processes) == (13, 6, 3, 3)
    assert every.hit_rate == pytest.approx(13 / 19)
    assert runstats.read_run(root, "job", rank=1).hits == 8
    status = LocalCache(root).status()
    assert status.last_run is not None and status.last_run.run == "job"
    doc = status.to_json()["last_run"]
    assert (doc["hits"], doc["misses"], doc["evictions"], doc["evicted_bytes"]) == (13, 6, 3, 3 * 7)
    out = subprocess.run([sys.executable, "-m", "ucstage", "cache", "status", "--json"],
                         env=dict(env, UCSTAGE_CACHE_DIR=root), capture_output=True, text=True)
    assert json.loads(out.stdout)["last_run"]["hits"] == 13, out.stderr
    human = subprocess.run([sys.executable, "-m", "ucstage", "cache", "status"],
                           env=dict(env, UCSTAGE_CACHE_DIR=root), capture_output=True, text=True)
    assert "13 hits" in human.stdout and "6 misses" in human.stdout, human.stdout


def test_only_the_newest_runs_are_kept(tmp_path: Path) -> None:
    root = str(LocalCache(tmp_path / "cache").root)
    for i in range(runstats.KEEP_RUNS + 3):
        c = runstats.counters(root, f"run{i:02d}", 0)
        assert c is not None
        c.add(hits=1)
        c.flush()
        os.utime(c.path, ns=(i * 10**9 + 10**18, i * 10**9 + 10**18))
    kept = sorted(os.listdir(os.path.join(root, ".ucstage", "runs")))
    assert len(kept) == runstats.KEEP_RUNS + 1 and "run10" in kept  # the newest, and this run
    assert runstats.last_run(root).run == "run10"  # type: ignore[union-attr]
