"""The checkpoints of a folder: listing them, keeping the newest N, and the
multipart uploads killed saves left behind.

Pruning removes only **complete** checkpoints older than the ``keep``
newest complete ones (by the time each was published), so the newest
complete checkpoint is never removed. An incomplete checkpoint is never
removed: a job may be writing it right now, and only a person knows it is
dead (remove its folder by hand). A checkpoint is removed ``.metadata``
first, so a reader that races the removal is refused ("incomplete") rather
than shown half a checkpoint; then the files its record names, then the
folder when nothing else is left in it.

A rank killed in the middle of a multipart upload leaves it unfinished: S3
keeps its parts, unlisted and billed, until someone aborts it. ``list``
reports the unfinished uploads under a folder, and the next save into the
folder (its coordinator) and ``prune`` abort those idle for
:data:`STALE_SECONDS`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..engines import objput
from ..errors import InvalidArgument, SourceNotFound
from .folder import DATA_FILE, METADATA, RECORD, Checkpoint, inspect
from .place import Place, StorePlace, place

_log = logging.getLogger("ucstage")

STALE_SECONDS = 3600.0
"""How long a save's leftovers sit untouched before a later save (or
``prune``) removes them: a dead process's scratch folder, an unfinished
multipart upload whose newest part is older. An upload still going on
sends a part every few seconds; one idle for an hour has lost its writer."""


def list_checkpoints(path: str) -> list[Checkpoint]:
    """The checkpoint ``path`` is, or the checkpoints in its subfolders,
    oldest first (complete or not).

    Raises:
        SourceNotFound: no such folder.
        InvalidArgument: ``path`` is a file.
    """
    at = place(path)
    if at.is_local and os.path.exists(at.path) and not os.path.isdir(at.path):
        raise InvalidArgument(f"{path} is not a folder",
                              hint="pass a checkpoint's folder or the folder that holds them")
    if at.files() is None:
        raise SourceNotFound(f"{path} does not exist", hint="check the path")
    itself = inspect(at)
    if itself is not None:
        return [itself]
    found = []
    for sub in at.folders():
        ckpt = inspect(sub)
        if ckpt is not None:
            found.append(ckpt)
    return sorted(found, key=lambda c: (c.saved_at, c.name))


def latest(path: str) -> str | None:
    """The folder of the newest complete checkpoint in ``path`` (by when it
    was published), or None when there is none: where a restarted job
    resumes from. Incomplete checkpoints are passed over.

    Raises:
        SourceNotFound: no such folder.
    """
    complete = [c for c in list_checkpoints(path) if c.complete]
    return complete[-1].path if complete else None


@dataclass(frozen=True)
class UnfinishedUpload:
    """A multipart upload of a checkpoint's file never completed (its rank was
    killed mid-upload): S3 keeps, and bills, its parts until it is aborted."""

    path: str
    """The object it was uploading, as a URL under the folder listed."""
    upload_id: str
    initiated: float
    last_active: float
    """When it began or its newest part arrived, whichever is later."""
    upload: objput.Unfinished = field(repr=False, compare=False)
    at: StorePlace = field(repr=False, compare=False)

    def stale(self, now: float) -> bool:
        """Idle for :data:`STALE_SECONDS`: its writer is gone."""
        return now - self.last_active >= STALE_SECONDS

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {"path": self.path, "upload_id": self.upload_id, "initiated": self.initiated,
                "idle_s": round(max(0.0, now - self.last_active), 3),
                "stale": self.stale(now)}


def unfinished_uploads(path: str | Place) -> list[UnfinishedUpload]:
    """The unfinished multipart uploads under the folder ``path`` (its
    checkpoints' files included), oldest first; empty off S3, and when s3fs
    (``ucstage[s3]``), which lists them, is not installed."""
    at = place(path) if isinstance(path, str) else path
    if not isinstance(at, StorePlace):
        return []
    try:
        found = at.unfinished_uploads()
    except ImportError:
        _log.warning("ucstage: cannot list unfinished uploads under %s: s3fs is not "
                     "installed (pip install 'ucstage[s3]')", at.path)
        return []
    return [UnfinishedUpload(at.shown(u.key), u.upload_id, u.initiated, u.last_active, u, at)
            for u in found]


def abort_stale_uploads(path: str | Place, *, dry_run: bool = False,
                        now: float | None = None) -> list[UnfinishedUpload]:
    """Abort the unfinished multipart uploads under ``path`` idle for
    :data:`STALE_SECONDS` (a rank killed mid-upload); return them (with
    ``dry_run``, those it would abort). An upload that is still sending
    parts is left alone."""
    now = time.time() if now is None else now
    stale = [u for u in unfinished_uploads(path) if u.stale(now)]
    if not dry_run:
        for u in stale:
            u.at.abort_upload(u.upload)
            _log.info("ucstage: aborted the unfinished upload of %s (idle %.0f s)", u.path,
                      now - u.last_active)
    return stale


@dataclass
class PruneReport:
    removed: list[Checkpoint]
    kept: list[Checkpoint]
    """Complete checkpoints kept (the newest ``keep``)."""
    incomplete: list[Checkpoint]
    """Never removed: a job may be writing them."""
    dry_run: bool
    left: dict[str, list[str]] = field(default_factory=dict)
    """Per removed checkpoint, files ucstage did not write that it left in place."""
    aborted: list[UnfinishedUpload] = field(default_factory=list)
    """Stale unfinished multipart uploads aborted (dry run: that would be)."""

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        return {"dry_run": self.dry_run,
                "removed": [c.to_json(now) for c in self.removed],
                "kept": [c.to_json(now) for c in self.kept],
                "incomplete": [c.to_json(now) for c in self.incomplete],
                "removed_bytes": sum(c.bytes for c in self.removed),
                "left": self.left,
                "aborted_uploads": [u.to_json(now) for u in self.aborted]}


def prune(path: str, keep: int, *, dry_run: bool = False,
          protect: Iterable[str] = (), uploads: bool = True) -> PruneReport:
    """Remove the complete checkpoints in the folder ``path`` older than its
    ``keep`` newest complete ones; ``protect`` names folders never removed.
    ``uploads``: also abort the stale unfinished uploads under it
    (:func:`abort_stale_uploads`; a save does that itself, less often).

    Raises:
        InvalidArgument: ``keep`` below 1, or ``path`` is itself a checkpoint.
    """
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InvalidArgument(f"keep must be 1 or more, got {keep!r}",
                              hint="the newest complete checkpoint is always kept")
    at = place(path)
    if inspect(at) is not None:
        raise InvalidArgument(f"{path} is a checkpoint: prune takes the folder that holds "
                              "checkpoints", hint=f"pass {at.parent().path}")
    found = list_checkpoints(path)
    complete = sorted((c for c in found if c.complete), key=lambda c: (c.saved_at, c.name),
                      reverse=True)
    protected = {place(p).path for p in protect}
    kept = complete[:keep] + [c for c in complete[keep:] if c.path in protected]
    removed = [c for c in complete[keep:] if c.path not in protected]
    report = PruneReport(removed, kept, [c for c in found if not c.complete], dry_run)
    if uploads:
        report.aborted = abort_stale_uploads(at, dry_run=dry_run)
    if not dry_run:
        for ckpt in removed:
            left = _remove(ckpt)
            if left:
                report.left[ckpt.path] = left
    return report


def _remove(ckpt: Checkpoint) -> list[str]:
    """Remove one complete checkpoint, ``.metadata`` first; return the names
    of files left because ucstage did not write them."""
    at = ckpt.place
    at.remove(METADATA)
    names = set(ckpt.files)
    if ckpt.record is not None:
        names.update(f.name for f in ckpt.record.files)
    for name in [*sorted(names), RECORD]:
        at.remove(name)
    return [n for n in at.remove_if_empty() if not DATA_FILE.fullmatch(n)]
