"""The engine that moves a volume's bytes: one interface, three backends, chosen once.

A volume is read by one of three backends: :data:`LOCAL` (a local folder or
a mount: ``os`` calls), :data:`FSSPEC` (any fsspec filesystem, and object
stores when obstore is not used) and :data:`OBSTORE` (``s3://``, ``gs://``,
``az://`` through obstore: :mod:`ucstage.engines.objstore`). :func:`of`
decides which, from the volume and this process (``$UCSTAGE_ENGINE``,
obstore installed, the fork fallback of
:func:`ucstage.engines.objstore.usable`); nothing else looks at an engine's
name. Callers ask the backend what they need: its walk of the source
(:meth:`Engine.walk`), ranged reads (:func:`read_ranges`), whether a
metadata read must be kept out of this process (:meth:`Engine.keep_clean`),
and a whole file copied into an open descriptor (:meth:`Engine.copy`),
whether its copies run on an event loop (:attr:`Engine.on_loop`) and whether
its runtime survives ``fork`` (:attr:`Engine.fork_safe`). A file's ``info``
is ``volume.fs.info`` on every backend
(:class:`ucstage.engines.objstore.ObjectFS` answers it for obstore).

Whole-file copies: a local or mounted file with ``os`` calls (below); an
object on the obstore engine by :mod:`ucstage.engines.objget`; another
fsspec source through ``fs.open`` with large reads. Never
``shutil.copy2``/``copytree``: they copy xattrs, which FUSE mounts (rclone's
among them) answer with EIO, and they copy the source's permission bits,
which a cache must not inherit. Every copy's bytes are checked where the
store says what they are (:mod:`ucstage.engines.checks`), the expectation
given by the listed version (:attr:`~ucstage.engines.context.FetchContext.listed`)
and the response.

Ranged reads (a Parquet footer, a row group's column chunks): a local file
with ``pread``; obstore with ranged GETs, each conditional on the listed ETag
(GCS: the generation), so a changed object is an error, never a mix of
versions; fsspec with ``cat_file``, the ETag compared after where the store
gives one. Adjacent ranges are read as one (:mod:`ucstage.engines.ranges`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from .. import cloudfs
from ..errors import UnsafePath
from ..volumes.entry import RangeEntry, local_version, version_of
from ..volumes.location import Volume
from ..volumes.walk import Walk, walk_fsspec, walk_local, walks_by_ls
from . import azranges, checks, mounts, objget, objstore, pagecrc
from .context import Copied, FetchContext, Stoppable
from .ranges import RangeChanged, cut_ranges, merge_ranges

T = TypeVar("T")

__all__ = ["CHUNK", "FSSPEC", "HASH_KEYS", "LOCAL", "OBSTORE", "READ_CHUNK", "Engine",
           "copy_ranges", "of", "open_local", "pump", "read_ranges"]

CHUNK = 8 * 1024 * 1024
"""Bytes per read call of a remote fsspec source: large, so a network-bound
source sees few round trips per file."""

HASH_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c")
"""Keys of an fsspec ``info`` that hold a content hash: only a hash compares
across calls (fsspec backends spell timestamps differently in ``info`` and in
the listing)."""


class Engine:
    """What every backend answers; :func:`of` picks one of the three."""

    name = "fsspec"
    """How reports name the engine (``WarmReport.engine``): ``obstore`` or
    ``fsspec``; a local folder has always been reported as ``fsspec``."""
    on_loop = False
    """Whether a warm's copies run as coroutines on the engine's event loop
    (:class:`ucstage.cache.fetch.LoopWarm`), not one thread each."""
    fork_safe = True
    """Whether a process forked after this engine ran can still use it."""

    def walk(self, volume: Volume, walk: Walk) -> None:
        """Fill ``walk`` with every file under the volume's root."""
        raise NotImplementedError

    def ranges(self, volume: Volume, relpath: str, merged: list[tuple[int, int]],
               version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
        """The bytes of each of the ``merged`` ranges of ``relpath`` and the
        version seen (:func:`read_ranges`)."""
        raise NotImplementedError

    def keep_clean(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, reading metadata in a way that leaves processes
        forked from this one able to use the engine."""
        return fn(*args)

    def copy(self, volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
        """Copy ``relpath`` of ``volume`` into the open file ``dst`` (at offset
        0; a preallocated file is overwritten and cut to the copied size).

        With ``ctx.inflight`` (a warm's), the copy checks between chunks
        whether the job stopped. ``ctx.size`` (the listed size) lets the
        object-store engine split a large object into ranged GETs;
        ``ctx.evidence`` is where the checks keep which sources serve MD5
        ETags (:func:`ucstage.engines.checks.judge`); ``ctx.listed`` (the
        listed version) carries a GCS or Azure object's checksum, the
        expectation passed in as a value.

        Raises:
            Stopped: ``ctx.inflight`` stopped.
            UnsafePath: the entry is a symlink or folder link leaving the volume.
            checks.Mismatch: the bytes differ from what the store says (retried).
            OSError: from the source or the local disk (ENOSPC included); the
                caller removes the temp file.
        """
        raise NotImplementedError


class _Fsspec(Engine):
    """Any fsspec filesystem (object stores too when obstore does not read them)."""

    def walk(self, volume: Volume, walk: Walk) -> None:
        fs, root = volume.fs, volume.root
        # fsspec instances are cached per process and some (s3fs) keep
        # listings: a long-lived process must see the store as it is now.
        fs.invalidate_cache(root)
        if walks_by_ls(fs):
            walk_fsspec(fs, root, walk)
        else:
            walk.found = self._find(volume)

    def copy(self, volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
        return _copy_remote(volume, relpath, dst, ctx)

    def _find(self, volume: Volume) -> dict[str, dict[str, Any]]:
        """A flat listing of an object store, as fsspec's ``find(detail=True)``."""
        return dict(volume.fs.find(volume.root, withdirs=False, detail=True))

    def ranges(self, volume: Volume, relpath: str, merged: list[tuple[int, int]],
               version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
        # cat_file per range, the version compared after the reads.
        path = volume.full_path(relpath)
        blobs = [bytes(volume.fs.cat_file(path, start=off, end=off + n)) for off, n in merged]
        for (_, n), data in zip(merged, blobs, strict=True):
            if len(data) != n:
                raise OSError(f"short read: {len(data)} of {n} bytes of {relpath}")
        info = volume.fs.info(path)
        seen = version_of(info) if any(k in info for k in HASH_KEYS) else ""
        if version and seen and seen != version:
            raise RangeChanged(f"{relpath} changed since it was listed")
        return blobs, seen


class _Local(Engine):
    """A local folder or a mount, read with ``os`` calls."""

    def walk(self, volume: Volume, walk: Walk) -> None:
        walk_local(volume.root, walk)

    def copy(self, volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
        """The local engine's whole-file copy: opened without following a link
        out of the volume (:func:`open_local`), read and written 1 MiB at a time
        (:func:`pump`), checked not to have changed or come short while it was
        read; a mount that died meanwhile is named (:func:`ucstage.engines.mounts.lost`)."""
        inflight = ctx.inflight
        try:
            src = open_local(volume, relpath)
            try:
                before = os.fstat(src)
                if not stat.S_ISREG(before.st_mode):
                    raise UnsafePath(f"{relpath}: not a regular file")
                size = pump(src, dst, inflight, before.st_size, ctx.read_size or READ_CHUNK)
                os.ftruncate(dst, size)  # the caller may have preallocated more
                after = os.fstat(src)
            finally:
                os.close(src)
        except OSError as exc:
            gone = mounts.lost(volume.root, relpath, exc)
            if gone is not None:
                raise gone from exc  # not retried: the mount's server is gone
            raise
        if (after.st_mtime_ns, after.st_size) != (before.st_mtime_ns, before.st_size):
            # Rewritten while we read it: the bytes may mix two versions.
            raise InterruptedError(f"{relpath} changed while it was copied")
        if size != before.st_size:
            # Fewer bytes than the file has, and it did not change: a read cut
            # short (a FUSE mount's glitch). Discarded and retried, never cached.
            raise OSError(f"short read: {size} of {before.st_size} bytes of {relpath}")
        return Copied(size, local_version(before.st_mtime), before.st_mtime_ns)

    def ranges(self, volume: Volume, relpath: str, merged: list[tuple[int, int]],
               version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
        fd = os.open(volume.full_path(relpath), os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = os.fstat(fd)
            seen = local_version(before.st_mtime)
            if version is not None and version and seen != version:
                raise RangeChanged(f"{relpath} changed since it was listed")
            blobs = []
            for off, n in merged:
                data = os.pread(fd, n, off)
                if len(data) != n:
                    raise OSError(f"short read: {len(data)} of {n} bytes at {off} of {relpath}")
                blobs.append(data)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if (after.st_mtime_ns, after.st_size) != (before.st_mtime_ns, before.st_size):
            raise RangeChanged(f"{relpath} changed while it was read")
        return blobs, seen


class _Obstore(_Fsspec):
    """An object store read through obstore (:mod:`ucstage.engines.objstore`); its
    walk is fsspec's, its flat listing obstore's."""

    name = "obstore"
    on_loop = True
    fork_safe = False  # its Tokio runtime's threads stay in the parent

    def _find(self, volume: Volume) -> dict[str, dict[str, Any]]:
        try:
            return objstore.list_objects(volume, volume.root)
        except objstore.Unparsable:
            pass  # keys with "." or ".." segments: fsspec lists them, and we refuse them
        fs = volume.fs
        if isinstance(fs, objstore.ObjectFS):
            fs = fs.fsspec()
        return dict(fs.find(volume.root, withdirs=False, detail=True))

    def keep_clean(self, fn: Callable[..., T], *args: Any) -> T:
        return objstore.keep_clean(fn, *args)

    def copy(self, volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
        got = objget.get_into(volume, volume.full_path(relpath), dst, ctx)
        return Copied(got.size, got.etag, got.mtime_ns)

    def ranges(self, volume: Volume, relpath: str, merged: list[tuple[int, int]],
               version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
        import obstore

        kind, bucket, key = objstore.location(volume, volume.full_path(relpath))
        client = objstore.store(kind, bucket, deadline)
        blobs, seen = [], version or ""
        for off, n in merged:
            options: dict[str, Any] = {"range": (off, off + n)}
            # GCS and Azure versions carry the store's MD5 after the marker
            # (ucstage.cloudfs): GCS is pinned by its generation, Azure by its ETag.
            marker = cloudfs.marker(seen) if kind in ("gs", "az") else seen
            if seen and kind == "gs":
                options["version"] = marker
            elif seen:
                options["if_match"] = f'"{marker}"'
            try:
                got = obstore.get(client, key, options=options)  # type: ignore[arg-type]
                data = bytes(got.bytes())
            except FileNotFoundError as exc:
                if kind == "gs" and seen:  # that generation is gone: the object was replaced
                    raise RangeChanged(f"{relpath} changed since it was listed") from exc
                raise
            except Exception as exc:
                text = str(exc)
                if "Precondition" in text or "412" in text:
                    raise RangeChanged(f"{relpath} changed since it was listed") from exc
                raise objstore.concise(exc, volume.full_path(relpath)) from exc
            seen = seen or (str(got.meta.get("version") or "") if kind == "gs" else
                            objstore._etag(got.meta.get("e_tag")))
            if len(data) != n:
                raise OSError(f"short read: {len(data)} of {n} bytes at {off} of {relpath}")
            blobs.append(data)
        return blobs, seen


LOCAL: Engine = _Local()
FSSPEC: Engine = _Fsspec()
OBSTORE: Engine = _Obstore()


def of(volume: Volume) -> Engine:
    """The engine that reads ``volume`` in this process: the one place that decides.

    Raises:
        InvalidArgument: ``$UCSTAGE_ENGINE`` has an unknown value.
        MissingDependency: ``UCSTAGE_ENGINE=obstore`` for a store obstore
            serves, but obstore is not installed.
    """
    if volume.is_local:
        return LOCAL
    return OBSTORE if objstore.reads(volume.fs) else FSSPEC


def read_ranges(volume: Volume, relpath: str, ranges: Sequence[tuple[int, int]], *,
                version: str | None = None, deadline: float | None = None
                ) -> tuple[list[bytes], str]:
    """The bytes of each (offset, length) range of ``relpath``, and the file's
    change marker as seen while reading (see :func:`~ucstage.volumes.version_of`).

    ``version``: the listed change marker; a file that no longer has it raises
    :class:`RangeChanged` (an ``InterruptedError``: the cache retries it).
    ``deadline``: seconds per request on obstore (None: the environment's).
    """
    merged = merge_ranges(ranges)
    blobs, seen = of(volume).ranges(volume, relpath, merged, version, deadline)
    return cut_ranges(merged, blobs, ranges), seen


# Whole files of a local folder or a mount.


def _inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=64)
def _real_root(root: str) -> str:
    return os.path.realpath(root)


def _folders_inside(volume: Volume, relpath: str, full: str) -> bool:
    """Whether the folders of ``relpath`` resolve inside the volume.

    One ``lstat`` per folder below the root: a path of plain folders stays
    inside by construction, and only a symlinked folder on the way costs a
    full ``realpath`` (and the root's own, once per process). On a mount
    every ``lstat`` of the root's own ancestors, which ``realpath`` would
    redo for every file, can be a round trip.
    """
    folder = volume.root
    for part in relpath.split("/")[:-1]:
        folder = os.path.join(folder, part)
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return _inside(os.path.realpath(os.path.dirname(full)), _real_root(volume.root))
    return True


def open_local(volume: Volume, relpath: str) -> int:
    """Open a local source file without following a symlink out of the volume."""
    full = volume.full_path(relpath)
    # The folders on the way must resolve inside the volume; O_NOFOLLOW then
    # refuses a last component that is a symlink, which we resolve ourselves.
    if not _folders_inside(volume, relpath, full):
        raise UnsafePath(f"{relpath}: a folder on its path links outside the volume")
    try:
        return os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    real = os.path.realpath(full)
    if not _inside(real, _real_root(volume.root)):
        raise UnsafePath(f"{relpath}: symlink to {real}, outside the volume")
    return os.open(real, os.O_RDONLY | os.O_CLOEXEC)


READ_CHUNK = 1024 * 1024
"""Bytes per read and write of a local-like source."""


def pump(src: int, dst: int, inflight: Stoppable | None, size: int,
         read_size: int = READ_CHUNK) -> int:
    """Copy ``src`` to ``dst`` from their offsets, ``read_size`` at a time;
    returns the bytes copied. Checks before each read whether ``inflight``
    stopped (raises :exc:`~ucstage.engines.context.Stopped`); ends at EOF
    or once ``size`` bytes (the size ``fstat`` gave) are read, which saves
    the read that would find EOF (a round trip on some mounts). A file that
    grew meanwhile is caught by the caller's second ``fstat``.

    The check between reads is all a stop can do to a read of a mount: a
    read the kernel has sent to a FUSE daemon is waited for even by a dying
    process, so a stop waits for at most one read per thread. A
    ``read_size`` below ``READ_CHUNK`` also turns the kernel's read-ahead off
    for ``src``, which would otherwise ask the mount for more than each
    read.

    Reads and writes of up to 1 MiB, not ``sendfile``: sendfile moves the
    bytes through a pipe 64 KiB at a time, and the page cache then keeps the
    copy in 64 KiB pieces instead of one large folio, which made every later
    read of a page-cached 256 KiB copy about 15% slower (docs/benchmarks.md,
    "Warm epochs"). The copy through Python's memory costs far less than the
    rest of a copy's work, and is what a bare copy does."""
    if read_size < READ_CHUNK:
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(src, 0, 0, os.POSIX_FADV_RANDOM)
    total = 0
    while True:
        if inflight is not None:
            inflight.check()
        block = os.read(src, read_size)
        if not block:
            return total
        view = memoryview(block)
        while view:
            view = view[os.write(dst, view):]
        total += len(block)
        if total >= size > 0:
            return total


# Whole files of another fsspec filesystem.


def _mtime_ns(info: dict[str, Any]) -> int | None:
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return int(value.timestamp() * 1e9)
        if isinstance(value, (int, float)):
            return int(value * 1e9)
    return None


def _copy_remote(volume: Volume, relpath: str, dst: int, ctx: FetchContext) -> Copied:
    """The fsspec engine's whole-file copy: ``fs.open`` and large reads."""
    path, inflight, listed = volume.full_path(relpath), ctx.inflight, ctx.listed
    kind = _kind(volume)
    if kind:
        _, bucket, key = objstore.location(volume, path)
        if azranges.wanted(f"{kind}://{bucket}", listed, ctx.size):
            return _copy_az_ranges(bucket, key, dst, ctx)
    with volume.fs.open(path, "rb") as src:
        # s3fs and friends attach the object's info to the open file (served
        # from the listing cache when this process listed the source).
        info = getattr(src, "details", None) or volume.fs.info(path)
        # GCS and Azure keep an MD5 that the listed version carries: checked
        # here too (a forked worker's copy), while the object is the one listed.
        want = checks.listed_expect(listed, cloudfs.marker(version_of(info)))
        digest = checks.hasher(want.check)
        size = 0
        while True:
            if inflight is not None:
                inflight.check()
            block = src.read(CHUNK)
            if not block:
                break
            if digest is not None:
                digest.update(block)
            view = memoryview(block)
            while view:
                view = view[os.write(dst, view):]
            size += len(block)
        os.ftruncate(dst, size)
    if digest is not None:
        checks.record(dst, checks.judge(f"{kind}://", relpath, want, digest.hexdigest()))
    # Only a content hash is comparable across calls: fsspec backends format
    # timestamps differently in info() and find() (memory gives a datetime in
    # one and a float in the other), so those fall back to the listing's.
    version = version_of(info) if any(k in info for k in HASH_KEYS) else ""
    return Copied(size, version, _mtime_ns(info))


def _copy_az_ranges(bucket: str, key: str, dst: int, ctx: FetchContext) -> Copied:
    """An Azure blob the store keeps no MD5 for, read in ranges whose MD5
    Azure gives (:func:`ucstage.engines.azranges.copy_into`), as the
    object-store engine reads it: adlfs would check nothing."""
    got = azranges.copy_into(bucket, key, dst, ctx.inflight, ctx.deadline)
    os.ftruncate(dst, got.size)  # the caller may have preallocated more
    checks.record(dst, azranges.passed(got.md5))
    # Stamped with the listed version while the blob is the one listed.
    stamp = checks.listed_expect(ctx.listed, got.etag).stamp
    return Copied(got.size, stamp, objstore.mtime_ns(got.last_modified))


def _kind(volume: Volume) -> str:
    return str(getattr(volume.fs, "kind", "") or "")


def copy_ranges(volume: Volume, entry: RangeEntry, dst: int, ctx: FetchContext) -> Copied:
    """Copy the byte ranges of ``entry`` (a row group's column chunks of its
    source file) into ``dst``, one after another: ranged reads (ranged GETs
    on the object-store engine), each checked against the source file's
    listed version (:func:`read_ranges`). Every byte
    is checked where a check exists, before the entry is renamed into place:
    an Azure blob's ranges against the MD5 Azure gives of each piece of at
    most 4 MiB (:func:`ucstage.engines.azranges.read_ranges`, on both engines),
    and every chunk's pages against the CRCs they carry
    (:func:`ucstage.engines.pagecrc.verified`), a chunk that fails read again.
    The entry counts as ``md5`` (Azure), ``page_crc`` (every page carried a
    CRC) or ``size`` (S3 and GCS ranges of a file without page CRCs: the
    size and the ETag only); a local or mounted file's count as a whole
    file's does (none), unless its pages carry CRCs.

    Raises:
        Stopped: ``ctx.inflight`` stopped.
        InterruptedError: the file changed since it was listed (retried).
        checks.Mismatch: a chunk's bytes failed their check on every read.
        OSError: from the source or the local disk.
    """
    if ctx.inflight is not None:
        ctx.inflight.check()
    if volume.is_local:
        # The folders on the way must stay inside the volume, as for whole files.
        os.close(open_local(volume, entry.source))
    # One rule for Azure whichever engine runs (a forked worker's fsspec, or
    # obstore, which cannot ask for a range's MD5: azranges' docstring):
    # range entries are copied in a thread on both, so the SDK's sync client.
    azure = _kind(volume) == "az"

    def read(ranges: Sequence[tuple[int, int]]) -> tuple[list[bytes], str]:
        try:
            if azure:
                _, bucket, key = objstore.location(volume, volume.full_path(entry.source))
                merged = merge_ranges(ranges)
                got = azranges.read_ranges(bucket, key, merged, cloudfs.marker(entry.version),
                                           ctx.inflight, ctx.deadline)
                return cut_ranges(merged, got, ranges), entry.version
            return read_ranges(volume, entry.source, ranges, version=entry.version,
                               deadline=ctx.deadline)
        except OSError as exc:
            gone = mounts.lost(volume.root, entry.source, exc) if volume.is_local else None
            if gone is not None:
                raise gone from exc
            raise

    blobs, seen = read(entry.ranges)
    # Reads again only a chunk whose pages fail (a flipped byte in transit).
    paged = entry.parquet and \
        pagecrc.verified(entry.path, blobs, lambda i: read([entry.ranges[i]])[0][0])
    check = "md5" if azure else pagecrc.CHECK if paged else "" if volume.is_local else "size"
    if check:
        checks.TALLY.add(check)
    size = 0
    for blob in blobs:
        view = memoryview(blob)
        while view:
            written = os.pwrite(dst, view, size)
            view, size = view[written:], size + written
    os.ftruncate(dst, size)
    return Copied(size, seen or entry.version, None)
