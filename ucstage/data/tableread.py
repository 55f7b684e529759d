"""Turning a row group's rows into what the dataset yields, and the checks
of ``format`` and ``fill_null``. A cached row group is read by
:func:`ucstage.tables.groupread.read_group` (one reader for the dataset, a
:class:`~ucstage.Mix` and the count of a filter's matches at freeze)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ..manifest.arrays import numbers
from ..tables.entries import group_entry
from ..tables.groupread import read_group

__all__ = ["FORMATS", "convert", "group_entry", "read_group"]

FORMATS = ("arrow", "torch", "numpy")


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
