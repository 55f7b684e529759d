"""The engine that reads a volume: one interface, three backends, chosen once.

A volume is read by one of three backends: :data:`LOCAL` (a local folder or
a mount: ``os`` calls), :data:`FSSPEC` (any fsspec filesystem, and object
stores when obstore is not used) and :data:`OBSTORE` (``s3://``, ``gs://``,
``az://`` through obstore: :mod:`ucstage.objstore`). :func:`of` decides which,
from the volume and this process (``$UCSTAGE_ENGINE``, obstore installed, the
fork fallback of :func:`ucstage.objstore.usable`); nothing else looks at an
engine's name. Callers ask the backend what they need: its walk of the
source (:meth:`Engine.walk`), ranged reads (:func:`read_ranges`), whether a
metadata read must be kept out of this process (:meth:`Engine.keep_clean`),
whether its copies run on an event loop (:attr:`Engine.on_loop`) and whether
its runtime survives ``fork`` (:attr:`Engine.fork_safe`). A file's ``info``
is ``volume.fs.info`` on every backend (:class:`ucstage.objstore.ObjectFS`
answers it for obstore). Copying a whole file into the cache is the fourth
operation: :mod:`ucstage.cache.fetch` keys its copies by these backends, as
the copies need the cache's checks, which the core does not import.

Ranged reads (a Parquet footer, a row group's column chunks): a local file
with ``pread``; obstore with ranged GETs, each conditional on the listed ETag
(GCS: the generation), so a changed object is an error, never a mix of
versions; fsspec with ``cat_file``, the ETag compared after where the store
gives one. Adjacent ranges are read as one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .. import cloudfs, objstore
from .entry import version_of
from .location import Volume
from .walk import Walk, walk_fsspec, walk_local, walks_by_ls

T = TypeVar("T")

__all__ = ["FSSPEC", "HASH_KEYS", "LOCAL", "OBSTORE", "Engine", "RangeChanged", "cut_ranges",
           "merge_ranges", "of", "read_ranges"]

HASH_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c")
"""Keys of an fsspec ``info`` that hold a content hash: only a hash compares
across calls (fsspec backends spell timestamps differently in ``info`` and in
the listing)."""


class RangeChanged(InterruptedError):
    """The file changed while (or since it was listed and) its ranges were read."""


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

    def ranges(self, volume: Volume, relpath: str, merged: list[tuple[int, int]],
               version: str | None, deadline: float | None) -> tuple[list[bytes], str]:
        fd = os.open(volume.full_path(relpath), os.O_RDONLY | os.O_CLOEXEC)
        try:
            before = os.fstat(fd)
            seen = version_of({"mtime": before.st_mtime})
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
    """An object store read through obstore (:mod:`ucstage.objstore`); its
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


def of(volume: Any) -> Engine:
    """The engine that reads ``volume`` in this process: the one place that decides.

    Raises:
        InvalidArgument: ``$UCSTAGE_ENGINE`` has an unknown value.
        MissingDependency: ``UCSTAGE_ENGINE=obstore`` for a store obstore
            serves, but obstore is not installed.
    """
    if volume.is_local:
        return LOCAL
    return OBSTORE if objstore.reads(volume.fs) else FSSPEC


def merge_ranges(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, length) ranges sorted, adjacent or overlapping ones merged."""
    out: list[list[int]] = []
    for off, n in sorted(ranges):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + n - out[-1][0])
        else:
            out.append([off, n])
    return [(a, b) for a, b in out]


def cut_ranges(merged: list[tuple[int, int]], blobs: list[bytes],
               ranges: Sequence[tuple[int, int]]) -> list[bytes]:
    """The bytes of each of ``ranges`` out of ``blobs``, the bytes of the
    ``merged`` ranges (:func:`merge_ranges`) that hold them."""
    out = []
    for off, n in ranges:
        for (m_off, m_n), blob in zip(merged, blobs, strict=True):
            if m_off <= off and off + n <= m_off + m_n:
                out.append(blob[off - m_off:off - m_off + n])
                break
    return out


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
