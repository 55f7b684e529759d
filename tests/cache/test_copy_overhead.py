"""A copy from a local or FUSE source does only the work it needs: no realpath of
the whole path, no makedirs, no read past the end per file (issue 11), while
path safety and the folder a clear removed still hold."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.common.folios import folios
from ucstage.cache import LocalCache
from ucstage.errors import FetchFailed, UnsafePath
from ucstage.manifest import snapshot
from ucstage.volumes import FileEntry


def _tree(root: Path) -> Path:
    for rel in ("a/b/1.bin", "a/b/2.bin", "a/b/3.bin", "c/4.bin"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode() * 100)
    return root


def test_per_file_work_is_not_repeated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _tree(tmp_path / "src")
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    calls: dict[str, list[str]] = {"realpath": [], "makedirs": [], "read": []}
    realpath, makedirs, read = os.path.realpath, os.makedirs, os.read

    def traced_realpath(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["realpath"].append(str(path))
        return realpath(path, *args, **kwargs)

    def traced_makedirs(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["makedirs"].append(str(path))
        return makedirs(path, *args, **kwargs)

    def traced_read(src_fd, count):  # type: ignore[no-untyped-def]
        calls["read"].append("")
        return read(src_fd, count)

    monkeypatch.setattr(os.path, "realpath", traced_realpath)
    monkeypatch.setattr(os, "makedirs", traced_makedirs)
    monkeypatch.setattr(os, "read", traced_read)
    report = cache.warm(m.volume(), m.entries, jobs=1)
    assert report.fetched == 4
    ns = cache.namespace_dir(m.volume())
    # The volume's folders are plain folders: no file's path is resolved in full.
    assert not [p for p in calls["realpath"] if p.startswith(str(src) + os.sep)]
    # Each cache folder is made once, not once per file.
    data_dirs = [p for p in calls["makedirs"] if p.startswith(ns + os.sep)]
    assert len(data_dirs) == len(set(data_dirs))
    assert set(data_dirs) == {os.path.join(ns, "a"), os.path.join(ns, "a", "b"),
                              os.path.join(ns, "c")}
    # A file of known size is copied in one call: no read to find the end.
    assert len(calls["read"]) == 4
    for e in m.entries:
        path = cache.lookup(m.volume(), e)
        assert path is not None and Path(path).read_bytes() == e.path.encode() * 100


def test_a_linked_folder_deep_in_the_path_is_checked(tmp_path: Path) -> None:
    """Path safety holds at any depth: a folder link inside the volume is
    followed, one leaving it refused."""
    src = _tree(tmp_path / "src")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_bytes(b"do not copy")
    (src / "a" / "out").symlink_to(secret, target_is_directory=True)
    (src / "a" / "in").symlink_to(src / "c", target_is_directory=True)
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    vol = m.volume()
    with pytest.raises((UnsafePath, FetchFailed), match="outside the volume"):
        cache.fetch(vol, FileEntry("a/out/key.txt", 11, "0"))
    inside = next(e for e in m.entries if e.path == "a/in/4.bin")
    assert Path(cache.fetch(vol, inside)).read_bytes() == b"c/4.bin" * 100
    for path in Path(cache.root).rglob("*"):
        assert not path.is_file() or path.read_bytes() != b"do not copy"


def test_a_cache_folder_removed_behind_the_cache_is_made_again(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    vol = m.volume()
    first, second = [e for e in m.entries if e.path.startswith("a/b/")][:2]
    cache.fetch(vol, first)
    shutil.rmtree(os.path.join(cache.namespace_dir(vol), "a"))
    assert Path(cache.fetch(vol, second)).read_bytes() == second.path.encode() * 100


def test_the_temp_file_is_created_outside_the_ledger_lock(tmp_path: Path) -> None:
    """Creating the temp file (the slowest step on a busy disk) does not wait
    for the ledger lock; the preallocation and the ledger update do."""
    import fcntl
    import threading
    import time

    src = _tree(tmp_path / "src")
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    vol = m.volume()
    entry = m.entries[0]
    cache.prepare(vol)
    folder = os.path.join(cache.namespace_dir(vol), *entry.path.split("/")[:-1])
    fd = os.open(os.path.join(cache.root, ".ucstage", "usage"), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as another process in the middle of a reservation
    result: list[str] = []
    worker = threading.Thread(target=lambda: result.append(cache.fetch(vol, entry)))
    try:
        worker.start()
        deadline = time.monotonic() + 10
        temp: list[str] = []
        while not temp and time.monotonic() < deadline:
            temp = [n for n in os.listdir(folder)] if os.path.isdir(folder) else []
            time.sleep(0.01)
        assert [n for n in temp if n.endswith(".ucstage-part")], temp
        # Empty until the ledger lock is ours: it counts 0 bytes in any walk meanwhile.
        assert os.path.getsize(os.path.join(folder, temp[0])) == 0
        assert not result
    finally:
        os.close(fd)  # releases the lock
        worker.join(30)
    assert result and Path(result[0]).read_bytes() == entry.path.encode() * 100
    assert cache.space.recorded_bytes() == entry.size


def test_a_touched_file_keeps_its_stamp_in_the_memo(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Handing a file out touches its atime, which moves its ctime; the memo
    follows, so the next hand-out costs a stat and no stamp read."""
    from ucstage.cache import paths

    src = _tree(tmp_path / "src")
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    vol = m.volume()
    entry = m.entries[0]
    path = cache.fetch(vol, entry)
    mtime = os.stat(path).st_mtime_ns
    past = mtime - 60 * 10**9
    os.utime(path, ns=(past, mtime))  # last handed out long ago: the next lookup touches it
    reads: list[str] = []
    read_stamp = paths.read_stamp

    def counted(p: str):  # type: ignore[no-untyped-def]
        reads.append(p)
        return read_stamp(p)

    monkeypatch.setattr(paths, "read_stamp", counted)
    assert cache.lookup(vol, entry) == path  # touches (ctime moves)
    assert os.stat(path).st_atime_ns > past
    assert cache.lookup(vol, entry) == path
    assert reads == [path] or reads == []  # at most the first lookup read it


def test_a_cached_copy_is_cached_in_folios_as_large_as_a_whole_write(tmp_path: Path) -> None:
    """A copy made through a pipe (sendfile) sits in the page cache in 64 KiB
    pieces, and every later read of it costs more than a read of its source
    (issue 11, warm epochs): the copy is written the way a plain write makes
    a file, in as few folios."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(256 * 1024))
    reference = folios(src / "f.bin")
    if reference is None or reference > 1:
        pytest.skip("the kernel does not show folios here, or keeps no large ones")
    m = snapshot(str(src))
    cache = LocalCache(tmp_path / "cache")
    path = cache.fetch(m.volume(), m.entries[0])
    assert folios(path) == reference


def test_a_miss_checks_validity_once_before_its_lock_and_once_under_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41: ``fetch`` of a miss runs the validity rule twice (the check
    that spares a hit the lock, and the one under the lock that finds another
    process's copy), and ``fetch_missing`` (the caller's lookup just missed)
    once; a hit once. Counted at the rule itself, ``Bound.lookup_rows``."""
    from ucstage.cache.fetch import Bound

    m = snapshot(str(_tree(tmp_path / "src")))
    at = LocalCache(tmp_path / "cache").at(m.volume())
    checks: list[tuple[str, ...]] = []
    rule = Bound.lookup_rows

    def counted(self, rels, *rest, **kwargs):  # type: ignore[no-untyped-def]
        checks.append(tuple(rels))
        return rule(self, rels, *rest, **kwargs)

    monkeypatch.setattr(Bound, "lookup_rows", counted)
    first, second = m.entries[0], m.entries[1]
    at.fetch(first)
    assert checks == [(first.path,), (first.path,)]
    checks.clear()
    at.fetch(first)
    assert checks == [(first.path,)]
    checks.clear()
    assert at.lookup(second) is None
    at.fetch_missing(second)
    assert checks == [(second.path,), (second.path,)]  # the caller's lookup, then under the lock
