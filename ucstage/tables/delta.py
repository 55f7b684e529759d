"""Delta table states read with delta-rs: a version's live files, partition
values, schema and row count, straight from the transaction log.

Spark (export) and :class:`~ucstage.TableDataset` are then given exactly
those files, never the folder (which also holds removed files). Tables whose
reader features a plain Parquet read cannot honour are refused by name:
deletion vectors (rows deleted in a side file, which plain Parquet reads
would resurrect) and column mapping (physical column names differ from the
logical ones).

deltalake is imported only inside functions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import ExportError, MissingDependency, TableNotFound, UnsupportedTable
from .names import WAREHOUSE_ENV

__all__ = ["TableState", "table_state"]

# Reader features a plain Parquet read of the live files honours.
_SAFE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
                         "variantType", "variantType-preview"}
_REFUSED = {
    "deletionVectors": "deletion vectors (deleted rows are recorded beside the Parquet files, "
                       "so reading the files would bring them back)",
    "columnMapping": "column mapping (Parquet column names differ from the table's)",
}


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
    sizes: list[int] = field(default_factory=list)
    """Each file's size in bytes, as the log records it (same order as ``files``)."""
    partition_values: list[dict[str, Any]] = field(default_factory=list)
    """Each file's partition values (column -> value as the log gives it), same order."""


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
                                   hint="read the table from a local or mounted path")
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
            f"table {label} uses {', '.join(refused)}, which ucstage cannot honour reading "
            f"the Parquet files without Delta support in Spark ({reasons})",
            hint="export through a server that reads Delta (SPARK_REMOTE=sc://HOST:PORT), or "
                 "rewrite the table without the feature (e.g. REORG TABLE ... APPLY (PURGE) "
                 "and disable it)",
        )
    if unknown:
        raise UnsupportedTable(
            f"table {label} needs Delta reader feature(s) {', '.join(unknown)}, "
            "which ucstage does not know how to honour",
            hint="export through a server that reads Delta (SPARK_REMOTE=sc://HOST:PORT)",
        )
    if protocol.min_reader_version > 3:
        raise UnsupportedTable(f"table {label} needs Delta reader version "
                               f"{protocol.min_reader_version}, newer than this supports")


def table_state(path: str, *, label: str | None = None, version: int | None = None
                ) -> TableState:
    """Read a version of the Delta table in folder ``path`` (default: the latest).

    ``label`` names the table in messages (its catalog name); default ``path``.

    Raises:
        TableNotFound: no Delta table there, or no such version.
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
        dt = deltalake.DeltaTable(path, version=version)
    except Exception as exc:
        what = f"version {version} of Delta table" if version is not None else "Delta table"
        raise TableNotFound(f"cannot open {what} {label} at {path}: "
                            f"{str(exc).splitlines()[0] if str(exc) else exc!r}") from exc
    _check_features(label, dt.protocol(), dict(dt.metadata().configuration or {}))
    actions = pa.table(dt.get_add_actions(flatten=True))
    parts = list(dt.metadata().partition_columns)
    rows = sorted(actions.to_pylist(), key=lambda a: _data_path(path, a["path"]))
    files = [_data_path(path, a["path"]) for a in rows]
    missing = [f for f in files if not os.path.isfile(f)]
    if missing:
        raise ExportError(
            f"table {label}: {len(missing)} data file(s) of version {dt.version()} are missing, "
            f"e.g. {missing[0]}", hint="the table was vacuumed or copied incompletely")
    num_records: int | None = None
    counts = [a.get("num_records") for a in rows]
    if all(c is not None for c in counts):
        num_records = int(sum(counts))  # type: ignore[arg-type]
    return TableState(
        path=path,
        version=int(dt.version()),
        files=files,
        partition_columns=parts,
        arrow_schema=pa.schema(dt.schema().to_arrow()),
        num_records=num_records,
        sizes=[int(a["size_bytes"]) for a in rows],
        partition_values=[{c: a.get(f"partition.{c}") for c in parts} for a in rows],
    )
