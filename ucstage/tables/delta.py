"""Delta table states read with delta-rs: a version's live files, partition
values, schema and row count, straight from the transaction log.

Spark (export) and :class:`~ucstage.TableDataset` are then given exactly
those files, never the folder (which also holds removed files). Three reader
features change what a file's rows are: deletion vectors (rows deleted in a
side file), column mapping (physical column names differ from the logical
ones) and type widening (a file written before a column's type was widened
holds the narrower type). Both readers honour them from this state:
``TableDataset`` by :mod:`ucstage.tables.deletion` and
:mod:`ucstage.tables.colmap`, export by :mod:`ucstage.export.deltaread`
(Spark drops the deleted rows by row index, reads physical columns under
logical names, in the log's types). Reader features ucstage does not know
are refused by name.

deltalake is imported only inside functions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import (
    MissingDataFiles,
    MissingDependency,
    TableNotFound,
    UnreadableDeltaLog,
    UnsafePath,
    UnsupportedTable,
)
from ..manifest.arrays import int_array
from . import deletion, partvalues
from .colmap import MODE_KEY
from .deltalog import LocalLog, LogFiles, deletion_descriptors
from .logpaths import Folder, TableFolder
from .names import WAREHOUSE_ENV

__all__ = ["TableState", "table_state"]

# Reader features a plain Parquet read of the live files honours ...
_SAFE_READER_FEATURES = {"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck",
                         "variantType", "variantType-preview"}
# ... and those the readers apply from the state: the vectors, the schema's
# mapping, the log's types (TableDataset: colmap.to_logical; export: Spark's
# Parquet reader widens a narrower file type to the read schema's).
_APPLIED = {"deletionVectors", "columnMapping", "typeWidening", "typeWidening-preview"}


@dataclass(frozen=True)
class TableState:
    """One version of a Delta table, as delta-rs reads it (Delta calls this a snapshot)."""

    path: str
    """The table's folder (absolute, local), or its URL (a table on an object store)."""
    version: int
    files: list[str]
    """Absolute local paths (URLs, on a store) of the live data files, sorted
    (from the log's add actions), each inside ``path``
    (:class:`ucstage.tables.logpaths.TableFolder`, ``StoreFolder``)."""
    partition_columns: list[str]
    arrow_schema: Any
    """The table schema as a ``pyarrow.Schema`` (partition columns included)."""
    num_records: int | None
    """Rows in this version from the log's file statistics; None when a file has none."""
    sizes: list[int] = field(default_factory=list)
    """Each file's size in bytes, as the log records it (same order as ``files``)."""
    partition_values: list[dict[str, Any]] = field(default_factory=list)
    """Each file's partition values (column -> Arrow's text form of the value, or
    None), same order (:mod:`ucstage.tables.partvalues`)."""
    deletion_vectors: list[dict[str, Any] | None] = field(default_factory=list)
    """Each file's deletion-vector descriptor, resolved (``deletion.resolve``), or None."""
    column_mapping: str = "none"
    """``delta.columnMapping.mode``: ``none``, ``name`` or ``id``."""
    stats: Any = None
    """The log's file statistics, one row per file (same order): a pyarrow
    table of ``num_records`` and the ``min.C``, ``max.C`` and ``null_count.C``
    columns delta-rs gives (what a row filter prunes files by)."""


def _delta() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise MissingDependency("reading Delta tables here needs deltalake (delta-rs)",
                                hint="pip install 'ucstage[spark]'") from exc
    return deltalake


class StoreTable(LogFiles, Protocol):
    """A table on an object store, as :func:`table_state` reads it: its log's
    files, and how deltalake opens it
    (:class:`ucstage.tables.storedelta.StoreLog`)."""

    url: str
    """The URL deltalake opens."""
    options: dict[str, str]
    """deltalake's ``storage_options`` (:func:`ucstage.engines.objstore.delta_location`)."""

    def keep_clean(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` reading the store as the engine keeps this process clean."""
        ...


def _logged_file(folder: Folder, logged: str) -> str:
    """An ``add``'s file as :func:`table_state` names it, or "" for one it
    would refuse: older commits may add files no longer live, which are
    never read, so they fail nothing (every live file was checked)."""
    try:
        return folder.path(logged, "data file")
    except (UnsafePath, UnsupportedTable):
        return ""


def _check_features(label: str, protocol: Any, configuration: dict[str, str]) -> set[str]:
    """The table's reader features, checked: refused when ucstage does not know one."""
    features = set(protocol.reader_features or [])
    mode = configuration.get("delta.columnMapping.mode", "none").lower()
    if mode != "none":
        features.add("columnMapping")
    if mode not in ("none", "name", "id"):
        raise UnsupportedTable(f"table {label} has column mapping mode {mode!r}, which the "
                               "Delta protocol does not define")
    unknown = sorted(features - _SAFE_READER_FEATURES - _APPLIED)
    if unknown:
        raise UnsupportedTable(
            f"table {label} needs Delta reader feature(s) {', '.join(unknown)}, "
            "which ucstage does not know how to honour",
            hint="export through a server that reads Delta (SPARK_REMOTE=sc://HOST:PORT)",
        )
    if protocol.min_reader_version > 3:
        raise UnsupportedTable(f"table {label} needs Delta reader version "
                               f"{protocol.min_reader_version}, newer than this supports")
    return features


def _stable(schema: Any) -> Any:
    """``schema`` with every field's metadata in key order: delta-rs hands it
    over in hash order, which differs between opens, and the manifest's
    fingerprint covers the schema's bytes."""
    import pyarrow as pa

    def field(f: Any) -> Any:
        t = f.type
        if pa.types.is_struct(t):
            t = pa.struct([field(c) for c in t])
        elif pa.types.is_large_list(t):
            t = pa.large_list(field(t.value_field))
        elif pa.types.is_list(t):
            t = pa.list_(field(t.value_field))
        elif pa.types.is_map(t):
            t = pa.map_(field(t.key_field), field(t.item_field), keys_sorted=t.keys_sorted)
        meta = dict(sorted((f.metadata or {}).items())) or None
        return pa.field(f.name, t, f.nullable, meta)

    return pa.schema([field(f) for f in schema],
                     dict(sorted((schema.metadata or {}).items())) or None)


def _open(deltalake: Any, path: str, label: str, version: int | None,
          options: dict[str, str] | None = None) -> Any:
    """``DeltaTable`` of ``path`` at ``version``; a version that does not exist
    is :class:`TableNotFound`, a log that does not parse :class:`UnreadableDeltaLog`."""
    try:
        return deltalake.DeltaTable(path, version=version, storage_options=options)
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        failure = exc
    latest: int | None = None
    if version is not None:
        try:
            latest = int(deltalake.DeltaTable(path, storage_options=options).version())
        except Exception:
            latest = None
        if latest is not None and version > latest:
            raise TableNotFound(f"table {label} has no version {version} (its latest is "
                                f"{latest})", hint="pass an existing version") from failure
    if type(failure).__name__ == "TableNotFoundError":
        raise TableNotFound(f"cannot open Delta table {label} at {path}: {first}",
                            hint="its _delta_log holds no commits") from failure
    what = f"version {version} of Delta table" if version is not None else "Delta table"
    raise UnreadableDeltaLog(f"cannot read the log of {what} {label} at {path}: {first}",
                             hint="the log (a commit or checkpoint in _delta_log) may be "
                                  "damaged, written by a newer Delta version, or use what the "
                                  "reader (deltalake) cannot parse, such as a date partition "
                                  "column widened to timestamp_ntz") from failure


def _here(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def table_state(path: str, *, label: str | None = None, version: int | None = None,
                store: StoreTable | None = None) -> TableState:
    """Read a version of the Delta table in folder ``path`` (default: the latest).

    ``store``: the table is on an object store, ``path`` its URL; its log is
    read through ``store``, and its files' being
    there is left to the caller's listing.

    ``label`` names the table in messages (its catalog name); default ``path``.
    Deletion vectors are resolved (``num_records`` counts live rows), the
    column mapping mode named in the schema's metadata.

    Raises:
        TableNotFound: no Delta table there, or no such version.
        UnreadableDeltaLog: a log (or deletion-vector descriptor) that does not parse.
        MissingDataFiles: live files gone from the folder (vacuumed).
        UnsafePath: the log names a data file or deletion vector outside the
            table's folder (:mod:`ucstage.tables.logpaths`).
        UnsupportedTable: reader features ucstage does not know; a partition
            column whose type cannot be read.
    """
    import pyarrow as pa

    deltalake = _delta()
    label = label or path
    if store is None and not os.path.isdir(os.path.join(path, "_delta_log")):
        raise TableNotFound(
            f"table {label} not found: no Delta log at {path}",
            hint=f"check the name, or set {WAREHOUSE_ENV} to the folder holding "
                 "<catalog>/<schema>/<table>" if label != path else "check the path",
        )
    dt = _open(deltalake, store.url if store else path, label, version,
               store.options if store else None)
    configuration = dict(dt.metadata().configuration or {})
    features = _check_features(label, dt.protocol(), configuration)
    # Through the C stream, not pa.table(): that asks whether its argument is
    # a pandas DataFrame first, which imports pandas (a second of start-up).
    actions = pa.RecordBatchReader.from_stream(dt.get_add_actions(flatten=True)).read_all()
    # Each live file confined to the table before anything reads it (export
    # hands these to Spark). DeltaTable.file_uris() is not used: it
    # percent-encodes the root folder but not the rest, so it names no real
    # file when the root has a space.
    folder = store.folder if store is not None else TableFolder(path, label)
    local = [folder.path(p, "data file") for p in actions.column("path").to_pylist()]
    order = sorted(range(len(local)), key=local.__getitem__)
    actions = actions.take(int_array(order, pa.int64()))
    rows = actions.select([c for c in ("num_records", "size_bytes")
                           if c in actions.column_names]).to_pylist()
    parts = list(dt.metadata().partition_columns)
    files = [local[i] for i in order]
    missing = [] if store is not None else [f for f in files if not os.path.isfile(f)]
    if missing:
        raise MissingDataFiles(
            f"table {label}: {len(missing)} data file(s) of version {dt.version()} are "
            f"missing, e.g. {missing[0]}",
            hint="the table was vacuumed past this version, or copied incompletely: read "
                 "a later version, or copy the table again")
    schema = _stable(pa.schema(dt.schema().to_arrow()))
    mode = configuration.get("delta.columnMapping.mode", "none").lower()
    if mode != "none":
        schema = schema.with_metadata({**(schema.metadata or {}), MODE_KEY: mode.encode()})
    texts = {c: partvalues.as_text(actions.column(f"partition.{c}").combine_chunks()
                                   if f"partition.{c}" in actions.column_names
                                   else pa.nulls(len(rows)), schema.field(c).type, c, label)
             for c in parts}
    vectors: list[dict[str, Any] | None] = [None] * len(files)
    if "deletionVectors" in features:
        log: LogFiles = store if store is not None else LocalLog(folder)
        run = store.keep_clean if store is not None else _here
        found = run(deletion_descriptors, log, int(dt.version()), set(files),
                    lambda p: _logged_file(folder, p), label)
        vectors = [deletion.resolve(folder, d) if d else None
                   for d in (found[f] for f in files)]
    num_records: int | None = None
    counts = [a.get("num_records") for a in rows]
    if all(c is not None for c in counts):
        deleted = sum(v["cardinality"] for v in vectors if v)
        num_records = int(sum(counts)) - deleted  # type: ignore[arg-type]
    return TableState(
        path=path,
        version=int(dt.version()),
        files=files,
        partition_columns=parts,
        arrow_schema=schema,
        num_records=num_records,
        sizes=[int(a["size_bytes"]) for a in rows],
        partition_values=[{c: texts[c][i] for c in parts} for i in range(len(rows))],
        deletion_vectors=vectors,
        column_mapping=mode,
        stats=actions.select([c for c in actions.column_names if c == "num_records"
                              or c.startswith(("min.", "max.", "null_count."))]),
    )
