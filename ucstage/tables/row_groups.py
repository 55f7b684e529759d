"""The row-group listing: a table SOURCE resolved, its footers read once,
frozen into a :class:`~ucstage.manifest.rowgroups.RowGroupManifest`.

A Delta file's deletion vector is read here once, so each row group's rows
are its live rows (the vector's deleted rows in the group's range counted
off, no data read): the slot rule, ``len()``, resume and the audit all count
live rows. Column-mapped files' top-level columns are listed under their
logical names (:func:`ucstage.tables.colmap.logical_leaves`).

With a row filter (:mod:`ucstage.tables.filters`) only the row groups that
hold a matching row are listed: files are pruned by their partition values
and the Delta log's statistics before their footers are read (a Delta
table's schema is the log's; a folder's needs every footer), row groups by
their footers' statistics (:mod:`ucstage.tables.prune`); the filter's
columns of the rest are read and their matching rows counted
(:func:`ucstage.tables.groupread.count_matching`), so ``rows_per_group``
counts matching rows and a group with none is left out. The manifest
records the filter and what it pruned.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import UnreadableDeltaLog
from ..manifest.rowgroups import RowGroupManifest
from ..volumes.location import Fetch
from .colmap import logical_leaves, mode
from .deletion import deleted
from .filters import BoundFilter, RowFilter, row_filter
from .footers import FileFooter, read_footers, table_schema
from .groupread import count_matching
from .prune import can_match, file_guarantees, group_guarantees
from .resolve import TableSource, resolve_table

__all__ = ["from_footers", "row_groups", "select_groups"]


def row_groups(source: str | os.PathLike[str], *, version: int | None = None,
               filter: Any = None, fetch: Fetch | None = None) -> RowGroupManifest:
    """Every row group of a table SOURCE, frozen, with its fingerprint.

    ``source``: a folder of Parquet files (local, ``/Volumes/...``, an fsspec
    or object-store URL), an export destination (its record), a Delta table
    path or ``catalog.schema.table`` under ``$UCSTAGE_WAREHOUSE``.
    ``version``: a Delta version (default: the latest).
    ``filter``: a row filter (a ``pyarrow.compute.Expression`` or a string,
    :mod:`ucstage.tables.filters`): only row groups holding a matching row,
    each counting its matching rows.
    ``fetch``: how a Delta table on an object store has its deletion-vector
    files fetched (:func:`~ucstage.tables.resolve.resolve_table`).

    Raises:
        NotParquet, SchemaMismatch, TableNotFound, UnsupportedTable,
        SourceNotFound, EmptySource, InvalidArgument: each a one-line error.
        UnknownColumn: a filter naming a column the table lacks.
    """
    wanted = row_filter(filter)  # a bad filter string fails before anything is read
    table = resolve_table(source, version=version, fetch=fetch)
    if wanted is not None:
        return _filtered(table, wanted)
    footers = read_footers(table)
    return from_footers(table, footers, table_schema(table, footers))


def _filter_schema(schema: Any, bound: BoundFilter) -> Any:
    import pyarrow as pa

    return pa.schema([schema.field(c) for c in bound.columns])


def _filtered(table: TableSource, wanted: RowFilter) -> RowGroupManifest:
    """The row groups of ``table`` that hold a row ``wanted`` matches (see the
    module docstring)."""
    from dataclasses import replace

    files, size = len(table.files), sum(e.size for e in table.files)
    bound = None
    if table.schema is not None:  # the log's schema: prune files before their footers
        bound = wanted.bind(table.schema, table.source)
        keep = can_match(file_guarantees(table.partition_values, table.file_stats,
                                         table.schema, bound.columns),
                         bound.expression, _filter_schema(table.schema, bound))
        table = _keep_files(table, keep)
    footers = read_footers(table)
    schema = table_schema(table, footers)
    if bound is None:
        bound = wanted.bind(schema, table.source)
    listed = from_footers(table, footers, schema)
    manifest = replace(listed, filter=bound.header())
    manifest = select_groups(manifest, can_match(group_guarantees(manifest, bound.columns),
                                                 bound.expression,
                                                 _filter_schema(schema, bound)))
    counts = count_matching(manifest)
    manifest = select_groups(replace(manifest, rows_per_group=counts), counts > 0)
    pruned = {"files": [len(manifest.files), files],
              "row_groups": [manifest.row_groups, listed.row_groups],
              "bytes": [manifest.bytes, size]}
    return _with_fingerprint(replace(manifest, filter={**bound.header(), "pruned": pruned}))


def _keep_files(table: TableSource, keep: Any) -> TableSource:
    """``table`` with only the files ``keep`` marks (a bool per file)."""
    from dataclasses import replace

    def kept(values: list[Any]) -> list[Any]:
        return [v for v, k in zip(values, keep, strict=True) if k] if values else values

    stats = table.file_stats
    if stats is not None:
        import numpy as np

        stats = stats.take(np.flatnonzero(keep))
    return replace(table, files=kept(table.files), partition_values=kept(table.partition_values),
                   deletion_vectors=kept(table.deletion_vectors), file_stats=stats)


def select_groups(manifest: RowGroupManifest, keep: Any) -> RowGroupManifest:
    """``manifest`` with only the row groups ``keep`` marks (a bool per row
    group), and only the files that hold one; not fingerprinted."""
    from dataclasses import replace

    import numpy as np

    groups = np.flatnonzero(np.asarray(keep, dtype=bool))
    used = sorted({int(f) for f in manifest.file[groups]})
    number = np.zeros(len(manifest.files), dtype=np.int32)
    number[used] = np.arange(len(used), dtype=np.int32)
    lo, hi = manifest.chunk_start[groups], manifest.chunk_start[groups + 1]
    chunks = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]) \
        if len(groups) else np.zeros(0, dtype=np.int64)

    def of_files(values: list[Any]) -> list[Any]:
        return [values[f] for f in used] if values else values

    return replace(
        manifest, files=of_files(manifest.files),
        partition_values=of_files(manifest.partition_values), leaves=of_files(manifest.leaves),
        deletion_vectors=of_files(list(manifest.deletion_vectors)),
        footers={int(number[f]): manifest.footers[f] for f in used if f in manifest.footers},
        file=number[manifest.file[groups]], index=manifest.index[groups],
        rows_per_group=np.asarray(manifest.rows_per_group)[groups].astype(np.int64),
        chunk_start=np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64),
        chunk_column=manifest.chunk_column[chunks], chunk_offset=manifest.chunk_offset[chunks],
        chunk_length=manifest.chunk_length[chunks], path=None)


def from_footers(table: TableSource, footers: list[FileFooter], schema: Any
                 ) -> RowGroupManifest:
    """The manifest of ``table`` from its read footers and its schema."""
    import numpy as np

    file, index, rows, start = [], [], [], [0]
    col, off, length = [], [], []
    footer_bytes: dict[int, bytes] = {}
    vectors = list(table.deletion_vectors) or [None] * len(footers)
    for f, footer in enumerate(footers):
        md = footer.metadata
        if md.num_row_groups:
            footer_bytes[f] = footer.footer
        vector = vectors[f]
        gone = deleted(vector, footer.entry.path) if vector is not None else None
        if gone is not None and len(gone) and int(gone.max()) >= md.num_rows:
            raise UnreadableDeltaLog(
                f"{table.source}: the deletion vector of {footer.entry.path} deletes rows "
                f"past its {md.num_rows} rows",
                hint="the vector belongs to another file: the table may be damaged")
        at = 0
        for g in range(md.num_row_groups):
            file.append(f)
            index.append(g)
            stored = md.row_group(g).num_rows
            rows.append(stored - (gone.range_cardinality(at, at + stored)
                                  if gone is not None else 0))
            at += stored
            for c, (o, n) in enumerate(footer.ranges[g]):
                col.append(c)
                off.append(o)
                length.append(n)
            start.append(len(col))
    manifest = RowGroupManifest(
        source=table.source, kind=table.kind, table_version=table.table_version,
        volume_url=table.volume.url, files=list(table.files),
        partition_values=list(table.partition_values) or [{} for _ in table.files],
        leaves=[logical_leaves(schema, f.metadata.schema.to_arrow_schema(), f.leaves,
                               f"{table.source}: {f.entry.path}")
                if mode(schema) != "none" else f.leaves for f in footers], schema=schema,
        file=np.array(file, dtype=np.int32), index=np.array(index, dtype=np.int32),
        rows_per_group=np.array(rows, dtype=np.int64), chunk_start=np.array(start, dtype=np.int64),
        chunk_column=np.array(col, dtype=np.int32), chunk_offset=np.array(off, dtype=np.int64),
        chunk_length=np.array(length, dtype=np.int64), footers=footer_bytes,
        deletion_vectors=vectors if any(vectors) else [], refused=list(table.refused))
    return _with_fingerprint(manifest)


def _with_fingerprint(manifest: RowGroupManifest) -> RowGroupManifest:
    from dataclasses import replace

    return replace(manifest, fingerprint=manifest.compute_fingerprint())
