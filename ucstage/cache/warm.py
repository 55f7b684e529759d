"""Warming: copying many entries into the cache at once, ``jobs`` at a time.

:func:`warm_entries` is the body of :meth:`ucstage.LocalCache.warm`: it looks up
which entries are already valid, checks that the rest fit, then
:class:`WarmCopies` runs the copies (daemon threads, or coroutines on the
object-store engine's loop: :mod:`.loopwarm`), each through the fetch
protocol (:mod:`ucstage.cache.fetch`), and stops them on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Sequence

from ..engines import checks, engine, objget
from ..errors import CacheFull, InvalidArgument, UcstageError
from ..progress import NO_PROGRESS, Callback
from ..units import format_bytes
from ..volumes import FileEntry, Volume
from . import paths
from .fetch import Fetcher, retryable
from .inflight import Inflight, Stopped
from .reports import EvictedSource, WarmReport
from .space import Evicted, free_bytes
from .tuning import AUTO, Jobs, ceiling, check_jobs, first_guess

__all__ = ["GRACE", "WARM_FEWER", "WarmCopies", "warm_entries"]

WARM_FEWER = "warm fewer files"
"""How a :exc:`CacheFull` hint of :meth:`ucstage.LocalCache.warm` ends when warming
fewer files would help; the library cannot name the CLI flags that choose
them, so the CLI's error mapper adds them (:func:`ucstage.cli.output.error_hint`)."""
GRACE = 1.0
"""Seconds a stopping warm lets its copies in flight finish before abandoning them."""
_LATE_REPORTS = 0.5
"""Seconds a stopped warm still listens, after abandoning, for copies that
committed meanwhile. It returns as soon as every copy has reported, so only a
copy stuck in a hung read costs the whole wait; GRACE plus this stays well
inside the 2 s a Ctrl-C may take. The margin is for a thread starved on a
loaded 2-core machine: without this wait, one fresh-clone test run counted a
file fewer than the cache held.)"""


def warm_entries(fetcher: Fetcher, volume: Volume, entries: Sequence[FileEntry], *,
                 jobs: int | str = AUTO, callback: Callback = NO_PROGRESS) -> WarmReport:
    """Copy every entry not already valid into ``fetcher``'s cache, ``jobs`` at a time.

    See :meth:`ucstage.LocalCache.warm`.
    """
    cache = fetcher.cache
    cb = callback if callback is not None else NO_PROGRESS
    try:
        fixed = check_jobs(jobs)
    except ValueError as exc:
        raise InvalidArgument(str(exc), hint="pass a positive number, or 'auto'") from None
    reader = engine.of(volume)  # chosen once for the whole warm
    start = time.monotonic()
    checked = checks.TALLY.snapshot()
    hedges = dict(objget.STATS)
    new_namespace = not os.path.isdir(cache.space.namespace_dir(volume.url))
    ns_dir = cache.prepare(volume)
    cache.space.sweep(ns_dir)
    report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries),
                        source=volume.source, cache_dir=cache.root, namespace=ns_dir,
                        engine=reader.name, jobs_auto=fixed is None)
    todo: list[FileEntry] = []
    valid: list[str] = []
    for e in entries:
        try:
            hit = cache.lookup(volume, e)
        except UcstageError as exc:
            report.failed.append((e.path, str(exc)))
            continue
        if hit is None:
            todo.append(e)
        else:
            valid.append(e.path)
            report.already_cached += 1
            report.already_cached_bytes += e.size
    try:
        _check_room(ns_dir, todo, report.bytes, cache.max_bytes)
    except CacheFull:
        # Refused before copying anything: a namespace made for this warm
        # would show in `cache status` as an empty source that was never cached.
        if new_namespace and not os.listdir(ns_dir):
            cache.space.remove_namespaces([ns_dir])
        raise
    cb.set_size(report.bytes, items=report.files)
    cb.relative_update(report.already_cached_bytes)
    for path in valid:
        cb.item_done(path, "cached")
    for path, reason in report.failed:
        cb.item_done(path, "failed", reason)
    evicted = Evicted()
    start_at = first_guess(volume, reader) if fixed is None else None
    tuner = Jobs(fixed, ceiling=ceiling(reader), start=start_at)
    WarmCopies(fetcher, volume, todo, report, cb, evicted, tuner, reader.on_loop).run()
    report.jobs = tuner.settled
    checks.note(report, checked, volume.url)
    report.hedged = objget.STATS["hedges"] - hedges.get("hedges", 0)
    report.timeouts = objget.STATS["timeouts"] - hedges.get("timeouts", 0)
    sources = cache.space.sources()
    report.evicted = [EvictedSource(name, sources.get(name, ("", ""))[0], files, nbytes)
                      for name, (files, nbytes) in evicted.by_namespace().items()]
    report.seconds = time.monotonic() - start
    return report


def _check_room(ns_dir: str, todo: Sequence[FileEntry], total: int, max_bytes: int | None) -> None:
    need = sum(e.size for e in todo)
    free = free_bytes(ns_dir)
    if need > free:
        raise CacheFull(
            f"not enough space in the cache folder {ns_dir}: {len(todo):,} files need "
            f"{format_bytes(need)}, {format_bytes(free)} free",
            hint=f"free space, point {paths.CACHE_DIR_ENV} at a larger disk, or {WARM_FEWER}")
    if max_bytes is not None and total > max_bytes:
        raise CacheFull(
            f"these files total {format_bytes(total)}, more than the cache cap "
            f"{format_bytes(max_bytes)}",
            hint=f"raise max_bytes, or {WARM_FEWER}")


class WarmCopies:
    """One warm's copy phase: ``jobs`` daemon threads copy (``on_loop``, an
    engine whose copies are coroutines on its event loop: :mod:`.loopwarm`), the
    calling thread waits for their results and reports them (the report and
    the callback are touched by the calling thread only).

    Daemon threads, not a ``ThreadPoolExecutor``: leaving an executor waits for
    every queued copy, and the interpreter joins its threads at exit, so a
    thread stuck in a slow read would hold up Ctrl-C. On any exception in the
    calling thread (Ctrl-C, SIGTERM, a full cache) the warm stops: see
    :meth:`_stop`.
    """

    def __init__(self, fetcher: Fetcher, volume: Volume, todo: Sequence[FileEntry],
                 report: WarmReport, cb: Callback, evicted: Evicted, tuner: Jobs,
                 on_loop: bool = False) -> None:
        self.fetcher, self.volume, self.todo = fetcher, volume, todo
        self.report, self.cb, self.evicted = report, cb, evicted
        self.tuner = tuner
        self.inflight = Inflight(on_retry=tuner.error)
        self.threads = 0
        self.on_loop = on_loop
        """Copies run as coroutines on the engine's loop (:mod:`.loopwarm`)."""
        self.results: queue.SimpleQueue[list[tuple[FileEntry, bool | BaseException]]] = \
            queue.SimpleQueue()
        """Outcomes of copies, in batches (a thread puts one; the event loop's
        driver puts what ended in one pass of the loop, so the waiting thread
        wakes once per batch, not once per file)."""
        self._pending = iter(todo)
        self._take = threading.Lock()
        self.taken = 0
        self._open: set[FileEntry] = set()
        """Entries taken whose outcome is not recorded yet (see :meth:`_settle`)."""
        self.received = 0
        self.done_bytes = 0

    def run(self) -> None:
        if not self.todo:
            return
        try:
            if self.on_loop:
                # Every copy a coroutine on the engine's event loop: no thread
                # per copy in flight (see :mod:`.loopwarm`).
                from .loopwarm import LoopWarm

                LoopWarm(self).start()
            self._spawn()
            while self.received < len(self.todo):
                for entry, outcome in self.results.get():
                    self._record(entry, outcome)
                self._spawn()
        except BaseException as exc:
            self._stop()
            if isinstance(exc, CacheFull):
                left = sum(e.size for e in self.todo) - self.done_bytes
                raise CacheFull(f"{exc.message}; this warm still needs {format_bytes(left)}",
                                exc.hint) from exc
            raise

    def _spawn(self) -> None:
        """One thread per place in flight, started as the tuner raises the limit."""
        want = min(self.tuner.limit, len(self.todo))
        while not self.on_loop and self.threads < want:
            threading.Thread(target=self._work, name=f"ucstage-warm-{self.threads}",
                             daemon=True).start()
            self.threads += 1

    def _work(self) -> None:
        tuner = self.tuner
        while tuner.enter():
            with self._take:
                entry = None if self.inflight.stopped else next(self._pending, None)
                if entry is None:
                    tuner.leave(0, counted=False)
                    tuner.close()
                    return
                self.took(entry)
            outcome: bool | BaseException
            try:
                outcome = self.fetcher.fetch_retrying(self.volume, entry, self.inflight,
                                                      self.evicted)[1]
            except BaseException as exc:
                outcome = exc
            tuner.leave(entry.size if outcome is True else 0)
            self.results.put([(entry, outcome)])

    def took(self, entry: FileEntry) -> None:
        """A copy of ``entry`` starts (called under ``_take``)."""
        self.taken += 1
        self._open.add(entry)

    def _record(self, e: FileEntry, outcome: bool | BaseException) -> None:
        self.received += 1
        with self._take:
            self._open.discard(e)
        report, cb = self.report, self.cb
        if isinstance(outcome, Stopped):
            return
        if isinstance(outcome, UcstageError) and not isinstance(outcome, CacheFull):
            report.failed.append((e.path, str(outcome)))
            if retryable(outcome):
                report.retryable.add(e.path)
            cb.item_done(e.path, "failed", str(outcome))
            return
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome:
            report.fetched += 1
            report.fetched_bytes += e.size
        else:
            report.already_cached += 1
            report.already_cached_bytes += e.size
        self.done_bytes += e.size
        cb.relative_update(e.size)
        cb.item_done(e.path, "fetched" if outcome else "cached")

    def _stop(self) -> None:
        """Start no copy; give copies in flight :data:`GRACE` seconds to finish
        (reporting the ones that do), then abandon the rest."""
        self.inflight.stop()
        self.tuner.close()
        deadline = time.monotonic() + GRACE
        try:
            while True:
                with self._take:
                    running = self.taken - self.received
                left = deadline - time.monotonic()
                if running <= 0 or left <= 0:
                    break
                try:
                    batch = self.results.get(timeout=left)
                except queue.Empty:
                    break
                for entry, outcome in batch:
                    # Stopping already: the first error is the one raised.
                    with contextlib.suppress(BaseException):
                        self._record(entry, outcome)
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting, but still clean up
        # A second Ctrl-C here leaves temp files that the next warm sweeps
        # (nobody holds their stripes once this process is gone).
        with contextlib.suppress(KeyboardInterrupt):
            self.inflight.abandon(self.fetcher.cache.space.abandon)
            # A copy that committed just as the grace ran out (abandon waited
            # for it) reports right after: count it, or the summary would
            # miss a file that is cached.
            self._drain(time.monotonic() + _LATE_REPORTS)
            self._settle()

    def _settle(self) -> None:
        """Count the copies still unreported that are in the cache now.

        A thread starved past the wait above, or an outcome taken off the
        queue just as Ctrl-C landed, would otherwise leave the summary a file
        short of what the cache holds (seen on a loaded 2-core machine). The
        cache itself is the truth: each open entry that is valid there now was
        copied since the warm started (by this warm, or by another process
        racing it, which the stop summary need not tell apart). At most the
        copies in flight are looked up."""
        with self._take:
            still = list(self._open)
        for entry in still:
            if self.fetcher.cache.lookup(self.volume, entry, touch=False) is not None:
                with contextlib.suppress(BaseException):
                    self._record(entry, True)

    def _drain(self, until: float) -> None:
        while True:
            with self._take:
                running = self.taken - self.received
            left = until - time.monotonic()
            if running <= 0 or left <= 0:
                return
            try:
                batch = self.results.get(timeout=left)
            except queue.Empty:
                return
            for entry, outcome in batch:
                with contextlib.suppress(BaseException):
                    self._record(entry, outcome)
