"""The DataLoader's checkpoint, resume and audit hooks, kept out of loader.py.

One :class:`LoaderHooks` per ucstage ``DataLoader``: it wraps the loader's
``collate_fn`` so batches carry their worker's position, starts each epoch's
delivery tracking (and the check of a loaded state across ranks) before the
workers start, strips the tags as batches are returned, and runs the
exactly-once audit when the epoch ends. The state and the audit themselves
live in :mod:`ucstage.data.state` and :mod:`ucstage.data.audit`.
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Callable
from typing import Any

import torch.utils.data as tud

from ..errors import InvalidArgument
from . import audit as audit_
from . import state as state_
from .frozen import active
from .sharded import ShardedDataset

__all__ = ["LoaderHooks"]


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
