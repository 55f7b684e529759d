"""Grouped samples in a VolumeDataset's slot: a sample's files fetched as one item.

A grouped manifest (:mod:`ucstage.manifest.groups`) keeps each sample's
members in consecutive rows; the slot rule deals sample numbers, and
:class:`SampleRows` makes a slot's :class:`Sample` values from the manifest a
block at a time. The fetch, the read-ahead's lookup and the warm path's run
lookup below take a whole sample: they return ``{suffix: local path}`` only
once every member is valid in the cache, so a sample is never handed out
half cached, and the read-ahead's window counts samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..manifest import Manifest
from ..manifest.groups import split_name
from ..volumes import FileEntry

__all__ = ["Sample", "SampleRows", "fetcher", "looker", "release", "run_lookup"]


class Sample(tuple):  # type: ignore[type-arg]
    """One sample's members (:class:`FileEntry`, in suffix order)."""

    __slots__ = ()

    @property
    def size(self) -> int:
        """The sample's bytes."""
        return sum(e.size for e in self)

    @property
    def files(self) -> int:
        return len(self)

    @property
    def path(self) -> str:
        """The sample's key (what messages name it by)."""
        return split_name(self[0].path)[0]

    def suffixes(self) -> list[str]:
        return [split_name(e.path)[1] for e in self]


class SampleRows(Sequence[Sample]):
    """A slot's samples, made from the manifest a block at a time as they are read."""

    BLOCK = 512

    def __init__(self, manifest: Manifest, indices: Any) -> None:
        assert manifest.groups is not None
        self._manifest = manifest
        self._groups = manifest.groups
        self._indices = indices
        self._cached: tuple[int, list[Sample]] = (-1, [])

    def __len__(self) -> int:
        return len(self._indices)

    def _make(self, samples: Any) -> list[Sample]:
        entries = self._manifest.take(self._groups.rows(samples))
        counts = self._groups.members()[samples].tolist()
        out, at = [], 0
        for count in counts:
            out.append(Sample(entries[at:at + count]))
            at += count
        return out

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return self._make(self._indices[index])
        if not 0 <= index < len(self._indices):
            raise IndexError("slot index out of range")
        block, start = index // self.BLOCK, index // self.BLOCK * self.BLOCK
        cached_block, rows = self._cached
        if cached_block != block:
            rows = self._make(self._indices[start:start + self.BLOCK])
            self._cached = (block, rows)
        return rows[index - start]

    def tail(self, start: int) -> SampleRows:
        return self if start == 0 else SampleRows(self._manifest, self._indices[start:])

    def with_indices(self, indices: Any) -> SampleRows:
        return SampleRows(self._manifest, indices)

    def take_all(self) -> list[Sample]:
        return self._make(self._indices)


def release(reader: Any, item: Any, *, consumed: bool = True) -> None:
    """Let a handed-out item go: a path, or every path of a sample's dict."""
    if isinstance(item, dict):
        for path in item.values():
            reader.release(path, consumed=consumed)
    else:
        reader.release(item, consumed=consumed)


def fetcher(fetch: Callable[[FileEntry], str]) -> Callable[[Sample], dict[str, str]]:
    """``fetch(sample)``: every member through the file ``fetch``, in order."""

    def fetch_sample(sample: Sample) -> dict[str, str]:
        return dict(zip(sample.suffixes(), map(fetch, sample), strict=True))

    return fetch_sample


def looker(lookup: Callable[[FileEntry], str | None] | None, reader: Any
           ) -> Callable[[Sample], dict[str, str] | None] | None:
    """``lookup(sample)``: the members' paths when every one is a valid hit,
    else None (the members already held are let go; the fetch takes them)."""
    if lookup is None:
        return None

    def lookup_sample(sample: Sample) -> dict[str, str] | None:
        found: dict[str, str] = {}
        for suffix, entry in zip(sample.suffixes(), sample, strict=True):
            path = lookup(entry)
            if path is None:
                if reader is not None:
                    release(reader, found, consumed=False)
                return None
            found[suffix] = path
        return found

    return lookup_sample


def run_lookup(lookup_run: Callable[[Sequence[FileEntry]], list[str]]
               ) -> Callable[[Sequence[Sample]], list[dict[str, str]]]:
    """The warm path's ``lookup_run`` over samples: the leading run of samples
    whose members are all valid hits."""

    def samples_run(block: Sequence[Sample]) -> list[dict[str, str]]:
        paths = lookup_run([e for s in block for e in s])
        out: list[dict[str, str]] = []
        at = 0
        for sample in block:
            end = at + len(sample)
            if end > len(paths):
                break
            out.append(dict(zip(sample.suffixes(), paths[at:end], strict=True)))
            at = end
        return out

    return samples_run
