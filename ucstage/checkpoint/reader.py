"""``Reader``: torch.distributed.checkpoint storage that loads only complete
checkpoints and checks every byte range it reads.

It is torch's ``FileSystemReader`` (which reads, per item of the load plan,
only that item's byte range of its file) behind two checks: the checkpoint
is complete and every file of its record is there, at its size, before
anything is read; and each range read matches the checksum the save
recorded for it. A mounted volume is read through its mount, range by
range; an object store by one ranged GET per item, through the engines and
the local cache, which keeps each range read (:class:`_Cached`), so the
next load of the checkpoint on this machine reads it from local disk. A
range that fails its checksum is read again (a cached copy is dropped
first, so "again" is a new GET), up to :data:`RANGE_ATTEMPTS` reads in all
(a byte flipped on the way is fetched again; a file damaged at rest fails).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Iterator
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..cache.local import LocalCache
from ..errors import CheckpointCorrupt, InvalidArgument, UcstageError
from ..volumes import FileEntry, RangeEntry
from ..volumes.listing import list_volume
from . import digests
from .folder import METADATA, Record, check_indexed, require_complete
from .index import load_metadata
from .place import Place, StorePlace

_log = logging.getLogger("ucstage")

RANGE_ATTEMPTS = 3
"""Reads of one item's range before a checksum mismatch fails the load."""


class _Direct:
    """Ranges read from the store each time (one ranged GET each)."""

    def __init__(self, at: StorePlace) -> None:
        self.at = at

    def read(self, name: str, offset: int, length: int) -> bytes:
        return self.at.read_range(name, offset, length)

    def reject(self, name: str, offset: int, length: int) -> None:
        """The range just read failed its checksum: nothing kept to drop."""


class _Cached:
    """Ranges kept in the local cache: the first read of an item's range on
    this machine is a ranged GET whose bytes the cache keeps (an entry of
    that range alone, as a Parquet row group's chunks are kept: ``RangeEntry``),
    and later loads of the checkpoint (another rank here, a restart) read
    them from local disk. The cache's entry is stamped with the file's
    version (its ETag): a file replaced since is fetched again."""

    def __init__(self, at: StorePlace, cache: LocalCache) -> None:
        self.at = at
        self.bound = cache.at(at.volume)
        self._files: dict[str, FileEntry] | None = None
        self._seen: dict[tuple[str, int, int], tuple[str, os.stat_result]] = {}
        self._lock = threading.Lock()

    def _entry(self, name: str, offset: int, length: int) -> RangeEntry:
        with self._lock:
            if self._files is None:
                # One listing of the checkpoint: each file's version, as the
                # cache stamps its entries (and checks them on each GET).
                listed = list_volume(self.at.volume, include_hidden=True)
                self._files = {e.path: e for e in listed.entries}
            files = self._files
        if name not in files:
            raise CheckpointCorrupt(f"checkpoint {self.at.path} has no file {name}",
                                    hint="it was removed since the load began")
        return RangeEntry.of(files[name], f"{offset}-{length}", ((offset, length),),
                             parquet=False)

    def read(self, name: str, offset: int, length: int) -> bytes:
        entry = self._entry(name, offset, length)
        local = self.bound.fetch(entry)  # type: ignore[arg-type]  # a range entry: ranged GETs
        with open(local, "rb") as fh:
            seen = os.fstat(fh.fileno())
            data = fh.read()
        with self._lock:
            self._seen[(name, offset, length)] = (local, seen)
        return data

    def reject(self, name: str, offset: int, length: int) -> None:
        """The cached range just read failed its checksum: drop that copy (if
        it is still the one read), so the next read fetches it again."""
        with self._lock:
            found = self._seen.pop((name, offset, length), None)
        if found is not None:
            entry = self._entry(name, offset, length)
            self.bound.space.discard(self.bound.prepare(), entry.path, *found)


class _Ranged:
    """A file of a store as torch's reader uses it: seek, then read a range."""

    def __init__(self, ranges: _Direct | _Cached, name: str) -> None:
        self.ranges, self.name, self.pos = ranges, name, 0
        self._last = (0, 0)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset
        return offset

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise io.UnsupportedOperation("a checkpoint file on a store is read by ranges")
        data = self.ranges.read(self.name, self.pos, size) if size else b""
        self._last = (self.pos, size)
        self.pos += len(data)
        return data

    def reject(self) -> None:
        """The last range read failed its checksum (:meth:`Reader._slice_file`)."""
        self.ranges.reject(self.name, *self._last)


class _StoreFS:
    """The part of torch's ``FileSystem`` its reader uses, over a store."""

    def __init__(self, ranges: _Direct | _Cached) -> None:
        self.ranges = ranges

    def init_path(self, path: Any) -> Any:
        return path

    def concat_path(self, path: Any, suffix: str) -> str:
        return suffix

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[_Ranged]:
        yield _Ranged(self.ranges, str(path))


class Reader(FileSystemReader):
    """Load a checkpoint saved by :class:`ucstage.checkpoint.Writer` (or any
    torch.distributed.checkpoint folder) from a local or mounted folder or
    an object store (``s3://``, ``gs://``, ``az://``).

    Pass it to ``dcp.load`` as ``storage_reader``. An incomplete checkpoint
    (no ``.metadata``), a folder that holds none, and a checkpoint missing a
    file are refused here, before ``dcp.load`` starts, with a one-line error.

    Args:
        path: the checkpoint's folder (``/Volumes/...`` through
            ``$UCSTAGE_VOLUMES_ROOT``); ``checkpoint_id=`` of ``dcp.load``
            replaces it.
        cache: keep the byte ranges read from an object store in the local
            cache, so a later load of the same checkpoint on this machine
            (another rank, a restarted job) reads them from local disk.
            None (the default): yes when the cache root is usable, else
            read from the store (with a warning); True: the cache must be
            usable; False: never. A local or mounted folder is always read
            in place.
        cache_dir: the cache root (default ``$UCSTAGE_CACHE_DIR``, else
            ``/tmp/ucstage-<uid>``).
    """

    def __init__(self, path: str | os.PathLike[str], *, cache: bool | None = None,
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        if cache is not None and not isinstance(cache, bool):
            raise InvalidArgument(f"cache must be True, False or None, got {cache!r}")
        self._shown = os.fspath(path)
        self.cache = cache
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self._local_cache: LocalCache | None = None
        at, ckpt = require_complete(self._shown)
        super().__init__(at.path)
        self._use(at)
        self._record: Record | None = ckpt.record

    def _cache(self) -> LocalCache | None:
        """The local cache the ranges go through, or None (see ``cache``)."""
        if self.cache is False:
            return None
        if self._local_cache is None:
            try:
                self._local_cache = LocalCache(self.cache_dir)
            except UcstageError as exc:
                if self.cache:
                    raise
                self.cache = False
                _log.warning("ucstage: checkpoint %s is read from the store, not through the "
                             "local cache: %s", self._shown, exc)
                return None
        return self._local_cache

    def _use(self, at: Place) -> None:
        self._at = at
        if isinstance(at, StorePlace):
            cache = self._cache()
            ranges = _Direct(at) if cache is None else _Cached(at, cache)
            self.fs = _StoreFS(ranges)  # type: ignore[assignment]

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self._shown = os.fspath(checkpoint_id)
            at, ckpt = require_complete(self._shown)
            self.path = self.fs.init_path(at.path)
            self._use(at)
            self._record = ckpt.record

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # Checked again: it may have been pruned or damaged since the reader was made.
        _, ckpt = require_complete(self._shown)
        self._record = ckpt.record
        raw = self._at.read(METADATA)
        if raw is None:
            return super().read_metadata(*args, **kwargs)  # gone since: torch's error
        # Never torch's plain pickle.load: a checkpoint may come from anyone.
        metadata = load_metadata(raw, self._shown)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        # Every file .metadata indexes must be one of the checkpoint's own
        # (a plain torch checkpoint has no record to say which): refused here,
        # on each rank, before any is opened.
        _, ckpt = require_complete(self._shown)
        check_indexed(ckpt, (s.relative_path for s in metadata.storage_data.values()),
                      self._shown)
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        # torch's hook for one item's range of a file: read just that range,
        # and check it against the checksum the save recorded for it.
        name = sinfo.relative_path
        expected = None if self._record is None else \
            self._record.range_checksum(name, sinfo.offset, sinfo.length)
        for attempt in range(1, RANGE_ATTEMPTS + 1):
            file.seek(sinfo.offset)
            data = file.read(sinfo.length)
            if len(data) != sinfo.length:
                raise CheckpointCorrupt(
                    f"checkpoint {self._shown}: {name} ends before byte "
                    f"{sinfo.offset + sinfo.length:,} (an item's range)",
                    hint=f"`ucstage checkpoint verify {self._shown}` checks every file")
            if expected is None or digests.of_bytes(data, digests.kind_of(expected)) == expected:
                return io.BytesIO(data)
            reject = getattr(file, "reject", None)
            if reject is not None:
                reject()  # a cached copy that fails is dropped, and fetched again
            if attempt < RANGE_ATTEMPTS:
                _log.warning("ucstage: bytes %s-%s of %s in checkpoint %s failed their checksum; "
                             "reading them again", f"{sinfo.offset:,}",
                             f"{sinfo.offset + sinfo.length:,}", name, self._shown)
        raise CheckpointCorrupt(
            f"checkpoint {self._shown}: bytes {sinfo.offset:,}-"
            f"{sinfo.offset + sinfo.length:,} of {name} fail their checksum "
            f"({RANGE_ATTEMPTS} reads)",
            hint=f"the file changed since the save; `ucstage checkpoint verify "
                 f"{self._shown}` checks every file")
