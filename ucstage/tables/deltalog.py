"""The deletion-vector descriptors of a Delta version's live files, from the log.

delta-rs gives the live files, their statistics and typed partition values,
but not their deletion vectors (``get_add_actions`` leaves the descriptor
out). So the log is read here for that one field: the commits from the
version down, newest first (a live file's descriptor is the one of its
newest ``add``), and, for files added before the newest checkpoint at or
below the version, that checkpoint: classic, multi-part or v2 (UUID-named,
Parquet or JSON, with its sidecars). Only tables with the
``deletionVectors`` reader feature are read this way.

The log's files are read through a :class:`LogFiles`: a local folder's
(:class:`LocalLog`), or a table's on an object store
(:class:`ucstage.tables.storedelta.StoreLog`, through the engine).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..errors import UnreadableDeltaLog
from .logpaths import Folder

__all__ = ["LocalLog", "LogFiles", "deletion_descriptors"]


class LogFiles(Protocol):
    """A table's ``_delta_log``, as the descriptors are read from it."""

    @property
    def folder(self) -> Folder:
        """The table's folder (sidecars are confined to it)."""
        ...

    def names(self) -> list[str]:
        """The names of the files in ``_delta_log``."""
        ...

    def path(self, name: str) -> str:
        """The path (or URL) of ``_delta_log/<name>``, as :meth:`read` takes it."""
        ...

    def read(self, path: str) -> bytes:
        """The bytes of a file of the table (a path :meth:`path` or
        ``folder.path`` gave). Raises ``OSError``."""
        ...

    def parquet(self, path: str) -> Any:
        """Such a file as pyarrow reads Parquet from it (a path, a buffer)."""
        ...


class LocalLog:
    """The ``_delta_log`` of a local (or mounted) table folder."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder
        self._log = os.path.join(folder.root, "_delta_log")

    def names(self) -> list[str]:
        return os.listdir(self._log)

    def path(self, name: str) -> str:
        return os.path.join(self._log, name)

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def parquet(self, path: str) -> Any:
        return path  # pyarrow reads only the columns asked for

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.[0-9a-fA-F-]{36})?"
                         r"\.(parquet|json)$")


def _checkpoints(names: Iterable[str]) -> dict[int, list[str]]:
    """Per version, the files of one complete checkpoint (all parts of a multi-part one)."""
    found: dict[int, dict[str, list[str]]] = {}
    for name in names:
        m = _CHECKPOINT.match(name)
        if m is None:
            continue
        version = int(m.group(1))
        key = f"parts-{int(m.group(3))}" if m.group(3) else name
        found.setdefault(version, {}).setdefault(key, []).append(name)
    out = {}
    for version, kinds in found.items():
        for key, files in sorted(kinds.items()):
            if not key.startswith("parts-") or len(files) == int(key[6:]):
                out[version] = sorted(files)
                break
    return out


def _json_actions(log: LogFiles, path: str) -> Iterable[dict[str, Any]]:
    for line in log.read(path).decode("utf-8").splitlines():
        if line.strip():
            yield json.loads(line)


def _parquet_actions(log: LogFiles, path: str) -> Iterable[dict[str, Any]]:
    """The ``add`` actions (path and deletion vector only) and sidecars' adds of
    a checkpoint Parquet file."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = log.parquet(path)
    schema = pq.read_schema(source)
    columns = [c for c in ("add", "sidecar") if c in schema.names]
    table = pq.read_table(source, columns=columns)
    if "add" in columns:
        adds = table.column("add").combine_chunks()
        kept = adds.filter(pc.is_valid(adds))
        names = [f.name for f in kept.type]
        paths = kept.field(names.index("path")).to_pylist()
        dvs = kept.field(names.index("deletionVector")).to_pylist() \
            if "deletionVector" in names else [None] * len(paths)
        for p, dv in zip(paths, dvs, strict=True):
            yield {"add": {"path": p, "deletionVector": dv}}
    if "sidecar" in columns:
        for side in table.column("sidecar").to_pylist():
            if side is not None:
                yield from _sidecar(log, side)


def _sidecar(log: LogFiles, side: dict[str, Any]) -> Iterable[dict[str, Any]]:
    # Named by the log like a data file, so confined to the table like one.
    path = log.folder.path(side["path"], "checkpoint sidecar", base=log.path("_sidecars"))
    yield from _parquet_actions(log, path)


def _checkpoint_actions(log: LogFiles, files: list[str]) -> Iterable[dict[str, Any]]:
    for name in files:
        path = log.path(name)
        if name.endswith(".json"):  # a v2 checkpoint's top file
            for action in _json_actions(log, path):
                if "sidecar" in action:
                    yield from _sidecar(log, action["sidecar"])
                else:
                    yield action
        else:
            yield from _parquet_actions(log, path)


def deletion_descriptors(log: LogFiles, version: int, wanted: set[str],
                         key: Callable[[str], str], label: str
                         ) -> dict[str, dict[str, Any] | None]:
    """For each live file in ``wanted`` (each ``key(log path)``), its
    deletion-vector descriptor as the log holds it (None: no vector).

    Raises:
        UnreadableDeltaLog: a commit or checkpoint that does not parse, or a
            live file the log does not add.
        UnsafePath: a checkpoint sidecar outside the table's folder.
    """
    names = log.names()
    commits = {int(m.group(1)) for m in map(_COMMIT.match, names) if m}
    checkpoints = _checkpoints(names)
    found: dict[str, dict[str, Any] | None] = {}

    def take(actions: Iterable[dict[str, Any]]) -> None:
        for action in actions:
            add = action.get("add")
            if add is None:
                continue
            k = key(add["path"])
            if k in wanted and k not in found:
                found[k] = add.get("deletionVector")

    where = ""
    try:
        for v in range(version, -1, -1):
            if len(found) == len(wanted):
                break
            if v in checkpoints:
                where = f"checkpoint {v}"
                take(_checkpoint_actions(log, checkpoints[v]))
                break
            if v not in commits:
                break
            where = f"commit {v}"
            take(_json_actions(log, log.path(f"{v:020d}.json")))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UnreadableDeltaLog(f"table {label}: the Delta log's {where} cannot be read "
                                 f"for deletion vectors ({str(exc).splitlines()[0]})",
                                 hint="the log may be damaged or copied incompletely") from exc
    if len(found) != len(wanted):
        raise UnreadableDeltaLog(f"table {label}: the Delta log does not add "
                                 f"{len(wanted) - len(found)} of version {version}'s live "
                                 "file(s)", hint="the log may be copied incompletely")
    return found
