"""Samples of several files: :class:`Grouping` (how files are grouped) and
:class:`Groups` (the sample boundaries frozen into a manifest).

A file's key is its relative path up to the first ``.`` of its *name*
(``d/0001.seg.png`` -> ``d/0001``; dots in folder names do not count), or
what a callable makes of the path; its suffix is the rest of its name after
that dot (``seg.png``), ``""`` for a name without a dot. Files sharing a key
are one sample, as in the WebDataset convention.

:func:`group_manifest` orders samples by key and members by suffix (path
order does not keep a sample together: ``d/K.jpg`` < ``d/K.jpgx/a.txt`` <
``d/K.json``), drops or refuses samples missing a required suffix, and
returns a manifest whose rows are in that order with the boundaries as
:class:`Groups` (saved as the ``sample`` column of the Arrow manifest,
docs/manifest.md). Its fingerprint covers the rows and the grouping.

The work is done in Arrow compute over the path column (a listing in path
order, the usual case, needs no sort: one comparison pass shows it is
already in sample order).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import GroupingError, InvalidArgument, ManifestError

if TYPE_CHECKING:
    import numpy as np

    from .model import Manifest

__all__ = ["KEY", "ON_INCOMPLETE", "Grouped", "Grouping", "Groups", "combined_fingerprint",
           "group_manifest", "group_paths", "split_name"]

KEY = "key"
"""``group="key"``: the WebDataset key (the path up to the first dot of the name)."""
ON_INCOMPLETE = ("drop", "error")
EXAMPLES = 5
"""Incomplete samples named in a message."""
_PATTERN = r"(?s)^(?P<key>(?:.*/)?[^/.]*)(?:\.(?P<suffix>.*))?$"


def split_name(relpath: str) -> tuple[str, str]:
    """``(key, suffix)`` of a relative path: split at the first ``.`` of its name."""
    dot = relpath.find(".", relpath.rfind("/") + 1)
    if dot < 0:
        return relpath, ""
    return relpath[:dot], relpath[dot + 1:]


@dataclass(frozen=True)
class Grouping:
    """How a dataset groups files into samples (checked once, here).

    ``by``: ``"key"``, or a callable from relative path to key (it must
    pickle, to reach DataLoader workers: a module-level function, not a
    lambda). ``require``: suffixes every sample must have (case-sensitive);
    ``on_incomplete``: ``"drop"`` such samples (counted) or ``"error"``.
    """

    by: str | Callable[[str], str] = KEY
    require: tuple[str, ...] = ()
    on_incomplete: str = "drop"

    def __post_init__(self) -> None:
        if isinstance(self.by, str) and self.by != KEY or not (
                isinstance(self.by, str) or callable(self.by)):
            raise InvalidArgument(f'group must be "key" or a callable from relative path to '
                                  f"key, got {self.by!r}")
        if isinstance(self.require, str) or not all(isinstance(s, str) for s in self.require):
            raise InvalidArgument(f'require must be a sequence of suffixes such as ("jpg", '
                                  f'"json"), got {self.require!r}')
        object.__setattr__(self, "require", tuple(self.require))
        if self.on_incomplete not in ON_INCOMPLETE:
            raise InvalidArgument(f"on_incomplete must be one of {ON_INCOMPLETE}, "
                                  f"got {self.on_incomplete!r}")

    @property
    def label(self) -> str:
        """What the grouping is called in the manifest and the digest."""
        if isinstance(self.by, str):
            return self.by
        name = getattr(self.by, "__qualname__", type(self.by).__qualname__)
        return f"callable:{getattr(self.by, '__module__', '?')}.{name}"


@dataclass(frozen=True, eq=False)
class Groups:
    """Sample boundaries over a manifest's rows: sample ``i`` is rows
    ``offsets[i]:offsets[i + 1]``, its members in suffix order."""

    offsets: np.ndarray
    """int64, one more than the samples, from 0 to the row count."""
    by: str = KEY
    require: tuple[str, ...] = ()
    dropped: int = 0
    """Incomplete samples left out (their files are not in the manifest)."""

    @property
    def count(self) -> int:
        """The number of samples."""
        return len(self.offsets) - 1

    def members(self) -> np.ndarray:
        """Files per sample (int64)."""
        import numpy as np

        return np.diff(self.offsets)

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 of the grouping (its name, required suffixes, boundaries)."""
        import numpy as np

        h = hashlib.sha256(f"{self.by}\0{','.join(self.require)}\0".encode())
        h.update(np.ascontiguousarray(self.offsets, dtype="<i8").tobytes())
        return h.hexdigest()

    def rows(self, samples: Sequence[int] | np.ndarray) -> np.ndarray:
        """The manifest rows of ``samples`` (in that order, members in order)."""
        import numpy as np

        idx = np.asarray(samples, dtype=np.int64)
        starts = self.offsets[idx]
        lengths = self.offsets[idx + 1] - starts
        total = int(lengths.sum())
        if not total:
            return np.zeros(0, dtype=np.int64)
        # Each member's row: its sample's start plus its place within the sample.
        before = np.cumsum(lengths) - lengths
        return np.repeat(starts - before, lengths) + np.arange(total, dtype=np.int64)

    def sample_sizes(self, sizes: Sequence[int] | np.ndarray) -> np.ndarray:
        """Bytes per sample, from the rows' sizes."""
        import numpy as np

        arr = np.asarray(sizes, dtype=np.int64)
        if not self.count:
            return np.zeros(0, dtype=np.int64)
        return np.add.reduceat(arr, self.offsets[:-1]) if len(arr) else arr

    def column(self) -> np.ndarray:
        """Each row's sample number (the Arrow manifest's ``sample`` column)."""
        import numpy as np

        return np.repeat(np.arange(self.count, dtype=np.int64), self.members())

    def header(self) -> dict[str, Any]:
        return {"by": self.by, "require": list(self.require), "samples": self.count,
                "dropped": self.dropped, "digest": self.digest}

    @classmethod
    def from_column(cls, column: np.ndarray, header: dict[str, Any], path: str) -> Groups:
        """The groups of a manifest read back: its ``sample`` column, checked
        against the header's sample count (:attr:`digest` by a full check)."""
        import numpy as np

        step = np.diff(column)
        if len(column) and (column[0] != 0 or step.min(initial=0) < 0
                            or step.max(initial=0) > 1):
            raise ManifestError(f"manifest {path} is malformed: its sample column is not "
                                "0, 1, 2, ... in row order", hint="recreate it from the source")
        offsets = np.concatenate(([0], np.flatnonzero(step) + 1, [len(column)])).astype(np.int64)
        if not len(column):
            offsets = np.zeros(1, dtype=np.int64)
        try:
            groups = cls(offsets, str(header["by"]), tuple(header.get("require") or ()),
                         int(header.get("dropped") or 0))
            samples = int(header["samples"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest {path} is malformed: grouping {header!r}") from exc
        if groups.count != samples:
            raise ManifestError(f"manifest {path} fails its header check ({groups.count} "
                                f"samples, header says {samples})", hint="recreate it from the source")
        return groups


def combined_fingerprint(rows_fingerprint: str, groups: Groups | None) -> str:
    """A grouped manifest's fingerprint: its rows' and its grouping's digest."""
    if groups is None:
        return rows_fingerprint
    return hashlib.sha256(f"{rows_fingerprint}\0{groups.digest}".encode()).hexdigest()


@dataclass(frozen=True, eq=False)
class Grouped:
    """What :func:`group_paths` found."""

    order: np.ndarray | None
    """Rows of the listing in sample order (None: the listing's own order)."""
    groups: Groups
    incomplete: list[tuple[str, list[str]]]
    """Up to :data:`EXAMPLES` dropped samples: (key, missing suffixes)."""


def _bools(arr: Any) -> np.ndarray:
    """An Arrow boolean (chunked) array as numpy, from its buffers (pyarrow's
    own conversion may import pandas)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    as_bytes = pc.cast(arr, pa.uint8())
    chunks = as_bytes.chunks if isinstance(as_bytes, pa.ChunkedArray) else [as_bytes]
    parts = [np.frombuffer(c.buffers()[1], dtype=np.uint8)[c.offset:c.offset + len(c)]
             for c in chunks if len(c)]
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)).astype(bool)


def _keys(paths: Any, grouping: Grouping) -> tuple[Any, Any]:
    """(keys, suffixes) of an Arrow array of paths, as large_string arrays."""
    import pyarrow as pa
    import pyarrow.compute as pc

    parts = pc.extract_regex(paths, _PATTERN)
    if isinstance(parts, pa.ChunkedArray):
        parts = parts.combine_chunks()
    suffixes = parts.field("suffix").cast(pa.large_string())
    if isinstance(grouping.by, str):
        return parts.field("key").cast(pa.large_string()), suffixes
    made = [grouping.by(p) for p in paths.to_pylist()]
    bad = next((k for k in made if not isinstance(k, str)), None)
    if bad is not None:
        raise InvalidArgument(f"group={grouping.label} must return a str key, got {bad!r}")
    return pa.array(made, pa.large_string()), suffixes


def group_paths(paths: Any, grouping: Grouping) -> Grouped:
    """Group an Arrow array of relative paths (listing order) into samples.

    Raises:
        GroupingError: two members of a sample share a suffix, or (with
            ``on_incomplete="error"``) a sample lacks a required suffix.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(paths, pa.ChunkedArray):
        paths = paths.combine_chunks()
    n = len(paths)
    keys, suffixes = _keys(paths, grouping)
    order: np.ndarray | None = None
    same = np.zeros(max(n - 1, 0), dtype=bool)
    if n > 1:
        k0, k1, s0, s1 = keys[:-1], keys[1:], suffixes[:-1], suffixes[1:]
        eq = pc.equal(k1, k0)
        out_of_order = pc.or_(pc.less(k1, k0), pc.and_(eq, pc.less_equal(s1, s0)))
        if pc.any(out_of_order).as_py():
            sorted_at = pc.sort_indices(pa.table({"k": keys, "s": suffixes}),
                                        sort_keys=[("k", "ascending"), ("s", "ascending")])
            order = _ints(sorted_at)
            keys, suffixes = keys.take(sorted_at), suffixes.take(sorted_at)
            k0, k1, s0, s1 = keys[:-1], keys[1:], suffixes[:-1], suffixes[1:]
            eq = pc.equal(k1, k0)
            dup = _bools(pc.and_(eq, pc.equal(s1, s0)))
            if dup.any():
                at = int(np.flatnonzero(dup)[0])
                rows = [at, at + 1] if order is None else [int(order[at]), int(order[at + 1])]
                a, b = (paths[r].as_py() for r in rows)
                raise GroupingError(
                    f"{a} and {b} are both member {suffixes[at].as_py()!r} of sample "
                    f"{keys[at].as_py()!r}", hint="make the group key tell them apart")
        same = _bools(eq)
    offsets = np.concatenate(([0], np.flatnonzero(~same) + 1, [n])).astype(np.int64)
    if not n:
        offsets = np.zeros(1, dtype=np.int64)
    groups = Groups(offsets, grouping.label, grouping.require)
    if not grouping.require or not groups.count:
        return Grouped(order, groups, [])
    return _require(paths, order, groups, keys, suffixes, grouping)


def _ints(arr: Any) -> np.ndarray:
    import numpy as np

    if hasattr(arr, "combine_chunks"):
        arr = arr.combine_chunks()
    return np.frombuffer(arr.buffers()[1], dtype=np.uint64)[arr.offset:arr.offset + len(arr)
                                                            ].astype(np.int64)


def _require(paths: Any, order: np.ndarray | None, groups: Groups, keys: Any, suffixes: Any,
             grouping: Grouping) -> Grouped:
    import numpy as np
    import pyarrow.compute as pc

    starts = groups.offsets[:-1]
    keep = np.ones(groups.count, dtype=bool)
    missing: dict[str, np.ndarray] = {}
    for suffix in grouping.require:
        has = np.add.reduceat(_bools(pc.equal(suffixes, suffix)).astype(np.int64), starts) > 0
        missing[suffix] = ~has
        keep &= has
    dropped = int((~keep).sum())
    if not dropped:
        return Grouped(order, groups, [])
    lacking = np.flatnonzero(~keep)[:EXAMPLES]
    examples = [(str(keys[int(starts[i])].as_py()), [s for s in grouping.require if missing[s][i]])
                for i in lacking.tolist()]
    if grouping.on_incomplete == "error":
        named = "; ".join(f"{k!r} lacks {', '.join(m)}" for k, m in examples)
        raise GroupingError(f"{dropped:,} samples lack a required member ({named})",
                            hint='pass on_incomplete="drop" to leave them out')
    kept = np.flatnonzero(keep)
    rows = groups.rows(kept)
    members = groups.members()[kept]
    offsets = np.concatenate(([0], np.cumsum(members))).astype(np.int64)
    final = rows if order is None else order[rows]
    return Grouped(final, Groups(offsets, groups.by, groups.require, dropped), examples)


def group_manifest(manifest: Manifest, grouping: Grouping) -> tuple[Manifest, Grouped]:
    """``manifest`` grouped: its rows in sample order (incomplete samples left
    out), its :attr:`~ucstage.manifest.Manifest.groups` set and its
    fingerprint covering both; and what :func:`group_paths` found."""
    import dataclasses

    from . import columns
    from .columns import ArrowEntries

    if manifest.groups is not None:
        raise InvalidArgument("this manifest is already grouped into samples")
    table = columns.table(manifest.entries).select([0, 1, 2])
    found = group_paths(table.column(0), grouping)
    rows_fingerprint = manifest.fingerprint
    if found.order is not None:
        table = table.take(found.order)
        rows_fingerprint = columns.arrow_fingerprint(table.to_batches())
    grouped = dataclasses.replace(
        manifest, entries=ArrowEntries(table), groups=found.groups, path=None,
        fingerprint=combined_fingerprint(rows_fingerprint, found.groups))
    listed = manifest.__dict__.get("_listed")
    if listed is not None:  # the fresh listing's volume (Manifest.volume)
        object.__setattr__(grouped, "_listed", listed)
    return grouped, found
