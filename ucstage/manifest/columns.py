"""The Arrow view of a manifest's files (:class:`ArrowEntries`) and the
fingerprint computed in Arrow (:func:`arrow_fingerprint`).

A columnar manifest's rows stay in Arrow columns, usually memory-mapped:
a :class:`FileEntry` is made only for a row that is asked for.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

from ..volumes.entry import FileEntry
from .arrays import large_string_scalar, numbers

if TYPE_CHECKING:
    import numpy as np

__all__ = ["ARROW_FIELDS", "BATCH_ROWS", "SAMPLE_FIELD", "ArrowEntries", "arrow_fingerprint",
           "schema", "table"]

BATCH_ROWS = 65536
"""Rows per record batch of an Arrow manifest: verifying streams one batch at
a time, so a process that checks a large manifest never holds all of it."""
HASH_ROWS = 8192


def arrow_fingerprint(batches: Iterable[Any]) -> str:
    """:func:`ucstage.manifest.fingerprint` of Arrow record batches, computed in Arrow: each
    batch's canonical records are joined in C and hashed as one buffer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    digest = hashlib.sha256()
    nul, lf, empty = (large_string_scalar(text) for text in ("\0", "\n", ""))
    # Hashed in slices of HASH_ROWS: the joined records of one slice are the
    # only large buffer alive, so a full check of a huge manifest stays small.
    slices = (b.slice(at, HASH_ROWS) for b in batches for at in range(0, b.num_rows, HASH_ROWS))
    for batch in slices:
        path, size, version = (batch.column(i) for i in range(3))
        joined = pc.binary_join_element_wise(
            pc.cast(path, pa.large_string()), pc.cast(size, pa.large_string()),
            pc.cast(version, pa.large_string()), nul)
        records = pc.binary_join_element_wise(joined, lf, empty)
        offsets = records.buffers()[1]
        data = records.buffers()[2]
        import numpy as np

        first, last = np.frombuffer(offsets, dtype=np.int64)[[records.offset,
                                                                records.offset + len(records)]]
        digest.update(memoryview(data)[int(first):int(last)])
    return digest.hexdigest()


ARROW_FIELDS = (("path", "large_string"), ("size", "int64"), ("version", "large_string"))
SAMPLE_FIELD = ("sample", "int64")
"""The fourth column of a grouped manifest (docs/manifest.md)."""


def schema(metadata: dict[str, str] | None = None) -> Any:
    import pyarrow as pa

    return pa.schema([pa.field(name, getattr(pa, kind)(), nullable=False)
                      for name, kind in ARROW_FIELDS], metadata=metadata)


def table(entries: Sequence[FileEntry]) -> Any:
    """The Arrow table of ``entries`` (the same table if they already are Arrow)."""
    import pyarrow as pa

    if isinstance(entries, ArrowEntries):
        return entries.table
    return pa.Table.from_arrays(
        [pa.array([e[0] for e in entries], pa.large_string()),
         pa.array([e[1] for e in entries], pa.int64()),
         pa.array([e[2] for e in entries], pa.large_string())], schema=schema())


DECODE_ROWS = 4096
"""Rows of a string column decoded at once (:func:`_decode`): its gather's
index arrays are 8 bytes per byte of text, so a large ``take`` goes a part at a time."""


def _decode(data: np.ndarray, begins: np.ndarray, ends: np.ndarray) -> list[str]:
    """The UTF-8 strings at bytes ``begins[i]:ends[i]`` of ``data``: gathered
    into one buffer and decoded in one call, not one per row (a warm epoch's
    lookups read every path and version); ASCII text is then cut at the rows'
    byte offsets, other text cut as bytes and each piece decoded."""
    import numpy as np

    lengths = ends - begins
    stops = np.cumsum(lengths)
    starts = stops - lengths
    total = int(stops[-1]) if len(stops) else 0
    joined = data[np.repeat(begins - starts, lengths)
                  + np.arange(total, dtype=np.int64)].tobytes()
    text = joined.decode("utf-8")
    cut: Any = text if len(text) == total else joined
    pieces = [cut[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    if cut is joined:  # not ASCII: byte offsets are not character offsets
        pieces = [p.decode("utf-8") for p in pieces]
    return pieces


_new_entry = functools.partial(tuple.__new__, FileEntry)
"""``FileEntry`` from a (path, size, version) tuple, without the NamedTuple's
Python-level ``__new__`` (a third of what making a row cost)."""


class ArrowEntries(Sequence[FileEntry]):
    """The files of a columnar manifest: a sequence of :class:`FileEntry` over
    Arrow columns (usually memory-mapped), made one row at a time on access.

    ``len()`` costs nothing; :meth:`take` makes only the rows asked for;
    :meth:`sizes` is the size column as a numpy array.
    """

    def __init__(self, table: Any) -> None:
        self.table = table
        lengths = [len(c) for c in table.column(0).chunks]
        self._starts = [0]
        for length in lengths:
            self._starts.append(self._starts[-1] + length)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def _row(self, index: int) -> FileEntry:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("manifest entry index out of range")
        return self.take([index])[0]

    @overload
    def __getitem__(self, index: int) -> FileEntry: ...

    @overload
    def __getitem__(self, index: slice) -> list[FileEntry]: ...

    def __getitem__(self, index: int | slice) -> FileEntry | list[FileEntry]:
        if isinstance(index, slice):
            return self.take(range(len(self))[index])
        return self._row(index)

    def __iter__(self) -> Iterator[FileEntry]:
        for batch in self.table.to_batches(max_chunksize=BATCH_ROWS):
            yield from map(FileEntry, batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                           batch.column(2).to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrowEntries):
            return bool(self.table.equals(other.table))
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ArrowEntries({len(self)} files)"

    def take(self, indices: Sequence[int] | np.ndarray) -> list[FileEntry]:
        """The entries at ``indices`` (any order, repeats allowed), made in one go."""
        return list(map(_new_entry, zip(*self.columns(indices), strict=True)))

    def columns(self, indices: Sequence[int] | np.ndarray) -> tuple[list[str], list[int],
                                                                   list[str]]:
        """The paths, sizes and versions at ``indices``, as three lists: the
        entries' fields without an object per entry."""
        return self._strings(0, indices), self._ints(1, indices), self._strings(2, indices)

    def paths(self, indices: Sequence[int] | np.ndarray | None = None) -> list[str]:
        """The relative paths at ``indices`` (None: every path, in listing order)."""
        if indices is None:
            return self.table.column(0).to_pylist()  # type: ignore[no-any-return]
        return self._strings(0, indices)

    def _locate(self, indices: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(chunk, row within the chunk) of each of ``indices``, checked."""
        import numpy as np

        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError("manifest entry index out of range")
        starts = np.asarray(self._starts, dtype=np.int64)
        chunk = np.searchsorted(starts, idx, side="right") - 1
        return chunk, idx - starts[chunk]

    # Rows are read straight from the column buffers with numpy: only the pages
    # holding the asked-for rows are touched, and no Arrow compute kernel (tens
    # of MiB of library pages per process) is loaded.
    def _ints(self, column: int, indices: Sequence[int] | np.ndarray) -> list[int]:
        import numpy as np

        chunk, row = self._locate(indices)
        out = np.empty(len(row), dtype=np.int64)
        for c in np.unique(chunk).tolist():
            where = chunk == c
            array = self.table.column(column).chunk(c)
            values = np.frombuffer(array.buffers()[1], dtype=np.int64)
            out[where] = values[row[where] + array.offset]
        return out.tolist()  # type: ignore[no-any-return]

    def _strings(self, column: int, indices: Sequence[int] | np.ndarray) -> list[str]:
        import numpy as np

        chunk, row = self._locate(indices)
        out: list[str] = [""] * len(row)
        for c in np.unique(chunk).tolist():
            where = np.flatnonzero(chunk == c)
            array = self.table.column(column).chunk(c)
            _, offsets_buf, data_buf = array.buffers()
            offsets = np.frombuffer(offsets_buf, dtype=np.int64)
            data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None \
                else np.zeros(0, dtype=np.uint8)
            local = row[where] + array.offset
            for at in range(0, len(local), DECODE_ROWS):
                part = local[at:at + DECODE_ROWS]
                pieces = _decode(data, offsets[part], offsets[part + 1])
                if len(pieces) == len(row):
                    return pieces
                for slot, piece in zip(where[at:at + DECODE_ROWS].tolist(), pieces, strict=True):
                    out[slot] = piece
        return out

    def sizes(self) -> np.ndarray:
        """Every file's size, in listing order (int64; no per-file Python objects)."""
        # Zero-copy and read-only, as to_numpy() was, without its pandas
        # import (ucstage/manifest/arrays.py). The column has no nulls (the
        # Arrow reader checks).
        return numbers(self.table.column(1))
