"""One slot's batches of a :class:`~ucstage.data.table.TableDataset`: its row
groups fetched through the cache in read order, their rows taken window by
window (:func:`ucstage.tables.rowplan.windows`), cut into batches, each batch's
delivery counted by the slot's :class:`~ucstage.data.tablestate.TableTracker`
just before it is handed out."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..cache.leases import Reader
from ..manifest.arrays import int_array
from ..sharding import slot_array
from ..tables import RowGroupManifest
from ..tables.rowplan import WindowPlan, slot_rows, windows
from . import slotread
from .tableread import convert, group_entry, read_group
from .tablestate import TableTracker, slot_runs

__all__ = ["group_items", "pending_positions", "slot_batches", "slot_totals", "whole_groups"]

DECODE_THREADS = 2
"""Threads decoding a slot's next row groups while the consumer takes batches."""
DECODE_AHEAD = 2
"""Row groups decoded ahead (at most ``read_ahead``; one without read-ahead)."""


def slot_totals(dataset: Any, layout: Any, tracker: TableTracker | None = None
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


def whole_groups(dataset: Any, layout: Any, slot: int, limit: int) -> Any:
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

    def __init__(self, dataset: Any, manifest: RowGroupManifest, run: Any, start: int,
                 skip: dict[int, int], slot_key: tuple[int, ...], reader: Reader) -> None:
        self.dataset, self.manifest = dataset, manifest
        self.columns = manifest.check_columns(dataset.columns)
        size = dataset.shuffle_window if dataset.shuffle else 1
        rows = manifest.rows_per_group
        todo = pending_positions(run, start, rows, skip, size)
        self.groups = [int(run[p]) for p in todo]
        self.entries = [group_entry(manifest, g, dataset.columns) for g in self.groups]
        self.paths = slotread.read(self.entries, slotread.FILES, reader,
                                   dataset.cache().at(manifest.volume()), dataset.read_ahead)
        self.plans = windows(run, start, rows, skip, window=dataset.shuffle_window,
                             shuffle=dataset.shuffle, seed=dataset.seed, epoch=dataset.epoch,
                             slot_key=slot_key)
        self._pool: ThreadPoolExecutor | None = None
        self._tables = self._decoded(max(1, min(dataset.read_ahead, DECODE_AHEAD)))

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


def slot_batches(dataset: Any, manifest: RowGroupManifest, tracker: TableTracker, rank: int,
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


def group_items(dataset: Any, groups: Any, rank: int) -> Iterator[Any]:
    """Row groups ``groups`` (an int array), in order, each as one batch of its
    rows (in the table's ``format``), fetched ``read_ahead`` ahead and held
    while read; untracked: what a :class:`~ucstage.Mix` reads of a table."""
    manifest: RowGroupManifest = dataset.freeze()
    columns = manifest.check_columns(dataset.columns)
    entries = [group_entry(manifest, int(g), dataset.columns) for g in groups]
    reader = slotread.open_reader(dataset, rank)
    own = _in_worker()
    paths = slotread.read(entries, slotread.FILES, reader, dataset.cache().at(manifest.volume()),
                          dataset.read_ahead)
    try:
        for g, path, entry in zip(groups, paths, entries):  # noqa: B905 (paths: a generator)
            table = read_group(manifest, int(g), path, entry, columns)
            yield convert(_batch(table, own), dataset.format, dataset.fill_null)
    finally:
        paths.close()  # type: ignore[attr-defined]  # a generator
        reader.close()
