"""Samples of several files: :class:`Grouping` (how files are grouped) and
:class:`Groups` (the sample boundaries frozen into a manifest).

A file's key is its relative path up to the first ``.`` of its *name*
(``d/0001.seg.png`` -> ``d/0001``; dots in folder names do not count), or
what a callable makes of the path; its suffix is the rest of its name after
that dot (``seg.png``), ``""`` for a name without a dot. Files sharing a key
are one sample, as in the WebDataset convention.

:func:`ucstage.manifest.group_manifest` orders samples by key and members by suffix (path
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

import dataclasses
import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import params
from ..errors import GroupingError, InvalidArgument, ManifestError
from .arrays import numbers

if TYPE_CHECKING:
    import numpy as np

__all__ = ["KEY", "ON_INCOMPLETE", "Grouped", "Grouping", "Groups", "combined_fingerprint",
           "group_paths", "split_name"]

KEY = "key"
"""``group="key"``: the WebDataset key (the path up to the first dot of the name)."""
ON_INCOMPLETE = ("drop", "error")
EXAMPLES = 5
"""Incomplete samples named in a message."""


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
        if (isinstance(self.by, str) and self.by != KEY) or not (
                isinstance(self.by, str) or callable(self.by)):
            raise InvalidArgument(f'group must be "key" or a callable from relative path to '
                                  f"key, got {self.by!r}")
        # A single str is one suffix (ucstage/params.py: one rule for every such parameter).
        object.__setattr__(self, "require", params.strings(self.require, "require"))
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
    unkeyed: int = 0
    """Files a key callable returned None for: in no sample, left out."""
    unkeyed_examples: list[str] = dataclasses.field(default_factory=list)
    """Up to :data:`EXAMPLES` of them."""


def _bools(arr: Any) -> np.ndarray:
    """An Arrow boolean (chunked) array without nulls as numpy, unpacked from
    its bitmaps (pyarrow's own conversion may import pandas)."""
    import numpy as np
    import pyarrow as pa

    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    parts = [np.unpackbits(np.frombuffer(c.buffers()[1], dtype=np.uint8),
                           bitorder="little")[c.offset:c.offset + len(c)].astype(bool)
             for c in chunks if len(c)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


@dataclass(frozen=True)
class _Column:
    """A column of ``n`` strings: element ``i`` is ``arr[at + step * i]`` (the
    keys and suffixes are every third piece of one array over the paths' bytes)."""

    arr: Any
    at: int
    step: int
    n: int

    def consecutive(self, op: Any) -> np.ndarray:
        """``op(x[i + 1], x[i])`` for ``i`` in ``0 .. n-2``, as numpy bools:
        one kernel over the whole array, every ``step``-th result kept."""
        span = self.step * (self.n - 2) + 1  # compares element 0's slot .. element n-2's
        later = self.arr[self.at + self.step:self.at + self.step + span]
        return _bools(op(later, self.arr[self.at:self.at + span]))[::self.step]

    def equals(self, value: str) -> np.ndarray:
        import pyarrow.compute as pc

        return _bools(pc.equal(self.arr, value))[self.at::self.step][:self.n]

    def get(self, i: int) -> str:
        return str(self.arr[self.at + self.step * i].as_py())

    def array(self) -> Any:
        """The ``n`` strings as their own array (copied when strided)."""
        import numpy as np
        import pyarrow as pa

        if self.step == 1:
            return self.arr.slice(self.at, self.n)
        return self.arr.take(pa.array(np.arange(self.at, self.at + self.step * self.n,
                                                self.step, dtype=np.int64)))


def _name_dots(data: np.ndarray, begin: np.ndarray, end: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """(key end, has a dot) of the rows ``begin:end`` of ``data``: the first dot
    after each row's last slash, from every ``/`` and ``.`` of the bytes."""
    import numpy as np

    slashes = np.flatnonzero(data == ord("/"))
    dots = np.flatnonzero(data == ord("."))
    at = np.searchsorted(slashes, end) - 1  # the last slash before each row's end
    last = np.where(at >= 0, slashes[np.maximum(at, 0)] if len(slashes) else begin - 1,
                    begin - 1)
    name = np.maximum(last + 1, begin)  # a slash before the row's start is another row's
    first = np.searchsorted(dots, name)
    dot = dots[np.minimum(first, max(len(dots) - 1, 0))] if len(dots) else end
    has_dot = (first < len(dots)) & (dot < end) if len(dots) else np.zeros(len(begin), bool)
    return np.where(has_dot, dot, end), has_dot


def _columns(paths: Any, grouping: Grouping, made: list[str] | None
             ) -> tuple[_Column, _Column]:
    """(keys, suffixes) of an Arrow large_string array of paths.

    The name's first dot is found in numpy over the column's bytes (``/``
    and ``.`` never occur inside a multi-byte UTF-8 character); then one
    array of three pieces per row (key, its dot or nothing, suffix) over the
    same bytes needs only new offsets: no string is copied or made in Python.
    """
    import numpy as np
    import pyarrow as pa

    n = len(paths)
    if not n:
        empty = _Column(pa.array([], pa.large_string()), 0, 1, 0)
        return empty, empty
    _, offsets_buf, data_buf = paths.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[paths.offset:paths.offset + n + 1]
    data = (np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None
            else np.zeros(0, dtype=np.uint8))
    begin, end = offsets[:-1], offsets[1:]
    key_end, has_dot = _name_dots(data, begin, end)
    cuts = np.empty(3 * n + 1, dtype=np.int64)
    cuts[0:3 * n:3] = begin
    cuts[1:3 * n:3] = key_end
    cuts[2:3 * n:3] = key_end + has_dot
    cuts[3 * n] = end[-1]
    pieces = pa.Array.from_buffers(pa.large_string(), 3 * n,
                                   [None, pa.py_buffer(cuts), data_buf])
    suffixes = _Column(pieces, 2, 3, n)
    if made is None:
        return _Column(pieces, 0, 3, n), suffixes
    return _Column(pa.array(made, pa.large_string()), 0, 1, n), suffixes


def _keyed(paths: Any, grouping: Grouping) -> tuple[Any, list[str] | None, np.ndarray | None,
                                                      list[str]]:
    """A callable's keys: (the paths it keyed, their keys, those paths' rows
    in ``paths`` or None for all, up to :data:`EXAMPLES` paths it returned
    None for). None means "not part of any sample": such files are left out
    (and counted), never merged into one sample of key None."""
    import numpy as np
    import pyarrow as pa

    if isinstance(grouping.by, str):
        return paths, None, None, []
    listed = paths.to_pylist()
    made = [grouping.by(p) for p in listed]
    for key in made:
        if key is not None and not isinstance(key, str):
            raise InvalidArgument(f"group={grouping.label} must return a str key (or None "
                                  f"for a file of no sample), got {key!r}")
    keep = np.fromiter((k is not None for k in made), dtype=bool, count=len(made))
    if keep.all():
        return paths, made, None, []
    rows = np.flatnonzero(keep).astype(np.int64)
    examples = [listed[i] for i in np.flatnonzero(~keep)[:EXAMPLES].tolist()]
    kept = [made[i] for i in rows.tolist()]
    return paths.take(pa.array(rows)), kept, rows, examples


def group_paths(paths: Any, grouping: Grouping) -> Grouped:
    """Group an Arrow array of relative paths (listing order) into samples.

    Raises:
        GroupingError: two members of a sample share a suffix, or (with
            ``on_incomplete="error"``) a sample lacks a required suffix.

    A key callable's None leaves the file out of every sample (counted in
    :attr:`Grouped.unkeyed`).
    """
    import pyarrow as pa

    if isinstance(paths, pa.ChunkedArray):
        paths = paths.combine_chunks()
    if paths.type != pa.large_string():
        paths = paths.cast(pa.large_string())
    total = len(paths)
    paths, made, base, unkeyed = _keyed(paths, grouping)
    found = _group(paths, grouping, made)
    if base is None:
        return found
    # Rows of the keyed paths back to rows of the listing.
    order = base if found.order is None else base[found.order]
    return dataclasses.replace(found, order=order, unkeyed=total - len(base),
                               unkeyed_examples=unkeyed)


def _group(paths: Any, grouping: Grouping, made: list[str] | None) -> Grouped:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(paths)
    keys, suffixes = _columns(paths, grouping, made)
    order: np.ndarray | None = None
    same = np.zeros(max(n - 1, 0), dtype=bool)
    if n > 1:
        same = keys.consecutive(pc.equal)
        # Already in sample order (a listing in path order usually is): no sort.
        if (keys.consecutive(pc.less) | (same & suffixes.consecutive(pc.less_equal))).any():
            k, s = keys.array(), suffixes.array()
            sorted_at = pc.sort_indices(pa.table({"k": k, "s": s}),
                                        sort_keys=[("k", "ascending"), ("s", "ascending")])
            order = numbers(sorted_at).astype(np.int64)
            keys = _Column(k.take(sorted_at), 0, 1, n)
            suffixes = _Column(s.take(sorted_at), 0, 1, n)
            same = keys.consecutive(pc.equal)
            dup = same & suffixes.consecutive(pc.equal)
            if dup.any():
                at = int(np.flatnonzero(dup)[0])
                a, b = (paths[int(order[r])].as_py() for r in (at, at + 1))
                raise GroupingError(
                    f"{a} and {b} are both member {suffixes.get(at)!r} of sample "
                    f"{keys.get(at)!r}", hint="make the group key tell them apart")
    offsets = np.concatenate(([0], np.flatnonzero(~same) + 1, [n])).astype(np.int64)
    if not n:
        offsets = np.zeros(1, dtype=np.int64)
    groups = Groups(offsets, grouping.label, grouping.require)
    if not grouping.require or not groups.count:
        return Grouped(order, groups, [])
    return _require(order, groups, keys, suffixes, grouping)


def _require(order: np.ndarray | None, groups: Groups, keys: _Column, suffixes: _Column,
             grouping: Grouping) -> Grouped:
    import numpy as np

    starts = groups.offsets[:-1]
    keep = np.ones(groups.count, dtype=bool)
    missing: dict[str, np.ndarray] = {}
    for suffix in grouping.require:
        has = np.add.reduceat(suffixes.equals(suffix).astype(np.int64), starts) > 0
        missing[suffix] = ~has
        keep &= has
    dropped = int((~keep).sum())
    if not dropped:
        return Grouped(order, groups, [])
    lacking = np.flatnonzero(~keep)[:EXAMPLES]
    examples = [(keys.get(int(starts[i])), [s for s in grouping.require if missing[s][i]])
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

