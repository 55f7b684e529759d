"""Reading one cached row group, and turning batches into what the dataset yields.

A row group's cache entry holds only its column chunks of the chosen
columns, one after another (``ucstage.volumes.RangeEntry``). pyarrow reads it
as the file's first bytes (:func:`_sparse`: each chunk at its own offset in
an untouched zero mapping), with the footer the manifest kept
(``ParquetFile(..., metadata=...)``): no footer is fetched, no other byte is
needed. The table is then conformed to the table's schema: a column a file
does not hold (added later) is null, a partition column is the log's value
in the column's type (:mod:`ucstage.tables.partvalues`). For a Delta table
the physical columns of a column-mapped file are renamed to the logical
ones (:mod:`ucstage.tables.colmap`), and the rows its deletion vector
deletes are dropped (:mod:`ucstage.tables.deletion`), so a row group yields
exactly the live rows the manifest counts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ..errors import CorruptParquet, InvalidArgument, SchemaMismatch, UnreadableDeltaLog
from ..manifest.arrays import numbers
from ..tables import RowGroupManifest, colmap, partvalues
from ..tables.deletion import deleted
from ..tables.entries import group_entry
from ..tables.footers import INT96_UNIT
from ..volumes import RangeEntry

__all__ = ["FORMATS", "convert", "group_entry", "read_group"]

FORMATS = ("arrow", "torch", "numpy")


def _sparse(path: str, ranges: Sequence[tuple[int, int]]) -> Any:
    """The file's bytes up to its last cached range, as one in-memory buffer:
    the cached ranges at their own offsets, zeros elsewhere. The zeros are
    never written (a fresh anonymous mapping), so only the chunks' pages
    become resident; pyarrow then reads it natively (and in parallel), and
    never uses a byte outside the chunks it was told of."""
    import numpy as np
    import pyarrow as pa

    end = max((off + n for off, n in ranges), default=0)
    memory = np.zeros(end, dtype=np.uint8)
    view = memoryview(memory)  # type: ignore[arg-type]
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
    return pa.BufferReader(pa.py_buffer(memory))


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
    ``pyarrow.Table`` of ``columns`` in the table's schema (its live rows)."""
    import pyarrow as pa

    f = int(manifest.file[group])
    held = manifest.file_columns(f, columns)
    n = int(manifest.rows_per_group[group])
    how = colmap.mode(manifest.schema)
    if held:
        buffer = _sparse(path, entry.ranges)
        file_schema = manifest.metadata(f).schema.to_arrow_schema() if how != "none" else None
        physical = [colmap.physical_top(manifest.schema, file_schema, c) for c in held]
        raw = _decode(manifest, group, buffer, physical)
        got = pa.table({c: _conformed(manifest, f, c, raw.column(p), how)
                        for c, p in zip(held, physical, strict=True)})
        stored = got.num_rows
    else:
        got = pa.table({"__n": pa.nulls(n)}).drop_columns(["__n"])
        stored = int(manifest.metadata(f).row_group(int(manifest.index[group])).num_rows) \
            if manifest.deletion_vectors and manifest.deletion_vectors[f] else n
    keep = _live(manifest, f, group, stored)
    if keep is not None and held:
        got = got.filter(keep)
    if held and got.num_rows != n:
        raise UnreadableDeltaLog(f"row group {int(manifest.index[group])} of "
                                 f"{manifest.files[f].path} has {got.num_rows} live rows, "
                                 f"its listing counted {n}",
                                 hint="the table's deletion vectors changed since it was "
                                      "frozen: freeze it again")
    out = []
    parts = manifest.partition_values[f] if manifest.partition_values else {}
    for name in columns:
        field = manifest.schema.field(name)
        if name in got.column_names:
            out.append(got.column(name))
        elif name in parts:
            out.append(partvalues.column(parts[name], field.type, n))
        else:
            out.append(pa.nulls(n, type=field.type))
    return pa.Table.from_arrays(out, schema=pa.schema([manifest.schema.field(c)
                                                       for c in columns]))


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


def check_fill_null(fill_null: Any) -> None:
    """Refuse a ``fill_null`` that is no scalar value (checked at construction;
    whether each column can hold it, by :func:`check_format` once the schema is known)."""
    if fill_null is None or isinstance(fill_null, (bool, int, float, str)):
        return
    import numpy as np

    if isinstance(fill_null, (np.integer, np.floating, np.bool_)):
        return
    raise InvalidArgument(f"fill_null must be a number, bool or str, got "
                          f"{type(fill_null).__name__} {fill_null!r}")


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


def _check_fill(schema: Any, columns: Sequence[str], fill_null: Any) -> None:
    import pyarrow as pa

    for name in columns:
        t = schema.field(name).type
        if pa.types.is_fixed_size_list(t):
            continue  # convert() leaves these as they are
        try:
            pa.scalar(fill_null).cast(t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise InvalidArgument(
                f"fill_null={fill_null!r} does not fit column {name!r} ({t}): "
                f"{str(exc).splitlines()[0]}",
                hint="pass a fill_null every chosen column can hold, or pick columns=...") \
                from None


def check_format(schema: Any, columns: Sequence[str], fmt: str, fill_null: Any) -> None:
    """Refuse up front what ``format`` cannot convert, naming the columns, and
    a ``fill_null`` a chosen column cannot hold."""
    import pyarrow as pa

    if fmt != "arrow" and fill_null is not None:
        _check_fill(schema, columns, fill_null)
    if fmt != "torch":
        return
    bad = []
    for name in columns:
        t = schema.field(name).type
        while pa.types.is_fixed_size_list(t):
            t = t.value_type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
            bad.append(f"{name} ({schema.field(name).type})")
    if bad:
        raise InvalidArgument(f'format="torch" takes numeric and fixed-size-list columns; '
                              f"not {', '.join(bad)}",
                              hint='pick columns=..., or use format="arrow" or "numpy"')


def _numpy(col: Any) -> Any:
    """An Arrow array as numpy, as ``to_numpy(zero_copy_only=False)`` makes
    it; numbers and booleans without nulls from their buffers, for
    ``to_numpy`` imports pandas when it is installed: seconds at the first
    batch of every DataLoader worker (:mod:`ucstage.manifest.arrays`)."""
    import numpy as np
    import pyarrow as pa

    t = col.type
    if not col.null_count:
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            arr = numbers(col)
            arr.flags.writeable = False  # a view of the batch's buffers, as to_numpy's
            return arr
        if pa.types.is_boolean(t):
            if not len(col):
                return np.zeros(0, dtype=bool)
            bits = np.frombuffer(col.buffers()[1], dtype=np.uint8)
            return np.unpackbits(bits, count=col.offset + len(col),
                                 bitorder="little")[col.offset:].astype(bool)
    return col.to_numpy(zero_copy_only=False)


def convert(batch: Any, fmt: str, fill_null: Any) -> Any:
    """A ``pyarrow.RecordBatch`` as the dataset yields it."""
    if fmt == "arrow":
        return batch
    import numpy as np
    import pyarrow as pa

    out = {}
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        if col.null_count:
            if fmt == "torch" and fill_null is None:
                raise InvalidArgument(f"column {name!r} has {col.null_count} null(s), which "
                                      'format="torch" cannot hold',
                                      hint="pass fill_null=VALUE, or pick other columns")
            if fill_null is not None:
                col = col.fill_null(pa.scalar(fill_null).cast(col.type)) \
                    if not pa.types.is_fixed_size_list(col.type) else col
        shape: list[int] = []
        t = col.type
        while pa.types.is_fixed_size_list(t):
            shape.append(t.list_size)
            t = t.value_type
        if shape:
            flat = col.flatten()
            for _ in shape[1:]:
                flat = flat.flatten()
            arr = _numpy(flat).reshape(len(col), *shape)
        else:
            arr = _numpy(col)
        if fmt == "torch":
            import torch

            arr = np.ascontiguousarray(arr)
            out[name] = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        else:
            out[name] = arr
    return out
