"""Which files and row groups of a table can hold a row a filter keeps.

Each file, then each row group, gets a *guarantee*: an expression every one
of its rows satisfies, from what is known without reading its data: the
partition values (the Delta log's, or ``COL=value`` folders), the Delta
log's per-file ``stats`` and the Parquet footers' row-group statistics
(min, max, null count). pyarrow decides whether the filter can be true
under a guarantee (``FileSystemDataset.get_fragments(filter=...)``, the
simplification ``pyarrow.dataset`` prunes with), so a file or row group is
left out only when no row of it can match.

What is not known is left out of the guarantee, which keeps the unit:

* a column without statistics, or without a min and max (all nulls is known
  from the null count);
* a null count that is missing: the guarantee then allows nulls;
* floating-point columns: statistics leave NaN out, and ``not (x < 1)``
  holds for a NaN;
* a file's column whose type differs from the table's (a timestamp of
  another unit, a decimal of another scale), except integers widened;
* the Delta log's string maximum, which writers truncate, and its timestamp
  maximum, kept to the millisecond (widened by a millisecond here);
* a partition folder's value for a column the file holds itself.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

__all__ = ["can_match", "file_guarantees", "group_guarantees"]

_DELTA_TIMESTAMP_STEP = datetime.timedelta(milliseconds=1)
"""How far below a value the Delta log's timestamp maximum may be (kept to the ms)."""


def _prunable(kind: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_integer(kind) or pa.types.is_date(kind) or pa.types.is_timestamp(kind)
            or pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_decimal(kind) or pa.types.is_boolean(kind))


def _same(file_type: Any, table_type: Any) -> bool:
    """A file's statistics are the table's values: the same type, or integers widened."""
    import pyarrow as pa

    if file_type == table_type:
        return True
    return pa.types.is_integer(file_type) and pa.types.is_integer(table_type)


def _scalar(value: Any, kind: Any) -> Any:
    """``value`` as a scalar of ``kind``, or None when it is not one."""
    import pyarrow as pa

    if value is None:
        return None
    try:
        return pa.scalar(value, type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError,
            ValueError, TypeError):
        return None


def _bounds(name: str, low: Any, high: Any, nulls: int | None, rows: int | None) -> Any:
    """The guarantee of one column: its values within [low, high] (either may
    be None: unbounded), or null when the null count says it may be."""
    import pyarrow.compute as pc

    field = pc.field(name)
    if nulls is not None and rows is not None and rows > 0 and nulls >= rows:
        return field.is_null()
    parts = [c for c in ((field >= low) if low is not None else None,
                         (field <= high) if high is not None else None) if c is not None]
    if not parts:
        return None
    inside = parts[0] if len(parts) == 1 else parts[0] & parts[1]
    return inside if nulls == 0 else inside | field.is_null()


def _all(parts: Sequence[Any]) -> Any:
    found = [p for p in parts if p is not None]
    if not found:
        return None
    out = found[0]
    for p in found[1:]:
        out = out & p
    return out


def _partition(values: dict[str, Any], columns: Sequence[str], schema: Any,
               held: Sequence[str] = ()) -> list[Any]:
    """One file's partition values of ``columns`` as guarantees (a column the
    file holds itself is read from the file, so its folder says nothing)."""
    import pyarrow.compute as pc

    from .partvalues import column

    out = []
    for name in columns:
        if name not in values or name in held:
            continue
        if values[name] is None:
            out.append(pc.field(name).is_null())
            continue
        one = column(values[name], schema.field(name).type, 1)
        out.append(pc.field(name) == one[0])
    return out


def file_guarantees(partition_values: Sequence[dict[str, Any]], stats: Any, schema: Any,
                    columns: Sequence[str]) -> list[Any]:
    """Per file, what its partition values and the Delta log's ``stats`` (a
    table of the log's ``num_records``, ``min.C``, ``max.C``, ``null_count.C``
    columns, one row per file, or None) guarantee of ``columns``."""
    import pyarrow as pa

    n = len(partition_values)
    have = set(stats.column_names) if stats is not None else set()
    per_column: dict[str, list[Any]] = {}
    records = stats.column("num_records").to_pylist() if "num_records" in have else [None] * n
    for name in columns:
        kind = schema.field(name).type
        if f"min.{name}" not in have or not _prunable(kind) or "." in name:
            continue
        low = stats.column(f"min.{name}").to_pylist()
        high = stats.column(f"max.{name}").to_pylist() if f"max.{name}" in have else [None] * n
        nulls = stats.column(f"null_count.{name}").to_pylist() \
            if f"null_count.{name}" in have else [None] * n
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            high = [None] * n  # truncated by writers: no upper bound
        elif pa.types.is_timestamp(kind):
            high = [h + _DELTA_TIMESTAMP_STEP if isinstance(h, datetime.datetime) and
                    h < datetime.datetime.max - _DELTA_TIMESTAMP_STEP else None for h in high]
        per_column[name] = [
            _bounds(name, _scalar(lo, kind), _scalar(hi, kind),
                    None if nc is None else int(nc), None if r is None else int(r))
            if lo is not None or (nc is not None and r is not None and nc >= r) else None
            for lo, hi, nc, r in zip(low, high, nulls, records, strict=True)]
    return [_all([*_partition(partition_values[f], columns, schema),
                  *(g[f] for g in per_column.values())]) for f in range(n)]


def group_guarantees(manifest: Any, columns: Sequence[str]) -> list[Any]:
    """Per row group of ``manifest``, what its file's partition values and its
    footer's statistics guarantee of ``columns``."""
    from .colmap import physical_top
    from .footers import arrow_schema

    schema = manifest.schema
    out: list[Any] = []
    files: dict[int, tuple[list[Any], dict[str, tuple[int, Any]]]] = {}
    for g in range(manifest.row_groups):
        f = int(manifest.file[g])
        if f not in files:
            if f not in manifest.footers:
                files[f] = ([], {})
            else:
                md = manifest.metadata(f)
                held = manifest.file_columns(f, columns)
                file_schema = arrow_schema(md)
                leaves = manifest.leaves[f]
                # column -> (its leaf index, the file's type): top-level leaves only
                found = {}
                for name in held:
                    # a top-level leaf (no struct or list above it), of a type pruned by
                    if name in leaves and _prunable(schema.field(name).type):
                        top = physical_top(schema, file_schema, name)
                        kind = file_schema.field(top).type
                        if _same(kind, schema.field(name).type):
                            found[name] = (leaves.index(name), kind)
                parts = _partition(manifest.partition_values[f] if manifest.partition_values
                                   else {}, columns, schema, held)
                files[f] = (parts, found)
        parts, found = files[f]
        if not found:
            out.append(_all(parts))
            continue
        rg = manifest.metadata(f).row_group(int(manifest.index[g]))
        out.append(_all([*parts, *(_group_bounds(rg, name, i, schema.field(name).type)
                                   for name, (i, _) in found.items())]))
    return out


def _group_bounds(rg: Any, name: str, leaf: int, kind: Any) -> Any:
    try:
        stats = rg.column(leaf).statistics
    except (ValueError, OSError):
        return None
    if stats is None:
        return None
    nulls = int(stats.null_count) if stats.has_null_count else None
    try:
        low, high = (stats.min, stats.max) if stats.has_min_max else (None, None)
    except (ValueError, UnicodeDecodeError):  # bytes that are no text of the type
        low, high = None, None
    return _bounds(name, _scalar(low, kind), _scalar(high, kind), nulls, int(rg.num_rows))


def can_match(guarantees: Sequence[Any], expression: Any, schema: Any) -> Any:
    """Per unit, whether ``expression`` can hold for a row under its guarantee
    (None: nothing known, kept), as a numpy bool array."""
    import numpy as np
    import pyarrow.dataset as ds
    from pyarrow import fs

    keep = np.ones(len(guarantees), dtype=bool)
    known = [i for i, g in enumerate(guarantees) if g is not None]
    if not known:
        return keep
    fmt = ds.ParquetFileFormat()
    local = fs.LocalFileSystem()
    # Fragments named by their unit's number; nothing is opened: pyarrow only
    # simplifies the filter under each fragment's guarantee.
    fragments = [fmt.make_fragment(f"/{i}", filesystem=local,
                                   partition_expression=guarantees[i]) for i in known]
    dataset = ds.FileSystemDataset(fragments, schema, fmt, local)
    kept = {int(f.path[1:]) for f in dataset.get_fragments(filter=expression)}
    keep[[i for i in known if i not in kept]] = False
    return keep
