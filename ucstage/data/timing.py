"""Per-batch wait timing for :class:`ucstage.DataLoader`, logged to MLflow.

The training loop's view of the loader is one number per batch: how long
``next()`` blocked. This module measures it, summarises each epoch and, when
an MLflow run is active in this process, logs both in batches through
``MlflowClient.log_batch`` from a background thread, so the loop pays for a
tuple append per batch and never waits for the tracking store
(``DataLoader.flush_metrics()`` waits, for code that reads them back).

Metric names (``PREFIX`` defaults to ``ucstage``):

=================================  ===========================================
``PREFIX/batch_wait_ms``           per batch (step = batches since the loader
                                   was created): time the loop waited; with
                                   ``mlflow_step_every=N``, the mean over N
                                   batches, logged at every Nth step
``PREFIX/epoch_wait_p50_ms``       per epoch (step = epoch index of this
                                   loader, 0-based): median wait
``PREFIX/epoch_wait_p95_ms``       95th percentile wait (:mod:`ucstage.percentile`)
``PREFIX/epoch_wait_max_ms``       longest wait
``PREFIX/epoch_batches_per_s``     batches / epoch wall time
``PREFIX/epoch_stall_share``       total wait / epoch wall time (0..1)
``PREFIX/epoch_batches``           batches in the epoch
``PREFIX/epoch_cache_hit_rate``    files found in the cache / files this rank
                                   read (a VolumeDataset through ucstage's cache)
``PREFIX/epoch_cache_wait_s``      time copies waited for readers to make room
                                   under the cap (part of the batch waits)
``PREFIX/epoch_cache_evictions``   cached files this rank's copies evicted
``PREFIX/epoch_checked_md5``       files this rank copied whose bytes matched
                                   the store's MD5 (the ETag)
``PREFIX/epoch_checked_crc32c``    files copied whose bytes matched the
                                   store's CRC32C (GCS composite objects)
``PREFIX/epoch_checked_page_crc``  row groups copied whose every page matched
                                   the CRC32 it carries (no store checksum)
``PREFIX/epoch_checked_size``      files copied checked by size only (the
                                   store gave no usable checksum)
``PREFIX/epoch_check_mismatches``  copies whose bytes differed from the
                                   store's checksum (retried, never cached)
``PREFIX/epoch_items_<source>``    a :class:`~ucstage.Mix`'s items from each
                                   source that this rank's loader returned
=================================  ===========================================

mlflow is never imported here: a run can only be active if the user's code
imported mlflow already, so ``sys.modules`` is checked instead, and without a
run (or without mlflow) nothing is logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..percentile import percentile
from ..shutdown import exiting
from .state import Wrapping

__all__ = ["EpochStats", "MlflowSink", "TimedIterator", "summarise"]

log = logging.getLogger("ucstage")

_clock = time.perf_counter

# MLflow accepts at most 1000 metrics per log_batch call.
_MAX_BATCH = 1000


@dataclass(frozen=True)
class EpochStats:
    """What one pass over a DataLoader looked like from the training loop."""

    epoch: int
    batches: int
    wall_s: float
    """From the first ``next()`` to the end of the epoch."""
    wait_s: float
    """Sum of the time ``next()`` blocked."""
    wait_p50_ms: float
    wait_p95_ms: float
    wait_max_ms: float
    batches_per_s: float
    stall_share: float
    """``wait_s / wall_s``: the share of the epoch the loop sat waiting for data."""
    overhead_s: float
    """Time spent in ucstage's own timing and logging bookkeeping."""
    complete: bool
    """False when the loop stopped before the loader was exhausted."""
    cache_hit_rate: float | None = None
    """Files this rank read that were already cached / files it read (None
    without a VolumeDataset on ucstage's cache, or when it read nothing)."""
    cache_wait_s: float = 0.0
    """Time this rank's copies waited for room under the cache cap."""
    source_items: dict[str, int] | None = None
    """A mix's items per source that this rank's loader returned (None without a mix)."""


def summarise(epoch: int, waits: list[float], wall_s: float, overhead_s: float,
              complete: bool) -> EpochStats:
    ordered = sorted(waits)
    total = sum(waits)
    return EpochStats(
        epoch=epoch,
        batches=len(waits),
        wall_s=wall_s,
        wait_s=total,
        wait_p50_ms=percentile(ordered, 50) * 1000,
        wait_p95_ms=percentile(ordered, 95) * 1000,
        wait_max_ms=(ordered[-1] if ordered else 0.0) * 1000,
        batches_per_s=len(waits) / wall_s if wall_s > 0 else 0.0,
        stall_share=min(1.0, total / wall_s) if wall_s > 0 else 0.0,
        overhead_s=overhead_s,
        complete=complete,
    )


class MlflowSink:
    """Buffers metrics for the run active when it was created; sends them in batches.

    The loop only appends a tuple per batch; building MLflow entities and the
    ``log_batch`` calls happen on one background thread, including the
    end-of-epoch flush, so the loop never waits for the tracking store.
    :meth:`flush` waits for everything sent so far.
    """

    def __init__(self, run_id: str, prefix: str, flush_every: int) -> None:
        self.run_id = run_id
        self.prefix = prefix.rstrip("/")
        self.flush_every = max(1, min(flush_every, _MAX_BATCH))
        self._buffer: list[tuple[str, float, int, int]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._client: Any = None
        self._warned = False

    @classmethod
    def for_active_run(cls, prefix: str, flush_every: int) -> MlflowSink | None:
        mlflow = sys.modules.get("mlflow")
        if mlflow is None or not hasattr(mlflow, "active_run"):
            return None
        try:
            run = mlflow.active_run()
        except Exception:  # a broken tracking setup must not stop training
            return None
        if run is None:
            return None
        return cls(run.info.run_id, prefix, flush_every)

    def add(self, name: str, value: float, step: int) -> None:
        self._buffer.append((name, value, int(time.time() * 1000), step))
        if len(self._buffer) >= self.flush_every:
            self.send()

    def send(self) -> None:
        """Hand the buffered metrics to the background thread."""
        if not self._buffer:
            return
        batch, self._buffer = self._buffer, []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ucstage-mlflow")
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._log, batch))

    def _log(self, batch: list[tuple[str, float, int, int]]) -> None:
        try:
            from mlflow.entities import Metric
            from mlflow.tracking import MlflowClient

            if self._client is None:
                self._client = MlflowClient()
            metrics = [Metric(f"{self.prefix}/{name}", float(value), ts, step)
                       for name, value, ts, step in batch]
            for i in range(0, len(metrics), _MAX_BATCH):
                self._client.log_batch(self.run_id, metrics=metrics[i:i + _MAX_BATCH])
        except Exception as exc:  # logging must never kill a training run
            if not self._warned:
                self._warned = True
                log.warning("ucstage: could not log loader metrics to MLflow: %s", exc)

    @property
    def busy(self) -> bool:
        return bool(self._buffer) or any(not f.done() for f in self._pending)

    def flush(self) -> None:
        """Send everything buffered and wait until it is written."""
        self.send()
        for f in self._pending:
            f.result()
        self._pending = []


class TimedIterator(Wrapping):
    """Wraps a DataLoader iterator; times each ``next()`` and reports the epoch.

    Other attributes are forwarded to the wrapped iterator (:class:`Wrapping`).
    """

    def __init__(self, inner: Iterator[Any], *, epoch: int, first_step: int,
                 sink: MlflowSink | None, on_done: Any, step_every: int = 1,
                 extra: Any = None) -> None:
        self._inner = inner
        self._extra = extra
        """Called at the epoch's end: more per-epoch metrics (the cache's)."""
        self._every = max(1, step_every)
        self._window = 0.0
        self._epoch = epoch
        self._step = first_step
        self._sink = sink
        self._on_done = on_done
        self._waits: list[float] = []
        self._start: float | None = None
        self._overhead = 0.0
        self._done = False

    def __next__(self) -> Any:
        t0 = _clock()
        if self._start is None:
            self._start = t0
        try:
            batch = next(self._inner)
        except StopIteration:
            self._finish(t0, complete=True)
            raise
        t1 = _clock()
        wait = t1 - t0
        self._waits.append(wait)
        if self._sink is not None:
            self._log(wait, t1)
        self._step += 1
        return batch

    def _log(self, wait: float, t1: float) -> None:
        """The batch's wait to MLflow; the time it takes counts as overhead.
        (Without a sink the bookkeeping is one append, cheaper than timing it.)"""
        if self._every == 1:
            self._sink.add("batch_wait_ms", wait * 1000, self._step)  # type: ignore[union-attr]
        else:
            self._window += wait
            if (self._step + 1) % self._every == 0:
                self._sink.add("batch_wait_ms",  # type: ignore[union-attr]
                               self._window / self._every * 1000, self._step)
                self._window = 0.0
        self._overhead += _clock() - t1

    def close(self) -> None:
        """End the epoch early (the loop broke out); its summary is still logged."""
        self._finish(time.perf_counter(), complete=False)

    def __del__(self) -> None:
        # Collected at interpreter exit (an epoch left by an uncaught error):
        # no summary, since reading the counters and logging may fail then.
        if exiting():
            return
        with contextlib.suppress(Exception):
            self.close()

    def _finish(self, now: float, *, complete: bool) -> None:
        if self._done:
            return
        self._done = True
        t0 = time.perf_counter()
        wall = now - self._start if self._start is not None else 0.0
        stats = summarise(self._epoch, self._waits, wall, self._overhead, complete)
        extra: dict[str, float] = {}
        if self._extra is not None:
            try:
                extra = self._extra()
            except Exception as exc:  # the counters must never stop a training run
                log.warning("ucstage: could not read the cache counters: %s", exc)
        if self._sink is not None and stats.batches:
            for name, value in extra.items():
                self._sink.add(name, value, self._epoch)
            for name, value in (("epoch_wait_p50_ms", stats.wait_p50_ms),
                                ("epoch_wait_p95_ms", stats.wait_p95_ms),
                                ("epoch_wait_max_ms", stats.wait_max_ms),
                                ("epoch_batches_per_s", stats.batches_per_s),
                                ("epoch_stall_share", stats.stall_share),
                                ("epoch_batches", stats.batches)):
                self._sink.add(name, value, self._epoch)
            self._sink.send()
        overhead = self._overhead + time.perf_counter() - t0
        stats = summarise(self._epoch, self._waits, wall, overhead, complete)
        if extra:
            items = {k[len("epoch_items_"):]: int(v) for k, v in extra.items()
                     if k.startswith("epoch_items_")}
            stats = dataclasses.replace(stats, cache_hit_rate=extra.get("epoch_cache_hit_rate"),
                                        cache_wait_s=extra.get("epoch_cache_wait_s", 0.0),
                                        source_items=items or None)
        self._on_done(stats, self._step)
