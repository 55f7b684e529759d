"""The local cache against real parts: local folders, an rclone FUSE mount,
a moto S3 server and fsspec memory. Guarantees 1-9 of issue 3 are marked."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tests.common.backends import Backend, make_source
from tests.common.parts import REPO, rclone_mount, tmpfs, unique, wait_synced
from tests.common.throttle import throttled
from ucstage import manifest as manifest_mod
from ucstage.cache import LocalCache
from ucstage.cache.paths import PART_SUFFIX, STAMP_XATTR, read_stamp
from ucstage.errors import CacheFull, CacheOwnershipError, FetchFailed, UnsafePath
from ucstage.manifest import snapshot
from ucstage.progress import Callback
from ucstage.sharding import Layout, ReadOrder, rank_entries, shard_plan
from ucstage.volumes import FileEntry

KB = 1024


def blob(name: str, size: int) -> bytes:
    """Deterministic bytes that differ per name (so a mix-up is visible)."""
    seed = hashlib.sha256(name.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def visible_files(folder: str) -> list[str]:
    """Files a person (or a reader) would take for data: everything but temp files."""
    found = []
    for dirpath, _, names in os.walk(folder):
        found += [os.path.join(dirpath, n) for n in names if not n.endswith(PART_SUFFIX)]
    return sorted(found)


def partial_files(folder: str) -> list[str]:
    return [os.path.join(d, n) for d, _, names in os.walk(folder) for n in names
            if n.endswith(PART_SUFFIX)]


# -- the abstract suite: every backend ---------------------------------------------


def test_fetch_warm_and_rewarm(backend: Backend) -> None:
    files = {f"d{i % 3}/f{i}.bin": blob(f"{backend.name}{i}", 3 * KB + i) for i in range(12)}
    backend.write_many(files)
    m = snapshot(backend.url)
    vol = m.volume()
    cache = LocalCache()
    assert cache.lookup(vol, m.entries[0]) is None  # lazy: nothing copied yet
    first = cache.fetch(vol, m.entries[0])
    assert first == os.path.join(cache.namespace_dir(vol), *m.entries[0].path.split("/"))
    report = cache.warm(vol, m.entries, jobs=4)
    assert (report.files, report.fetched, report.already_cached) == (12, 11, 1)
    assert report.bytes == sum(len(b) for b in files.values()) and not report.failed
    for e in m.entries:
        path = cache.lookup(vol, e)
        assert path is not None and Path(path).read_bytes() == files[e.path]
    again = cache.warm(vol, m.entries)
    assert (again.fetched, again.already_cached) == (0, 12)


@pytest.mark.parametrize("same_size", [False, True], ids=["new-size", "same-size"])
def test_stale_source_is_fetched_again(backend: Backend, same_size: bool) -> None:
    """Guarantee 3: a rewritten source file (new size, or same size and new
    mtime/etag) is fetched again by the next fetch and warm."""
    backend.write_many({"a.bin": blob("old", 4 * KB), "b.bin": blob("b", 2 * KB)})
    old = snapshot(backend.url)
    vol = old.volume()
    cache = LocalCache()
    cache.warm(vol, old.entries)
    new_bytes = blob("new", 4 * KB if same_size else 5 * KB)
    backend.write("a.bin", new_bytes)
    if backend.name in ("local", "fuse"):  # a coarse-mtime filesystem must still see a change
        t = time.time() + 5
        os.utime(f"{backend.store_root}/a.bin", (t, t))
    backend.settle()
    new = snapshot(backend.url)
    (a_old, a_new) = (old.entries[0], new.entries[0])
    assert a_old.version != a_new.version
    assert cache.lookup(vol, a_new) is None  # the stamp no longer matches the listing
    assert Path(cache.fetch(vol, a_new)).read_bytes() == new_bytes
    assert cache.lookup(vol, a_old) is None  # and the old listing no longer validates
    backend.write("b.bin", blob("b2", 2 * KB))
    if backend.name in ("local", "fuse"):
        t = time.time() + 10
        os.utime(f"{backend.store_root}/b.bin", (t, t))
    backend.settle()
    newer = snapshot(backend.url)
    report = cache.warm(vol, newer.entries)
    assert (report.fetched, report.already_cached) == (1, 1)
    assert Path(cache.lookup(vol, newer.entries[1]) or "").read_bytes() == blob("b2", 2 * KB)
    verify = cache.verify(vol, old.entries)
    assert [p for p, _ in verify.stale] == ["a.bin", "b.bin"]


# -- 1. atomic, SIGKILL-safe ------------------------------------------------------


def test_sigkill_during_warm_leaves_no_partial_data(fuse_volume: tuple[str, str],
                                                    tmp_path: Path) -> None:
    """Guarantee 1: kill `cache warm` at several points; nothing visible is
    ever partial, and the rerun completes and removes stale temp files."""
    backing = tmp_path / "slow-backing"
    backing.mkdir()
    files = {f"part-{i:02d}.bin": blob(f"k{i}", 512 * KB) for i in range(24)}
    for name, data in files.items():
        (backing / name).write_bytes(data)
    cache_dir = str(tmp_path / "cache")
    env = {**os.environ, "UCSTAGE_CACHE_DIR": cache_dir}
    with rclone_mount(str(backing), str(tmp_path / "slow"), "--bwlimit", "3M") as mnt:
        cmd = [sys.executable, "-m", "ucstage", "cache", "warm", mnt, "--jobs", "4", "--json"]
        saw_partial = False
        # Kill points, each awaited, never timed (on a loaded machine a fixed
        # delay lands anywhere): during start-up (once the cache folder
        # exists), as soon as this run's first copy is in progress, once
        # several of its copies are in flight together, once one of its copies
        # has landed while another is in progress (so the rerun has something
        # to resume); then more kills as soon as a copy shows, until one has
        # landed mid-copy. "This run's": the temp files a killed run left
        # (same names, other inodes) and the files it landed do not count.
        def points(old_temps: set[tuple[str, int]], old_files: set[str]
                   ) -> dict[str, Callable[[], bool]]:
            def fresh_temps() -> set[tuple[str, int]]:
                return _temps(cache_dir) - old_temps

            def landed() -> bool:
                ns = _only_namespace(cache_dir)
                return ns is not None and bool(set(visible_files(ns)) - old_files) \
                    and bool(fresh_temps())

            return {"start": lambda: os.path.isdir(cache_dir),
                    "copying": lambda: bool(fresh_temps()),
                    "several": lambda: len(fresh_temps()) >= 2,
                    "landed": landed}

        attempts = ["start", "copying", "several", "landed", *["copying"] * 6]
        for n, point in enumerate(attempts):
            if n >= 4 and saw_partial:
                break
            ns = _only_namespace(cache_dir)
            seen = points(_temps(cache_dir), set(visible_files(ns)) if ns else set())[point]
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 120
            while not seen() and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            ns = _only_namespace(cache_dir)
            if ns is None:  # killed before the namespace existed
                continue
            saw_partial = saw_partial or bool(partial_files(ns))
            for path in visible_files(ns):  # complete or absent, never half
                name = os.path.basename(path)
                assert Path(path).read_bytes() == files[name], name
                assert read_stamp(path) is not None
        assert saw_partial, "no kill landed mid-copy; the test proved nothing"
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout)
        assert summary["failed"] == [] and summary["fetched"] + summary["already_cached"] == 24
        assert summary["already_cached"] > 0  # the rerun resumed
        ns = _only_namespace(cache_dir)
        assert ns is not None and partial_files(ns) == []
        assert len(visible_files(ns)) == 24


def _temps(folder: str) -> set[tuple[str, int]]:
    """(path, inode) of the temp files under ``folder``: a copy's temp file
    has the name a killed run's had, but not its inode."""
    found = set()
    for path in partial_files(folder):
        with contextlib.suppress(FileNotFoundError):  # swept or renamed meanwhile
            found.add((path, os.stat(path).st_ino))
    return found


def _only_namespace(cache_dir: str) -> str | None:
    if not os.path.isdir(cache_dir):
        return None
    found = [os.path.join(cache_dir, n) for n in os.listdir(cache_dir)
             if not n.startswith(".") and os.path.isdir(os.path.join(cache_dir, n))]
    return found[0] if found else None


# -- 2. single flight across processes ---------------------------------------------

_WORKER = textwrap.dedent("""
    import hashlib, json, os, sys, time
    from ucstage import manifest
    from ucstage.cache import LocalCache
    m = manifest.load(sys.argv[1])
    expected = json.load(open(sys.argv[2]))
    open(f"{sys.argv[3]}.ready{os.getpid()}", "w").close()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.01)
    vol, cache, bad = m.volume(), LocalCache(), 0
    for e in m.entries:
        with open(cache.fetch(vol, e), "rb") as fh:
            bad += hashlib.sha256(fh.read()).hexdigest() != expected[e.path]
    print(bad)
""")


def test_single_flight_eight_processes(moto, tmp_path: Path, engine: str) -> None:  # type: ignore[no-untyped-def]
    """Guarantee 2: 8 processes fetching the same 500 files copy each once
    (counted in the moto server's request log) and all read the right bytes."""
    prefix = unique("sf")
    fs = moto.filesystem()
    files = {f"f{i:03d}.bin": blob(f"sf{i}", 1 * KB + i) for i in range(500)}
    fs.pipe({f"ucstage-test/{prefix}/{k}": v for k, v in files.items()})
    m = snapshot(f"s3://ucstage-test/{prefix}")
    man = manifest_mod.save(m, tmp_path / "m.json")
    (tmp_path / "sums.json").write_text(json.dumps(
        {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}))
    go = tmp_path / "go"
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    # UCSTAGE_HEDGE=0: a hedged GET (a late response on a loaded machine) is a
    # second GET of one fetch by design; this counts fetches.
    # PYTHONFAULTHANDLER and LIBC_FATAL_STDERR_: a reader that dies of a signal
    # prints its threads' Python stacks, and glibc's own abort message, to the
    # stderr this test shows (glibc writes it to the terminal otherwise).
    env = dict(os.environ, UCSTAGE_HEDGE="0", PYTHONFAULTHANDLER="1", LIBC_FATAL_STDERR_="1")
    procs = [subprocess.Popen([sys.executable, str(script), str(man), str(tmp_path / "sums.json"),
                               str(go)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for _ in range(8)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready*"))) < 8:  # all imported, waiting at the gate
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.poll() for p in procs]
        time.sleep(0.01)
    go.touch()
    done = [p.communicate(timeout=150) for p in procs]
    outs = [out for out, _ in done]
    # One fresh-clone run under load (2026-12-03) saw a reader die of SIGABRT
    # after its work, once in 4 runs and never in 96 tries since: say why next time.
    assert [p.returncode for p in procs] == [0] * 8, \
        [err[-2000:] for p, (_, err) in zip(procs, done, strict=True) if p.returncode]
    assert [int(o) for o in outs] == [0] * 8  # every reader got the right bytes
    moto.log.flush()
    log = Path(moto.log.name).read_text(errors="replace")
    gets = re.findall(rf"GET /ucstage-test/{prefix}/(\S+) HTTP", log)
    assert len(gets) == 500 and sorted(set(gets)) == sorted(files)


# -- 4. byte cap, LRU, leases ------------------------------------------------------


def _local_source(tmp_path: Path, n: int, size: int,
                  kind: str = "local") -> tuple:  # type: ignore[type-arg]
    """``n`` files of ``size`` bytes in a local folder, or (``kind``, a
    ``source_kind``) in the moto bucket read through one engine."""
    src = make_source(kind, str(tmp_path / "src"),
                      {f"f{i:03d}.bin": blob(f"c{i}", size) for i in range(n)})
    m = snapshot(src)
    return m.volume(), list(m.entries)


def _usage(cache: LocalCache, ns: str) -> int:
    """Bytes on disk in ``ns``, temp files included, read under the ledger lock
    (renames happen under it, so the walk cannot see a file twice or not at all)."""
    found = cache.space.tally([ns])
    return found.bytes + found.partial_bytes


def test_lru_evicts_least_recently_used_first(tmp_path: Path, source_kind: str) -> None:
    """Guarantee 4: least recently used entries go first."""
    vol, (a, b, c, d) = _local_source(tmp_path, 4, 1000, source_kind)
    cache = LocalCache(max_bytes=3500, lease_seconds=0)
    # The LRU clock is the atime, and a hand-out refreshes it only when it is
    # over a second old: set the three hand-out times explicitly (a oldest),
    # rather than sleeping for the clock to tick.
    past = time.time_ns() - 60 * 10**9
    for i, e in enumerate((a, b, c)):
        path = cache.fetch(vol, e)
        os.utime(path, ns=(past + i * 10**9, os.stat(path).st_mtime_ns))
    assert cache.lookup(vol, a) is not None  # a is now the most recently used
    cache.fetch(vol, d)
    assert cache.lookup(vol, b) is None
    assert all(cache.lookup(vol, e) for e in (a, c, d))
    assert cache.status().bytes <= 3500


def test_file_handed_to_reader_is_not_evicted(tmp_path: Path, source_kind: str) -> None:
    """Guarantee 4: files handed out within the lease stay; a clear error
    instead, once the (bounded) wait for room is over."""
    vol, (a, b, c) = _local_source(tmp_path, 3, 1000, source_kind)
    cache = LocalCache(max_bytes=2500, lease_seconds=3600, wait_seconds=0.2)
    pa, pb = cache.fetch(vol, a), cache.fetch(vol, b)
    with pytest.raises(CacheFull, match="handed to readers"):
        cache.fetch(vol, c)
    assert Path(pa).read_bytes() == blob("c0", 1000) and Path(pb).read_bytes() == blob("c1", 1000)


def test_cap_smaller_than_one_file_is_a_clear_error(tmp_path: Path, source_kind: str) -> None:
    vol, (a,) = _local_source(tmp_path, 1, 1000, source_kind)
    cache = LocalCache(max_bytes=999)
    with pytest.raises(CacheFull, match="larger than the whole cache cap"):
        cache.fetch(vol, a)
    assert cache.status().entries == 0


def test_usage_never_exceeds_cap_by_more_than_in_flight(tmp_path: Path, source_kind: str) -> None:
    """Guarantee 4 (stronger): 4 threads fetch 60 files through a 10-file cap;
    usage never passes the cap, even counting the copies in flight."""
    vol, entries = _local_source(tmp_path, 60, 1000, source_kind)
    cache = LocalCache(max_bytes=10_000, lease_seconds=0)
    ns = cache.prepare(vol)
    peaks: list[int] = []

    def one(e: FileEntry) -> None:
        cache.fetch(vol, e)
        peaks.append(_usage(cache, ns))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, entries))
    # Copies in flight are counted (their preallocated temp files): never over.
    assert len(peaks) == 60 and max(peaks) <= 10_000
    assert cache.status().bytes <= 10_000


_CAP_WORKER = textwrap.dedent("""
    import random, sys
    from ucstage import manifest
    from ucstage.cache import LocalCache
    m = manifest.load(sys.argv[1])
    entries = list(m.entries)
    random.Random(int(sys.argv[2])).shuffle(entries)
    cache, vol = LocalCache(max_bytes=int(sys.argv[3]), lease_seconds=0), m.volume()
    for e in entries:
        cache.fetch(vol, e)
""")


def test_cap_holds_across_processes(tmp_path: Path, source_kind: str) -> None:
    """Guarantee 4 across processes: 3 processes share one capped cache."""
    vol, _ = _local_source(tmp_path, 40, 1000, source_kind)
    man = manifest_mod.save(snapshot(vol.source), tmp_path / "m.json")
    script = tmp_path / "cap.py"
    script.write_text(_CAP_WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(man), str(seed), "8000"])
             for seed in range(3)]
    cache = LocalCache()
    ns = cache.namespace_dir(vol)
    peak = 0
    samples = 0
    while any(p.poll() is None for p in procs):
        peak = max(peak, _usage(cache, ns))
        samples += 1
    assert [p.wait() for p in procs] == [0, 0, 0]
    assert samples > 0 and peak <= 8000  # temp files of copies in flight included
    final = cache.status()
    assert 0 < final.bytes <= 8000 and final.entries <= 8


# -- 5. disk full ---------------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 2 MiB tmpfs; the cache root is a private folder inside it."""
    with tmpfs(str(tmp_path / "tiny"), "size=2m") as mnt:
        yield Path(mnt)


def test_disk_full_before_warm(tiny_fs: Path, tmp_path: Path, source_kind: str) -> None:
    """Guarantee 5: a warm that cannot fit stops naming the folder and the space."""
    vol, entries = _local_source(tmp_path, 3, 1024 * KB, source_kind)
    cache = LocalCache(tiny_fs / "cache")
    with pytest.raises(CacheFull) as info:
        cache.warm(vol, entries)
    assert cache.namespace_dir(vol) in info.value.message and "3.0 MiB" in info.value.message
    assert partial_files(cache.root) == [] and visible_files(cache.namespace_dir(vol)) == []


def test_disk_full_during_warm_leaves_no_partials(tiny_fs: Path, tmp_path: Path, source_kind: str) -> None:
    """Guarantee 5: the disk fills up after the check (another writer); the
    warm stops with CacheFull and no partial file remains."""
    vol, entries = _local_source(tmp_path, 3, 600 * KB, source_kind)
    cache = LocalCache(tiny_fs / "cache")

    class Filler(Callback):
        def set_size(self, size: int, items: int | None = None) -> None:
            (tiny_fs / "other-writer").write_bytes(b"\0" * (1200 * KB))

    with pytest.raises(CacheFull) as info:
        cache.warm(vol, entries, jobs=1, callback=Filler())
    assert "no space left in the cache folder" in info.value.message
    assert cache.namespace_dir(vol) in info.value.message and "still needs" in info.value.message
    assert partial_files(cache.root) == []
    for path in visible_files(cache.namespace_dir(vol)):
        assert read_stamp(path) is not None and os.path.getsize(path) == 600 * KB


def test_enospc_on_single_fetch(tiny_fs: Path, tmp_path: Path, source_kind: str) -> None:
    vol, (big,) = _local_source(tmp_path, 1, 3 * 1024 * KB, source_kind)
    cache = LocalCache(tiny_fs / "cache")
    with pytest.raises(CacheFull, match="no space left"):
        cache.fetch(vol, big)
    assert partial_files(cache.root) == [] and visible_files(cache.namespace_dir(vol)) == []


# -- 6. path safety ---------------------------------------------------------------


def test_dotdot_and_absolute_keys_are_refused(moto, tmp_path: Path, engine: str) -> None:  # type: ignore[no-untyped-def]
    """Guarantee 6: S3 keys with `..` or an absolute path never leave the cache root."""
    prefix = unique("ps")
    fs = moto.filesystem()
    fs.pipe({f"ucstage-test/{prefix}/ok.bin": b"ok",
             f"ucstage-test/{prefix}/sub/../../escape.bin": b"evil",
             f"ucstage-test/{prefix}//abs.bin": b"evil"})
    m = snapshot(f"s3://ucstage-test/{prefix}")
    assert [e.path for e in m.entries] == ["ok.bin"]
    assert sorted(p for p, _ in m.refused) == ["/abs.bin", "sub/../../escape.bin"]
    vol = m.volume()
    cache = LocalCache()
    for bad in ("sub/../../escape.bin", "/abs.bin", "../escape.bin"):
        with pytest.raises(UnsafePath):
            cache.fetch(vol, FileEntry(bad, 4, "x"))
        with pytest.raises(UnsafePath):
            cache.lookup(vol, FileEntry(bad, 4, "x"))
    with pytest.raises(UnsafePath, match="temp files"):  # could be swept as a dead copy
        cache.fetch(vol, FileEntry("d/.0001.x.ucstage-part", 4, "x"))
    report = cache.warm(vol, [*m.entries, FileEntry("../escape.bin", 4, "x")])
    assert report.fetched == 1 and [p for p, _ in report.failed] == ["../escape.bin"]
    parent = os.path.dirname(cache.root)
    assert not [p for p in Path(parent).rglob("*escape.bin")]
    assert not [p for p in Path(parent).rglob("abs.bin")]


def test_symlinks_out_of_a_source_are_refused(fuse_volume: tuple[str, str],
                                              tmp_path: Path) -> None:
    """Guarantee 6: a symlink (file or folder) pointing outside the volume is never read."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.txt").write_bytes(b"do not copy")
    for root in (tmp_path / "local", Path(fuse_volume[0]) / unique()):
        root.mkdir()
        (root / "ok.bin").write_bytes(b"fine")
        (root / "link.bin").symlink_to(secret / "key.txt")
        (root / "dir").symlink_to(secret)
    local_src = tmp_path / "local"
    fuse_src = Path(fuse_volume[1]) / root.name
    wait_synced(str(root), str(fuse_src))
    cache = LocalCache()
    for src in (local_src, fuse_src):
        m = snapshot(str(src))
        assert [e.path for e in m.entries] == ["ok.bin"]  # rclone hides links; we refuse them
        vol = m.volume()
        for rel in ("link.bin", "dir/key.txt"):
            with pytest.raises((UnsafePath, FetchFailed)):
                cache.fetch(vol, FileEntry(rel, 11, "0"))
        cache.warm(vol, m.entries)
    for path in Path(cache.root).rglob("*"):
        assert not path.is_file() or path.read_bytes() != b"do not copy"


# -- 7. ownership -----------------------------------------------------------------


def test_root_is_private_and_foreign_roots_are_refused(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "cache"
    cache = LocalCache(fresh)
    assert os.stat(cache.root).st_mode & 0o777 == 0o700
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    with pytest.raises(CacheOwnershipError, match="owned by uid 12345"):
        LocalCache(other)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    with pytest.raises(CacheOwnershipError, match="writable by other users"):
        LocalCache(open_dir)
    link = tmp_path / "link"
    link.symlink_to(fresh)
    with pytest.raises(CacheOwnershipError, match="symlink"):
        LocalCache(link)
    assert os.listdir(other) == [] and os.listdir(open_dir) == []


def test_default_root_is_per_user_under_tmp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UCSTAGE_CACHE_DIR")
    from ucstage.cache.paths import default_root

    assert default_root() == f"/tmp/ucstage-{os.getuid()}"
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", "/x/y")
    assert default_root() == "/x/y"


# -- 8. transient errors -------------------------------------------------------------


class FlakyFS(MemoryFileSystem):
    """fsspec's memory store, but some files fail to open: ``flaky*`` the
    first two times (a transient error), ``broken*`` every time."""

    protocol = "flaky"
    opens: ClassVar[dict[str, int]] = {}

    @classmethod
    def _strip_protocol(cls, path):  # type: ignore[no-untyped-def]
        if isinstance(path, str) and path.startswith("flaky://"):
            path = path[len("flaky://"):]
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):  # type: ignore[no-untyped-def]
        name = os.path.basename(path)
        self.opens[name] = self.opens.get(name, 0) + 1
        if name.startswith("broken") or (name.startswith("flaky") and self.opens[name] <= 2):
            raise OSError(errno.EIO, "Input/output error (injected)")
        return super()._open(path, mode, **kwargs)


@pytest.fixture(params=["memory", "s3-fsspec", "s3-obstore"])
def flaky_source(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
                 ) -> Iterator[tuple[str, Counter[str] | dict[str, int], int]]:
    """good.bin, flaky.bin (fails twice) and broken.bin (always fails): in
    FlakyFS (an I/O error), or in moto behind a proxy answering 503 SlowDown
    (S3's throttling) through each engine. Yields the source and the counter
    of reads per name, and the reads per attempt of the cache (s3fs retries
    throttling itself, ``S3FileSystem.retries`` times in all)."""
    files = {name: blob(name, 2 * KB) for name in ("good.bin", "flaky.bin", "broken.bin")}
    if request.param == "memory":
        fsspec.register_implementation("flaky", FlakyFS, clobber=True)
        key = unique()
        store = MemoryFileSystem()
        for name, data in files.items():
            store.pipe_file(f"/{key}/{name}", data)
        FlakyFS.opens.clear()
        yield f"flaky://{key}", FlakyFS.opens, 1
        return
    import s3fs

    moto = request.getfixturevalue("moto")
    source = make_source("s3", "", files)
    monkeypatch.setenv("UCSTAGE_ENGINE", request.param.split("-", 1)[1])
    with throttled(moto.endpoint) as (url, throttle):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries off
        s3fs.S3FileSystem.clear_instance_cache()
        try:
            yield source, throttle.gets, (s3fs.S3FileSystem.retries
                                          if request.param == "s3-fsspec" else 1)
        finally:
            s3fs.S3FileSystem.clear_instance_cache()


def test_transient_errors_are_retried_and_failures_named(
        fuse_volume: tuple[str, str], flaky_source: tuple[str, dict[str, int], int]) -> None:
    """Guarantee 8: retried with backoff (I/O errors, S3's 503 SlowDown); what
    still fails is named, the rest cached."""
    source, reads, per_attempt = flaky_source
    m = snapshot(source)
    vol = m.volume()
    cache = LocalCache(backoff=0.01)
    report = cache.warm(vol, m.entries, jobs=2)
    assert report.fetched == 2 and [p for p, _ in report.failed] == ["broken.bin"]
    assert "after 4 attempts" in report.failed[0][1]
    assert report.retryable == {"broken.bin"}
    # On the object-store engine a throttled GET is paced, and its first
    # FREE_RETRIES retries spend none of the copy's 4 attempts.
    from ucstage.engines.pace import FREE_RETRIES

    paced = FREE_RETRIES if os.environ.get("UCSTAGE_ENGINE") == "obstore" else 0
    assert reads["flaky.bin"] == 3 and reads["broken.bin"] == 4 * per_attempt + paced
    # A file deleted from a FUSE volume after listing fails at once, by name.
    backing, mnt = fuse_volume
    key = unique()
    os.makedirs(os.path.join(backing, key))
    for name in ("a.bin", "gone.bin"):
        Path(backing, key, name).write_bytes(blob(name, KB))
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    listed = snapshot(os.path.join(mnt, key))
    os.unlink(os.path.join(backing, key, "gone.bin"))
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    report = cache.warm(listed.volume(), listed.entries)
    assert report.fetched == 1 and [p for p, _ in report.failed] == ["gone.bin"]


# -- 9. bytes and mtime only ------------------------------------------------------------


def test_copies_bytes_and_mtime_only(fuse_volume: tuple[str, str]) -> None:
    backing, mnt = fuse_volume
    key = unique()
    src = Path(backing, key)
    src.mkdir()
    path = src / "x.bin"
    path.write_bytes(blob("x", 10 * KB))
    os.chmod(path, 0o755)
    os.setxattr(path, "user.origin", b"source")
    os.utime(path, ns=(1_000_000_000_000_000_000, 1_000_000_000_123_456_789))
    wait_synced(str(src), os.path.join(mnt, key))
    m = snapshot(os.path.join(mnt, key))
    cache = LocalCache()
    local = cache.fetch(m.volume(), m.entries[0])
    st = os.stat(local)
    assert Path(local).read_bytes() == blob("x", 10 * KB)
    assert abs(st.st_mtime_ns - os.stat(os.path.join(mnt, key, "x.bin")).st_mtime_ns) < 1000
    assert int(st.st_mtime) == 1_000_000_000
    assert st.st_mode & 0o777 == 0o600
    assert os.listxattr(local) == [STAMP_XATTR]


# -- slices and the hot path ----------------------------------------------------------


def test_rank_entries_match_the_shard_plan(tmp_path: Path) -> None:
    _, entries = _local_source(tmp_path, 37, 10)
    order = ReadOrder(len(entries), shuffle=True, seed=7, epoch=2, shuffle_scope="global")
    p = shard_plan([e.size for e in entries], Layout(4, 3), order)
    for rank in range(4):
        mine = rank_entries(entries, [rank], Layout(4, 3), order)
        want = sorted(i for s in p.slots if s.rank == rank for i in s.files)
        assert [e.path for e in mine] == [entries[i].path for i in want]


def test_rank_entries_under_the_node_scope_are_the_nodes_share(tmp_path: Path) -> None:
    """A node's files are the same every epoch: the share of the rank's node, whole."""
    _, entries = _local_source(tmp_path, 37, 10)
    sizes = [e.size for e in entries]
    for rank in range(4):
        mine = rank_entries(entries, [rank], Layout(4, 3, 2),
                            ReadOrder(len(entries), shuffle=True, seed=7, epoch=5))
        for epoch in range(3):
            p = shard_plan(sizes, Layout(4, 3, 2),
                           ReadOrder(len(sizes), shuffle=True, seed=7, epoch=epoch))
            want = sorted(i for s in p.slots if s.node == rank // 2 for i in s.files)
            assert [e.path for e in mine] == [entries[i].path for i in want]
    # One node (no nproc_per_node): its share is every file.
    assert rank_entries(entries, [3], Layout(4, 3), ReadOrder(len(entries), shuffle=True)) == \
        list(entries)


def test_lookup_rate_is_counted(tmp_path: Path) -> None:
    """The hit path is stat + dict: measure it, assert only that it works."""
    vol, entries = _local_source(tmp_path, 200, 10)
    cache = LocalCache()
    cache.warm(vol, entries)
    start = time.perf_counter()
    hits = sum(cache.lookup(vol, e) is not None for _ in range(20) for e in entries)
    rate = hits / (time.perf_counter() - start)
    assert hits == 4000 and rate > 0


def test_concurrent_threads_fetch_each_file_once(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, source_kind: str) -> None:
    from ucstage.engines.engine import of as engine_of

    vol, entries = _local_source(tmp_path, 20, 4 * KB, source_kind)
    copies: list[str] = []
    reader_engine = engine_of(vol)
    real_copy = reader_engine.copy

    def counting_copy(volume, relpath, dst, *rest, **kw):  # type: ignore[no-untyped-def]
        copies.append(relpath)
        return real_copy(volume, relpath, dst, *rest, **kw)

    monkeypatch.setattr(reader_engine, "copy", counting_copy)
    cache = LocalCache()
    results: list[str] = []
    barrier = threading.Barrier(6)

    def reader() -> None:
        barrier.wait()
        results.extend(cache.fetch(vol, e) for e in entries)

    threads = [threading.Thread(target=reader) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 120 and len(set(results)) == 20
    assert sorted(copies) == sorted(e.path for e in entries)


# -- verify never leaves a known-corrupt copy to be served ---------------------------


def test_verify_deletes_corrupt_copies_so_they_are_refetched(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a.bin", "b.bin"):
        (src / name).write_bytes(blob(name, 4 * KB))
    cache = LocalCache(tmp_path / "cache", max_bytes=1 << 20)
    m = snapshot(str(src))
    vol = m.volume()
    cache.warm(vol, m.entries)
    bad = Path(cache.lookup(vol, m.entries[0]) or "")
    bad.write_bytes(b"\0" * 4 * KB)  # same size, stamp intact: only a checksum sees it
    report = cache.verify(vol, m.entries, checksum=True)
    assert [p for p, _ in report.corrupt] == ["a.bin"] and report.removed == ["a.bin"]
    assert not bad.exists() and cache.lookup(vol, m.entries[0]) is None
    assert cache.status().bytes == 4 * KB
    assert cache.space.recorded_bytes() == 4 * KB  # the cap's byte count dropped with the file
    again = cache.warm(vol, m.entries)
    assert (again.fetched, again.already_cached) == (1, 1)
    assert Path(cache.fetch(vol, m.entries[0])).read_bytes() == blob("a.bin", 4 * KB)
    assert cache.verify(vol, m.entries, checksum=True).clean


# -- verify without a source, warm's progress, the JSON documents ----------------------


def test_verify_without_a_source_checks_every_cached_source(moto, tmp_path: Path, engine: str) -> None:  # type: ignore[no-untyped-def]
    """verify() with no volume covers every source the cache holds, each listed
    afresh from the URL its namespace record names, labelled as first given."""
    local = tmp_path / "local"
    local.mkdir()
    for name in ("a.bin", "b.bin"):
        (local / name).write_bytes(blob(name, 2 * KB))
    prefix = unique("va")
    fs = moto.filesystem()
    fs.pipe({f"ucstage-test/{prefix}/x.bin": blob("x", KB),
             f"ucstage-test/{prefix}/y.bin": blob("y", KB)})
    cache = LocalCache(tmp_path / "cache")
    sources = {}
    for given in (str(local), f"s3://ucstage-test/{prefix}"):
        m = snapshot(given)
        cache.warm(m.volume(), m.entries)
        sources[cache.namespace_dir(m.volume())] = m.volume().source
    record = json.loads(Path(cache.root, ".ucstage", "namespaces",
                             os.path.basename(next(iter(sources))) + ".json").read_text())
    assert set(record) == {"namespace", "url", "source", "created"}
    clean = cache.verify()
    assert [s.source for s in clean.sources] == [sources[k] for k in sorted(sources)]
    assert clean.clean and clean.checked == clean.ok == 4
    # Break each source a different way: a corrupt copy here, a changed object there.
    bad = Path(cache.lookup(snapshot(str(local)).volume(), snapshot(str(local)).entries[1]) or "")
    bad.write_bytes(b"\0" * 2 * KB)
    fs.pipe_file(f"ucstage-test/{prefix}/y.bin", blob("y2", KB + 1))
    report = cache.verify(checksum=True)
    by_source = {s.source: s for s in report.sources}
    assert set(by_source) == set(sources.values()) and not report.clean
    assert [p for p, _ in by_source[str(local)].corrupt] == ["b.bin"]
    assert by_source[str(local)].removed == ["b.bin"] and not bad.exists()
    assert [p for p, _ in by_source[f"s3://ucstage-test/{prefix}"].stale] == ["y.bin"]
    assert [p for p, _ in report.stale] == ["y.bin"] and report.removed == ["b.bin"]
    doc = report.to_json()
    assert doc["checksum"] is True and doc["clean"] is False
    assert [s["source"] for s in doc["sources"]] == [s.source for s in report.sources]
    assert LocalCache(tmp_path / "empty").verify().to_json() == {
        "clean": True, "checksum": False, "sources": []}


class Recorder(Callback):
    """Every progress call warm makes, in order (it may call from threads)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []  # type: ignore[type-arg]
        self.lock = threading.Lock()

    def set_size(self, size: int, items: int | None = None) -> None:
        with self.lock:
            self.calls.append(("set_size", size, items))

    def relative_update(self, inc: int = 1) -> None:
        with self.lock:
            self.calls.append(("update", inc))

    def item_done(self, name: str, status: str, error: str = "") -> None:
        with self.lock:
            self.calls.append(("done", name, status, error))


def test_warm_reports_progress_through_the_callback(backend: Backend) -> None:
    """set_size(total bytes, items=total files) first; the updates add up to
    every byte now valid; one item_done per file, saying what happened to it."""
    files = {f"d{i % 2}/f{i}.bin": blob(f"p{backend.name}{i}", KB + 7 * i) for i in range(6)}
    backend.write_many(files)
    m = snapshot(backend.url)
    vol = m.volume()
    cache = LocalCache()
    cache.fetch(vol, m.entries[0])  # one already valid
    unsafe = FileEntry("../escape.bin", 5, "x")  # refused before any copy
    entries = [*m.entries, unsafe]
    progress = Recorder()
    report = cache.warm(vol, entries, jobs=3, callback=progress)
    total = sum(len(b) for b in files.values()) + unsafe.size
    assert progress.calls[0] == ("set_size", total, len(entries))
    assert [c for c in progress.calls if c[0] == "set_size"] == [progress.calls[0]]
    assert sum(c[1] for c in progress.calls if c[0] == "update") == total - unsafe.size
    done = {c[1]: (c[2], c[3]) for c in progress.calls if c[0] == "done"}
    assert len([c for c in progress.calls if c[0] == "done"]) == len(entries) == len(done)
    assert done[m.entries[0].path] == ("cached", "")
    assert {p: s for p, (s, _) in done.items() if s == "fetched"} == {
        e.path: "fetched" for e in m.entries[1:]}
    assert done[unsafe.path][0] == "failed" and "unsafe" in done[unsafe.path][1]
    assert (report.fetched, report.already_cached, len(report.failed)) == (5, 1, 1)


def _documented(command: str) -> dict:  # type: ignore[type-arg]
    """The example document of ``command`` in docs/json-cache.md."""
    text = (Path(REPO) / "docs" / "json-cache.md").read_text()
    section = text.split(f"\n## {command}\n", 1)[1]
    return json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])  # type: ignore[no-any-return]


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    return "number" if isinstance(value, (int, float)) else type(value).__name__


def _same_shape(doc: object, got: object, where: str = "$") -> None:
    """``got`` has ``doc``'s keys at every level and the same kind of values
    (a documented null stands for "or a value"; lists compare their first item)."""
    if doc is None:
        return
    assert _kind(got) == _kind(doc), f"{where}: {_kind(got)} instead of {_kind(doc)}"
    if isinstance(doc, dict) and isinstance(got, dict):
        assert set(got) == set(doc), f"{where}: keys {sorted(set(got) ^ set(doc))} differ"
        assert list(got) == list(doc), f"{where}: key order differs"
        for key in doc:
            _same_shape(doc[key], got[key], f"{where}.{key}")
    elif isinstance(doc, list) and isinstance(got, list) and doc:
        assert got, f"{where}: empty, so its items were not checked"
        _same_shape(doc[0], got[0], f"{where}[0]")


def test_every_report_builds_its_documented_json(tmp_path: Path) -> None:
    """to_json() of warm, status, verify, clear and prune has the keys, order,
    kinds and nesting docs/json-cache.md shows (lists made non-empty to check items)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.bin").write_bytes(blob(f"j{i}", 100 + i))
    (tmp_path / "secret").write_bytes(b"no")
    (src / "link.bin").symlink_to(tmp_path / "secret")  # refused by the listing
    m = snapshot(str(src))
    assert m.refused
    vol = m.volume()
    other = tmp_path / "other"  # cached first, then evicted: evicted_sources has an item
    other.mkdir()
    (other / "o.bin").write_bytes(blob("o", 1000))
    o = snapshot(str(other))
    LocalCache(tmp_path / "cache").warm(o.volume(), o.entries)
    cache = LocalCache(tmp_path / "cache", lease_seconds=0, max_bytes=1000)
    entries = rank_entries(m.entries, [0, 1], Layout(2, 1), ReadOrder(len(m.entries)))
    from ucstage.cache.reports import RankSlice

    warm = cache.warm(vol, [*entries, FileEntry("../out.bin", 1, "x")])
    assert warm.evicted_files == 1
    doc = warm.to_json(rank_slice=RankSlice([0, 1], Layout(2, 1, 2),
                                            ReadOrder(0, True, 0, 0, None, "node"), [0]),
                       refused=m.refused,
                       unreadable=[("dog", "Permission denied")])
    _same_shape(_documented("warm"), doc)
    assert doc["slice"] == {"ranks": [0, 1], "world_size": 2, "num_workers": 1,
                            "shuffle": True, "seed": 0, "epoch": 0, "shuffle_scope": "node",
                            "nproc_per_node": 2, "node_share": True, "nodes": [0]}
    assert RankSlice([0], Layout(2, 1), ReadOrder(0)).to_json()["node_share"] is False
    assert doc["namespace"] == cache.namespace_dir(vol) and doc["cache_dir"] == cache.root
    assert warm.to_json()["slice"] is None and warm.to_json()["refused"] == []
    assert cache.status().to_json()["last_run"] is None  # no training run read through it
    from ucstage.cache import runstats

    counters = runstats.counters(cache.root, "job", 0)
    assert counters is not None
    counters.add(hits=1, hit_bytes=100)
    counters.flush()
    _same_shape(_documented("status"), cache.status().to_json())
    Path(cache.lookup(vol, m.entries[0]) or "").write_bytes(b"\0" * 100)
    (src / "f1.bin").write_bytes(blob("new", 120))
    gone = next(e.path for e in m.entries[2:] if cache.lookup(vol, e))
    (src / gone).unlink()  # its copy: an orphan
    verify = cache.verify(vol, checksum=True)
    _same_shape(_documented("verify"), verify.to_json())
    _same_shape(_documented("prune"), cache.prune(300).to_json())
    _same_shape(_documented("clear"), cache.clear().to_json())
