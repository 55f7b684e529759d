"""A checkpoint folder: what is in it, when it is complete, and its record.

A checkpoint is a folder (on an object store, a key prefix: :mod:`.place`)
of torch.distributed.checkpoint files: each rank's
data files (``__<rank>_<n>.distcp``) and one ``.metadata`` that indexes
them. The publish rule (docs/training.md, "Checkpoints through the stage"):

* **complete** means ``.metadata`` is there. It is written last, by the
  coordinator, once every rank's files are in place and checked, so a
  folder with ``.metadata`` holds a whole checkpoint;
* **incomplete** is a folder with data files (or a record) and no
  ``.metadata``: a save that has not finished, or a killed one. It is never
  loaded and never pruned (a job may still be writing it);
* anything else is not a checkpoint.

Beside ``.metadata`` ucstage writes its **record**
(``.ucstage-checkpoint.json``, before ``.metadata``): every data file with
its rank, size and checksum, and a checksum for each byte range a load may
ask for. ``verify`` checks files against it, and a load checks each range it
reads. The checkpoint itself stays a plain DCP checkpoint: torch's own
``FileSystemReader`` loads it too.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    NESTED_TOO_DEEP,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointIncomplete,
    SourceNotFound,
)
from ..progress import NO_PROGRESS, Callback
from ..units import format_bytes
from . import digests
from .place import Place, place

METADATA = ".metadata"
"""torch's index of a checkpoint: written last, it makes the checkpoint complete."""
RECORD = ".ucstage-checkpoint.json"
FORMAT = "ucstage-checkpoint"
VERSION = 1
DATA_FILE = re.compile(r"__(\d+)_\d+\.distcp")
"""A rank's data file, as torch's FileSystemWriter names it (``__<rank>_<n>.distcp``)."""


@dataclass(frozen=True)
class FileRecord:
    name: str
    rank: int
    size: int
    checksum: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "size": self.size,
                "checksum": self.checksum}


@dataclass(frozen=True)
class Record:
    """What ucstage wrote beside ``.metadata``: each file's rank, size and
    checksum, and the checksum of each item's byte range."""

    saved_at: float
    world_size: int
    files: tuple[FileRecord, ...]
    ranges: dict[str, list[tuple[int, int, str]]] = field(default_factory=dict)
    """Per file, ``(offset, length, checksum)`` of each item torch wrote in it."""

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "saved_at": self.saved_at,
                "world_size": self.world_size, "files": [f.to_json() for f in self.files],
                "ranges": {name: [list(r) for r in rs] for name, rs in self.ranges.items()}}

    def range_checksum(self, name: str, offset: int, length: int) -> str | None:
        """The checksum recorded for this range of ``name``, or None."""
        for o, n, checksum in self.ranges.get(name, ()):
            if o == offset and n == length:
                return checksum
        return None

    @classmethod
    def from_json(cls, data: Any, where: str) -> Record:
        def bad(why: str) -> CheckpointError:
            return CheckpointError(f"the checkpoint record {where} is malformed: {why}",
                                   hint="it was not written by ucstage, or was edited")

        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise bad(f'"format" is not {FORMAT!r}')
        if data.get("version") != VERSION:
            raise bad(f'"version" {data.get("version")!r} is not {VERSION}')
        try:
            files = tuple(FileRecord(str(f["name"]), int(f["rank"]), int(f["size"]),
                                     str(f["checksum"])) for f in data["files"])
            ranges = {str(name): [(int(o), int(n), str(c)) for o, n, c in rs]
                      for name, rs in data.get("ranges", {}).items()}
            record = cls(float(data["saved_at"]), int(data["world_size"]), files, ranges)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(f"{type(exc).__name__}: {exc}") from exc
        for f in files:
            if DATA_FILE.fullmatch(f.name) is None or f.size < 0:
                raise bad(f"{f.name!r} is not a data file name with a size")
        return record


def read_record(folder: str | Place) -> Record | None:
    """The folder's record, or None when it has none."""
    at = place(folder) if isinstance(folder, str) else folder
    path = f"{at.path}/{RECORD}"
    raw = at.read(RECORD)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except RecursionError as exc:
        raise CheckpointError(f"the checkpoint record {path} is {NESTED_TOO_DEEP}") from exc
    except ValueError as exc:
        raise CheckpointError(f"the checkpoint record {path} is not valid JSON: {exc}",
                              hint="it was not written by ucstage, or was cut short") from exc
    return Record.from_json(data, path)


@dataclass
class Checkpoint:
    """One checkpoint folder as found on disk."""

    path: str
    complete: bool
    record: Record | None
    files: dict[str, int]
    """The data files present, with their sizes."""
    saved_at: float
    """When it was published (its record), else when its newest file was written."""
    at: Place | None = field(default=None, repr=False, compare=False)
    """Where it is (None: made by hand, at :attr:`path` on local disk)."""

    @property
    def place(self) -> Place:
        return self.at if self.at is not None else place(self.path)

    @property
    def name(self) -> str:
        return os.path.basename(self.path.rstrip(os.sep)) or self.path

    @property
    def ranks(self) -> int:
        """The number of ranks that saved it (its record's world size), else
        the ranks its data files name."""
        if self.record is not None:
            return self.record.world_size
        found = {int(m.group(1)) for n in self.files if (m := DATA_FILE.fullmatch(n))}
        return len(found)

    @property
    def bytes(self) -> int:
        return sum(self.files.values())

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {"path": self.path, "name": self.name, "complete": self.complete,
                "ranks": self.ranks, "files": len(self.files), "bytes": self.bytes,
                "saved_at": self.saved_at, "age_s": round(max(0.0, now - self.saved_at), 3),
                "record": self.record is not None}


def inspect(folder: str | Place) -> Checkpoint | None:
    """The checkpoint in ``folder``, or None when it holds none (or is no folder)."""
    at = place(folder) if isinstance(folder, str) else folder
    listed = at.files()
    if listed is None:
        return None
    files: dict[str, int] = {}
    mtimes: dict[str, float] = {}
    for name, (size, mtime) in listed.items():
        if DATA_FILE.fullmatch(name) or name in (METADATA, RECORD):
            mtimes[name] = mtime
            if DATA_FILE.fullmatch(name):
                files[name] = size
    if not mtimes:
        return None
    complete = METADATA in mtimes
    record = read_record(at) if RECORD in mtimes else None
    if record is not None:
        saved_at = record.saved_at
    elif complete:
        saved_at = mtimes[METADATA]
    else:
        saved_at = max(mtimes.values())
    return Checkpoint(at.path, complete, record, files, saved_at, at)


def _incomplete(ckpt: Checkpoint, shown: str) -> CheckpointIncomplete:
    return CheckpointIncomplete(
        f"checkpoint {shown} is incomplete: it has no {METADATA} (a save that has not "
        f"finished, or was stopped), so it is never loaded",
        hint=f"load the latest complete one: `ucstage checkpoint list {ckpt.place.parent().path}`")


def require_complete(path: str) -> tuple[Place, Checkpoint]:
    """The place of the complete checkpoint ``path`` names, checked
    before anything is loaded: every file its record names present, at its size.

    Raises:
        SourceNotFound: no such folder.
        CheckpointError: the folder holds no checkpoint.
        CheckpointIncomplete: it has no ``.metadata``.
        CheckpointCorrupt: a file of its record is missing or of another size.
    """
    at = place(path)
    ckpt = inspect(at)
    if ckpt is None and at.files() is None:
        where = "" if at.path == path.rstrip("/") else f" (looked up at {at.path})"
        raise SourceNotFound(f"checkpoint {path} does not exist{where}",
                             hint="check the path: a checkpoint is the folder it was saved to")
    if ckpt is None:
        raise CheckpointError(
            f"{path} is not a checkpoint: it holds no {METADATA} and no .distcp files",
            hint="pass the folder a checkpoint was saved to (`ucstage checkpoint list "
                 "FOLDER` lists the checkpoints in a folder)")
    if not ckpt.complete:
        raise _incomplete(ckpt, path)
    if ckpt.record is not None:
        for f in ckpt.record.files:
            size = ckpt.files.get(f.name)
            if size is None:
                raise CheckpointCorrupt(
                    f"checkpoint {path} is missing {f.name} (rank {f.rank}'s file, "
                    f"{format_bytes(f.size)})",
                    hint=f"restore the file, or load an earlier checkpoint (`ucstage checkpoint "
                         f"verify {path}` checks every file)")
            if size != f.size:
                raise CheckpointCorrupt(
                    f"checkpoint {path}: {f.name} (rank {f.rank}'s file) has {size:,} bytes, "
                    f"its record says {f.size:,}",
                    hint="load an earlier checkpoint; `ucstage checkpoint verify` checks every file")
    return at, ckpt


@dataclass(frozen=True)
class FileCheck:
    name: str
    rank: int
    expected_size: int
    size: int | None
    """None: the file is missing."""
    status: str
    """``ok``, ``missing``, ``size`` (another size) or ``checksum`` (other bytes)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "expected_size": self.expected_size,
                "size": self.size, "status": self.status}


@dataclass
class VerifyReport:
    checkpoint: Checkpoint
    files: list[FileCheck]
    problem: str
    """Why the checkpoint does not verify, '' when it does."""

    @property
    def ok(self) -> bool:
        return not self.problem

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.to_json(), "ok": self.ok, "problem": self.problem,
                "files": [f.to_json() for f in self.files]}


def verify(path: str, callback: Callback = NO_PROGRESS) -> VerifyReport:
    """Check every file of the checkpoint ``path`` against its record: present,
    of its size, and its bytes of its checksum (each file read whole).

    Raises:
        SourceNotFound: no such folder.
        CheckpointError: the folder holds no checkpoint.
    """
    at = place(path)
    ckpt = inspect(at)
    if ckpt is None:
        if at.files() is None:
            raise SourceNotFound(f"checkpoint {path} does not exist", hint="check the path")
        raise CheckpointError(f"{path} is not a checkpoint: it holds no {METADATA} and no "
                              ".distcp files", hint="pass the folder a checkpoint was saved to")
    record = ckpt.record
    if record is None:
        why = (f"it has no {RECORD}: it was not saved by ucstage.checkpoint.Writer, so there "
               "is nothing to check its files against") if ckpt.complete else \
            f"it is incomplete: no {METADATA} and no {RECORD} (a save that has not finished)"
        return VerifyReport(ckpt, [], why)
    checks: list[FileCheck] = []
    callback.set_size(sum(f.size for f in record.files if f.name in ckpt.files),
                      len(record.files))
    for f in record.files:
        size = ckpt.files.get(f.name)
        if size is None:
            status = "missing"
        elif size != f.size:
            status = "size"
        else:
            _, checksum = at.checksum(f.name, digests.kind_of(f.checksum),
                                      progress=callback.relative_update)
            status = "ok" if checksum == f.checksum else "checksum"
        callback.item_done(f.name, status)
        checks.append(FileCheck(f.name, f.rank, f.size, size, status))
    bad = [c for c in checks if c.status != "ok"]
    problems = []
    if not ckpt.complete:
        problems.append(f"it is incomplete (no {METADATA})")
    if bad:
        problems.append(f"{len(bad)} of {len(checks)} files are missing or differ from the "
                        "record")
    return VerifyReport(ckpt, checks, "; ".join(problems))

