"""A VolumeDataset slot's items (:class:`SlotRows`), and grouped samples: a
sample's files fetched as one item.

A grouped manifest (:mod:`ucstage.manifest.groups`) keeps each sample's
members in consecutive rows; the slot rule deals sample numbers, and
:class:`SampleRows` makes a slot's :class:`Sample` values from the manifest a
block at a time. The read path fetches and looks up a whole sample
(:data:`ucstage.data.slotread.SAMPLES`), and its read-ahead's window counts samples.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from ..manifest import ArrowEntries, Manifest
from ..manifest.groups import split_name
from ..volumes import FileEntry

__all__ = ["Sample", "SampleRows", "SlotRows"]


class Sample(tuple):  # type: ignore[type-arg]
    """One sample: its members (:class:`FileEntry`, in suffix order), their
    suffixes and its bytes. Iterating it (and ``len()``) gives the members.

    One tuple ``(suffixes, size, *members)`` (a slot's samples are made a
    block at a time: one object each, the suffix tuples shared, keeps the
    garbage collector's work per sample small).
    """

    __slots__ = ()

    def __new__(cls, members: Sequence[FileEntry], suffixes: Sequence[str] | None = None,
                size: int | None = None) -> Sample:
        if suffixes is None:
            suffixes = tuple(split_name(e.path)[1] for e in members)
        if size is None:
            size = sum(e.size for e in members)
        return tuple.__new__(cls, (tuple(suffixes), size, *members))

    @property
    def members(self) -> tuple[FileEntry, ...]:
        return tuple.__getitem__(self, slice(2, None))  # type: ignore[no-any-return]

    @property
    def suffixes(self) -> tuple[str, ...]:
        return tuple.__getitem__(self, 0)  # type: ignore[no-any-return]

    @property
    def size(self) -> int:
        """The sample's bytes."""
        return tuple.__getitem__(self, 1)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[FileEntry]:
        return itertools.islice(tuple.__iter__(self), 2, None)

    def __len__(self) -> int:
        return tuple.__len__(self) - 2

    def __getitem__(self, index: Any) -> Any:
        return self.members[index]

    def __repr__(self) -> str:
        return f"Sample({self.path!r}, {list(self.suffixes)})"

    @property
    def path(self) -> str:
        """The sample's key (what messages name it by)."""
        return split_name(tuple.__getitem__(self, 2).path)[0]


class SlotRows(Sequence[Any]):
    """A slot's items, made from the manifest a block at a time as they are
    read: a worker never holds an object per item of its slot. The items are
    the rows' :class:`FileEntry` values; :class:`SampleRows`' are samples."""

    BLOCK = 1024

    def __init__(self, manifest: Manifest, indices: Any) -> None:
        self._manifest = manifest
        self._indices = indices
        entries = manifest.entries
        # What makes the rows (``take``, ``columns``), picked once: a frozen
        # listing's mapped columns when it is one (nearly always), else the
        # manifest's own forms over its list.
        self._rows: ArrowEntries | Manifest = \
            entries if isinstance(entries, ArrowEntries) else manifest
        # One (block, items) tuple, replaced whole: read-ahead threads index
        # concurrently and must never see one block's number with another's items.
        self._cached: tuple[int, list[Any]] = (-1, [])

    def _make(self, indices: Any) -> list[Any]:
        return self._rows.take(indices)

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._make(self._indices[index])
        if not 0 <= index < len(self._indices):
            raise IndexError("slot index out of range")
        block, start = index // self.BLOCK, index // self.BLOCK * self.BLOCK
        cached_block, rows = self._cached
        if cached_block != block:  # read-ahead threads read near one another, in order
            rows = self._make(self._indices[start:start + self.BLOCK])
            self._cached = (block, rows)
        return rows[index - start]

    def tail(self, start: int) -> SlotRows:
        """The items from ``start`` on (a view: no item is made)."""
        return type(self)(self._manifest, self._indices[start:])

    def take_all(self) -> list[Any]:
        return self._make(self._indices)

    def columns(self, start: int, stop: int) -> tuple[list[str], list[int], list[str]]:
        """The paths, sizes and versions of items ``start:stop`` (files: the
        warm path's lookup makes no entry object, :mod:`.slotread`)."""
        return self._rows.columns(self._indices[start:stop])


class SampleRows(SlotRows):
    """A grouped slot's samples (the slot rule dealt sample numbers)."""

    BLOCK = 512

    def __init__(self, manifest: Manifest, indices: Any) -> None:
        assert manifest.groups is not None
        super().__init__(manifest, indices)
        self._groups = manifest.groups

    def _make(self, samples: Any) -> list[Sample]:
        import numpy as np

        offsets = self._groups.offsets
        rows = self._groups.rows(samples)
        entries = self._rows.take(rows)
        counts = offsets[samples + 1] - offsets[samples]
        starts = np.cumsum(counts) - counts
        sizes = (np.add.reduceat(np.asarray(self._manifest.sizes())[rows], starts).tolist()
                 if len(rows) else [])
        # Each member's suffix: its name's part after the first dot (split_name, inlined).
        names = [e[0] for e in entries]
        suffixes = [p[d + 1:] if (d := p.find(".", p.rfind("/") + 1)) >= 0 else ""
                    for p in names]
        shared: dict[tuple[str, ...], tuple[str, ...]] = {}
        make = tuple.__new__
        return [make(Sample, (shared.setdefault(tuple(suffixes[a:a + c]),
                                                tuple(suffixes[a:a + c])), size,
                              *entries[a:a + c]))
                for a, c, size in zip(starts.tolist(), counts.tolist(), sizes, strict=True)]
