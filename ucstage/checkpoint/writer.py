"""``Writer``: torch.distributed.checkpoint storage that writes locally first,
then uploads and publishes.

Each rank writes its files with torch's own ``FileSystemWriter`` into a
private scratch folder on local disk (under the cache root) and copies
them to the checkpoint's folder on several threads, each file straight to
its final name, and checks the size and checksum of what landed. The copy
of a file starts as torch opens it and follows the writing part by part,
and the checksums are taken as torch writes (:mod:`.tee`). The
coordinator then checks every rank's files are in place, writes the record
(:mod:`ucstage.checkpoint.folder`) and ``.metadata`` last, and prunes older
checkpoints when ``keep`` asks. With ``dcp.async_save`` all of this runs in
torch's background thread: the training loop waits only for the state to be
copied to CPU memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import pickle
import shutil
import stat
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import (
    CURRENT_DCP_VERSION,
    FileSystemWriter,
    _StorageInfo,
)
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ..cache.paths import CONTROL, default_root, open_root
from ..errors import (
    CacheOwnershipError,
    CheckpointCorrupt,
    CheckpointError,
    InvalidArgument,
    UcstageError,
)
from . import digests
from .folder import METADATA, RECORD, FileRecord, Record
from .place import Place, StorePlace, place
from .retention import STALE_SECONDS, abort_stale_uploads, prune
from .tee import Growing, TeeFileSystem
from .upload import Destination, FolderDestination, Landed, ObjectDestination

_log = logging.getLogger("ucstage")

SCRATCH = os.path.join(CONTROL, "checkpoints")
"""Where ranks write before uploading, relative to the cache root: one
private folder per save and rank, named ``<pid>-<random>``."""


@dataclasses.dataclass(frozen=True)
class _Stored:
    """A rank's WriteResult storage data on its way to the coordinator: torch's
    own, plus the checksum of its byte range and its file's record."""

    info: _StorageInfo
    checksum: str
    file: FileRecord


def _refuse_complete(path: str, *, now: bool = True) -> Place:
    """The place ``path`` names, refused when it holds a complete checkpoint.
    ``now=False`` leaves a store unlisted: the writer is made in the training
    loop (``dcp.async_save(state, storage_writer=Writer(...))``), where a
    listing's round trips would block it; ``prepare_local_plan`` checks
    again in the save's own thread, before anything is written."""
    at = place(path)
    if (now or at.is_local) and METADATA in (at.files() or {}):
        raise CheckpointError(
            f"checkpoint {path} already exists and is complete: a save never writes over one",
            hint="save each checkpoint to a folder of its own (step-000100, step-000200, ...); "
                 "keep=N removes the older ones")
    return at


def _scratch_base(cache_dir: str | None) -> str:
    """The cache root's scratch folder for checkpoints, private, never a link."""
    root = open_root(cache_dir if cache_dir is not None else default_root())
    base = os.path.join(root, SCRATCH)
    with contextlib.suppress(FileExistsError):
        os.mkdir(base, 0o700)
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise CacheOwnershipError(f"{base} in the cache is not a private folder of yours",
                                  "remove it: ucstage makes it again, private")
    return base


def _sweep(base: str, now: float | None = None) -> None:
    """Remove scratch folders left by processes that are gone (a killed save)
    and untouched for :data:`STALE_SECONDS`. The pid alone is not proof: a
    container sharing this cache root has its own pids, and removing a live
    save's scratch would fail that save."""
    now = time.time() if now is None else now
    for entry in os.scandir(base):
        pid, _, _ = entry.name.partition("-")
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < STALE_SECONDS:
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except (PermissionError, FileNotFoundError):
            pass  # alive and someone else's, or just removed


STOP_S = 1.0
"""How long a stopped save waits for torch's writer threads to notice."""

_CHECKED: dict[str, float] = {}
"""When this process last aborted the stale uploads of a folder of checkpoints."""
_CHECKED_LOCK = threading.Lock()


class Writer(FileSystemWriter):
    """Save a torch.distributed.checkpoint to a local or mounted folder
    (``/Volumes/...``) or an object store (``s3://``, ``gs://``, ``az://``),
    written to local disk first and uploaded checked.

    Pass it to ``dcp.save`` or ``dcp.async_save`` as ``storage_writer``. The
    checkpoint is complete only when every rank's files are in place and
    checked and ``.metadata`` is written, last; a folder without it is never
    loaded (:class:`ucstage.checkpoint.Reader` refuses it).

    Args:
        path: the checkpoint's folder: a new one per checkpoint (a complete
            checkpoint is never written over). ``checkpoint_id=`` of
            ``dcp.save`` replaces it.
        keep: after publishing, remove the complete checkpoints of the same
            parent folder older than the ``keep`` newest (this one counts);
            incomplete ones are never removed. None keeps everything.
        cache_dir: the cache root whose scratch folder the ranks write to
            first (default ``$UCSTAGE_CACHE_DIR``, else ``/tmp/ucstage-<uid>``).
        upload_threads: files copied to the folder at once, per rank (each
            copy starts as torch opens its file; a large file's parts go
            several at once within its copy).
        thread_count: files each rank writes (torch's option): more files
            upload in parallel.
        sync_files: fsync each scratch file as torch writes it; default
            (None): yes for a folder, no for an object store, whose upload
            reads the scratch files straight back from the page cache and
            removes them (its check is the store's checksum, not the disk).
        per_thread_copy_ahead, cache_staged_state_dict: torch's
            ``FileSystemWriter`` options.
    """

    def __init__(self, path: str | os.PathLike[str], *, keep: int | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, upload_threads: int = 4,
                 thread_count: int = 1, sync_files: bool | None = None,
                 per_thread_copy_ahead: int = 10_000_000,
                 cache_staged_state_dict: bool = False) -> None:
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise InvalidArgument(f"keep must be 1 or more, got {keep!r}",
                                  hint="the newest complete checkpoint is always kept")
        if isinstance(upload_threads, bool) or not isinstance(upload_threads, int) \
                or upload_threads < 1:
            raise InvalidArgument(f"upload_threads must be 1 or more, got {upload_threads!r}")
        self._shown = os.fspath(path)
        self._at = _refuse_complete(self._shown, now=False)
        self._folder = self._at.path
        if sync_files is None:
            sync_files = self._at.is_local
        super().__init__(self._folder, single_file_per_rank=True, sync_files=sync_files,
                         thread_count=thread_count, per_thread_copy_ahead=per_thread_copy_ahead,
                         cache_staged_state_dict=cache_staged_state_dict, overwrite=False)
        self.keep = keep
        self.upload_threads = upload_threads
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.kind = digests.default_kind()
        self.fs = TeeFileSystem(self.kind)
        self._scratch: str | None = None
        self._checked_here: set[FileRecord] = set()
        """This process's files of the current save, landed and checked."""

    # -- torch's StorageWriter ------------------------------------------------

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(None)
        if checkpoint_id:
            self._shown = os.fspath(checkpoint_id)
            self._at = _refuse_complete(self._shown, now=False)
            self._folder = self._at.path
            self.path = self.fs.init_path(self._folder)

    @property
    def checkpoint_id(self) -> str:
        return self._folder

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self._folder, save_id=self.save_id)

    def destination(self) -> Destination:
        """Where the files go: the folder, or the store's prefix."""
        if isinstance(self._at, StorePlace):
            return ObjectDestination(self._at)
        return FolderDestination(self._folder)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self._checked_here = set()
        if not self.use_collectives:
            raise InvalidArgument("use_collectives=False is not supported: the coordinator "
                                  "publishes the checkpoint once every rank's files are in")
        _refuse_complete(self._shown)
        if self._at.is_local:  # a store's "folder" is a key prefix: nothing to make
            os.makedirs(self._folder, exist_ok=True)
        base = _scratch_base(self.cache_dir)
        _sweep(base)
        # mkdtemp: a new folder, 0700, made by this call (never one planted there).
        self._scratch = tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base)
        self.path = Path(self._scratch)
        return plan

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assert self._scratch is not None
        dest = self.destination()
        # Each file's upload starts when torch opens it and sends each part
        # as soon as torch has written it (:mod:`.tee`): writing, the
        # checksums and the upload overlap instead of running one after another.
        pool = ThreadPoolExecutor(max_workers=self.upload_threads,
                                  thread_name_prefix="ucstage-ckpt")
        uploads: dict[str, tuple[Growing, concurrent.futures.Future[Landed]]] = {}
        lock = threading.Lock()

        def opened(growing: Growing) -> None:
            dest.writing[growing.path] = growing
            with lock:
                uploads[growing.name] = (growing, pool.submit(dest.put, growing.path,
                                                              growing.name, self.kind))

        tee = self.fs = TeeFileSystem(self.kind, opened)
        try:
            written = super().write_data(plan, planner).wait()
            stored = self._checked(written, dest, uploads)
        except BaseException as exc:
            # Ctrl-C, a failed write or a failed copy: torch's other writer
            # threads stop at their next write (the scratch folder is removed
            # only once they have), the copies still running stop at their
            # next block rather than finish files that will not be
            # published, and the ones waiting for bytes stop waiting.
            dest.cancel()
            if not tee.stop("the save stopped", STOP_S):
                _log.warning("ucstage: torch's writer threads of the stopped save to %s "
                             "still write after %.0f s", self._shown, STOP_S)
            with lock:
                for growing, _ in uploads.values():
                    growing.fail("the save stopped")
            pool.shutdown(wait=True, cancel_futures=True)
            if tee.interrupted and not isinstance(exc, KeyboardInterrupt):
                raise KeyboardInterrupt from exc  # torch's serialiser reported it as its own
            raise
        finally:
            self.fs = TeeFileSystem(self.kind)
            if self._scratch is not None:
                shutil.rmtree(self._scratch, ignore_errors=True)
                self._scratch = None
            self.path = Path(self._folder)
        pool.shutdown()
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(stored)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        dest = self.destination()
        files: dict[str, FileRecord] = {}
        ranges: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        storage_md: dict[Any, Any] = {}
        for rank_results in results:
            for wr in rank_results:
                data = wr.storage_data
                if isinstance(data, _Stored):
                    files[data.file.name] = data.file
                    ranges[data.file.name].append((data.info.offset, data.info.length,
                                                   data.checksum))
                    data = data.info
                storage_md[wr.index] = data
        # Every rank checked its own copies; the coordinator checks the other
        # ranks' are all there before it publishes (its own it checked just
        # now: a listing would cost a round trip for nothing).
        for f in files.values():
            if f in self._checked_here:
                continue
            size = dest.size(f.name)
            if size != f.size:
                raise CheckpointCorrupt(
                    f"cannot publish checkpoint {self._shown}: rank {f.rank}'s {f.name} is "
                    + ("missing" if size is None else f"{size:,} bytes, not {f.size:,}"),
                    hint="nothing was published; save again (to a new folder)")
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        record = Record(time.time(), len(results),
                        tuple(sorted(files.values(), key=lambda f: (f.rank, f.name))),
                        {name: sorted(rs) for name, rs in sorted(ranges.items())})
        dest.write_small(RECORD, json.dumps(record.to_json(), separators=(",", ":")).encode())
        dest.write_small(METADATA, pickle.dumps(metadata))  # last: now it is complete
        if isinstance(self._at, StorePlace):
            self._abort_stale_uploads()
        if self.keep is not None:
            parent = self._at.parent().path
            try:
                report = prune(parent, self.keep, protect=[self._folder], uploads=False)
            except (UcstageError, OSError) as exc:
                _log.warning("ucstage: checkpoint %s is saved, but pruning %s failed: %s",
                             self._shown, parent, exc)
            else:
                for ckpt in report.removed:
                    _log.info("ucstage: removed checkpoint %s (keep=%d)", ckpt.path, self.keep)

    def _abort_stale_uploads(self) -> None:
        """Abort the multipart uploads a killed save left in this folder of
        checkpoints (:func:`abort_stale_uploads`): their parts are billed.

        Once per process and folder, then again only after
        :data:`STALE_SECONDS` (a save every few minutes would otherwise list
        the uploads each time, and find nothing newly stale): the first save
        of a restarted job is the one that finds a killed job's uploads. A
        failure costs storage, not this save: it is logged.
        """
        parent = self._at.parent()
        now = time.monotonic()
        with _CHECKED_LOCK:
            last = _CHECKED.get(parent.path)
            if last is not None and now - last < STALE_SECONDS:
                return
            _CHECKED[parent.path] = now
        try:
            abort_stale_uploads(parent)
        except (UcstageError, ImportError, OSError) as exc:
            _log.warning("ucstage: could not abort the stale unfinished uploads under %s: %s",
                         parent.path, exc)

    # -- the upload ---------------------------------------------------------------

    def _checked(self, written: Sequence[WriteResult], dest: Destination,
                 uploads: dict[str, tuple[Growing, concurrent.futures.Future[Landed]]]
                 ) -> list[WriteResult]:
        """Wait for this rank's uploads and check each against what torch
        wrote; return the results with each item's range checksum and its
        file's record."""
        by_file: dict[str, list[int]] = defaultdict(list)
        for i, wr in enumerate(written):
            by_file[wr.storage_data.relative_path].append(i)
        rank = self.rank or 0
        stored = list(written)
        for name in sorted(by_file):
            spans = [(written[i].storage_data.offset, written[i].storage_data.length)
                     for i in by_file[name]]
            local = os.path.join(self._scratch or "", name)
            if name in uploads:
                growing, put = uploads[name]
                size, checksum = growing.checksum()
                sums = growing.range_checksums(spans)
                landed: Landed | None = put.result()
            else:  # a file torch did not open through the scratch's file system
                size, checksum, sums = digests.of_file(local, self.kind, spans)
                landed = None
            for attempt in (1, 2):
                if landed is None:
                    landed = dest.put(local, name, self.kind)
                if (landed.size, landed.checksum) == (size, checksum):
                    break
                if attempt == 2:
                    raise CheckpointCorrupt(
                        f"the copy of {name} to {dest.where} holds {landed.size:,} bytes "
                        f"({landed.checksum}), not the {size:,} written ({checksum}), twice",
                        hint="check the destination's disk or mount; nothing was published")
                landed = None  # sent again, from the complete file
            record = FileRecord(name, rank, size, checksum)
            self._checked_here.add(record)
            for i, range_sum in zip(by_file[name], sums, strict=True):
                wr = written[i]
                stored[i] = WriteResult(index=wr.index, size_in_bytes=wr.size_in_bytes,
                                        storage_data=_Stored(wr.storage_data, range_sum, record))
        return stored
