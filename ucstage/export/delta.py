"""Delta table names, the local warehouse, and table states read with delta-rs.

Table names are ``catalog.schema.table``. Each part is a plain identifier
(letters, digits, ``_``, not starting with a digit) or a backtick-quoted one
(any characters but ``/`` and NUL; a backtick inside is written twice, as in
Spark SQL). Anything else is refused before it reaches Spark: a name is never
passed on as SQL text, only re-quoted part by part.

A TABLE argument containing ``/`` (or a ``file://`` URL) is a Delta table path.

Where the Spark server cannot read Delta itself (the embedded server: no Delta
jars here), ``$UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>`` is the table's
folder, and :func:`table_state` reads its transaction log with delta-rs: the
latest version, its live data files, partition columns, schema and row count.
Spark is then given exactly those files, never the folder (which also holds
removed files).
Tables whose reader features this path cannot honour are refused by name:
deletion vectors (rows deleted in a side file, which plain Parquet reads would
resurrect) and column mapping (physical column names differ from the logical
ones).

deltalake is imported only inside functions.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import (
    ExportError,
    InvalidArgument,
    MissingDependency,
    TableNotFound,
    UnsupportedTable,
)

__all__ = [
    "WAREHOUSE_ENV",
    "TableName",
    "TableState",
    "is_table_path",
    "local_table_path",
    "parse_table_name",
    "table_state",
    "warehouse_path",
]

WAREHOUSE_ENV = "UCSTAGE_WAREHOUSE"

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Reader features a plain Parquet read of the live files honours.
_SAFE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
                         "variantType", "variantType-preview"}
_REFUSED = {
    "deletionVectors": "deletion vectors (deleted rows are recorded beside the Parquet files, "
                       "so reading the files would bring them back)",
    "columnMapping": "column mapping (Parquet column names differ from the table's)",
}


@dataclass(frozen=True)
class TableName:
    """A validated three-part table name."""

    catalog: str
    schema: str
    table: str

    @property
    def parts(self) -> tuple[str, str, str]:
        return (self.catalog, self.schema, self.table)

    def quoted(self) -> str:
        """The name for Spark SQL: every part backtick-quoted, backticks doubled."""
        return ".".join("`" + p.replace("`", "``") + "`" for p in self.parts)

    def __str__(self) -> str:
        return ".".join(p if _PLAIN.fullmatch(p) else "`" + p.replace("`", "``") + "`"
                        for p in self.parts)


def _bad(name: str, why: str) -> InvalidArgument:
    return InvalidArgument(
        f"invalid table name {name!r}: {why}",
        hint="use catalog.schema.table (letters, digits, _; quote other names in backticks, "
             "e.g. main.`my-schema`.events), or a Delta table path containing /",
    )


def parse_table_name(name: str) -> TableName:
    """Parse and validate ``catalog.schema.table``.

    Raises:
        InvalidArgument: not exactly three valid parts.
    """
    parts: list[str] = []
    i, n = 0, len(name)
    while True:
        if i < n and name[i] == "`":
            j, buf = i + 1, []
            while True:
                if j >= n:
                    raise _bad(name, "unterminated backtick")
                if name[j] == "`":
                    if j + 1 < n and name[j + 1] == "`":
                        buf.append("`")
                        j += 2
                        continue
                    break
                buf.append(name[j])
                j += 1
            part = "".join(buf)
            if not part.strip():
                raise _bad(name, "an empty quoted part")
            if "/" in part or "\x00" in part or part in (".", ".."):
                raise _bad(name, f"part {part!r} cannot name a folder")
            i = j + 1
        else:
            m = _PLAIN.match(name, i)
            if m is None:
                where = f"at {name[i:i + 10]!r}" if i < n else "at the end"
                raise _bad(name, f"expected an identifier or a `quoted` part {where}")
            part = m.group(0)
            i = m.end()
        parts.append(part)
        if i == n:
            break
        if name[i] != ".":
            raise _bad(name, f"unexpected {name[i]!r} after {part!r}")
        i += 1
    if len(parts) != 3:
        raise _bad(name, f"{len(parts)} part{'s' if len(parts) != 1 else ''}, "
                         "expected catalog.schema.table")
    return TableName(*parts)


def is_table_path(table: str) -> bool:
    """A TABLE argument is a path when it has a ``/`` outside backticks or is a URL."""
    if "://" in table:
        return True
    return "/" in re.sub(r"`(?:[^`]|``)*`", "", table)


def local_table_path(table: str) -> str:
    """An absolute local folder for a Delta table path or ``file://`` URL.

    Raises:
        InvalidArgument: an object-store URL (Spark here has no s3a/gcs/abfs).
    """
    if table.startswith("file://"):
        return os.path.abspath(unquote(urlparse(table).path))
    if "://" in table:
        raise InvalidArgument(
            f"cannot export {table}: Spark here reads only local or mounted paths",
            hint="give the table's catalog name to a Spark Connect server that reads Delta "
                 "(SPARK_REMOTE=sc://HOST:PORT), or export from a local or mounted copy of "
                 "the table",
        )
    return os.path.abspath(os.path.expanduser(table))


def warehouse_path(name: TableName) -> str | None:
    """``$UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>``, or None when the variable is unset."""
    root = os.environ.get(WAREHOUSE_ENV, "")
    if not root:
        return None
    return os.path.join(local_table_path(root) if "://" in root else os.path.abspath(root),
                        *name.parts)


@dataclass(frozen=True)
class TableState:
    """One version of a Delta table, as delta-rs reads it (Delta calls this a snapshot)."""

    path: str
    """The table's folder (absolute, local)."""
    version: int
    files: list[str]
    """Absolute local paths of the live data files, sorted (from the log's add actions)."""
    partition_columns: list[str]
    arrow_schema: Any
    """The table schema as a ``pyarrow.Schema`` (partition columns included)."""
    num_records: int | None
    """Rows in this version from the log's file statistics; None when a file has none."""


def _delta() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependency("reading Delta tables here needs deltalake (delta-rs)",
                                hint="pip install 'ucstage[spark]'") from exc
    return deltalake


def _data_path(root: str, logged: str) -> str:
    """The local path of a data file from its path in the Delta log.

    The log stores paths URI-encoded (a partition folder ``name=a%20b`` on disk is
    ``name=a%2520b`` in the log), relative to the table root or absolute URIs.
    ``DeltaTable.file_uris()`` is not used: it percent-encodes the root folder
    but not the rest, so it names no real file when the root has a space.
    """
    if "://" in logged:
        parsed = urlparse(logged)
        if parsed.scheme != "file":
            raise UnsupportedTable(f"data file {logged} is not on a local or mounted filesystem",
                                   hint="Spark here reads only local paths")
        return unquote(parsed.path)
    return os.path.join(root, *unquote(logged).split("/"))


def _check_features(label: str, protocol: Any, configuration: dict[str, str]) -> None:
    features = set(protocol.reader_features or [])
    mode = configuration.get("delta.columnMapping.mode", "none").lower()
    if mode != "none":
        features.add("columnMapping")
    refused = sorted(f for f in features if f in _REFUSED)
    unknown = sorted(f for f in features if f not in _REFUSED and f not in _SAFE_READER_FEATURES)
    if refused:
        reasons = "; ".join(f"{f}: {_REFUSED[f]}" for f in refused)
        raise UnsupportedTable(
            f"table {label} uses {', '.join(refused)}, which export cannot honour without "
            f"Delta support in Spark ({reasons})",
            hint="export through a server that reads Delta (SPARK_REMOTE=sc://HOST:PORT), or "
                 "rewrite the table without the feature (e.g. REORG TABLE ... APPLY (PURGE) "
                 "and disable it)",
        )
    if unknown:
        raise UnsupportedTable(
            f"table {label} needs Delta reader feature(s) {', '.join(unknown)}, "
            "which export does not know how to honour",
            hint="export through a server that reads Delta (SPARK_REMOTE=sc://HOST:PORT)",
        )
    if protocol.min_reader_version > 3:
        raise UnsupportedTable(f"table {label} needs Delta reader version "
                               f"{protocol.min_reader_version}, newer than this supports")


def table_state(path: str, *, label: str | None = None) -> TableState:
    """Read the latest version of the Delta table in folder ``path``.

    ``label`` names the table in messages (its catalog name); default ``path``.

    Raises:
        TableNotFound: no Delta table there.
        UnsupportedTable: reader features this path cannot honour.
    """
    import pyarrow as pa

    deltalake = _delta()
    label = label or path
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        raise TableNotFound(
            f"table {label} not found: no Delta log at {path}",
            hint=f"check the name, or set {WAREHOUSE_ENV} to the folder holding "
                 "<catalog>/<schema>/<table>" if label != path else "check the path",
        )
    try:
        dt = deltalake.DeltaTable(path)
    except Exception as exc:
        raise TableNotFound(f"cannot open Delta table {label} at {path}: {exc}") from exc
    _check_features(label, dt.protocol(), dict(dt.metadata().configuration or {}))
    actions = pa.table(dt.get_add_actions(flatten=True))
    files = sorted(_data_path(path, p) for p in actions.column("path").to_pylist())
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ExportError(
            f"table {label}: {len(missing)} data file(s) of version {dt.version()} are missing, "
            f"e.g. {missing[0]}", hint="the table was vacuumed or copied incompletely")
    num_records: int | None = None
    if "num_records" in actions.column_names:
        counts = actions.column("num_records").to_pylist()
        if all(c is not None for c in counts):
            num_records = int(sum(counts))
    return TableState(
        path=path,
        version=int(dt.version()),
        files=files,
        partition_columns=list(dt.metadata().partition_columns),
        arrow_schema=pa.schema(dt.schema().to_arrow()),
        num_records=num_records,
    )
