"""What the cache tells and leaves behind (issue 10, items 5-7 and 15): the
evictions a warm caused, per source; the ledger; clear and the lock files;
finding a /Volumes source whatever UCSTAGE_VOLUMES_ROOT says now; which
failures a rerun can fix; a bad UCSTAGE_CACHE_MAX_BYTES."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.common.parts import unique
from ucstage.cache import LocalCache
from ucstage.cache.paths import FileLock
from ucstage.errors import InvalidArgument
from ucstage.manifest import snapshot
from ucstage.volumes import resolve


def _source(root: Path, n: int, size: int, prefix: str = "f") -> Path:
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"{prefix}{i:03d}.bin").write_bytes(os.urandom(size))
    return root


def _age(cache: LocalCache, seconds: float = 600) -> None:
    """Make every cached file look last handed out ``seconds`` ago (LRU and lease)."""
    past = time.time() - seconds
    for ns in cache.space.namespace_dirs():
        for p in Path(ns).rglob("*"):
            if p.is_file():
                os.utime(p, (past, p.stat().st_mtime))


def _cached_count(cache: LocalCache, folder: Path) -> int:
    m = snapshot(str(folder))
    vol = m.volume()
    return sum(cache.lookup(vol, e) is not None for e in m.entries)


def test_warm_reports_what_it_evicted_per_source(tmp_path: Path) -> None:
    """Item 5: evictions of other sources' files are counted, per source."""
    a = _source(tmp_path / "a", 6, 1000)
    b = _source(tmp_path / "b", 4, 1000)
    c = _source(tmp_path / "c", 5, 1000)
    plain = LocalCache()
    for folder in (a, b):
        m = snapshot(str(folder))
        plain.warm(m.volume(), m.entries)
    _age(plain)
    capped = LocalCache(max_bytes=10_500)
    m = snapshot(str(c))
    report = capped.warm(m.volume(), m.entries, jobs=1)
    gone = {str(f): n - _cached_count(capped, f) for f, n in ((a, 6), (b, 4))}
    assert report.fetched == 5 and sum(gone.values()) >= 4  # 10 cached + 5 > cap
    got = {e.source: (e.files, e.bytes) for e in report.evicted}
    assert got == {s: (n, n * 1000) for s, n in gone.items() if n}
    assert (report.evicted_files, report.evicted_bytes) == (sum(gone.values()),
                                                            1000 * sum(gone.values()))
    doc = report.to_json()
    assert doc["evicted_files"] == report.evicted_files
    assert doc["evicted_bytes"] == report.evicted_bytes
    assert {x["source"]: x["files"] for x in doc["evicted_sources"]} == {
        s: n for s, n in gone.items() if n}
    assert all(x["namespace"] for x in doc["evicted_sources"])
    again = capped.warm(m.volume(), m.entries)  # nothing to copy, nothing evicted
    assert (again.evicted, again.to_json()["evicted_sources"]) == ([], [])


def test_ledger_counts_exactly_what_is_cached_without_a_cap(tmp_path: Path) -> None:
    """A fresh, uncapped cache: the first commit recounted the tree, temp files
    of other copies in flight and itself included, then added itself again."""
    src = _source(tmp_path / "src", 60, 4096)
    cache = LocalCache()
    m = snapshot(str(src))
    report = cache.warm(m.volume(), m.entries, jobs=8)
    assert report.fetched == 60
    assert cache.space.recorded_bytes() == 60 * 4096 == cache.status().bytes


def _locks(cache: LocalCache) -> dict[str, int]:
    folder = Path(cache.root, ".ucstage", "locks")
    return {d.name: len(list(d.iterdir())) for d in folder.iterdir()}


def test_clear_removes_the_lock_files_of_what_it_clears(tmp_path: Path) -> None:
    """Item 6: lock stripes go with their namespace; clearing everything also
    removes what older clears left behind."""
    cache = LocalCache()
    vols = {}
    for name in ("a", "b"):
        m = snapshot(str(_source(tmp_path / name, 30, 100)))
        vols[name] = m.volume()
        cache.warm(vols[name], m.entries)
    before = _locks(cache)
    assert len(before) == 2 and all(n > 0 for n in before.values())
    left = Path(cache.root, ".ucstage", "locks", "gone-1a2b3c4d")  # an older clear's leftover
    left.mkdir()
    (left / "0001.lock").touch()
    Path(cache.root, ".ucstage", "namespaces", "gone-1a2b3c4d.json").write_text("{}")
    # What a clear or eviction killed between its rename into the trash and the delete left.
    killed = Path(cache.root, ".ucstage", "trash", "0123abcd")
    (killed / "sub").mkdir(parents=True)
    (killed / "sub" / "x.bin").write_bytes(b"x" * 100)
    Path(cache.root, ".ucstage", "trash", "4567ef01").write_bytes(b"y")
    cache.clear(vols["a"])
    assert set(_locks(cache)) == {os.path.basename(cache.namespace_dir(vols["b"])),
                                  "gone-1a2b3c4d"}
    cache.clear()
    assert _locks(cache) == {}
    assert list(Path(cache.root, ".ucstage", "namespaces").iterdir()) == []
    assert list(Path(cache.root, ".ucstage", "trash").iterdir()) == []
    m = snapshot(str(tmp_path / "a"))  # the cache works on after a clear
    assert cache.warm(m.volume(), m.entries).fetched == 30


def test_a_lock_file_unlinked_by_its_holder_is_never_shared(tmp_path: Path) -> None:
    """The waiter that wins a lock whose file its holder deleted must lock the
    path's new file, or it and a newcomer would both "hold" the stripe."""
    path = str(tmp_path / "locks" / "0001.lock")
    holder = FileLock(path)
    holder.acquire()
    waiter = FileLock(path)
    got = threading.Event()
    tid: list[int] = []

    def wait_for_it() -> None:
        tid.append(threading.get_native_id())
        waiter.acquire()
        got.set()

    thread = threading.Thread(target=wait_for_it, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        # Wait until the waiter sleeps in the kernel's flock (its wait channel
        # names the lock wait), so the unlink below happens while it waits.
        while not tid or "lock" not in Path(f"/proc/self/task/{tid[0]}/wchan").read_text():
            assert time.monotonic() < deadline, "the waiter never blocked on the lock"
            time.sleep(0.01)
        holder.unlink()
    finally:
        holder.release()
    assert got.wait(10)
    thread.join()
    newcomer = FileLock(path)
    assert not newcomer.acquire(blocking=False)  # the waiter holds the path's file
    waiter.release()
    assert newcomer.acquire(blocking=False)
    newcomer.release()


def test_a_volumes_source_is_found_whatever_the_root_says_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 7: the namespace record keeps the /Volumes path as given."""
    first = tmp_path / "first"
    _source(first / "cat" / "sch" / "vol", 4, 100)
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(first))
    cache = LocalCache()
    m = snapshot("/Volumes/cat/sch/vol")
    cache.warm(m.volume(), m.entries)
    for now in (str(tmp_path / "second"), ""):  # another root, or none at all
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", now)
        for spelling in ("/Volumes/cat/sch/vol", "dbfs:/Volumes/cat/sch/vol",
                         "/Volumes/cat/sch/vol/"):
            found = cache.find(spelling)
            assert [(v.source, v.url) for v in found] == [
                ("/Volumes/cat/sch/vol", str(first / "cat" / "sch" / "vol"))], spelling
        status = cache.status(cache.find("/Volumes/cat/sch/vol"))
        assert status.entries == 4 and status.namespaces[0].source == "/Volumes/cat/sch/vol"
    assert cache.find("/Volumes/cat/sch") == [] and cache.find(str(tmp_path / "x")) == []
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path / "second"))
    cleared = cache.clear(cache.find("/Volumes/cat/sch/vol"))
    assert (cleared.files, len(cleared.namespaces)) == (4, 1)
    assert cache.status().entries == 0


def test_a_local_path_is_found_by_where_it_resolves(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Only /Volumes paths match by their string: a relative path recorded as
    given must not match the same string typed in another folder."""
    for name in ("one", "two"):
        _source(tmp_path / name / "data", 2, 10)
    cache = LocalCache()
    monkeypatch.chdir(tmp_path / "one")
    vol = resolve("data")
    cache.warm(vol, snapshot("data").entries)
    assert [v.url for v in cache.find("data")] == [str(tmp_path / "one" / "data")]
    monkeypatch.chdir(tmp_path / "two")
    assert cache.find("data") == []


def test_only_transient_failures_are_retryable(tmp_path: Path) -> None:
    """Item 15: a missing file or a permission problem fails the same way on a
    rerun; an I/O error that outlasted the retries may not."""
    import errno

    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class Failing(MemoryFileSystem):
        protocol = "failing10"

        @classmethod
        def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
            if isinstance(path, str) and path.startswith("failing10://"):
                path = path[len("failing10://"):]
            return super()._strip_protocol(path)

        def _open(self, path, mode="rb", **kwargs):  # type: ignore[no-untyped-def]
            name = os.path.basename(path)
            if name.startswith("eio"):
                raise OSError(errno.EIO, "Input/output error (injected)")
            if name.startswith("denied"):
                raise PermissionError(errno.EACCES, "Permission denied (injected)")
            if name.startswith("gone"):
                raise FileNotFoundError(errno.ENOENT, "No such file or directory (injected)")
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("failing10", Failing, clobber=True)
    key = unique()
    store = MemoryFileSystem()
    for name in ("ok.bin", "eio.bin", "denied.bin", "gone.bin"):
        store.pipe_file(f"/{key}/{name}", b"x" * 10)
    m = snapshot(f"failing10://{key}")
    report = LocalCache(backoff=0.001).warm(m.volume(), m.entries)
    assert sorted(p for p, _ in report.failed) == ["denied.bin", "eio.bin", "gone.bin"]
    assert report.retryable == {"eio.bin"}
    assert {f["path"]: f["retryable"] for f in report.to_json()["failed"]} == {
        "denied.bin": False, "eio.bin": True, "gone.bin": False}


def test_a_bad_cap_in_the_environment_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 15: the error says which setting is wrong, not just the value."""
    monkeypatch.setenv("UCSTAGE_CACHE_MAX_BYTES", "garbage")
    with pytest.raises(InvalidArgument, match=r"^UCSTAGE_CACHE_MAX_BYTES='garbage' is not a size$"):
        LocalCache()
    monkeypatch.setenv("UCSTAGE_CACHE_MAX_BYTES", "0")
    with pytest.raises(InvalidArgument, match=r"UCSTAGE_CACHE_MAX_BYTES='0': .* positive"):
        LocalCache()
    assert LocalCache(max_bytes=5).max_bytes == 5  # an explicit cap wins over the variable
    monkeypatch.setenv("UCSTAGE_CACHE_MAX_BYTES", "20M")
    assert LocalCache().max_bytes == 20 * 1024 * 1024
    with pytest.raises(InvalidArgument, match=r"^max_bytes must be positive, got 0$"):
        LocalCache(max_bytes=0)
