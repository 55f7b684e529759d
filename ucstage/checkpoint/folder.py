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

A **plain torch checkpoint** (saved by torch's ``FileSystemWriter``: no
record) is complete by the same rule, loads, and is listed as such;
``verify`` checks what its ``.metadata`` tells (each file it indexes
present and long enough for the byte ranges it indexes), not its bytes.

Every file name a record or a ``.metadata`` gives is checked before
anything is read (:func:`name_problem`): a name that is not one of the
folder's data files (``../x``, an absolute path, control characters) or a
file that is a link is refused (:class:`~ucstage.errors.CheckpointUnsafe`).
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    NESTED_TOO_DEEP,
    CheckpointCorrupt,
    CheckpointError,
    CheckpointIncomplete,
    CheckpointUnsafe,
    MissingDependency,
    SourceNotFound,
)
from ..progress import NO_PROGRESS, Callback
from ..shown import UNSAFE
from ..units import format_bytes
from ..volumes.location import entry_name_problem
from . import digests
from .place import Place, place

METADATA = ".metadata"
"""torch's index of a checkpoint: written last, it makes the checkpoint complete."""
RECORD = ".ucstage-checkpoint.json"
FORMAT = "ucstage-checkpoint"
VERSION = 1
DATA_FILE = re.compile(r"__([0-9]+)_[0-9]+\.distcp")
"""A rank's data file, as torch's FileSystemWriter names it (``__<rank>_<n>.distcp``)."""


def name_problem(name: str) -> str | None:
    """Why ``name``, as a record or a ``.metadata`` gives it, cannot be one of
    the checkpoint's data files, or None when it can. Checked before the
    name is joined to the folder, so no read leaves it."""
    if UNSAFE.search(name) is not None:
        return "a name with control characters"
    if name.startswith("/"):
        return "an absolute path, outside the checkpoint"
    if ".." in name.split("/"):
        return "a path leading outside the checkpoint"
    why = entry_name_problem(name)
    if why is not None:
        return why
    if DATA_FILE.fullmatch(name) is None:
        return "not a data file name (__<rank>_<n>.distcp)"
    return None


def _unsafe(what: str, name: str, why: str) -> CheckpointUnsafe:
    return CheckpointUnsafe(f"{what} names {name}: {why}; refused, nothing was read",
                            hint="it was edited, or made by another tool: load another "
                                 "checkpoint (`ucstage checkpoint list` shows them)")


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
        for name in [*(f.name for f in files), *ranges]:
            why = name_problem(name)
            if why is not None:
                raise _unsafe(f"the checkpoint record {where}", name, why)
        for f in files:
            if f.size < 0:
                raise bad(f"{f.name} has a negative size")
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

    @property
    def saved_by(self) -> str | None:
        """``ucstage`` (it has a record); ``torch`` when complete without one
        (a plain torch checkpoint: torch's own ``FileSystemWriter``, or any
        tool writing DCP folders); None when incomplete without one (a save
        of either that has not finished: they cannot be told apart)."""
        if self.record is not None:
            return "ucstage"
        return "torch" if self.complete else None

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {"path": self.path, "name": self.name, "complete": self.complete,
                "ranks": self.ranks, "files": len(self.files), "bytes": self.bytes,
                "saved_at": self.saved_at, "age_s": round(max(0.0, now - self.saved_at), 3),
                "record": self.record is not None, "saved_by": self.saved_by}


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


def _not_a_file(at: Place, name: str) -> str | None:
    """Why ``name`` in the folder is not a file ucstage reads, or None: a
    link (it could lead anywhere) or a folder. Only a local or mounted
    folder holds such entries; its listing leaves them out, so a link
    named by a record or ``.metadata`` would otherwise look missing."""
    if not at.is_local:
        return None
    try:
        mode = os.lstat(os.path.join(at.path, name)).st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "a link, not a file of the checkpoint"
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_indexed(ckpt: Checkpoint, names: Iterable[str], shown: str, *,
                  present: bool = True) -> None:
    """Refuse, before any is read, the files a checkpoint's ``.metadata``
    indexes when one is not among its data files: a name outside its folder
    or with control characters, one its record does not list, or a link.
    With ``present``, a file missing is refused too.

    Raises:
        CheckpointUnsafe: a name or a file that is not the checkpoint's.
        CheckpointCorrupt: with ``present``, a file missing.
    """
    listed = None if ckpt.record is None else {f.name for f in ckpt.record.files}
    what = f"checkpoint {shown}: its {METADATA}"
    given = set(names)
    for name in given:
        if not isinstance(name, str):  # an edited pickle can hold anything
            raise _unsafe(what, f"a {type(name).__name__}", "not a file name")
    for name in sorted(given):
        why = name_problem(name)
        if why is None and listed is not None and name not in listed:
            why = "a file its record does not list"
        if why is None and name not in ckpt.files:
            why = _not_a_file(ckpt.place, name)
            if why is None and present:
                raise CheckpointCorrupt(f"checkpoint {shown} is missing {name} (a file its "
                                        f"{METADATA} indexes)",
                                        hint="restore the file, or load an earlier checkpoint")
        if why is not None:
            raise _unsafe(what, name, why)


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
        CheckpointUnsafe: its record names a file that is not one of its
            data files, or one that is a link.
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
            link = None if size is not None else _not_a_file(at, f.name)
            if link is not None:
                raise _unsafe(f"checkpoint {path}: its record", f.name, link)
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
    """The size its record gives; for a plain torch checkpoint, the bytes
    the ranges its ``.metadata`` indexes in it need (it may hold more)."""
    size: int | None
    """None: the file is missing."""
    status: str
    """``ok``, ``missing``, ``size`` (another size than recorded), ``short``
    (a plain torch checkpoint's file ends before a range it indexes) or
    ``checksum`` (other bytes)."""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rank": self.rank, "expected_size": self.expected_size,
                "size": self.size, "status": self.status}


@dataclass
class VerifyReport:
    checkpoint: Checkpoint
    files: list[FileCheck]
    problem: str
    """Why the checkpoint does not verify, '' when it does."""
    checksums: bool = True
    """The files' bytes were checked against recorded checksums; False for
    a plain torch checkpoint (none recorded: presence and sizes only)."""

    @property
    def ok(self) -> bool:
        return not self.problem

    def to_json(self) -> dict[str, Any]:
        return {"checkpoint": self.checkpoint.to_json(), "ok": self.ok, "problem": self.problem,
                "checksums": self.checksums, "files": [f.to_json() for f in self.files]}


def verify(path: str, callback: Callback = NO_PROGRESS) -> VerifyReport:
    """Check every file of the checkpoint ``path`` against its record: present,
    of its size, and its bytes of its checksum (each file read whole). A
    plain torch checkpoint (no record) is checked against its ``.metadata``:
    every file it indexes present, and long enough for the ranges it indexes.

    Raises:
        SourceNotFound: no such folder.
        CheckpointError: the folder holds no checkpoint.
        CheckpointUnsafe: its record or ``.metadata`` names a file that is
            not one of its data files, or one that is a link.
        CheckpointCorrupt: a plain torch checkpoint's ``.metadata`` is no index.
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
        if ckpt.complete:
            return _verify_plain(at, ckpt, path, callback)
        return VerifyReport(ckpt, [], f"it is incomplete: no {METADATA} and no {RECORD} (a "
                                      "save that has not finished)", checksums=False)
    # Every name first: a link or a name out of the folder refuses the whole
    # checkpoint before any file is read.
    for f in record.files:
        link = None if f.name in ckpt.files else _not_a_file(at, f.name)
        if link is not None:
            raise _unsafe(f"checkpoint {path}: its record", f.name, link)
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


def _verify_plain(at: Place, ckpt: Checkpoint, path: str, callback: Callback) -> VerifyReport:
    """A plain torch checkpoint, checked against its ``.metadata``: no
    checksum was recorded, so each file it indexes must be there and hold
    every byte range it indexes in it; the bytes themselves are not checked."""
    try:
        from .index import read_index  # torch's pickle: torch only here
    except ImportError as exc:
        raise MissingDependency(f"reading the {METADATA} of checkpoint {path} needs torch",
                                hint="pip install 'ucstage[torch]'") from exc
    raw = at.read(METADATA)
    if raw is None:
        raise CheckpointCorrupt(f"checkpoint {path}: its {METADATA} is gone",
                                hint="it was removed while being read: list the folder again")
    index = read_index(raw, path)
    check_indexed(ckpt, index, path, present=False)
    callback.set_size(0, len(index))
    checks: list[FileCheck] = []
    for name in sorted(index, key=lambda n: (_rank(n), n)):
        needed = max(offset + length for offset, length in index[name])
        size = ckpt.files.get(name)
        status = "missing" if size is None else "short" if size < needed else "ok"
        callback.item_done(name, status)
        checks.append(FileCheck(name, _rank(name), needed, size, status))
    bad = sum(c.status != "ok" for c in checks)
    problem = f"{bad} of {len(checks)} files are missing or shorter than its {METADATA} " \
        "says" if bad else ""
    return VerifyReport(ckpt, checks, problem, checksums=False)


def _rank(name: str) -> int:
    """The rank a data file's name gives (checked by :func:`name_problem`)."""
    m = DATA_FILE.fullmatch(name)
    return int(m.group(1)) if m else -1
