"""The exactly-once audit: at the end of an epoch, which listing rows each
rank delivered, gathered and counted.

Each rank counts the rows of the batches its loader returned (the batch tags
of :mod:`ucstage.data.state`) and, for a resumed epoch, the rows delivered
before the restart that it is responsible for. At the end of the epoch the
ranks exchange a bitmap (one bit per file) plus the few rows they delivered
more than once, on a gloo side group with a timeout, so the audit can never
hang training: a rank that does not arrive in time, or that left the epoch
early, makes the others skip it with a warning.

Expected duplicates (``equal_length="pad"``) and gaps (``"drop"``) come from
the slot rule: only what goes beyond them is reported.

A dataset whose items hold units it yields one by one (``ShardDataset``:
blocks of samples) gives each item a weight (``audit_weights()``): the
bitmap still counts items, the result counts their units, so an epoch's
``files`` are its samples.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from ..sharding import Segment, epoch_slot_length, segment_runs
from ..shown import shown

if TYPE_CHECKING:
    from .state import LoaderProgress

__all__ = ["AuditResult", "EpochAudit", "SourceAudit", "side_group"]

log = logging.getLogger("ucstage")


_FLUSH_ROWS = 65536
"""Delivered rows collected before they are counted into the bitmap."""


@dataclass(frozen=True)
class SourceAudit:
    """One source of a :class:`ucstage.Mix` in an audited epoch: its positions
    delivered once (``items``), more than once, or never."""

    name: str
    items: int
    duplicates: int
    gaps: int
    passes: tuple[int, int]
    """The first and last pass over the source that the epoch read."""


@dataclass(frozen=True)
class AuditResult:
    """One epoch's delivery, counted over every rank (and across a restart)."""

    epoch: int
    """The dataset's epoch."""
    files: int
    """Distinct files delivered at least once (samples for ``ShardDataset``)."""
    duplicates: int
    """Deliveries beyond the first of a file."""
    gaps: int
    """Files of the listing never delivered."""
    expected_duplicates: int
    """Re-reads ``equal_length="pad"`` plans."""
    expected_gaps: int
    """Files ``equal_length="drop"`` leaves out."""
    resumed_files: int
    """Files delivered before the restart (0 for an epoch run in one go)."""
    sources: tuple[SourceAudit, ...] = ()
    """Per source, for a mix: exactly once within each pass of each source."""
    skipped: int = 0
    """Entries the listing left out as unsafe (warned of when it was made:
    a name with a backslash, a broken link, a link leaving the source): not
    files of the epoch, so never gaps, but never read either."""

    @property
    def coverage_ok(self) -> bool:
        return self.duplicates <= self.expected_duplicates and self.gaps <= self.expected_gaps


def side_group(dist: Any, timeout_s: float) -> Any:
    """A gloo group for the audit (a collective: every rank calls it)."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))


class EpochAudit:
    """Counts one rank's deliveries in one epoch; :meth:`finish` gathers them."""

    def __init__(self, progress: LoaderProgress) -> None:
        state = progress.state()
        n = state.order.n
        self.epoch = state.order.epoch
        self.counts = np.zeros(n, dtype=np.uint16)
        self._progress = progress
        weights = getattr(progress.dataset, "audit_weights", None)
        self.weights = None if weights is None else weights()
        """Per item, what it counts as (None: one each)."""
        self._pending: list[Any] = []
        self._pending_list: list[int] = []
        """Rows that came as lists (small batches' tags), counted in one go."""
        self._pending_rows = 0
        layout = progress.layout
        start = [progress.counts.get(s) for s in range(layout.slots)]
        self.prior = self.prior_real = self.prior_pad = 0
        self.planned_real = self.planned_pad = 0
        progress.listeners.append(self.add)
        # Row groups a resumed state holds as delivered whole past a slot's
        # leading count (TableDataset's partial): one rank counts them.
        whole = getattr(progress.dataset, "audit_prior", None)
        if whole is not None and progress.rank == 0 and progress.resume is not None:
            done = whole(progress.resume)
            if len(done):
                self._prior(done, len(done))
        if not progress.done and not any(start) and self.weights is None:
            # An epoch from its start: the rank's own slot lengths are arithmetic.
            for s in progress.own:
                length, real = epoch_slot_length(state.order, layout, layout.slot_at(s))
                self.planned_real += real
                self.planned_pad += length - real
            # A dataset that equalises by rows (TableDataset) says what it completes.
            planned = getattr(progress.dataset, "audit_planned", None)
            if planned is not None and (found := planned(progress)) is not None:
                self.planned_real = found
            return
        current = Segment(layout, tuple(start))
        runs = segment_runs(state.order, [*progress.done, current])
        if progress.rank == 0:  # earlier segments are complete: one rank counts them
            for seg, seg_runs in zip(progress.done, runs, strict=False):
                for run, d in zip(seg_runs, seg.delivered, strict=True):
                    self._prior(run.files[:d or 0], run.real)
        for s in progress.own:
            run, d = runs[-1][s], start[s] or 0
            self._prior(run.files[:d], run.real)
            self.planned_real += self._weigh(run.files[d:run.real])
            self.planned_pad += self._weigh(run.files[max(d, run.real):])
        planned = getattr(progress.dataset, "audit_planned", None)
        if self.weights is not None and not progress.done and not any(start) \
                and planned is not None and (found := planned(progress)) is not None:
            self.planned_real = found  # a fresh epoch equalised by units (weighed)

    def _weigh(self, rows: np.ndarray) -> int:
        return len(rows) if self.weights is None else int(self.weights[rows].sum())

    def _prior(self, rows: np.ndarray, real: int) -> None:
        np.add.at(self.counts, rows, 1)
        self.prior += self._weigh(rows)
        self.prior_real += self._weigh(rows[:real])
        self.prior_pad += self._weigh(rows[real:])

    def add(self, rows: Any) -> None:
        # Called once per delivered batch: collect the rows and count them in
        # bulk (one np.add.at per call costs more than a small batch itself).
        if len(rows):
            if isinstance(rows, list):
                self._pending_list += rows
            else:
                self._pending.append(rows)
            self._pending_rows += len(rows)
            if self._pending_rows >= _FLUSH_ROWS:
                self._flush()

    def _flush(self) -> None:
        if self._pending_list:
            self._pending.append(np.array(self._pending_list, dtype=np.int64))
            self._pending_list = []
        if self._pending:
            rows = np.concatenate([np.asarray(r, dtype=np.int64) for r in self._pending])
            np.add.at(self.counts, rows, 1)
            self._pending, self._pending_rows = [], 0

    def payload(self, complete: bool) -> tuple[Any, ...]:
        self._progress.sync()  # without workers the rows are taken from the slot now
        self._flush()
        extra = np.flatnonzero(self.counts > 1)
        return (complete, np.packbits(self.counts > 0).tobytes(),
                {int(i): int(self.counts[i]) - 1 for i in extra},
                self.prior, self.prior_real + self.planned_real,
                self.prior_pad + self.planned_pad)

    def finish(self, complete: bool, dist: Any = None, group: Any = None) -> AuditResult | None:
        """Gather every rank's deliveries and count; None when skipped (warned)."""
        mine = self.payload(complete)
        gathered: list[Any] = [mine]
        if dist is not None:
            gathered = [None] * dist.get_world_size()
            try:
                dist.all_gather_object(gathered, mine, group=group)
            except Exception as exc:  # a rank never came: never hang or fail training
                log.warning("ucstage: exactly-once audit of epoch %d skipped: not every rank "
                            "reached the end of the epoch in time (%s)", self.epoch,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                raise AuditTimeout from exc
        early = [r for r, g in enumerate(gathered) if not g[0]]
        if early:
            log.warning("ucstage: exactly-once audit of epoch %d skipped: rank%s %s left the "
                        "epoch early", self.epoch, "s" if len(early) > 1 else "",
                        ", ".join(map(str, early)))
            return None
        n = len(self.counts)
        total = np.zeros(n, dtype=np.int64)
        for g in gathered:
            total += np.unpackbits(np.frombuffer(g[1], dtype=np.uint8), count=n)
            for i, extra in g[2].items():
                total[i] += extra
        w = np.ones(n, dtype=np.int64) if self.weights is None else self.weights
        files = int(w[total > 0].sum())
        whole = int(w.sum())
        result = AuditResult(
            epoch=self.epoch, files=files, duplicates=int((w * total).sum()) - files,
            gaps=whole - files, expected_duplicates=sum(g[5] for g in gathered),
            expected_gaps=max(0, whole - sum(g[4] for g in gathered)),
            resumed_files=sum(g[3] for g in gathered),
            skipped=int(getattr(self._progress.dataset, "listing_skipped", 0) or 0))
        per_source = getattr(self._progress.dataset, "audit_sources", None)
        if per_source is not None:  # a mix: the same count, split by source
            result = replace(result, sources=per_source(self._progress, total))
        if not result.coverage_ok:
            log.warning("ucstage: epoch %d was not delivered exactly once: %d duplicate "
                        "deliveries and %d files never delivered, beyond equal_length's "
                        "%d and %d", self.epoch, result.duplicates, result.gaps,
                        result.expected_duplicates, result.expected_gaps)
            for src in result.sources:
                log.warning("ucstage: epoch %d, source %s: %d duplicate and %d missing items",
                            self.epoch, shown(src.name), src.duplicates, src.gaps)
        return result


class AuditTimeout(Exception):
    """The side group timed out: the loader stops auditing (the group is spent)."""


def log_result(sink: Any, result: AuditResult, step: int) -> None:
    """The audit's metrics under the loader's MLflow prefix."""
    if sink is None:
        return
    for name, value in (("epoch_files", result.files),
                        ("epoch_coverage_ok", int(result.coverage_ok)),
                        ("epoch_duplicates", result.duplicates),
                        ("epoch_gaps", result.gaps)):
        sink.add(name, value, step)
    if result.resumed_files:
        sink.add("resumed_files", result.resumed_files, step)
    if result.skipped:
        sink.add("listing_skipped", result.skipped, step)
    sink.send()
