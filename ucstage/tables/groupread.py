"""Reading a row group's rows: from its cached column chunks (what every
reader does) or from its chunks read at freeze (counting a filter's matches).

A row group's cache entry holds only its column chunks of the chosen
columns, one after another (``ucstage.volumes.RangeEntry``). pyarrow reads it
as the file's first bytes (:func:`_sparse`: each chunk at its own offset in
an otherwise unwritten buffer), with the footer the manifest kept
(``ParquetFile(..., metadata=...)``): no footer is fetched, no other byte is
needed. The table is then conformed to the table's schema: a column a file
does not hold (added later) is null, a partition column is the log's value
in the column's type (:mod:`ucstage.tables.partvalues`). For a Delta table
the physical columns of a column-mapped file are renamed to the logical
ones (:mod:`ucstage.tables.colmap`), and the rows its deletion vector
deletes are dropped (:mod:`ucstage.tables.deletion`). A listing made with a
row filter (:mod:`ucstage.tables.filters`) then keeps the rows it matches,
tested on the filter's columns (fetched with the chosen ones and dropped
after), so a row group yields exactly the rows the manifest counts.

:func:`count_matching` is that same read, of the filter's columns alone,
fetched straight from the source when the row groups are frozen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..engines import engine
from ..engines.engine import read_ranges
from ..errors import CorruptParquet, SchemaMismatch, UnreadableDeltaLog
from ..manifest.arrays import native
from ..manifest.rowgroups import RowGroupManifest
from ..volumes import RangeEntry
from . import colmap, partvalues
from .deletion import deleted
from .entries import group_entry
from .filters import bound_from_header
from .footers import FOOTER_THREADS, INT96_UNIT

__all__ = ["count_matching", "read_group"]


def _sparse(path: str, ranges: Sequence[tuple[int, int]]) -> Any:
    """The file's bytes up to its last cached range, as one in-memory buffer:
    the cached ranges at their own offsets, unwritten elsewhere (Arrow's
    own memory, :func:`ucstage.manifest.arrays.native`; a large allocation
    is a fresh mapping, so only the chunks' pages become resident); pyarrow
    then reads it natively (and in parallel), and never uses a byte outside
    the chunks it was told of."""
    import pyarrow as pa

    end = max((off + n for off, n in ranges), default=0)
    memory, view = native(end)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        at = 0
        for off, n in ranges:
            got = os.preadv(fd, [view[off:off + n]], at)
            if got != n:
                raise OSError(f"the cached row group {path} is short ({got} of {n} bytes)")
            at += n
    finally:
        os.close(fd)
    return pa.BufferReader(memory)


def _live(manifest: RowGroupManifest, f: int, group: int, rows: int) -> Any:
    """The keep mask of row group ``group``'s ``rows`` stored rows under file
    ``f``'s deletion vector (a pyarrow boolean array), or None: no vector."""
    import numpy as np
    import pyarrow as pa

    vector = manifest.deletion_vectors[f] if manifest.deletion_vectors else None
    if vector is None:
        return None
    md = manifest.metadata(f)
    index = int(manifest.index[group])
    start = sum(md.row_group(i).num_rows for i in range(index))
    gone = deleted(vector, manifest.files[f].path)
    keep = np.ones(rows, dtype=bool)
    lo = gone.rank(start - 1) if start else 0  # rank(x): deleted rows <= x
    hi = gone.rank(start + rows - 1) if rows else lo
    if hi > lo:
        keep[np.asarray(gone[lo:hi].to_array(), dtype=np.int64) - start] = False
    # from its bits: pa.array() of a numpy array imports pandas when installed
    bits = np.packbits(keep, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), rows, [None, pa.py_buffer(bits)])


def read_group(manifest: RowGroupManifest, group: int, path: str, entry: RangeEntry,
               columns: Sequence[str]) -> Any:
    """Row group ``group`` read from its cache entry at ``path``, as a
    ``pyarrow.Table`` of ``columns`` in the table's schema: its live rows,
    those the listing's filter matches (as many as the manifest counts)."""
    f = int(manifest.file[group])
    n = int(manifest.rows_per_group[group])
    table = _rows(manifest, group, lambda: _sparse(path, entry.ranges),
                  manifest.fetched_columns(columns) or [])
    if table.num_rows != n:
        what = "matching" if manifest.filter else "live"
        raise UnreadableDeltaLog(f"row group {int(manifest.index[group])} of "
                                 f"{manifest.files[f].path} has {table.num_rows} {what} "
                                 f"rows, its listing counted {n}",
                                 hint="the table's deletion vectors changed since it was "
                                      "frozen: freeze it again")
    return table.select(list(columns))


def _rows(manifest: RowGroupManifest, group: int, buffer: Callable[[], Any],
          wanted: Sequence[str]) -> Any:
    """Columns ``wanted`` of row group ``group`` (their chunks' bytes from
    ``buffer()``): its live rows, filtered by the listing's filter."""
    import pyarrow as pa

    f = int(manifest.file[group])
    index = int(manifest.index[group])
    held = manifest.file_columns(f, wanted)
    how = colmap.mode(manifest.schema)
    stored = int(manifest.metadata(f).row_group(index).num_rows)
    got = None
    if held:
        file_schema = manifest.metadata(f).schema.to_arrow_schema() if how != "none" else None
        physical = [colmap.physical_top(manifest.schema, file_schema, c) for c in held]
        raw = _decode(manifest, group, buffer(), physical)
        got = pa.table({c: _conformed(manifest, f, c, raw.column(p), how)
                        for c, p in zip(held, physical, strict=True)})
        stored = got.num_rows
    keep = _live(manifest, f, group, stored)
    live = stored if keep is None else keep.true_count
    if keep is not None and got is not None:
        got = got.filter(keep)
    out = []
    parts = manifest.partition_values[f] if manifest.partition_values else {}
    for name in wanted:
        field = manifest.schema.field(name)
        if got is not None and name in got.column_names:
            out.append(got.column(name))
        elif name in parts:
            out.append(partvalues.column(parts[name], field.type, live))
        else:
            out.append(pa.nulls(live, type=field.type))
    table = pa.Table.from_arrays(out, schema=pa.schema([manifest.schema.field(c)
                                                        for c in wanted]))
    expression = _expression(manifest)
    return table if expression is None else table.filter(expression)


_FILTERS: dict[int, tuple[RowGroupManifest, Any]] = {}


def _expression(manifest: RowGroupManifest) -> Any:
    """The listing's filter expression (parsed once per manifest), or None."""
    if not manifest.filter:
        return None
    found = _FILTERS.get(id(manifest))
    if found is None or found[0] is not manifest:
        if len(_FILTERS) > 256:
            _FILTERS.clear()
        found = (manifest, bound_from_header(manifest.filter).expression)
        _FILTERS[id(manifest)] = found
    return found[1]


def count_matching(manifest: RowGroupManifest) -> Any:
    """Per row group, the live rows the listing's filter matches (int64),
    from its filter columns' chunks alone, read from the source (on the
    object-store engine in a child process, as the footers are)."""
    return engine.of(manifest.volume()).keep_clean(_count_all, manifest)


def _count_all(manifest: RowGroupManifest) -> Any:
    import numpy as np

    volume = manifest.volume()
    columns = manifest.filter_columns

    def count(group: int) -> int:
        entry = group_entry(manifest, group, columns)
        f = int(manifest.file[group])

        def buffer() -> Any:
            blobs, _ = read_ranges(volume, manifest.files[f].path, list(entry.ranges),
                                   version=manifest.files[f].version)
            return _in_memory(entry.ranges, blobs)

        return int(_rows(manifest, group, buffer, columns).num_rows)

    groups = range(manifest.row_groups)
    if volume.is_local:
        counts = [count(g) for g in groups]
    else:
        with ThreadPoolExecutor(FOOTER_THREADS) as pool:
            counts = list(pool.map(count, groups))
    return np.array(counts, dtype=np.int64)


def _in_memory(ranges: Sequence[tuple[int, int]], blobs: Sequence[bytes]) -> Any:
    """The chunks ``blobs`` at their own offsets in an otherwise zero buffer
    (what :func:`_sparse` makes of a cached entry)."""
    import pyarrow as pa

    end = max((off + n for off, n in ranges), default=0)
    memory, view = native(end)
    for (off, n), blob in zip(ranges, blobs, strict=True):
        view[off:off + n] = memoryview(blob).cast("B")[:n]
    return pa.BufferReader(memory)


def _conformed(manifest: RowGroupManifest, f: int, name: str, column: Any, how: str) -> Any:
    """File ``f``'s ``column`` as the table's column ``name``
    (:func:`ucstage.tables.colmap.to_logical`: renamed, cast to the table's
    types); values that do not fit are one :class:`SchemaMismatch` naming the file."""
    import pyarrow as pa

    field = manifest.schema.field(name)
    try:
        return pa.chunked_array([colmap.to_logical(chunk, field, how) for chunk in column.chunks],
                                type=field.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        # Arrow's message is left out: it quotes the value that does not fit.
        raise SchemaMismatch(f"{manifest.source}: {manifest.files[f].path}: column {name!r} "
                             f"is {column.type} there, whose values do not all read as the "
                             f"table's {field.type}",
                             hint="the file does not match the table's schema: rewrite it "
                                  "with a Delta engine") from exc


def _decode(manifest: RowGroupManifest, group: int, buffer: Any, held: list[str]) -> Any:
    """Columns ``held`` of row group ``group`` decoded from ``buffer``; pages
    that do not decode are one :class:`CorruptParquet` naming the file, the
    row group and the first column that fails."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    f, index = int(manifest.file[group]), int(manifest.index[group])

    def read(columns: list[str]) -> Any:
        pf = pq.ParquetFile(buffer, metadata=manifest.metadata(f),
                            coerce_int96_timestamp_unit=INT96_UNIT)
        return pf.read_row_group(index, columns=columns)

    try:
        return read(held)
    except (pa.ArrowException, OSError, ValueError, KeyError, IndexError) as exc:
        error = exc
    # Which column: each alone (only on this failing path).
    for name in held:
        try:
            read([name])
        except (pa.ArrowException, OSError, ValueError, KeyError, IndexError) as exc:
            name_error = exc
            break
    else:
        name, name_error = ", ".join(held), error
    first = str(name_error).splitlines()[0] if str(name_error) else type(name_error).__name__
    raise CorruptParquet(f"{manifest.source}: {manifest.files[f].path}: row group {index}, "
                         f"column {name!r} does not decode ({first})",
                         hint="the file is damaged or its footer misstates its pages: "
                              "rewrite the file") from error
