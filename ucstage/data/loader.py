""":class:`DataLoader`: torch's DataLoader with ucstage's defaults, timing and rank guard.

Per-batch wait time goes to MLflow (:mod:`ucstage.data.timing`), and when
``torch.distributed`` is initialised every epoch starts with a guard that
freezes the :class:`~ucstage.data.dataset.VolumeDataset`'s listing on every
rank and refuses to start when ranks disagree on ``num_workers``, on the
shuffle scope and ``nproc_per_node``, or on the listing. Usage and every argument: docs/training.md.
"""

from __future__ import annotations

import atexit
import inspect
import os
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.utils.data as tud

from ..engines import objstore
from ..errors import InvalidArgument, RankMismatch
from ..sharding import Layout, World
from . import audit as audit_
from . import channel, slotread, workerstart
from . import state as state_
from .dataset import VolumeDataset
from .frozen import active, all_gather
from .sharded import DEFAULT_NUM_WORKERS, ShardedDataset
from .timing import EpochStats, MlflowSink, TimedIterator

__all__ = ["DataLoader", "find_sharded_dataset"]


def find_sharded_dataset(dataset: object, depth: int = 3) -> ShardedDataset | None:
    """The sharded dataset (a VolumeDataset, a TableDataset, a Mix) inside a user's
    wrapper dataset (its attributes, a few levels deep); a mix is found before its sources."""
    if isinstance(dataset, ShardedDataset):
        return dataset
    if depth == 0:
        return None
    children: list[Any] = []
    attrs = getattr(dataset, "__dict__", None)
    if isinstance(attrs, dict):
        children.extend(attrs.values())
    for child in children:
        if isinstance(child, (list, tuple)):
            for item in child[:8]:
                found = find_sharded_dataset(item, depth - 1)
                if found is not None:
                    return found
        elif hasattr(child, "__dict__") and not isinstance(child, type):
            found = find_sharded_dataset(child, depth - 1)
            if found is not None:
                return found
    return None


_TORCH_INIT = inspect.signature(tud.DataLoader.__init__)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class DataLoader(tud.DataLoader):  # type: ignore[type-arg]
    """``torch.utils.data.DataLoader`` with ucstage defaults, timing and a rank guard.

    Takes every argument torch's DataLoader takes; the defaults differ:
    ``num_workers=6`` and, when ``num_workers > 0``, ``prefetch_factor=4`` and
    ``persistent_workers=True`` (not for an ``IterableDataset`` of the user's
    own without a VolumeDataset inside). Each epoch's parameters (``set_epoch``,
    a loaded state, ``equal_length``, the environment) reach persistent workers
    through a per-epoch record (:mod:`ucstage.data.channel`).
    The 6 is a constant, not the machine's CPU count, because every rank must
    shard with the same value; on a machine with fewer cores ucstage warns
    once, saying so (torch's own warning, given twice, is left out; pass
    ``num_workers`` to choose).
    Without ``multiprocessing_context``, workers over an object-store volume
    start from a ``forkserver`` once obstore ran in this process (forked ones
    could not use it and would read through fsspec); elsewhere they fork
    (:mod:`ucstage.data.workerstart`, docs/training.md).
    ucstage's own keyword arguments:

    Args:
        log_mlflow: log per-batch wait time and an end-of-epoch summary to
            the MLflow run active in this process, if any (metric names in
            docs/training.md).
        mlflow_prefix: prefix of the metric names (default ``ucstage``).
        mlflow_flush_every: metrics buffered before a background
            ``log_batch`` (each epoch's end also sends; nothing waits).
        mlflow_step_every: log the per-step wait every N batches (the mean
            over those N) instead of every batch, for very fast loops: each
            logged metric costs the tracking store some CPU in the background.
        guard: when ``torch.distributed`` is initialised, check at the start
            of every epoch that all ranks use the same ``num_workers``, the
            same shuffle, ``shuffle_scope`` and ``nproc_per_node``, and the
            same listing, and raise :class:`ucstage.errors.RankMismatch` on
            every rank if not.
        volume_dataset: the VolumeDataset to freeze and guard, when the
            wrapper dataset hides it too deep to be found automatically.
        audit: at the end of each epoch, count over every rank which files
            were delivered, and warn about duplicates or gaps (see
            docs/training.md, "The exactly-once audit").
        audit_timeout: seconds the audit waits for the other ranks before it
            is skipped with a warning (it never stops training).

    After each epoch, :attr:`epoch_stats` holds an :class:`EpochStats` per
    epoch (also without MLflow), and :attr:`audits` an ``AuditResult`` per
    audited epoch.

    :meth:`state_dict` and :meth:`load_state_dict` checkpoint and resume an
    epoch, also on another number of ranks or workers (docs/training.md,
    "Checkpoint and resume").
    """

    def __init__(self, dataset: tud.Dataset[Any], *args: Any, log_mlflow: bool = True,
                 mlflow_prefix: str = "ucstage", mlflow_flush_every: int = 500,
                 mlflow_step_every: int = 1,
                 guard: bool = True, volume_dataset: ShardedDataset | None = None,
                 audit: bool = True, audit_timeout: float = 60.0,
                 **kwargs: Any) -> None:
        bound = _TORCH_INIT.bind_partial(None, dataset, *args, **kwargs).arguments
        # Read by check_worker_number_rationality, which torch's __init__ calls.
        self._workers_defaulted = "num_workers" not in bound
        self._workers_said = False
        if self._workers_defaulted:
            # A constant, not the machine's CPU count: every rank must agree.
            kwargs["num_workers"] = DEFAULT_NUM_WORKERS
        num_workers = bound.get("num_workers", kwargs.get("num_workers"))
        if "prefetch_factor" not in bound and num_workers:
            kwargs["prefetch_factor"] = 4
        found = volume_dataset if volume_dataset is not None else find_sharded_dataset(dataset)
        if "persistent_workers" not in bound and num_workers and (
                found is not None or not isinstance(dataset, tud.IterableDataset)):
            # Workers live across epochs; each epoch's parameters reach them
            # through the loader's channel (data/channel.py). Not for an
            # iterable dataset of the user's own: its set_epoch could not reach them.
            kwargs["persistent_workers"] = True
        super().__init__(dataset, *args, **kwargs)
        self._channel = channel.Channel()
        # None: the start method is ucstage's to choose each epoch (workerstart.py).
        self._given_context = self._chosen_context = self.multiprocessing_context
        self.log_mlflow = log_mlflow
        self.mlflow_prefix = mlflow_prefix
        self.mlflow_flush_every = mlflow_flush_every
        if mlflow_step_every < 1:
            raise InvalidArgument(f"mlflow_step_every must be 1 or more, got {mlflow_step_every}")
        self.mlflow_step_every = mlflow_step_every
        self.guard = guard
        self.volume_dataset = found
        if self.volume_dataset is not None:
            # len(dataset) in this process counts the rank's files over these workers.
            self.volume_dataset.num_workers = self.num_workers
        self.epoch_stats: list[EpochStats] = []
        # Checkpoint/resume and the audit (LoaderHooks, below).
        self._hooks = LoaderHooks(self, self.volume_dataset, audit=audit,
                                  audit_timeout=audit_timeout, find=find_sharded_dataset)
        self.audits = self._hooks.audits
        self.collate_fn = self._hooks.collate(self.collate_fn)
        self._steps = 0
        self._epochs = 0
        self._sinks: list[MlflowSink] = []
        self._start_early()

    def check_worker_number_rationality(self) -> None:
        """Say once, in ucstage's words, when there are more workers than cores.

        torch warns at construction and again at every new iterator (twice
        before the first batch), and cannot know that the default 6 is a
        constant on purpose. Kept, not capped at the cores: every rank must
        shard with the same value, and nodes may differ (docs/training.md).
        """
        if self._workers_said or not self.num_workers:
            return
        self._workers_said = True
        cores = usable_cores()
        if self.num_workers <= cores:
            return
        than = f"more than the {cores} CPU core{'s' * (cores != 1)} this process may use"
        if self._workers_defaulted:
            warnings.warn(
                f"ucstage DataLoader: num_workers defaults to {DEFAULT_NUM_WORKERS} (a constant, "
                f"so that every rank shards alike), {than}; pass num_workers={cores} (the "
                "same on every rank) if the workers slow each other down", stacklevel=3)
        else:
            warnings.warn(f"ucstage DataLoader: num_workers={self.num_workers} is {than}; the "
                          "workers may slow each other down", stacklevel=3)

    def __iter__(self) -> TimedIterator:  # type: ignore[override]
        if self.volume_dataset is not None:
            self.volume_dataset.num_workers = self.num_workers  # another loader may share it
        self._prepare()
        ds, rank = self.volume_dataset, World.detect().rank
        in_loop = self._in_loop()
        if ds is not None:  # a window that can never fit fails here, before workers start
            slotread.check_loader_window(ds, ds.cache(), self.num_workers,
                                        in_loop=in_loop if isinstance(ds, VolumeDataset) else 0)
            _warn_if_empty(ds, rank)
        workers_alive = self._workers_alive()
        if not workers_alive:  # persistent workers keep the start they were given
            self._choose_start()
        before = slotread.rank_stats(ds, rank)
        sink = (MlflowSink.for_active_run(self.mlflow_prefix, self.mlflow_flush_every)
                if self.log_mlflow else None)
        if sink is not None:
            self._sinks = [s for s in self._sinks if s.busy] + [sink]
        epoch = self._epochs
        self._epochs += 1
        self._hooks.before_workers()
        gen = self._publish_epoch(fresh=not workers_alive)
        board = self._start_board(gen, fresh=not workers_alive, in_loop=in_loop)
        # Forked workers start here (not when persistent ones are reset).
        with workerstart.gc_frozen_for_fork(self.multiprocessing_context,
                                            0 if workers_alive else self.num_workers):
            workers = super().__iter__()
        inner, on_done = self._hooks.after_workers(workers, sink, self._epoch_done)
        if gen is not None:
            on_done = self._record_done(on_done, gen)
        if board is not None and ds is not None:
            # Each next() tells the slot iterators what the loop is past.
            inner = channel.Following(inner, board, ds._link, live=self.num_workers == 0)
            on_done = inner.done(on_done)
        return TimedIterator(inner, epoch=epoch, first_step=self._steps,
                             sink=sink, on_done=on_done,
                             step_every=self.mlflow_step_every,
                             extra=lambda: {**slotread.epoch_metrics(ds, rank, before),
                                            **slotread.source_metrics(ds)})

    def _in_loop(self) -> int:
        """Items per slot the loop may hold before it moves past them: with
        workers, the batches queued for it (``prefetch_factor`` each) and the
        one it has; without, the one it has."""
        batch = self.batch_size if self.batch_size is not None else 1
        if self.num_workers == 0:
            return batch
        return (int(self.prefetch_factor or 0) + 1) * batch

    def _start_board(self, gen: int | None, *, fresh: bool, in_loop: int) -> channel.Board | None:
        """Start the epoch on the loop's board (data/channel.py), which the
        holds of a VolumeDataset's slot iterators follow."""
        ds = self.volume_dataset
        if not isinstance(ds, VolumeDataset) or ds._link.progress is None:
            return None
        if not slotread.holds_files(ds.cache()):
            # Nothing is held without a cap, so nothing follows the board:
            # no per-item publish (4 us of a warm epoch's 68 us per file).
            return None
        progress = ds._link.progress
        shared = self.num_workers > 0
        board = self._channel.start_board(Layout(1, self.num_workers).workers, shared=shared,
                                          in_loop=in_loop)
        board.start(gen if gen is not None else board.gen + 1,
                    [progress.counts[s] for s in progress.own])
        if not shared:
            ds._link.board = board  # taken by the slot iterator this epoch starts
        elif fresh and gen is not None:  # pickled into (or forked with) the workers starting now
            ds._link.channel = self._channel.link(gen)
        return board

    def _workers_alive(self) -> bool:
        return bool(self.persistent_workers and self.num_workers > 0
                    and self._iterator is not None)

    def _publish_epoch(self, *, fresh: bool) -> int | None:
        """Write this epoch's parameters where the workers read them, before
        torch starts or resets them; returns the record's generation."""
        ds = self.volume_dataset
        if ds is None or self.num_workers == 0:
            return None
        gen = self._channel.write(ds, persistent=bool(self.persistent_workers), fresh=fresh)
        if fresh:  # pickled into (or forked with) the workers that start now
            ds._link.channel = self._channel.link(gen)
        return gen

    def _record_done(self, on_done: Any, gen: int) -> Any:
        record = self._channel

        def done(stats: EpochStats, next_step: int) -> None:
            if stats.complete:
                record.done(gen)
            else:
                # Given up before its end (a `break`, close()): persistent workers
                # close the epoch's iterators (read-ahead, holds) now, not next epoch.
                record.stop(gen)
            on_done(stats, next_step)
        return done

    def state_dict(self, gather: bool = False) -> dict[str, Any]:
        """Where this epoch stands: small JSON-serialisable data, no file list.

        Counts, per slot of this rank, the files whose batches ``__next__``
        has returned (prefetched batches do not count).

        Args:
            gather: under ``torch.distributed``, gather every rank's state and
                return the merged (global) state on every rank; a collective,
                so every rank must call it. Without it, merge the ranks' states
                with ``ucstage.merge_states`` before resuming on another layout.
        """
        return self._hooks.state_dict(gather)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the state's epoch when this loader is next iterated.

        Pass the merged state (``ucstage.merge_states`` or
        ``state_dict(gather=True)``) on every rank, whatever the new layout;
        on the same layout a rank may also load its own state. Sets the
        dataset's epoch to the state's. A state for another listing or seed
        raises ``ResumeMismatch`` on every rank when iteration starts (at
        once without ``torch.distributed``).
        """
        self._hooks.load_state_dict(state)

    def flush_metrics(self) -> None:
        """Wait until every metric logged so far is in the MLflow tracking store.

        Metrics are written in the background; call this before reading them
        back in the same process. Python waits for them at exit anyway.
        """
        for sink in self._sinks:
            sink.flush()
        self._sinks = []

    def _start_early(self) -> None:
        """Start the forkserver now when the first epoch's workers will use it
        (workerstart.start_early). Never lists: an unfrozen dataset is judged
        by its source's URL (a listing here could be a collective)."""
        ds = self.volume_dataset
        if ds is None or self.num_workers <= 0:
            return
        try:
            if getattr(ds, "_manifest", None) is None and \
                    getattr(ds, "_manifest_path", None) is None:
                source = getattr(ds, "_source", None)
                store = isinstance(source, str) and objstore.serves(source)
            else:
                store = workerstart.reads_object_store(ds._get_volume())
            workerstart.start_early(self._given_context, self.num_workers, store,
                                    self.dataset, self.collate_fn, self.worker_init_fn)
        except Exception:  # only a head start: the first epoch decides again
            return

    def _choose_start(self) -> None:
        """fork, or forkserver when forked workers could not use obstore (workerstart.py)."""
        if self.multiprocessing_context is not self._chosen_context:
            self._given_context = self.multiprocessing_context  # set by the user since
        init = self.worker_init_fn
        if isinstance(init, workerstart.WithEnviron):
            init = init.init  # ours, from an earlier epoch
        ds = self.volume_dataset
        volume = ds._get_volume() if ds is not None and self.num_workers > 0 else None
        chosen = workerstart.start_context(self._given_context, self.num_workers, volume,
                                           self.dataset, self.collate_fn, init)
        if chosen is not self.multiprocessing_context:
            self.multiprocessing_context = chosen
        self._chosen_context = self.multiprocessing_context
        ours = chosen is not None and chosen is not self._given_context
        self.worker_init_fn = workerstart.WithEnviron(dict(os.environ), init) if ours else init

    def _epoch_done(self, stats: EpochStats, next_step: int) -> None:
        self.epoch_stats.append(stats)
        self._steps = max(self._steps, next_step)

    def _prepare(self) -> None:
        """Freeze the listing on every rank and run the rank-consistency guard."""
        ds = self.volume_dataset
        dist = active()
        if dist is None or dist.get_world_size() == 1:
            if ds is not None:
                ds.freeze(broadcast=False)
            return
        # Every rank takes the same branches below, because every decision is
        # made on the same gathered values: no rank waits in a collective alone.
        sharded = ds is not None or isinstance(self.dataset, tud.IterableDataset)
        first = all_gather(dist, _GuardInfo.of(self.num_workers, ds, sharded,
                                                     dist.get_world_size()))
        if self.guard:
            _check_workers(first)
            _check_scope(first)
        unfrozen = [g.has_dataset and g.fingerprint is None for g in first]
        if ds is not None and ds.fingerprint is None:
            ds.freeze(broadcast=all(unfrozen))
        if not self.guard:
            return
        latest = first
        if any(unfrozen):
            latest = all_gather(dist, _GuardInfo.of(self.num_workers, ds, sharded,
                                                          dist.get_world_size()))
        _check_listings(latest)


def _warn_if_empty(ds: ShardedDataset, rank: int) -> None:
    """Warn when this rank reads nothing of a listing that has items: a loop
    over the loader would run no step, silently (too few files or row groups
    for the slots, or equal_length="drop" cut to an empty slot)."""
    try:
        mine, items = len(ds), len(ds.freeze())
    except TypeError:  # a dataset without a length
        return
    if mine or not items:
        return
    cut = ' (equal_length="drop" cuts every slot to the shortest)' \
        if ds.equal_length == "drop" else ""
    warnings.warn(f"rank {rank} reads nothing this epoch from a listing of {items} items"
                  f"{cut}; `ucstage shard-plan` shows each slot's share", stacklevel=3)


@dataclass(frozen=True)
class _GuardInfo:
    num_workers: int
    fingerprint: str | None
    files: int | None
    has_dataset: bool
    sharded: bool
    """The dataset shards itself over workers (an IterableDataset): only then
    does num_workers decide which files a rank reads."""
    shuffle: bool = False
    shuffle_scope: str = ""
    nproc_per_node: int | str | None = None
    """The dataset's ranks per node (given or $LOCAL_WORLD_SIZE); a string
    when that setting is invalid on this rank, so the ranks still compare."""
    grouping: str | None = None
    """The digest of its grouping into samples (None: one file per item)."""

    @classmethod
    def of(cls, num_workers: int, ds: ShardedDataset | None, sharded: bool,
           world_size: int) -> _GuardInfo:
        if ds is None:
            return cls(num_workers, None, None, False, sharded)
        frozen = ds.fingerprint is not None
        nproc: int | str | None
        try:
            nproc = ds.nproc_setting(world_size)
        except InvalidArgument as exc:  # raised on every rank after the comparison
            nproc = f"invalid ({exc.message})"
        groups = ds.freeze().groups if frozen else None
        return cls(num_workers, ds.fingerprint, len(ds.freeze()) if frozen else None, True,
                   sharded, ds.shuffle, ds.shuffle_scope, nproc,
                   groups.digest if groups is not None else None)


def _check_scope(gathered: list[_GuardInfo]) -> None:
    """Ranks must agree on shuffling, its scope and nproc_per_node: each decides
    which node order it deals from, so a disagreement reads files twice or never."""
    datasets = [(r, g) for r, g in enumerate(gathered) if g.has_dataset]
    seen = {(g.shuffle, g.shuffle_scope, g.nproc_per_node) for _, g in datasets}
    if len(seen) <= 1:
        return
    values = ", ".join(f"rank {r}: shuffle={g.shuffle} shuffle_scope={g.shuffle_scope} "
                       f"nproc_per_node={g.nproc_per_node}" for r, g in datasets)
    raise RankMismatch(
        f"ranks disagree on the shuffle or its node layout ({values}); their slots would "
        "read some files twice and skip others",
        hint="pass the same shuffle, shuffle_scope and nproc_per_node to VolumeDataset on "
             "every rank (under torchrun, nproc_per_node defaults to $LOCAL_WORLD_SIZE, "
             "which differs between nodes of unequal size)",
    )


def _check_workers(gathered: list[_GuardInfo]) -> None:
    if not any(g.sharded for g in gathered):
        return  # a sampler shards map-style datasets; num_workers does not matter
    if Layout(len(gathered), [g.num_workers for g in gathered]).readers_agree:
        return
    values = ", ".join(f"rank {r}: {g.num_workers}" for r, g in enumerate(gathered))
    plan_k = ",".join(str(g.num_workers) for g in gathered)
    raise RankMismatch(
        f"ranks disagree on DataLoader num_workers ({values}); the slot rule would read "
        f"some files twice and skip others (see `ucstage shard-plan SOURCE "
        f"-w {len(gathered)} -k {plan_k}`)",
        hint="pass the same num_workers to the DataLoader on every rank",
    )


def _check_listings(gathered: list[_GuardInfo]) -> None:
    if len({(g.fingerprint, g.grouping) for g in gathered if g.has_dataset}) <= 1:
        return
    values = ", ".join(
        f"rank {r}: fingerprint {(g.fingerprint or 'none')[:12]} ({g.files} files"
        f"{'' if g.grouping is None else ', grouping ' + g.grouping[:12]})"
        for r, g in enumerate(gathered) if g.has_dataset)
    raise RankMismatch(
        f"ranks shard different listings ({values}); they would read overlapping or "
        "missing files",
        hint="give every rank the same source and filters, or one manifest from "
             "`ucstage cache lazy`",
    )


# -- the loader's hooks ------------------------------------------------------------
#
# The DataLoader's checkpoint, resume and audit hooks, beside the loader.
#
# One :class:`LoaderHooks` per ucstage ``DataLoader``: it wraps the loader's
# ``collate_fn`` so batches carry their worker's position, starts each epoch's
# delivery tracking (and the check of a loaded state across ranks) before the
# workers start, strips the tags as batches are returned, and runs the
# exactly-once audit when the epoch ends. The state and the audit themselves
# live in :mod:`ucstage.data.state` and :mod:`ucstage.data.audit`.

_HOLDING_GROUPS: weakref.WeakSet[LoaderHooks] = weakref.WeakSet()
"""Hooks that hold an audit group, released at exit (:func:`_release_groups`)."""


def _release_groups() -> None:
    """Let go of the audit's gloo groups while the interpreter is still whole.

    A loader usually lives in a reference cycle (its hooks point back at it),
    so without this its audit group, already destroyed by the job's
    ``destroy_process_group()``, would be freed only as the interpreter tears
    down, when gloo's threads ending can abort the process: ranks of a
    finished torchrun job under load died of "terminate called without an
    active exception" with no Python frame left, about once in 12 runs.
    """
    # Only the references: collecting the loader's cycle here would run its
    # finalizers (worker shutdown, read-ahead joins) at exit, which can wait.
    for hooks in list(_HOLDING_GROUPS):
        hooks._group = None
    _HOLDING_GROUPS.clear()


atexit.register(_release_groups)


class LoaderHooks:
    """Checkpoint/resume and audit for one loader (see the module docstring)."""

    def __init__(self, loader: Any, ds: ShardedDataset | None, *, audit: bool,
                 audit_timeout: float,
                 find: Callable[[Any], Any]) -> None:
        if audit_timeout <= 0:
            raise InvalidArgument(f"audit_timeout must be positive, got {audit_timeout}")
        # A proxy: the loader owns its hooks, and without a cycle `del loader`
        # shuts its (persistent) workers down at once, not at the next gc.
        self.loader, self.ds = weakref.proxy(loader), ds
        self.audit, self.audit_timeout = audit, audit_timeout
        self.audits: list[audit_.AuditResult] = []
        self._group: Any = None  # the audit's gloo group; False once it timed out
        self._find = find
        self._progress: Any = None
        self._epoch_audit: Any = None

    def collate(self, collate_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """Each batch carries its worker's position, stripped before the loop sees it."""
        if self.ds is None:
            return collate_fn
        return state_.TaggingCollate(collate_fn, self.ds, self._find)

    def before_workers(self) -> None:
        """Check a loaded state on every rank, start tracking the epoch's deliveries."""
        self._progress = self._epoch_audit = None
        ds = self.ds
        if ds is None:
            return
        dist = active()
        state_.check_across_ranks(dist, ds)
        # Only a dataset that iterates the VolumeDataset has tagged batches to audit.
        auditing = self.audit and isinstance(self.loader.dataset, tud.IterableDataset)
        if auditing and dist is not None and dist.get_world_size() > 1 and self._group is None:
            self._group = audit_.side_group(dist, self.audit_timeout)
            _HOLDING_GROUPS.add(self)
        self._progress = state_.start_epoch(self.loader, ds)
        if auditing and self._group is not False:
            self._epoch_audit = audit_.EpochAudit(self._progress)

    def after_workers(self, inner: Any, sink: Any, epoch_done: Callable[[Any, int], None]
                      ) -> tuple[Any, Callable[[Any, int], None]]:
        """The iterator the loop sees, and what runs when the epoch ends."""
        progress, audit = self._progress, self._epoch_audit
        if progress is None:
            return inner, epoch_done
        if self.loader.num_workers > 0:
            progress.dataset._link.resume = None  # the workers just started hold their copies

        def done(stats: Any, next_step: int) -> None:
            if progress.live and stats.complete:
                progress.finished = True
            epoch_done(stats, next_step)
            if audit is not None:
                self._finish_audit(audit, stats, sink)

        # Without workers no batch is tagged: nothing to strip (state.LoaderProgress.live).
        return (inner if progress.live else state_.Untagging(inner, progress)), done

    def _finish_audit(self, audit: Any, stats: Any, sink: Any) -> None:
        dist = active()
        group = self._group if dist is not None else None
        try:
            result = audit.finish(stats.complete, dist if group else None, group)
        except audit_.AuditTimeout:
            self._group = False  # a timed-out group is spent: audit no more
            return
        if result is not None:
            self.audits.append(result)
            audit_.log_result(sink, result, stats.epoch)

    def state_dict(self, gather: bool) -> dict[str, Any]:
        state = self._vds_for("state_dict").state_dict()
        if not gather:
            return state
        dist = active()
        if dist is None or dist.get_world_size() == 1:
            return state_.merge_states([state])
        return state_.gather_state(dist, state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Under torch.distributed the check waits for the epoch's start, where
        # every rank makes it together (so that all of them stop, not one).
        state_.load(self._vds_for("load_state_dict"), state, check=active() is None)

    def _vds_for(self, what: str) -> Any:
        if self.ds is None:
            raise InvalidArgument(f"{what} needs a VolumeDataset inside the loader's dataset",
                                  hint="pass volume_dataset= to the DataLoader")
        return self.ds
