"""Checkpoint and resume for :class:`~ucstage.VolumeDataset` and :class:`~ucstage.DataLoader`.

What counts as delivered: a file whose item the loader's ``__next__`` has
returned. Each batch is tagged, where it is collated (in its worker), with
that worker's position in its slot and the listing rows it consumed; the
loader's iterator strips the tag when it returns the batch and only then
counts it, so batches prefetched into worker queues are not counted (as
torchdata's ``StatefulDataLoader`` does). This assumes the pattern the docs
use: the decoding dataset yields one item per path, pulling the next path
only when asked for the next item.

The state format, merging and the re-split rule are torch-free
(:mod:`ucstage.resume`, :func:`ucstage.sharding.resume_slots`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch.utils.data as tud

from ..errors import InvalidArgument, RankMismatch, ResumeMismatch
from ..resume import LoaderState, merge_states
from ..sharding import Segment, Slot, resume_slots
from .frozen import all_gather

if TYPE_CHECKING:
    import numpy as np

    from ..cache import LocalCache
    from ..sharding import Layout, ReadOrder, World
    from ..volumes import Volume
    from .frozen import Listing

__all__ = ["LoaderProgress", "Sharded", "SlotTracker", "Tagged", "TaggingCollate", "Untagging",
           "Wrapping"]


class Sharded(Protocol):
    """A dataset sharded over ranks x DataLoader workers by the slot rule, as
    the state, the holds and the audit read it (documented on
    :class:`~ucstage.data.sharded.ShardedDataset`)."""

    epoch: int
    num_workers: int
    run: str
    shuffle: bool
    seed: int
    shuffle_scope: str
    equal_length: str | None
    _link: Any
    """Its :class:`~ucstage.data.sharded.LoaderLink`."""

    @property
    def read_ahead(self) -> int | str: ...

    @property
    def fingerprint(self) -> str | None: ...

    def freeze(self, *, broadcast: bool | None = None) -> Listing: ...

    def read_order(self) -> ReadOrder: ...

    def nproc_setting(self, world_size: int) -> int | None: ...

    def layout(self, world_size: int, num_workers: int) -> Layout: ...

    def world(self) -> World: ...

    def cache(self) -> LocalCache: ...

    def _get_volume(self) -> Volume: ...

    def track_deliveries(self, progress: Any) -> None: ...


    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


W = TypeVar("W", bound="Wrapping")


class Wrapping:
    """A wrapper of the loader's iterator: ``__iter__``, ``__len__`` and
    every other attribute are the wrapped iterator's (``_inner``); a
    subclass sets ``_inner`` and defines ``__next__``."""

    _inner: Iterator[Any]

    def __iter__(self: W) -> W:
        return self

    def __next__(self) -> Any:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name == "_inner":  # not set yet: the subclass's __init__ failed
            raise AttributeError(name)
        return getattr(self._inner, name)


def check_fits(dataset: Sharded, state: LoaderState) -> None:
    """Refuse a state for another listing, seed or read order (ResumeMismatch)."""
    manifest = dataset.freeze()
    state.check_fits(manifest.fingerprint, dataset.read_order())


def load(dataset: Sharded, state: Any, *, check: bool = True) -> None:
    """Arm ``dataset`` to resume the state's epoch at its next iteration."""
    parsed = LoaderState.from_dict(state)
    if check:
        check_fits(dataset, parsed)
    # Kept even when the saved epoch was over (the next one then starts fresh),
    # so that the ranks still check it together before they start.
    dataset._link.resume = with_groups(dataset, parsed)
    dataset.epoch = _resumes_epoch(parsed)


def with_groups(dataset: Sharded, state: LoaderState) -> LoaderState:
    """``state`` with its order's ``groups`` (a shard's blocks) taken from the
    dataset's listing: a state does not save them, and without them its
    epoch's order would not be the one the dataset read."""
    from dataclasses import replace

    if not state.order.shuffle or not getattr(dataset, "grouped_order", False):
        return state  # nothing to put back (and no freeze for it)
    groups = dataset.read_order().groups
    if groups is None or state.order.n != int(groups.sum()):
        return state  # another listing: check_fits says so
    return replace(state, order=replace(state.order, groups=groups))


def _resumes_epoch(state: LoaderState) -> int:
    return state.order.epoch + 1 if state.finished else state.order.epoch


def _pending(dataset: Sharded) -> LoaderState | None:
    """The loaded state, if it has an epoch's rest to deliver."""
    pending = dataset._link.resume
    return None if pending is None or pending.finished else pending


def on_set_epoch(dataset: Sharded, epoch: int) -> None:
    pending = dataset._link.resume
    if pending is not None and epoch != _resumes_epoch(pending):
        wanted = _resumes_epoch(pending)
        raise InvalidArgument(
            f"the loaded state resumes epoch {wanted}; set_epoch({epoch}) would restart "
            "or skip it", hint=f"call set_epoch({wanted}) (after load_state_dict the "
                               "dataset's epoch is already set), or load no state")


def resume_plan(dataset: Sharded, state: LoaderState, world_size: int, num_workers: int
                ) -> tuple[list[Segment], list[np.ndarray | None]]:
    """The epoch's segments from now on, and what each slot still reads."""
    if state.order.epoch != dataset.epoch:
        raise InvalidArgument(f"the loaded state resumes epoch {state.order.epoch}, but the dataset "
                              f"is at epoch {dataset.epoch}")
    return resume_slots(state.order, state.segments, dataset.layout(world_size, num_workers))


_LIST_ROWS = 64
"""Rows of a batch's tag up to which they travel as a list (see SlotTracker.take)."""


class SlotTracker:
    """Counts what one slot's iterator hands out, in the process that iterates it."""

    def __init__(self, dataset: Sharded, indices: np.ndarray, *, rank: int, world_size: int,
                 num_workers: int, worker: int, start: int, done: list[Segment],
                 pending: LoaderState | None = None) -> None:
        self.dataset = dataset
        self.indices = indices
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.worker = worker
        self.layout = dataset.layout(world_size, num_workers)
        # Checked by the dealing (sharding.SlotRule.of) before the tracker starts.
        self.slot = self.layout.slot_index(Slot(rank, worker))
        self.start = start
        self._base = start
        """Paths pulled before the current run (see :meth:`run`)."""
        self._run: Any = None
        self._run_len = 0
        self.epoch = dataset.epoch
        self.done = done
        """Segments of the epoch before the one this iterator runs."""
        self.pending = pending
        """The state this iteration resumes, if any."""
        self.finished = False
        self._taken = 0

    @classmethod
    def begin(cls, dataset: Sharded, indices: np.ndarray, *, rank: int, world_size: int,
              num_workers: int, worker: int) -> SlotTracker:
        """Start tracking an iteration over the slot's ``indices``; a pending
        resume picks the slot's rest (:meth:`resumed` says what it reads)."""
        link = dataset._link
        loaded, link.resume = link.resume, None  # applies to this one iteration of this process
        if loaded is not None:
            check_fits(dataset, loaded)
            cls.check_loaded(dataset, loaded)
        pending = None if loaded is None or loaded.finished else loaded
        start, done = 0, []
        if pending is not None:
            layout = dataset.layout(world_size, num_workers)
            slot = layout.slot_index(layout.slot(rank, worker))
            chain, rest = resume_plan(dataset, pending, world_size, num_workers)
            if rest[slot] is None:
                raise ResumeMismatch(
                    f"the state does not hold what slot {rank}:{worker} delivered",
                    hint="merge every rank's state with ucstage.merge_states and load the result")
            indices, start = cls.resumed(pending, chain, rest, slot)
            done = chain[:-1]
        tracker = cls(dataset, indices, rank=rank, world_size=world_size, num_workers=num_workers,
                      worker=worker, start=start, done=done, pending=pending)
        link.tracker = tracker  # state_dict() may be asked before the first item
        return tracker

    @staticmethod
    def check_loaded(dataset: Sharded, loaded: LoaderState) -> None:
        """Refuse a loaded state this kind of slot cannot resume (beyond :func:`check_fits`)."""

    @staticmethod
    def resumed(pending: LoaderState, chain: list[Segment], rest: list[Any], slot: int
                ) -> tuple[Any, int]:
        """(what the slot iterates, its position at the start) in a resumed
        epoch: the slot's rest; on the same layout the slot continues, its
        position the count it had delivered."""
        start = 0
        if len(chain) == len(pending.segments):  # the same layout: continue the slot
            start = chain[-1].delivered[slot] or 0
        return rest[slot], start

    @property
    def position(self) -> int:
        """Where the slot stands: paths the consumer has pulled (each part of
        its next batch). Computed when asked, never counted per path: the
        current run's list iterator knows how many of its paths it gave out."""
        run = self._run
        if run is None:
            return self._base
        return self._base + self._run_len - run.__length_hint__()

    def run(self, paths: list[str]) -> Iterator[str]:
        """An iterator over ``paths`` to hand them out with (``yield from``);
        :attr:`position` follows what the consumer pulls from it."""
        self._base = self.position
        self._run = iterator = iter(paths)
        self._run_len = len(paths)
        return iterator

    def count(self, paths: Iterator[str]) -> Iterator[str]:
        """Hand out ``paths`` one at a time (the path of misses and holds)."""
        self._base = self.position
        self._run = None
        for path in paths:
            self._base += 1  # pulled by the consumer: part of its next batch
            yield path

    def end(self) -> None:
        """The slot's iterator ran to its end."""
        self.finished = True

    def take(self) -> tuple[int, int, Any]:
        """(slot, position, listing rows consumed since the last take): a batch's tag.

        A few rows travel as a list of ints: a worker pickles every tag to
        the main process, and a small numpy array pickles 20 times slower."""
        position = self.position
        rows = self.indices[self._taken:position - self.start]
        self._taken = position - self.start
        return self.slot, position, rows.tolist() if len(rows) <= _LIST_ROWS else rows

    def state(self) -> LoaderState:
        """The slot's state: the epoch's earlier segments, this one with the
        slot's :attr:`position`, and the rows of items begun (:meth:`partial_rows`)."""
        counts: list[int | None] = [None] * self.layout.slots
        counts[self.slot] = self.position
        current = Segment(self.layout, tuple(counts))
        return _state_of(self.dataset, [*self.done, current], rank=self.rank,
                         finished=self.finished and self.layout.slots == 1, epoch=self.epoch,
                         partial=self.partial_rows())

    def partial_rows(self) -> dict[int, int] | None:
        """Rows delivered of items begun but not delivered whole (the hook a
        table's row groups fill in); a file is delivered whole or not at all."""
        return None


def _state_of(dataset: Sharded, segments: list[Segment], *, rank: int | None,
              finished: bool, epoch: int, partial: dict[int, int] | None = None
              ) -> LoaderState:
    manifest = dataset.freeze()
    return LoaderState(manifest.fingerprint, replace(dataset.read_order(), epoch=epoch),
                       tuple(segments), rank=rank, finished=finished,
                       unit=getattr(dataset, "state_unit", "file"),
                       partial=tuple(sorted((partial or {}).items())))


def dataset_state(dataset: Sharded) -> dict[str, Any]:
    """``VolumeDataset.state_dict()``: the loader's view in its main process,
    else this process's own iteration, else a state at the start of the epoch."""
    tracker, progress = dataset._link.tracker, dataset._link.progress
    # A tracker or progress of an earlier epoch (set_epoch was called since)
    # says nothing about this one: the state is then at the epoch's start.
    if tud.get_worker_info() is None and progress is not None and progress.epoch == dataset.epoch:
        return progress.state().to_dict()
    if tracker is not None and tracker.epoch == dataset.epoch:
        return tracker.state().to_dict()
    if dataset._link.resume is not None:
        return dataset._link.resume.to_dict()  # loaded, not started: save what was loaded
    here = dataset.world()
    rank = here.rank
    layout = dataset.layout(here.world_size,
                            here.num_workers if here.in_worker else dataset.num_workers)
    counts = tuple(0 if layout.slot_at(s).rank == rank else None for s in range(layout.slots))
    seg = Segment(layout, counts)
    return _state_of(dataset, [seg], rank=rank, finished=False, epoch=dataset.epoch).to_dict()


class Tagged:
    """A batch and the position of the worker that collated it (stripped by the loader)."""

    __slots__ = ("batch", "tag")

    def __init__(self, batch: Any, tag: tuple[int, int, Any]) -> None:
        self.batch, self.tag = batch, tag

    def __reduce__(self) -> tuple[Any, ...]:
        # Workers pickle one per batch: the default protocol for a class with
        # __slots__ costs several times more than the batch's own small pickle.
        return Tagged, (self.batch, self.tag)

    def pin_memory(self, *args: Any) -> Tagged:
        from torch.utils.data._utils.pin_memory import pin_memory

        return Tagged(pin_memory(self.batch, *args), self.tag)


class TaggingCollate:
    """Wraps the loader's ``collate_fn``: tags each batch with its worker's position."""

    def __init__(self, collate_fn: Callable[[Any], Any], dataset: Sharded,
                 find: Callable[[Any], Sharded | None]) -> None:
        self.collate_fn, self.dataset, self.find = collate_fn, dataset, find
        # (id of the worker's dataset, the sharded dataset inside it)
        self._found: tuple[int, Any] = (-1, None)

    def __call__(self, data: Any) -> Any:
        batch = self.collate_fn(data)
        info = tud.get_worker_info()
        if info is None:  # the main process: its LoaderProgress reads the tracker itself
            return batch
        if self._found[0] != id(info.dataset):  # a worker's own copy, found once
            self._found = (id(info.dataset), self.find(info.dataset))
        found = self._found[1]
        tracker = found._link.tracker if found is not None else None
        if tracker is None:
            return batch
        return Tagged(batch, tracker.take())


class LoaderProgress:
    """What one rank's loader has delivered in the current epoch (main process)."""

    def __init__(self, dataset: Sharded, *, rank: int, world_size: int, num_workers: int,
                 resume: LoaderState | None) -> None:
        self.dataset = dataset
        self.epoch = dataset.epoch
        self.rank, self.world_size, self.num_workers = rank, world_size, num_workers
        self.layout = dataset.layout(world_size, num_workers)
        k = self.layout.workers
        self.own = range(rank * k, (rank + 1) * k)
        self.resume = resume
        self.done: list[Segment] = []
        self.counts = dict.fromkeys(self.own, 0)
        if resume is not None:
            chain, _ = resume_plan(dataset, resume, world_size, num_workers)
            self.done = chain[:-1]
            if len(chain) == len(resume.segments):  # same layout: slots continue
                for s in self.own:
                    d = chain[-1].delivered[s]
                    if d is None:
                        raise ResumeMismatch(
                            f"the state does not hold what rank {rank}'s slots delivered",
                            hint="merge every rank's state with ucstage.merge_states")
                    self.counts[s] = d
        self.partial: dict[int, int] = dict(resume.partial) if resume is not None else {}
        """Rows delivered of row groups begun, not finished (a TableDataset's tags)."""
        self.finished = False
        self.listeners: list[Callable[[Any], None]] = []
        self.live = num_workers == 0
        """The slot is iterated in this process: batches carry no tags, and
        the slot's tracker is read when the position is asked for (between
        two ``__next__`` calls everything it handed out was returned)."""
        if self.live:
            # An earlier epoch's; this epoch's starts with its iterator.
            dataset._link.tracker = None

    def sync(self) -> None:
        """Bring the counts (and the listeners) up to the live tracker."""
        tracker = self.dataset._link.tracker if self.live else None
        if tracker is not None and tracker.epoch == self.epoch:
            self.record(tracker.take())

    def record(self, tag: tuple[Any, ...]) -> None:
        slot, position, rows = tag[:3]
        if slot in self.counts:
            self.counts[slot] = max(self.counts[slot], position)
        if len(tag) > 3:  # a TableDataset's: row groups finished, and rows of those begun
            for g in rows:
                self.partial.pop(int(g), None)
            self.partial.update(tag[3])
        for listener in self.listeners:
            listener(rows)

    def state(self) -> LoaderState:
        self.sync()
        counts: list[int | None] = [None] * self.layout.slots
        for s, d in self.counts.items():
            counts[s] = d
        current = Segment(self.layout, tuple(counts))
        return _state_of(self.dataset, [*self.done, current], rank=self.rank,
                         finished=self.finished, epoch=self.epoch, partial=self.partial)


class Untagging(Wrapping):
    """The loader's iterator seen by the loop: strips tags and counts deliveries."""

    def __init__(self, inner: Iterator[Any], progress: LoaderProgress) -> None:
        self._inner, self._progress = inner, progress

    def __next__(self) -> Any:
        try:
            item = next(self._inner)
        except StopIteration:
            self._progress.finished = True
            raise
        if isinstance(item, Tagged):
            self._progress.record(item.tag)
            return item.batch
        return item


def start_epoch(loader: Any, dataset: Sharded) -> LoaderProgress:
    """Called by the loader before its workers start: the rank's progress tracker."""
    here = dataset.world()
    progress = LoaderProgress(dataset, rank=here.rank, world_size=here.world_size,
                              num_workers=loader.num_workers, resume=_pending(dataset))
    dataset.track_deliveries(progress)
    return progress


def check_across_ranks(dist: Any, dataset: Sharded) -> None:
    """Every rank checks the loaded state; if any fails, every rank raises."""
    pending = dataset._link.resume
    if dist is None or dist.get_world_size() == 1:
        if pending is not None:
            check_fits(dataset, pending)
        return
    error = ""
    if pending is not None:
        try:
            check_fits(dataset, pending)
        except ResumeMismatch as exc:
            error = exc.message
    digest = None if pending is None else (pending.order.epoch, pending.segments[:-1],
                                           pending.last.layout.world_size,
                                           pending.last.layout.num_workers)
    gathered = all_gather(dist, (error, digest))
    failed = [(r, e) for r, (e, _) in enumerate(gathered) if e]
    if failed:
        rank, message = failed[0]
        raise ResumeMismatch(f"rank {rank}: {message}" if len(failed) < len(gathered)
                             else message,
                             hint="resume with the listing and options the state was saved "
                                  "with, or start without the state")
    if len({d is None for _, d in gathered}) > 1 or len({repr(d) for _, d in gathered}) > 1:
        loaded = ", ".join(f"rank {r}: {'epoch ' + str(d[0]) if d else 'none'}"
                           for r, (_, d) in enumerate(gathered))
        raise RankMismatch(f"ranks loaded different states ({loaded})",
                           hint="load one merged state (ucstage.merge_states) on every rank")


def gather_state(dist: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Every rank's state merged, on every rank (a collective)."""
    states = all_gather(dist, state)
    return merge_states(states)

