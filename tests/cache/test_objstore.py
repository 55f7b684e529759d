"""The object-store engine (obstore) against the moto server: the same listing
as fsspec, fork safety, stopping through the event loop, ranged GETs of large
objects, and clear errors. The cache guarantees themselves run on both engines
in test_cache.py (``engine``, ``source_kind`` and ``backend`` fixtures)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.common.backends import make_source
from tests.common.parts import unique
from tests.common.throttle import Throttle, throttled
from ucstage.cache import Inflight, LocalCache
from ucstage.cache.inflight import Stopped
from ucstage.cache.paths import PART_SUFFIX
from ucstage.engines import objstore
from ucstage.engines.engine import of as engine_of
from ucstage.engines.objget import PART, SPLIT_AT
from ucstage.errors import InvalidArgument, SourceUnreadable
from ucstage.manifest import Manifest, snapshot
from ucstage.progress import Callback
from ucstage.volumes import list_files, resolve

KB = 1024
MB = 1024 * KB


def _poll(what: str, ok, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _partials(root: str) -> list[Path]:
    return list(Path(root).rglob(f"*{PART_SUFFIX}"))


@pytest.fixture
def proxied(moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[Throttle]:  # type: ignore[no-untyped-def]
    """The obstore engine reaching moto through tests/common/throttle.py's proxy."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    with throttled(moto.endpoint) as (url, proxy):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        yield proxy


def test_both_engines_list_the_same_entries_and_fingerprint(moto, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Paths, sizes, ETag versions (a multipart one too) and the fingerprint
    agree, so switching engines invalidates no cached file."""
    import s3fs

    files = {f"d{i % 3}/sub/f{i}.bin": os.urandom(100 + i) for i in range(25)}
    files.update({"_hidden/x.bin": b"h", ".dot": b"d", "top.bin": b""})
    src = make_source("s3", "", files)
    # A multipart upload: its ETag is "<hash>-<parts>", not an MD5.
    big = f"{src[len('s3://'):]}/multi.bin"
    with s3fs.S3FileSystem(skip_instance_cache=True).open(big, "wb", block_size=5 * MB) as fh:
        fh.write(os.urandom(11 * MB))
    listings: dict[str, Manifest] = {}
    for engine in ("fsspec", "obstore"):
        monkeypatch.setenv("UCSTAGE_ENGINE", engine)
        for hidden in (False, True):
            m = snapshot(src, include_hidden=hidden)
            listings[f"{engine}-{hidden}"] = m
        assert type(resolve(src).fs).__name__ == ("ObjectFS" if engine == "obstore"
                                                  else "S3FileSystem")
    for hidden in (False, True):
        a, b = listings[f"fsspec-{hidden}"], listings[f"obstore-{hidden}"]
        assert list(a.entries) == list(b.entries)
        assert a.fingerprint == b.fingerprint
    multi = next(e for e in listings["obstore-False"].entries if e.path == "multi.bin")
    assert "-" in multi.version  # "<hash>-<parts>"
    assert len(listings["obstore-True"].entries) == len(files) + 1


def test_a_file_cached_by_one_engine_is_valid_for_the_other(moto, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    src = make_source("s3", "", {f"f{i}.bin": os.urandom(3 * KB) for i in range(5)})
    monkeypatch.setenv("UCSTAGE_ENGINE", "fsspec")
    cache = LocalCache()
    m = snapshot(src)
    assert cache.warm(m.volume(), m.entries).fetched == 5
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    again = snapshot(src)
    report = cache.warm(again.volume(), again.entries)
    assert (report.engine, report.already_cached, report.fetched) == ("obstore", 5, 0)


_PARENT: dict[str, object] = {}


def _fetch_all(cache_dir: str) -> tuple[int, str, list[str]]:
    """In a forked worker: fetch every entry through the volume and manifest
    the parent made before the fork (as a DataLoader worker does)."""
    m = _PARENT["manifest"]
    assert isinstance(m, Manifest)
    vol = m.volume()
    cache = LocalCache(cache_dir)
    got = [Path(cache.fetch(vol, e)).read_bytes().hex() for e in m.entries]
    return os.getpid(), engine_of(vol).name, got


def test_forked_workers_read_through_their_own_clients(moto, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """DataLoader workers fork after the main process listed and fetched with
    obstore, whose runtime does not survive a fork: each child reads through
    clients of its own (fsspec's), gets the right bytes, and its copies are
    valid for the parent's obstore engine (the same stamps)."""
    from ucstage.engines import objget

    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    files = {f"f{i}.bin": os.urandom(2 * KB + i) for i in range(12)}
    src = make_source("s3", "", files)
    m = snapshot(src)
    parent_cache = LocalCache(tmp_path / "parent")
    parent_cache.fetch(m.volume(), m.entries[0])  # the parent's client and loop exist
    assert objstore._stores and objget._loop is not None
    _PARENT["manifest"] = m
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(3) as pool:
        jobs = [pool.apply_async(_fetch_all, (str(tmp_path / f"c{i}"),)) for i in range(3)]
        results = [job.get(timeout=120) for job in jobs]
    assert os.getpid() not in {pid for pid, _, _ in results}
    for _, engine, got in results:
        assert engine == "fsspec" and got == [files[e.path].hex() for e in m.entries]
    # A child's copy is valid for the parent's engine: warm finds it cached.
    child_cache = LocalCache(tmp_path / "c0")
    report = child_cache.warm(m.volume(), m.entries)
    assert (report.engine, report.already_cached, report.fetched) == ("obstore", 12, 0)


def test_large_objects_are_fetched_as_parallel_ranged_gets(proxied: Throttle) -> None:
    data = os.urandom(2 * PART + 12345)
    src = make_source("s3", "", {"big.bin": data, "small.bin": b"s" * 100})
    m = snapshot(src)
    cache = LocalCache()
    report = cache.warm(m.volume(), m.entries)
    assert report.fetched == 2 and report.engine == "obstore"
    big = next(e for e in m.entries if e.path == "big.bin")
    assert Path(cache.fetch(m.volume(), big)).read_bytes() == data
    starts = sorted(int(r.split("=")[1].split("-")[0]) for r in proxied.ranges)
    assert starts == [i * PART for i in range(3)]  # three parts; the small file in one GET


def test_resolving_a_folder_lists_it_once(proxied: Throttle) -> None:
    """Resolving a prefix asks its first page of keys; when that page is the
    whole listing, the walk that follows uses it: one listing request, where
    asking whether anything is there and then listing took two."""
    files = {f"d{i % 3}/f{i}.bin": os.urandom(10 + i) for i in range(30)}
    src = make_source("s3", "", files)
    listing = list_files(src)
    assert sorted(e.path for e in listing.entries) == sorted(files)
    assert [e.size for e in sorted(listing.entries)] == [len(files[p]) for p in sorted(files)]
    assert len(proxied.listings) == 1


def test_a_prefix_longer_than_one_page_is_listed_whole(proxied: Throttle) -> None:
    """More keys than one listing page holds: every key is listed, not just
    the page the resolve saw; the second page, which the resolve read to
    learn that, is not asked for again."""
    files = {f"f{i:04d}": b"x" for i in range(1001)}
    src = make_source("s3", "", files)
    assert len(list_files(src).entries) == 1001
    assert len(proxied.listings) == 2


def test_the_walk_lists_on_after_the_pages_the_resolve_read(
        proxied: Throttle, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 10 keys, 25 keys: resolving reads two batches of its one
    request, the walk lists on after the last key read (one more request,
    not the whole listing again); every key once, in order. In this process
    (``objstore.run_here``, as ``cache warm`` does): a listing in a child
    would need this process never to have used obstore."""
    monkeypatch.setattr(objstore, "_PAGE", 10)
    objstore.run_here()
    assert objstore._used_in == os.getpid()
    files = {f"d{i % 2}/f{i:03d}.bin": os.urandom(5 + i) for i in range(25)}
    src = make_source("s3", "", files)
    entries = list_files(src).entries
    assert [e.path for e in entries] == sorted(files)
    assert [e.size for e in entries] == [len(files[p]) for p in sorted(files)]
    assert len(proxied.listings) == 2


def test_a_warm_with_as_many_large_objects_as_places_reads_each_whole(proxied: Throttle) -> None:
    """Three large objects and two places in flight: every place already
    carries a whole object, so no object is cut into ranges (each range would
    be another request, and a full read for a server like moto)."""
    data = {f"big{i}.bin": os.urandom(SPLIT_AT + 1000 * i) for i in range(3)}
    src = make_source("s3", "", data)
    m = snapshot(src)
    cache = LocalCache()
    report = cache.warm(m.volume(), m.entries, jobs=2)
    assert report.fetched == 3 and report.engine == "obstore"
    assert proxied.ranges == []
    for e in m.entries:
        assert Path(cache.fetch(m.volume(), e)).read_bytes() == data[e.path]


def test_split_shares_the_places_in_flight_among_the_objects_left() -> None:
    from ucstage.engines.objget import MAX_PART, PARTS_IN_FLIGHT, _part_size, split

    assert split(32, 16) == 1 and split(32, 8) == PARTS_IN_FLIGHT
    assert split(32, 1) == PARTS_IN_FLIGHT and split(2, 3) == 1 and split(1, 0) == 1
    assert _part_size(64 * MB, 2) == 32 * MB  # two ranges instead of four
    assert _part_size(64 * MB, 4) == PART
    assert _part_size(64 * MB, 1) == 64 * MB  # one range: the whole object
    assert _part_size(10 * 1024 * MB, 2) == MAX_PART
    assert _part_size(PART * 2 + 1, 4) == PART


def test_the_first_part_streams_while_the_others_run(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Only the first part's headers are awaited before the other parts
    start: its body streams beside them (here it cannot finish until the
    last part has started)."""
    import asyncio
    from datetime import datetime, timezone

    import obstore

    from ucstage.engines import objget

    size = 3 * PART
    last_started = asyncio.Event()

    class _Result:
        def __init__(self, start: int) -> None:
            self.start = start
            self.meta = {"size": size, "e_tag": '"v1"',
                         "last_modified": datetime.now(timezone.utc)}

        async def stream(self, min_chunk_size: int = 0):  # type: ignore[no-untyped-def]
            if self.start == 0:
                await last_started.wait()
            yield b"x" * PART

    async def fake_get(client, key, options=None):  # type: ignore[no-untyped-def]
        start = options["range"][0]
        if start == 2 * PART:
            last_started.set()
        return _Result(start)

    async def copy(fd: int) -> int:
        got = await asyncio.wait_for(objget._get(None, "key", fd, size, 4), timeout=20)
        return got.size

    monkeypatch.setattr(obstore, "get_async", fake_get)
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert asyncio.run(copy(fd)) == size
    finally:
        os.close(fd)


def test_a_stopped_fetch_cancels_its_request_while_the_store_hangs(proxied: Throttle) -> None:
    """A GET that the store never answers: stopping the run ends the fetch at
    once (the request is cancelled on the loop), where a blocking read would
    wait for the store. Nothing partial stays, the ledger is even."""
    src = make_source("s3", "", {"hang.bin": b"h" * 5000, "ok.bin": b"o" * 10})
    m = snapshot(src)
    vol = m.volume()
    cache = LocalCache(max_bytes=1 << 20)
    inflight = Inflight()
    outcome: list[BaseException | str] = []

    def fetch() -> None:
        try:
            outcome.append(cache.fetch(vol, m.entries[0], inflight=inflight))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    # At least 1: the GET may be hedged (a second leg) on a busy machine.
    _poll("the GET to reach the store", lambda: proxied.held >= 1)
    inflight.stop()
    thread.join(30)
    assert not thread.is_alive() and proxied.held >= 1  # ended while the store still hangs
    assert isinstance(outcome[0], Stopped)
    assert _partials(cache.root) == [] and cache.space.recorded_bytes() == 0


def test_ctrl_c_stops_a_warm_while_the_store_hangs(proxied: Throttle, tmp_path: Path) -> None:
    src = make_source("s3", "", {**{f"a{i}.bin": b"a" * 1000 for i in range(3)},
                                 **{f"hang{i}.bin": b"h" * 1000 for i in range(4)}})
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "ucstage", "cache", "warm", src, "--jobs", "8"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # At least 4: a hanging GET is also hedged (a second leg of the same
        # request), so the count can pass 4 between two polls on a busy machine.
        _poll("every hanging GET to reach the store", lambda: proxied.held >= 4)
        _poll("the other files to be cached",
              lambda: len(list((tmp_path / "cache").rglob("a*.bin"))) == 3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proxied.held >= 4  # the store never answered
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "stopped: 3 of 7 files copied" in err and "Traceback" not in err
    assert _partials(str(tmp_path / "cache")) == []


def test_missing_credentials_are_named(moto, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    monkeypatch.setenv("HOME", "/nonexistent")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(SourceUnreadable, match="AWS_ACCESS_KEY_ID") as info:
        list_files(f"s3://ucstage-test/{unique()}")
    assert "UCSTAGE_ENGINE=fsspec" in info.value.hint
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    with pytest.raises(SourceUnreadable, match="AWS_SECRET_ACCESS_KEY is not set"):
        list_files(f"s3://ucstage-test/{unique()}")


def test_an_unknown_engine_is_refused(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_ENGINE", "boto")
    with pytest.raises(InvalidArgument, match="UCSTAGE_ENGINE='boto'"):
        resolve("s3://bucket/x", must_exist=False)
    assert engine_of(resolve(".", must_exist=False)).name == "fsspec"  # local: never obstore


class _Threads(Callback):
    """Counts, at every finished file, the threads the warm started per copy."""

    def __init__(self) -> None:
        self.most = 0
        self.done = 0

    def item_done(self, name: str, status: str, error: str = "") -> None:
        self.done += 1
        self.most = max(self.most, sum(t.name.startswith("ucstage-warm")
                                       for t in threading.enumerate()))


def test_a_warm_keeps_its_copies_on_the_event_loop_not_a_thread_each(moto, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Many copies in flight on one event loop: no thread per copy (each
    thread cost GIL hand-offs and wake-ups per file)."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    files = {f"f{i:02d}.bin": os.urandom(3000) for i in range(40)}
    m = snapshot(make_source("s3", "", files))
    cache = LocalCache()
    seen = _Threads()
    report = cache.warm(m.volume(), m.entries, jobs=16, callback=seen)
    assert (report.engine, report.fetched, seen.done) == ("obstore", 40, 40)
    assert seen.most == 0
    for e in m.entries:
        assert Path(cache.fetch(m.volume(), e)).read_bytes() == files[e.path]
    assert cache.space.recorded_bytes() == 40 * 3000 and _partials(cache.root) == []


def test_a_warm_waits_for_a_stripe_held_elsewhere_in_a_thread(moto, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A stripe another copy holds (here: this test, as another process would)
    is waited for in a thread, not on the event loop: the other files are
    copied meanwhile, and the held one once the stripe is free."""
    from ucstage.cache.paths import FileLock

    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    files = {f"g{i}.bin": bytes([i]) * 2000 for i in range(6)}
    m = snapshot(make_source("s3", "", files))
    vol = m.volume()
    cache = LocalCache()
    held = m.entries[0]
    lock = FileLock(cache.space.entry_lock(cache.prepare(vol), held.path))
    assert lock.acquire()
    reports: list[object] = []
    thread = threading.Thread(target=lambda: reports.append(cache.warm(vol, m.entries, jobs=4)),
                              daemon=True)
    try:
        thread.start()
        others = [e for e in m.entries if e is not held]
        _poll("the other files to be cached", lambda: all(
            cache.lookup(vol, e, touch=False) for e in others))
        _poll("a thread to wait for the held stripe", lambda: any(
            t.name.startswith("ucstage-warm-wait") for t in threading.enumerate()))
        assert cache.lookup(vol, held, touch=False) is None and thread.is_alive()
    finally:
        lock.release()
    thread.join(60)
    assert not thread.is_alive()
    report = reports[0]
    assert report.fetched == 6  # type: ignore[attr-defined]
    assert Path(cache.fetch(vol, held)).read_bytes() == files[held.path]
    assert _partials(cache.root) == [] and cache.space.recorded_bytes() == 6 * 2000


def test_a_failed_ranged_part_cancels_the_others(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """When one part of a large object fails, no other part goes on (and
    writes into the temp file the copy is about to remove)."""
    import asyncio
    from datetime import datetime, timezone

    import obstore

    from ucstage.engines import objget

    size = 3 * PART + 1
    cancelled: list[int] = []

    class _Result:
        def __init__(self) -> None:
            self.meta = {"size": size, "e_tag": '"v1"',
                         "last_modified": datetime.now(timezone.utc)}

        async def stream(self, min_chunk_size: int = 0):  # type: ignore[no-untyped-def]
            yield b"x"

    async def fake_get(client, key, options=None):  # type: ignore[no-untyped-def]
        start = options["range"][0]
        if start == PART:
            raise OSError("part failed")
        if start == 2 * PART:
            try:
                await asyncio.Event().wait()  # a part that never ends by itself
            except asyncio.CancelledError:
                cancelled.append(start)
                raise
        return _Result()

    async def copy(fd: int) -> list[int]:
        with pytest.raises(OSError, match="part failed"):
            await objget._get(None, "key", fd, size)
        return list(cancelled)  # when the copy failed, not when the loop closes

    monkeypatch.setattr(obstore, "get_async", fake_get)
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert asyncio.run(copy(fd)) == [2 * PART]
    finally:
        os.close(fd)
