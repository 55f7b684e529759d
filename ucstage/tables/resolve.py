"""A table SOURCE resolved once: which Parquet files, from which volume, with
which schema and table version.

Three kinds, told apart in this order:

* ``delta``: a folder with ``_delta_log`` (a path or ``file://`` URL, or an
  ``s3://``, ``gs://``, ``az://``/``abfss://`` URL: :mod:`.storedelta`), or a
  ``catalog.schema.table`` name under ``$UCSTAGE_WAREHOUSE``. The live files
  of the latest version (or ``version=N``) come from the log; the log's
  schema is authoritative and partition values come from the log, as do
  each file's deletion vector and the column mapping (which the reader
  applies).
* ``export``: a folder holding an export record (``_ucstage_export.json``):
  its files, row count and Delta version.
* ``parquet``: any other folder, by any SOURCE form (local, ``/Volumes/...``,
  an fsspec or object-store URL): every listed file (names starting with
  ``_`` or ``.`` are not listed) is a Parquet file. Entries the listing
  refuses (a link out of the folder, a broken link) are left out by name
  (``TableSource.refused``), never silently.

The files are listed through :func:`ucstage.volumes.list_files`, so each
carries the change marker the cache stamps its copies with.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import EmptySource, InvalidArgument, MissingDataFiles, TableNotFound, UnsafePath
from ..manifest.arrays import int_array
from ..volumes import FileEntry, Volume, list_files, resolve
from ..volumes.listing import Listing
from ..volumes.location import Fetch
from .delta import TableState, table_state
from .logpaths import shown
from .names import WAREHOUSE_ENV, is_table_path, local_table_path, parse_table_name, warehouse_path
from .record import RECORD_NAME, ExportRecord
from .storedelta import StoreLog, has_log, inline_vectors

__all__ = ["KINDS", "StoreDelta", "TableSource", "open_store_delta", "resolve_table"]

KINDS = ("delta", "export", "parquet")


@dataclass(frozen=True)
class TableSource:
    """What a table SOURCE names, resolved (see the module docstring)."""

    source: str
    """The SOURCE as given."""
    kind: str
    """``delta``, ``export`` or ``parquet``."""
    volume: Volume
    """The folder the files are read from (and cached under)."""
    files: list[FileEntry]
    """The table's data files, paths relative to the volume, sorted."""
    table_version: int | None = None
    """The Delta version (``delta``; ``export`` when its record names one)."""
    schema: Any = None
    """The authoritative ``pyarrow.Schema`` (the Delta log's), or None: unify the footers'."""
    partition_values: list[dict[str, Any]] = field(default_factory=list)
    """Per file (``delta``), the partition values the log gives; else empty."""
    rows: int | None = None
    """Rows the source says it holds (the log's statistics, the record), if it says."""
    deletion_vectors: list[dict[str, Any] | None] = field(default_factory=list)
    """Per file (``delta``), its deletion-vector descriptor (resolved) or None; else empty."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of the entries the folder's listing refused (``parquet``):
    a link out of the folder, a broken link... Left out, and named by every
    reader's warning (``ucstage.volumes.listing.skip_messages``)."""
    file_stats: Any = None
    """Per file (``delta``), the log's statistics (``TableState.stats``), or None."""


def _is_name(source: str) -> bool:
    return not is_table_path(source) and source.count(".") >= 2 and \
        not os.path.exists(source)


def _local_folder(source: str) -> str | None:
    if source.startswith("file://") or "://" not in source:
        if source.startswith("/Volumes/"):
            return None  # resolved (and mapped) by ucstage.volumes
        return local_table_path(source)
    return None


def _select(volume: Volume, wanted: list[str], label: str, listing: Listing | None = None
            ) -> list[FileEntry]:
    """The listed entries of ``wanted`` relative paths (each must be listed;
    ``listing``: the volume's, hidden files included, if it was listed).

    Raises:
        UnsafePath: one the listing refused (a link out of the folder...), by name.
        MissingDataFiles: one that is not there.
    """
    listing = listing or list_files(volume, include_hidden=True)
    listed = {e.path: e for e in listing.entries}
    refused = dict(listing.refused)
    named = [p for p in wanted if p in refused]
    if named:
        raise UnsafePath(f"{label}: data file {shown(named[0])} is refused: "
                         f"{refused[named[0]]}" + (f" (and {len(named) - 1} more)"
                                                   if len(named) > 1 else ""),
                         hint="a table's files must be regular files inside its folder")
    missing = [p for p in wanted if p not in listed]
    if missing:
        raise MissingDataFiles(f"{label}: {len(missing)} data file(s) are missing, e.g. "
                               f"{missing[0]}", hint="the table was vacuumed or copied "
                                                     "incompletely")
    return sorted((listed[p] for p in wanted), key=lambda e: e.path)


def _delta(source: str, folder: str, label: str, version: int | None) -> TableSource:
    state = table_state(folder, label=label, version=version)
    volume = resolve(folder)
    rel = [os.path.relpath(f, folder).replace(os.sep, "/") for f in state.files]
    entries = _select(volume, rel, label)
    values = dict(zip(rel, state.partition_values or [{}] * len(rel), strict=True))
    vectors = dict(zip(rel, state.deletion_vectors or [None] * len(rel), strict=True))
    at = {p: i for i, p in enumerate(rel)}
    stats = None if state.stats is None else state.stats.take(
        _indices([at[e.path] for e in entries]))
    return TableSource(source, "delta", volume, entries, state.version, state.arrow_schema,
                       [values[e.path] for e in entries], state.num_records,
                       [vectors[e.path] for e in entries], file_stats=stats)


def _indices(rows: list[int]) -> Any:
    """Row numbers as an Arrow array for ``take`` (a list would go through
    ``pa.array()``, which imports pandas: a second of every freeze)."""
    import pyarrow as pa

    return int_array(rows, pa.int64())


@dataclass(frozen=True)
class StoreDelta:
    """A version of a Delta table on an object store (:mod:`.storedelta`),
    resolved from its log and its folder's listing alone: every data file
    and vector confined to the table and every data file listed, none of
    them read yet."""

    store: StoreLog
    state: TableState
    """The version; its ``files`` are URLs, its vectors not inlined yet."""
    entries: list[FileEntry]
    """The listed entry of each of ``state.files``, in that order."""

    @property
    def rel(self) -> list[str]:
        """Each data file's path in the table, in ``state.files``' order."""
        return [e.path for e in self.entries]


def open_store_delta(volume: Volume, label: str, version: int | None = None) -> StoreDelta:
    """The Delta table at ``volume`` (on an object store) at ``version``
    (default the latest), resolved without reading a data file or vector:
    what :func:`resolve_table` and export fetch through the cache afterwards.

    Raises:
        TableNotFound, UnreadableDeltaLog, UnsafePath, UnsupportedTable: as
            :func:`ucstage.tables.delta.table_state`.
        MissingDataFiles: a live file is not in the folder's listing (vacuumed).
    """
    store = StoreLog(volume, label)
    state = table_state(volume.url, label=label, version=version, store=store)
    rel = [store.folder.relative(f) for f in state.files]
    listed = {e.path: e for e in _select(volume, rel, label, store.listing)}
    return StoreDelta(store, state, [listed[p] for p in rel])


def _delta_store(source: str, volume: Volume, version: int | None,
                 fetch: Fetch | None) -> TableSource:
    """A Delta table on an object store (:mod:`.storedelta`)."""
    found = open_store_delta(volume, source, version)
    state, rel = found.state, found.rel
    vectors = inline_vectors(found.store, rel, state.deletion_vectors or [None] * len(rel),
                             fetch)
    values = dict(zip(rel, state.partition_values or [{}] * len(rel), strict=True))
    by_path = dict(zip(rel, vectors, strict=True))
    entries = sorted(found.entries, key=lambda e: e.path)
    return TableSource(source, "delta", volume, entries, state.version, state.arrow_schema,
                       [values[e.path] for e in entries], state.num_records,
                       [by_path[e.path] for e in entries])


def _record(volume: Volume) -> ExportRecord | None:
    try:
        raw = volume.fs.cat_file(volume.full_path(RECORD_NAME))
    except (OSError, ValueError):
        return None
    try:
        return ExportRecord.from_json(json.loads(raw))
    except ValueError:
        return None


def resolve_table(source: str | os.PathLike[str], *, version: int | None = None,
                  fetch: Fetch | None = None) -> TableSource:
    """Resolve a table SOURCE (see the module docstring).

    ``fetch``: how a Delta table on an object store has its deletion-vector
    files fetched (a dataset passes its cache's ``fetch``); without it they
    are read from the store, uncached.

    Raises:
        TableNotFound: a table name that is not under ``$UCSTAGE_WAREHOUSE``,
            or a Delta version that does not exist.
        UnreadableDeltaLog: a Delta log that does not parse.
        MissingDataFiles: files the log or record names are gone (vacuumed).
        UnsafePath: files the log or record names lie outside the folder (a
            ``..`` path, an absolute path elsewhere, a link out of it).
        UnsupportedTable: a Delta reader feature this reader does not know.
        SourceNotFound, EmptySource: no such folder, or no files in it.
        InvalidArgument: ``version`` for a source that is not a Delta table.
    """
    text = os.fspath(source)
    if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                or version < 0):
        raise InvalidArgument(f"version must be a Delta version (0 or more), got {version!r}")
    if _is_name(text):
        name = parse_table_name(text)
        folder = warehouse_path(name)
        if folder is None:
            raise TableNotFound(f"table {name} needs ${WAREHOUSE_ENV} to find its folder",
                                hint=f"set {WAREHOUSE_ENV} to the folder holding "
                                     "<catalog>/<schema>/<table>, or pass the table's path")
        return _delta(text, folder, str(name), version)
    local = _local_folder(text)
    if local is not None and os.path.isdir(os.path.join(local, "_delta_log")):
        return _delta(text, local, text, version)
    volume = resolve(text)
    if volume.is_local and not volume.file and \
            os.path.isdir(os.path.join(volume.root, "_delta_log")):
        # A /Volumes path (the FUSE mount, or mapped to a folder): its Delta log
        # rules which files are live, or removed files would be read too.
        return _delta(text, volume.root, text, version)
    if has_log(volume):
        return _delta_store(text, volume, version, fetch)
    if version is not None:
        raise InvalidArgument(f"version applies to Delta tables; {text} has no _delta_log")
    record = _record(volume) if not volume.file else None
    if record is not None:
        entries = _select(volume, [f["path"] for f in record.files], text)
        return TableSource(text, "export", volume, entries, record.delta_version,
                           partition_values=hive_values(entries), rows=record.row_count)
    listing = list_files(volume)
    entries = listing.entries
    if not entries:
        refused = listing.refused
        raise EmptySource(f"{text} holds no Parquet files" + (
            f" ({len(refused)} {'entry' if len(refused) == 1 else 'entries'} refused, e.g. "
            f"{shown(refused[0][0])}: {refused[0][1]})"
            if refused else ""), hint="files whose names start with _ or . are not listed")
    return TableSource(text, "parquet", volume, list(entries),
                       partition_values=hive_values(entries), refused=list(listing.refused))


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""The folder value Spark writes for a null partition value."""


def hive_values(entries: list[FileEntry]) -> list[dict[str, Any]]:
    """Per file, the ``COL=value`` folders of its path (``export --partition-by``
    writes them; the column then lives in the folder name, not the file), or
    empty when the files do not all name the same columns."""
    from urllib.parse import unquote

    found = []
    for e in entries:
        values: dict[str, Any] = {}
        for part in e.path.split("/")[:-1]:
            key, eq, value = part.partition("=")
            if eq and key:
                values[unquote(key)] = None if value == HIVE_NULL else unquote(value)
        found.append(values)
    if not found or not found[0] or any(f.keys() != found[0].keys() for f in found):
        return []
    return found
