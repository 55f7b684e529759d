"""Partition values: one text form in the manifest, the column's own type in batches.

A Delta log stores a file's partition values as text, delta-rs hands them
over typed (``get_add_actions(flatten=True)``), Hive folders (``COL=value``)
name them as text. The manifest keeps every value as Arrow's text form of
the value (``None`` for null), checked at freeze to turn back into the same
value of the column's type (:func:`as_text`); a batch's partition column is
then that text cast to the type (:func:`column`). So a type Arrow cannot
round-trip through text is refused at freeze, naming the column, and never
fails at the first batch.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedTable
from ..manifest.arrays import large_strings

__all__ = ["as_text", "column", "from_text"]


def as_text(values: Any, kind: Any, name: str, label: str) -> list[str | None]:
    """Per file, partition column ``name``'s value as text (``values``: a typed
    or text pyarrow array, one value per file; ``kind``: the column's type).

    Raises:
        UnsupportedTable: a value that does not survive the round trip to text.
    """
    import pyarrow as pa

    try:
        typed = values if values.type == kind else values.cast(kind)
        text = typed.cast(pa.string())
        same = text.cast(kind).equals(typed)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise UnsupportedTable(f"table {label}: partition column {name!r} ({kind}) cannot be "
                               f"read here ({str(exc).splitlines()[0]})",
                               hint="read the table with a Delta engine, or leave the column "
                                    "out of the partitioning") from exc
    if not same:
        raise UnsupportedTable(f"table {label}: partition column {name!r} ({kind}) does not "
                               "keep its values through Arrow's text form",
                               hint="read the table with a Delta engine")
    return [None if v is None else str(v) for v in text.to_pylist()]


def column(value: str | None, kind: Any, n: int) -> Any:
    """A column of ``n`` copies of partition value ``value`` (text, or None:
    null) of type ``kind``."""
    import numpy as np
    import pyarrow as pa

    if value is None:
        return pa.nulls(n, type=kind)
    one = from_text([value], kind)
    zeros = np.zeros(n, dtype=np.int32)
    return one.take(pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(zeros)]))


def from_text(texts: list[str | None], kind: Any) -> Any:
    """One value per file: partition values ``texts`` (from :func:`as_text`)
    back in the column's type ``kind``, as a pyarrow array."""
    import pyarrow as pa

    if all(t is not None for t in texts):  # not pa.array(): it imports pandas
        return large_strings(texts).cast(kind)  # type: ignore[arg-type]
    return pa.array(texts, type=pa.string()).cast(kind)
