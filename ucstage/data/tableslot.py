"""A slot of items that hold units of their own: a table's row groups (rows),
a shard set's blocks (samples).

- **Batches** (:func:`slot_batches`): one slot's batches of a
  :class:`~ucstage.data.table.TableDataset`: its row groups fetched through
  the cache in read order (:func:`ucstage.data.slotread.read`), their rows
  taken window by window (:func:`ucstage.tables.rowplan.windows`), cut into
  batches, each batch's delivery counted by the slot's :class:`TableTracker`
  just before it is handed out.
- **Rows to what the dataset yields** (:func:`convert`) and the checks of
  ``format`` and ``fill_null``; a cached row group is read by
  :func:`ucstage.tables.groupread.read_group` (one reader for the dataset, a
  :class:`~ucstage.Mix` and the count of a filter's matches at freeze).
- **Checkpoint and resume, exact to the unit** (:class:`TableTracker`): the
  loader's machinery (:mod:`ucstage.data.state`) counts, per slot, the items
  of its run delivered whole: here the leading row groups of the slot's run
  whose every row was delivered. What a batch leaves half done travels in the
  batch's tag as ``partial`` (row group -> rows delivered, a prefix of the
  order :mod:`ucstage.tables.rowplan` reads its rows in), and lands in the
  state's ``partial``; a resume skips exactly those rows, on the same layout
  (the slot continues, its window replayed) or another one (the row group
  goes, with its skip, to whichever slot the re-split deals it).
- **What the loader counts** (:class:`UnitCounts`): items are dealt whole by
  the slot rule; what a slot yields is counted in units (``batch_rows`` of
  them per batch), through one arithmetic (:func:`slot_totals`,
  :func:`~ucstage.tables.rowplan.equal_batches`): ``len()``, the
  equal-length count and what the audit expects of a resumed or dropped
  epoch. The exactly-once audit counts items, or with
  :attr:`UnitCounts.audit_by_unit` units: a ``ShardDataset``'s epoch is its
  samples, a ``TableDataset``'s its row groups.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, cast

from ..cache.leases import Reader
from ..errors import InvalidArgument, ResumeMismatch
from ..manifest.arrays import int_array, numbers
from ..resume import LoaderState
from ..sharding import Segment, segment_runs, slot_array
from ..tables import RowGroupManifest
from ..tables.entries import group_entry
from ..tables.groupread import read_group
from ..tables.rowplan import WindowPlan, equal_batches, slot_rows, windows
from . import slotread
from . import state as _state
from .state import Sharded

if TYPE_CHECKING:
    from ..sharding import Layout

__all__ = ["FORMATS", "TableSource", "TableTracker", "UnitCounts", "UnitSource", "convert",
           "group_entry", "group_items", "pending_positions", "read_group", "slot_batches",
           "slot_runs", "slot_totals", "whole_groups"]


class UnitSource(Sharded, Protocol):
    """What this module reads of a dataset whose items hold units: a
    :class:`~ucstage.data.table.TableDataset` or a
    :class:`~ucstage.data.shardset.ShardDataset` (a Protocol: both import this module)."""

    @property
    def shuffle_window(self) -> int: ...

    @property
    def batch_rows(self) -> int | None: ...

    def freeze(self, *, broadcast: bool | None = None) -> Any:
        """Its frozen manifest (row groups, or a shard manifest's blocks)."""


class TableSource(UnitSource, Protocol):
    """What a table's batches read of a :class:`~ucstage.data.table.TableDataset`."""

    @property
    def columns(self) -> list[str] | None: ...

    @property
    def format(self) -> str: ...

    @property
    def fill_null(self) -> Any: ...

DECODE_THREADS = 2
"""Threads decoding a slot's next row groups while the consumer takes batches."""
DECODE_AHEAD = 2
"""Row groups decoded ahead (at most ``read_ahead``; one without read-ahead)."""


def slot_totals(dataset: UnitSource, layout: Layout, tracker: TableTracker | None = None
                ) -> tuple[list[int], list[int]]:
    """Per slot of ``layout``: rows it delivers this iteration, and its batches
    without ``equal_length`` (``batch_rows`` each, else one per row group)."""
    manifest: RowGroupManifest = dataset.freeze()
    rows = manifest.rows_per_group
    pending = tracker.pending if tracker is not None else None
    skip = dict(pending.partial) if pending is not None else {}
    totals, counts = [], []
    for run, start in slot_runs(dataset, layout, pending):
        total = slot_rows(run, start, rows, skip)
        totals.append(total)
        if dataset.batch_rows:
            counts.append(-(-total // dataset.batch_rows))
        else:
            rest = [int(g) for g in run[start:]]
            counts.append(sum(1 for g in rest if int(rows[g]) > skip.get(g, 0)))
    return totals, counts


def whole_groups(dataset: UnitSource, layout: Layout, slot: int, limit: int) -> Any:
    """Row groups slot ``slot`` of a fresh epoch delivers whole within its first
    ``limit`` rows (what ``equal_length="drop"`` completes), as an int64 array."""
    import numpy as np

    manifest: RowGroupManifest = dataset.freeze()
    run = slot_array(dataset.read_order(), layout, layout.slot_at(slot))
    whole: list[Any] = []
    seen = 0
    for plan in windows(run, 0, manifest.rows_per_group, {}, window=dataset.shuffle_window,
                        shuffle=dataset.shuffle, seed=dataset.seed, epoch=dataset.epoch,
                        slot_key=(slot, 0)):
        take = max(0, min(plan.count, limit - seen))
        counts = np.bincount(plan.label[:take], minlength=len(plan.groups))
        whole.append(plan.groups[counts == manifest.rows_per_group[plan.groups]])
        seen += plan.count
        if seen >= limit:
            break
    return np.concatenate(whole).astype(np.int64) if whole else np.zeros(0, np.int64)


def pending_positions(run: Any, start: int, rows: Any, skip: dict[int, int], size: int) -> list[int]:
    """Run positions whose row group still has rows to deliver, in order."""
    first = (start // size) * size
    return [p for p in range(max(first, start), len(run))
            if skip.get(int(run[p]), 0) < int(rows[int(run[p])])]


SLACK = 1.1
"""Buffers a batch may hold, as a multiple of its rows' bytes, before a
DataLoader worker copies it into buffers of its own (:func:`_owned`)."""


def _batch(table: Any, own: bool) -> Any:
    """``table`` as one ``pyarrow.RecordBatch``; ``own``: holding buffers of
    its own rows only (:func:`_owned`)."""
    import pyarrow as pa

    if any(c.num_chunks > 1 for c in table.columns):  # else already one batch's buffers
        table = table.combine_chunks()
    batches = table.to_batches()
    if not batches:
        return pa.RecordBatch.from_pylist([], schema=table.schema)
    batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
    return _owned(batch) if own else batch


def _owned(batch: Any) -> Any:
    """``batch`` holding buffers of its own rows only. A batch cut from a
    window or a row group is a zero-copy slice of its buffers, and a pickled
    slice carries them whole: a DataLoader worker sent 20-100x a batch's rows
    to the main process (measured, docs/benchmarks.md). In the main process
    the slice stays (a copy would cost about 10% more CPU per epoch)."""
    import pyarrow as pa

    if batch.get_total_buffer_size() <= SLACK * batch.nbytes:
        return batch
    # Concatenating one array copies just its rows (half the time of take()).
    return pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in batch.columns],
                                      schema=batch.schema)


def _in_worker() -> bool:
    """Whether this is a DataLoader worker, whose batches are pickled to the
    main process."""
    import torch.utils.data as tud

    return tud.get_worker_info() is not None


class _Windows:
    """The tables of a slot's windows, read from the cache in order."""

    def __init__(self, dataset: TableSource, manifest: RowGroupManifest, run: Any, start: int,
                 skip: dict[int, int], slot_key: tuple[int, ...], reader: Reader) -> None:
        self.dataset, self.manifest = dataset, manifest
        self.columns = manifest.check_columns(dataset.columns)
        size = dataset.shuffle_window if dataset.shuffle else 1
        rows = manifest.rows_per_group
        todo = pending_positions(run, start, rows, skip, size)
        self.groups = [int(run[p]) for p in todo]
        self.entries = [group_entry(manifest, g, dataset.columns) for g in self.groups]
        self.paths = slotread.read(self.entries, slotread.FILES, reader,
                                   dataset.cache().at(manifest.volume()), int(dataset.read_ahead))
        self.plans = windows(run, start, rows, skip, window=dataset.shuffle_window,
                             shuffle=dataset.shuffle, seed=dataset.seed, epoch=dataset.epoch,
                             slot_key=slot_key)
        self._pool: ThreadPoolExecutor | None = None
        self._tables = self._decoded(max(1, min(int(dataset.read_ahead), DECODE_AHEAD)))

    def _decoded(self, depth: int) -> Iterator[Any]:
        """The todo row groups' tables in order, ``depth`` decoded ahead in
        threads (pyarrow decodes without the GIL): what ``pyarrow.dataset``
        gains from reading several row groups at once."""
        pending: collections.deque[Future[Any]] = collections.deque()
        order = iter(range(len(self.entries)))

        def submit() -> None:
            i = next(order, None)
            if i is None:
                return
            path = next(self.paths)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(DECODE_THREADS,
                                                thread_name_prefix="ucstage-decode")
            pending.append(self._pool.submit(read_group, self.manifest, self.groups[i], path,
                                             self.entries[i], self.columns))

        for _ in range(depth):
            submit()
        while pending:
            table = pending.popleft().result()
            submit()
            yield table

    def __iter__(self) -> Iterator[tuple[WindowPlan, Any, Any, Any]]:
        """(plan, its rows in delivery order, rows each group had delivered, sizes)."""
        import numpy as np
        import pyarrow as pa

        rows = self.manifest.rows_per_group
        for plan in self.plans:
            sizes = rows[plan.groups].astype(np.int64)
            # one row group (every window without shuffle): its rows, uncounted
            left = np.array([plan.count]) if len(plan.groups) == 1 else \
                np.bincount(plan.label, minlength=len(plan.groups))
            tables, offsets, at = [], np.zeros(len(plan.groups), dtype=np.int64), 0
            for i in range(len(plan.groups)):
                if not left[i]:
                    continue
                tables.append(next(self._tables))
                offsets[i] = at
                at += int(sizes[i])
            if tables:
                window = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
                if self.dataset.shuffle:
                    window = window.take(int_array(offsets[plan.label] + plan.row, pa.int64()))
                elif plan.count:  # one row group in file order: its rows from the skip on
                    window = window.slice(plan.skipped, plan.count)
            else:
                window = None
            yield plan, window, sizes - left, sizes

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self.paths.close()  # type: ignore[attr-defined]  # a generator


def slot_batches(dataset: TableSource, manifest: RowGroupManifest, tracker: TableTracker, rank: int,
                 count: int | None) -> Iterator[Any]:
    """The slot's batches, in order (see the module docstring); ``count``: the
    equal-length number of batches (``"drop"`` stops there, ``"pad"``
    re-reads the slot's rows from its start until there)."""
    import numpy as np
    import pyarrow as pa

    reader = slotread.open_reader(dataset, rank)
    own = _in_worker()
    b = dataset.batch_rows
    key = (tracker.slot, tracker.segment)
    yielded = 0
    carry: list[Any] = []
    accs: list[tuple[int, Any, Any]] = []
    streams: list[_Windows] = []

    def emit(parts: list[Any]) -> Any:
        nonlocal yielded, accs
        for first, counts, sizes in accs:
            tracker.delivered(first, counts, sizes)
        accs = []
        yielded += 1
        table = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        return convert(_batch(table, own), dataset.format, dataset.fill_null)

    def cut(stream: _Windows, counted: bool) -> Iterator[Any]:
        nonlocal carry, accs
        have = sum(t.num_rows for t in carry)
        for plan, window, done, sizes in stream:
            if counted:
                tracker.delivered(plan.first, done, sizes, before=True)  # what a resume left
            if window is None:
                continue
            n = window.num_rows
            if b is None:  # a batch per row group begun, cut as np.array_split would
                k = max(1, int((done < sizes).sum()))
                q, r = divmod(n, k)
                stops = [i * q + min(i, r) for i in range(1, k + 1)]
            else:
                stops = list(range(b - have, n + 1, b)) if b - have <= n else []
            lo = 0
            # rows of each group delivered so far in this window, counted
            # from where the last batch ended (not from the window's start)
            got, counted_to = np.zeros(len(plan.groups), dtype=np.int64), 0
            for z in stops:
                if count is not None and yielded >= count:
                    return
                if z <= lo and not carry:
                    continue
                if counted:
                    got += z - counted_to if len(got) == 1 else \
                        np.bincount(plan.label[counted_to:z], minlength=len(got))
                    counted_to = z
                    accs.append((plan.first, done + got, sizes))
                parts = [*carry, window.slice(lo, z - lo)]
                carry, have = [], 0
                yield emit(parts)
                lo = z
            if lo < n:
                carry.append(window.slice(lo, n - lo))
                have += n - lo
                if counted:
                    accs.append((plan.first, sizes.copy(), sizes))

    try:
        real = _Windows(dataset, manifest, tracker.run, tracker.start, tracker.skip, key, reader)
        streams.append(real)
        yield from cut(real, True)
        if dataset.equal_length == "pad" and count is not None:
            while yielded < count and int(manifest.rows_per_group[tracker.run].sum()):
                pad = _Windows(dataset, manifest, tracker.run, 0, {}, key, reader)
                streams.append(pad)
                yield from cut(pad, False)
        elif carry and (count is None or yielded < count) and \
                dataset.equal_length != "drop":
            yield emit(carry)
            carry = []
        tracker.end()
    finally:
        for stream in streams:
            stream.close()
        reader.close()


def group_items(dataset: TableSource, groups: Any, rank: int) -> Iterator[Any]:
    """Row groups ``groups`` (an int array), in order, each as one batch of its
    rows (in the table's ``format``), fetched ``read_ahead`` ahead and held
    while read; untracked: what a :class:`~ucstage.Mix` reads of a table."""
    manifest: RowGroupManifest = dataset.freeze()
    columns = manifest.check_columns(dataset.columns)
    entries = [group_entry(manifest, int(g), dataset.columns) for g in groups]
    reader = slotread.open_reader(dataset, rank)
    own = _in_worker()
    paths = slotread.read(entries, slotread.FILES, reader, dataset.cache().at(manifest.volume()),
                          int(dataset.read_ahead))
    try:
        for g, path, entry in zip(groups, paths, entries):  # noqa: B905 (paths: a generator)
            table = read_group(manifest, int(g), path, entry, columns)
            yield convert(_batch(table, own), dataset.format, dataset.fill_null)
    finally:
        paths.close()  # type: ignore[attr-defined]  # a generator
        reader.close()


# -- Rows to what the dataset yields; the checks of format and fill_null ---------
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


# -- Checkpoint and resume, exact to the row ---------------------------------


class TableTracker(_state.SlotTracker):
    """A slot's delivery, by row group and row (see the module docstring)."""

    run: Any
    """The slot's row groups in this segment, in order (int64)."""
    skip: dict[int, int]
    """Rows already delivered of row groups begun before this iteration."""
    segment: int
    """The segment's number in the epoch (seeds the windows with the slot)."""

    def __init__(self, dataset: Sharded, indices: Any, *, rank: int, world_size: int,
                 num_workers: int, worker: int, start: int, done: list[Segment],
                 pending: LoaderState | None = None) -> None:
        import numpy as np

        super().__init__(dataset, indices, rank=rank, world_size=world_size,
                         num_workers=num_workers, worker=worker, start=start, done=done,
                         pending=pending)
        self.run = np.asarray(indices, dtype=np.int64)
        self.skip = dict(pending.partial) if pending is not None else {}
        self.segment = len(done)
        self._pos = start
        self._started = start
        self._complete = np.zeros(len(self.run), dtype=bool)
        self._complete[:start] = True
        self._finished: list[int] = []
        self._partial: dict[int, int] = {}
        self._frozen = False

    @staticmethod
    def check_loaded(dataset: Sharded, loaded: LoaderState) -> None:
        """A state's partial row groups must be row groups of this table, each
        with no more rows than it has."""
        loaded.check_partial(dataset.freeze().rows_per_group)  # type: ignore[attr-defined]

    @staticmethod
    def resumed(pending: LoaderState, chain: list[Segment], rest: list[Any], slot: int
                ) -> tuple[Any, int]:
        """On the same layout the slot's whole run, its leading row groups
        delivered whole skipped (a window begun there is replayed); else its
        share of the re-split remainder."""
        if len(chain) == len(pending.segments):  # the same layout: continue the slot
            return segment_runs(pending.order, chain)[-1][slot].files, \
                chain[-1].delivered[slot] or 0
        return rest[slot], 0

    @property
    def position(self) -> int:
        """Leading row groups of the run delivered whole."""
        return self._pos

    def freeze(self) -> None:
        """From now on batches are padding (``equal_length="pad"``): not counted."""
        self._frozen = True

    def delivered(self, first: int, counts: Any, sizes: Any, *, before: bool = False) -> None:
        """After a batch: ``counts[i]`` rows delivered of the window's group at
        run position ``first + i``, of its ``sizes[i]``. ``before``: the
        window's start, where the counts are what a resumed state delivered
        (a group complete then was counted before the restart: the audit's
        prior, never again)."""
        if self._frozen:
            return
        partial = {}
        for i, (c, n) in enumerate(zip(counts.tolist(), sizes.tolist(), strict=True)):
            p = first + i
            if p < self._started or self._complete[p]:
                continue
            g = int(self.run[p])
            if c >= n:
                self._complete[p] = True
                # a row group with no live rows (its deletion vector deletes them
                # all) is delivered when reached, unless the resumed state holds it
                if not before or (n == 0 and g not in self.skip):
                    self._finished.append(g)
            elif c:
                partial[g] = c
        while self._pos < len(self.run) and self._complete[self._pos]:
            self._pos += 1
        # Row groups past the leading run that are done stay partial (with all their rows).
        for i, (c, n) in enumerate(zip(counts.tolist(), sizes.tolist(), strict=True)):
            p = first + i
            if p >= self._pos and c >= n and p >= self._started:
                partial[int(self.run[p])] = c
        self._partial = partial

    def take(self) -> tuple[int, int, Any, dict[int, int]]:  # type: ignore[override]
        """(slot, position, row groups finished since the last take, rows of those begun)."""
        finished, self._finished = self._finished, []
        return self.slot, self._pos, finished, dict(self._partial)

    def partial_rows(self) -> dict[int, int]:
        """Rows delivered of the row groups begun: those a resumed state held
        (unless since delivered whole) and those this iteration began."""
        lead = set(self.run[:self._pos].tolist())  # delivered whole: no skip needed
        partial = {g: n for g, n in self.skip.items() if g not in lead}
        partial.update(self._partial)
        return partial


def slot_runs(dataset: Sharded, layout: Layout, pending: LoaderState | None
              ) -> list[tuple[Any, int]]:
    """(run, start) of every slot of ``layout`` in this iteration: the epoch's
    slot rule, or what a resumed state leaves each slot (it must say what
    every slot delivered: a merged state)."""
    from ..sharding import slot_array

    order = dataset.read_order()
    if pending is None:
        return [(slot_array(order, layout, layout.slot_at(s)), 0) for s in range(layout.slots)]
    # One num_workers for every rank (slot_at needs it too).
    chain, rest = _state.resume_plan(dataset, pending, layout.world_size, layout.workers_of(0))
    if any(r is None for r in rest):
        raise ResumeMismatch("equal_length on a resumed epoch needs every slot's count",
                             hint="load the state merged over every rank (ucstage.merge_states)")
    if len(chain) == len(pending.segments):
        runs = segment_runs(pending.order, chain)[-1]
        return [(runs[s].files, chain[-1].delivered[s] or 0) for s in range(layout.slots)]
    return [(r, 0) for r in rest]


# -- What the loader counts in units ------------------------------------------


class UnitCounts:
    """The counts of a dataset of items holding units (see the module docstring)."""

    batch_rows: int | None
    equal_length: str | None
    audit_by_unit = False
    """The audit counts units (each item weighs its units), not items."""
    num_workers: int

    _len_needs: str
    """What ``len()`` needs frozen, as its refusal names it."""

    if TYPE_CHECKING:  # the sharded dataset's (never defined here: they would shadow it)
        def world(self) -> Any: ...

        def layout(self, world_size: int, num_workers: int) -> Any: ...

        def freeze(self, *, broadcast: bool | None = None) -> Any: ...

        def _frozen(self, needs: str) -> None: ...

    def _item_count(self) -> int:
        """Items the slot rule deals: the frozen listing's rows (row groups, blocks)."""
        return len(self.freeze())

    pads_items = False
    """Items are dealt whole, none padded or dropped: ``equal_length`` counts
    units (a table's batches, a shard set's samples)."""

    def __len__(self) -> int:
        """Units this process yields per epoch (a table's batches, a shard
        set's samples): a worker's slot, or the rank's slots in the main
        process (for :attr:`num_workers` workers)."""
        self._frozen(self._len_needs)
        return self.unit_length()

    def unit_length(self) -> int:
        """Batches this process yields per epoch: a worker's slot, or the
        rank's slots in the main process (for :attr:`num_workers` workers)."""
        here = self.world()
        rank, worker, in_worker = here.rank, here.worker, here.in_worker
        layout = self.layout(here.world_size, here.num_workers if in_worker else self.num_workers)
        totals, counts = slot_totals(cast(UnitSource, self), layout)
        fixed = equal_batches(totals, self.batch_rows, self.equal_length)
        slots = [layout.slot_index(layout.slot(rank, worker))] if in_worker else \
            [layout.slot_index(layout.slot(rank, w)) for w in range(layout.readers_of(rank))]
        return sum(fixed if fixed is not None else counts[s] for s in slots)

    def audit_weights(self) -> Any:
        """Per item, what the audit counts it as: its units with
        :attr:`audit_by_unit` (int64), else None (one each)."""
        import numpy as np

        if not self.audit_by_unit:
            return None
        return np.asarray(self.freeze().rows_per_group, dtype=np.int64)

    def audit_prior(self, state: Any) -> Any:
        """Items ``state`` holds as delivered whole in its ``partial`` (past
        their slot's leading count): delivered before the restart."""
        import numpy as np

        rows = self.freeze().rows_per_group
        return np.array([g for g, n in state.partial if n >= int(rows[g])], dtype=np.int64)

    def audit_planned(self, progress: Any) -> int | None:
        """Items the rank's slots deliver whole this epoch under
        ``equal_length="drop"`` (the rest are the audit's expected gaps), in
        the audit's measure (:meth:`audit_weights`); None otherwise. Called by
        the audit at the start of an epoch."""
        if self.equal_length != "drop":
            return None
        layout = progress.layout
        totals, _ = slot_totals(cast(UnitSource, self), layout)
        count = equal_batches(totals, self.batch_rows, "drop") or 0
        weights = self.audit_weights()
        whole = [whole_groups(cast(UnitSource, self), layout, s, count * (self.batch_rows or 0))
                 for s in progress.own]
        return sum(len(w) if weights is None else int(weights[w].sum()) for w in whole)
