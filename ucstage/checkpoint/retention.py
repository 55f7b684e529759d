"""The checkpoints of a folder: listing them, and keeping the newest N.

Pruning removes only **complete** checkpoints older than the ``keep``
newest complete ones (by the time each was published), so the newest
complete checkpoint is never removed. An incomplete checkpoint is never
removed: a job may be writing it right now, and only a person knows it is
dead (remove its folder by hand). A checkpoint is removed ``.metadata``
first, so a reader that races the removal is refused ("incomplete") rather
than shown half a checkpoint; then the files its record names, then the
folder when nothing else is left in it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument, SourceNotFound
from .folder import DATA_FILE, METADATA, RECORD, Checkpoint, inspect
from .place import place


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

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        return {"dry_run": self.dry_run,
                "removed": [c.to_json(now) for c in self.removed],
                "kept": [c.to_json(now) for c in self.kept],
                "incomplete": [c.to_json(now) for c in self.incomplete],
                "removed_bytes": sum(c.bytes for c in self.removed),
                "left": self.left}


def prune(path: str, keep: int, *, dry_run: bool = False,
          protect: Iterable[str] = ()) -> PruneReport:
    """Remove the complete checkpoints in the folder ``path`` older than its
    ``keep`` newest complete ones; ``protect`` names folders never removed.

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
