"""Small tables for the row-group and TableDataset tests: ``id`` (the row's
number, so a test can count every row), a float, a fixed-size vector, a string."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def table(start: int, n: int, *, width: int = 4, repeat: int = 1) -> pa.Table:
    """Rows ``start .. start + n - 1``: ``id``, ``x``, ``v`` (``width`` floats), ``s``."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "x": ids.astype(np.float32) / 2,
                     "v": pa.FixedSizeListArray.from_arrays(
                         pa.array(np.repeat(ids, width).astype(np.float32)), width),
                     "s": pa.array([f"row{i}" * repeat for i in ids])})


def parquet_bytes(t: pa.Table, row_group_rows: int) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=row_group_rows)
    return buf.getvalue()
