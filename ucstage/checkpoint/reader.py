"""``Reader``: torch.distributed.checkpoint storage that loads only complete
checkpoints and checks every byte range it reads.

It is torch's ``FileSystemReader`` (which reads, per item of the load plan,
only that item's byte range of its file) behind two checks: the checkpoint
is complete and every file of its record is there, at its size, before
anything is read; and each range read matches the checksum the save
recorded for it. A mounted volume is read through its mount, range by
range (not through the local cache, which copies whole files).
"""

from __future__ import annotations

import io
import os
from typing import IO, Any

from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata

from ..errors import CheckpointCorrupt
from . import digests
from .folder import Record, require_complete


class Reader(FileSystemReader):
    """Load a checkpoint saved by :class:`ucstage.checkpoint.Writer` (or any
    torch.distributed.checkpoint folder) from a local or mounted folder.

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
        folder, ckpt = require_complete(self._shown)
        super().__init__(folder)
        self._record: Record | None = ckpt.record

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self._shown = os.fspath(checkpoint_id)
            folder, ckpt = require_complete(self._shown)
            self.path = self.fs.init_path(folder)
            self._record = ckpt.record

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # Checked again: it may have been pruned or damaged since the reader was made.
        _, ckpt = require_complete(self._shown)
        self._record = ckpt.record
        return super().read_metadata(*args, **kwargs)

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        # torch's hook for one item's range of a file: read just that range,
        # and check it against the checksum the save recorded for it.
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        name = sinfo.relative_path
        if len(data) != sinfo.length:
            raise CheckpointCorrupt(
                f"checkpoint {self._shown}: {name} ends before byte "
                f"{sinfo.offset + sinfo.length:,} (an item's range)",
                hint=f"`ucstage checkpoint verify {self._shown}` checks every file")
        expected = None if self._record is None else \
            self._record.range_checksum(name, sinfo.offset, sinfo.length)
        if expected is not None and digests.of_bytes(data, digests.kind_of(expected)) != expected:
            raise CheckpointCorrupt(
                f"checkpoint {self._shown}: bytes {sinfo.offset:,}-"
                f"{sinfo.offset + sinfo.length:,} of {name} fail their checksum",
                hint=f"the file changed since the save; `ucstage checkpoint verify "
                     f"{self._shown}` checks every file")
        return io.BytesIO(data)
