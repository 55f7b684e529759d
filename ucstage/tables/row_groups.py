"""The row-group listing: a table SOURCE resolved, its footers read once,
frozen into a :class:`~ucstage.manifest.rowgroups.RowGroupManifest`.

A Delta file's deletion vector is read here once, so each row group's rows
are its live rows (the vector's deleted rows in the group's range counted
off, no data read): the slot rule, ``len()``, resume and the audit all count
live rows. Column-mapped files' top-level columns are listed under their
logical names (:func:`ucstage.tables.colmap.logical_leaves`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ..errors import UnreadableDeltaLog
from ..manifest.rowgroups import RowGroupManifest
from .colmap import logical_leaves, mode
from .deletion import deleted
from .footers import FileFooter, read_footers, table_schema
from .resolve import TableSource, resolve_table

if TYPE_CHECKING:
    from ..cache import LocalCache

__all__ = ["from_footers", "row_groups"]


def row_groups(source: str | os.PathLike[str], *, version: int | None = None,
               cache: LocalCache | None = None) -> RowGroupManifest:
    """Every row group of a table SOURCE, frozen, with its fingerprint.

    ``source``: a folder of Parquet files (local, ``/Volumes/...``, an fsspec
    or object-store URL), an export destination (its record), a Delta table
    path or ``catalog.schema.table`` under ``$UCSTAGE_WAREHOUSE``.
    ``version``: a Delta version (default: the latest). ``cache``: where a
    Delta table on an object store has its deletion-vector files fetched
    (default: the default cache).

    Raises:
        NotParquet, SchemaMismatch, TableNotFound, UnsupportedTable,
        SourceNotFound, EmptySource, InvalidArgument: each a one-line error.
    """
    table = resolve_table(source, version=version, cache=cache)
    footers = read_footers(table)
    return from_footers(table, footers, table_schema(table, footers))


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
