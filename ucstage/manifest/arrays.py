"""Arrow arrays to numpy and back through their buffers, for both kinds of
frozen listing.

pyarrow's own conversions (``pa.array()`` of a list or numpy array,
``to_numpy()``, ``pa.scalar``) import pandas when it is installed: about a
second of start-up and ~30 MiB of anonymous memory in every process that
freezes, loads or verifies a listing. Built from and read as buffers, no
Python value is converted and pandas is never imported.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from pyarrow.ipc import RecordBatchFileReader

__all__ = ["binary", "int_array", "large_string_scalar", "large_strings", "native", "native_copy",
           "numbers", "one", "read_marked"]


def numbers(array: Any) -> np.ndarray:
    """A fixed-width Arrow array or chunked array without nulls as numpy:
    zero-copy and read-only for one chunk, one copy joining several."""
    import numpy as np
    import pyarrow as pa

    dtype = np.dtype(array.type.to_pandas_dtype())
    chunks = array.chunks if isinstance(array, pa.ChunkedArray) else [array]
    parts = [np.frombuffer(c.buffers()[1], dtype=dtype)[c.offset:c.offset + len(c)]
             for c in chunks if len(c)]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def int_array(values: Any, kind: Any) -> Any:
    """A pyarrow integer array of ``kind`` over a copy of ``values``."""
    import numpy as np
    import pyarrow as pa

    arr = np.ascontiguousarray(values, dtype=kind.to_pandas_dtype())
    return pa.Array.from_buffers(kind, len(arr), [None, pa.py_buffer(arr)])


def binary(values: Sequence[bytes | None]) -> Any:
    """A pyarrow binary array of ``values`` (None: null)."""
    import numpy as np
    import pyarrow as pa

    sizes = np.array([len(v) if v is not None else 0 for v in values], dtype=np.int32)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    valid = np.packbits(np.array([v is not None for v in values], dtype=bool),
                        bitorder="little")
    data = b"".join(v for v in values if v is not None)
    return pa.Array.from_buffers(pa.binary(), len(values), [
        pa.py_buffer(valid.tobytes()), pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


def large_strings(values: Sequence[str]) -> Any:
    """A pyarrow large_string array of ``values`` (UTF-8; a lone surrogate
    raises ``UnicodeEncodeError``, as ``pa.array`` would)."""
    import numpy as np
    import pyarrow as pa

    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)),
              out=offsets[1:])
    return pa.Array.from_buffers(pa.large_string(), len(encoded), [
        None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(encoded))])


def native(size: int) -> tuple[Any, memoryview]:
    """An Arrow-allocated buffer of ``size`` bytes (not zeroed) and a
    writable byte view of it, to fill before Parquet reads it.

    Not ``pa.py_buffer`` of Python memory: the last reference to such a
    buffer may be dropped by one of Arrow's pool threads after a threaded
    Parquet read returned, and freeing it takes the GIL; during interpreter
    shutdown that thread is made to exit and the process aborts
    ("terminate called without an active exception", SIGABRT: seen about
    once in 24 fresh processes that read a table). Arrow's own memory is
    freed without Python."""
    import pyarrow as pa

    buffer = pa.allocate_buffer(size)
    return buffer, memoryview(buffer).cast("B")


def native_copy(data: bytes | memoryview) -> Any:
    """``data`` copied into an Arrow-allocated buffer (see :func:`native`)."""
    buffer, view = native(len(data))
    view[:] = data
    return buffer


def one(value: bool | int | float | str) -> Any:
    """A pyarrow array holding ``value`` alone (bool, int64, float64 or
    large_string), for ``pa.scalar(value)`` (``one(v)[0]``) or a cast; an
    int beyond int64 goes through ``pa.array`` (and so imports pandas)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(value, bool):
        return pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(bytes([value]))])
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return int_array([value], pa.int64())
        return pa.array([value])
    if isinstance(value, float):
        return pa.Array.from_buffers(pa.float64(), 1,
                                     [None, pa.py_buffer(np.array([value], np.float64))])
    return large_strings([value])


def large_string_scalar(text: str) -> Any:
    """``pa.scalar(text, pa.large_string())``."""
    import pyarrow as pa

    data = text.encode()
    offsets = pa.py_buffer(bytes(8) + len(data).to_bytes(8, sys.byteorder))  # int64 [0, len]
    return pa.Array.from_buffers(pa.large_string(), 1, [None, offsets, pa.py_buffer(data)])[0]


def read_marked(path: str, reader: RecordBatchFileReader, key: bytes, format: str) -> tuple[Any, dict[str, Any]]:
    """The table of an Arrow manifest file and its header (the JSON document
    under ``key`` in the schema's metadata, whose ``format`` must be
    ``format``), for the manifest kinds that keep their header so.

    Raises:
        ManifestError: not such a manifest, one whose header does not parse,
            or one nested too deeply to parse.
    """
    import json

    import pyarrow as pa

    from ..errors import NESTED_TOO_DEEP, ManifestError

    try:
        table = reader.read_all()
        meta = json.loads((table.schema.metadata or {})[key])
        if not isinstance(meta, dict) or meta.get("format") != format:
            raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else meta!r}")
    except RecursionError as exc:  # json's decoder recurses once per level
        raise ManifestError(f"{path} is not a {format} manifest ({NESTED_TOO_DEEP})") from exc
    except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
        raise ManifestError(f"{path} is not a {format} manifest ({exc})") from exc
    return table, meta
