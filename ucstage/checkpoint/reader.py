"""``Reader``: torch.distributed.checkpoint storage that loads only complete
checkpoints and checks every byte range it reads.

It is torch's ``FileSystemReader`` (which reads, per item of the load plan,
only that item's byte range of its file) behind two checks: the checkpoint
is complete and every file of its record is there, at its size, before
anything is read; and each range read matches the checksum the save
recorded for it. A mounted volume is read through its mount, range by
range (not through the local cache, which copies whole files); an object
store by one ranged GET per item, through the engines. A range that fails
its checksum is read again, up to :data:`RANGE_ATTEMPTS` reads in all (a
byte flipped on the way is fetched again; a file damaged at rest fails).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
from collections.abc import Iterator
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ..errors import CheckpointCorrupt
from . import digests
from .folder import METADATA, Record, check_indexed, require_complete
from .place import Place, StorePlace

_log = logging.getLogger("ucstage")

RANGE_ATTEMPTS = 3
"""Reads of one item's range before a checksum mismatch fails the load."""


class _Ranged:
    """A file of a store as torch's reader uses it: seek, then read a range
    (one ranged GET)."""

    def __init__(self, at: StorePlace, name: str) -> None:
        self.at, self.name, self.pos = at, name, 0

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset
        return offset

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            raise io.UnsupportedOperation("a checkpoint file on a store is read by ranges")
        data = self.at.read_range(self.name, self.pos, size) if size else b""
        self.pos += len(data)
        return data


class _StoreFS:
    """The part of torch's ``FileSystem`` its reader uses, over a store."""

    def __init__(self, at: StorePlace) -> None:
        self.at = at

    def init_path(self, path: Any) -> Any:
        return path

    def concat_path(self, path: Any, suffix: str) -> str:
        return suffix

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[_Ranged]:
        yield _Ranged(self.at, str(path))


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
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._shown = os.fspath(path)
        at, ckpt = require_complete(self._shown)
        super().__init__(at.path)
        self._use(at)
        self._record: Record | None = ckpt.record

    def _use(self, at: Place) -> None:
        self._at = at
        if isinstance(at, StorePlace):
            self.fs = _StoreFS(at)  # type: ignore[assignment]

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
        if not isinstance(self._at, StorePlace):
            return super().read_metadata(*args, **kwargs)
        raw = self._at.read(METADATA)
        if raw is None:
            return super().read_metadata(*args, **kwargs)  # gone since: torch's error
        metadata = pickle.loads(raw)
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
