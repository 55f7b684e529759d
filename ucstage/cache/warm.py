"""Warming: copying many entries into the cache at once, ``jobs`` at a time,
and the cache seen from the commands that warm, check and clear a SOURCE.

:func:`warm_entries` is the body of :meth:`ucstage.LocalCache.warm`
(docs/cache.md, "Warming"): it looks up which entries are already valid,
checks that the rest fit, then :class:`WarmCopies` runs the copies through
the fetch protocol (:mod:`ucstage.cache.fetch`: daemon threads, or its loop
driver on the object-store engine) and stops them on Ctrl-C. The rest are
what the CLI calls: which ranks' files a warm covers (:func:`rank_slice`,
the slot rule applied to a warm), and what the cache holds for a SOURCE
(:func:`cached_volumes`, :func:`verify_source`, :func:`job_env`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..errors import CacheFull, CacheUnusable, InvalidArgument, SourceNotFound, UcstageError
from ..manifest import Manifest
from ..progress import NO_PROGRESS, Callback
from ..sharding import Layout, ReadOrder, rank_entries
from ..source import ManifestSource, Source, VolumeSource, open_source
from ..units import format_bytes
from ..volumes import VOLUMES_ROOT_ENV, FileEntry, Volume, engine, is_volumes_path
from . import integrity, local, objget, paths
from .fetch import LoopWarm, fetch_once, fetch_retrying, retryable
from .inflight import Inflight, Stopped
from .paths import CACHE_DIR_ENV, user_root
from .policy import Evictions, charging
from .reports import (
    CacheStatus,
    EvictedSource,
    RankSlice,
    SourceCheck,
    VerifyReport,
    WarmReport,
)
from .space import free_bytes
from .tuning import AUTO, Jobs, ceiling, check_jobs, first_guess

if TYPE_CHECKING:
    from ..manifest.groups import Groups
    from .local import Bound, LocalCache

__all__ = ["GRACE", "WARM_FEWER", "WarmCopies", "cached_volumes", "job_env", "rank_slice",
           "share_text", "unusable_status", "verify_source", "warm_entries", "warm_ranks",
           "warm_slice"]

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


def warm_entries(at: Bound, entries: Sequence[FileEntry], *,
                 jobs: int | str = AUTO, callback: Callback = NO_PROGRESS) -> WarmReport:
    """Copy every entry not already valid into ``at``'s namespace, ``jobs`` at a time.

    See :meth:`ucstage.LocalCache.warm`.
    """
    cache, volume = at.cache, at.volume
    cb = callback if callback is not None else NO_PROGRESS
    try:
        fixed = check_jobs(jobs)
    except ValueError as exc:
        raise InvalidArgument(str(exc), hint="pass a positive number, or 'auto'") from None
    reader = engine.of(volume)  # chosen once for the whole warm
    start = time.monotonic()
    checked = integrity.TALLY.snapshot()
    hedges = dict(objget.STATS)
    new_namespace = not os.path.isdir(at.prefix)
    ns_dir = at.prepare()
    cache.space.sweep(ns_dir)
    report = WarmReport(files=len(entries), bytes=sum(e.size for e in entries),
                        source=volume.source, cache_dir=cache.root, namespace=ns_dir,
                        engine=reader.name, jobs_auto=fixed is None)
    todo: list[FileEntry] = []
    valid: list[str] = []
    for e in entries:
        try:
            hit = at.lookup(e)
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
    evicted = Evictions()
    start_at = first_guess(volume, reader) if fixed is None else None
    tuner = Jobs(fixed, ceiling=ceiling(reader), start=start_at)
    WarmCopies(at, todo, report, cb, evicted, tuner, reader.on_loop).run()
    report.jobs = tuner.settled
    integrity.note(report, checked, volume.url)
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
    engine whose copies are coroutines on its event loop:
    :class:`ucstage.cache.fetch.LoopWarm`), the
    calling thread waits for their results and reports them (the report and
    the callback are touched by the calling thread only).

    Daemon threads, not a ``ThreadPoolExecutor``: leaving an executor waits for
    every queued copy, and the interpreter joins its threads at exit, so a
    thread stuck in a slow read would hold up Ctrl-C. On any exception in the
    calling thread (Ctrl-C, SIGTERM, a full cache) the warm stops: see
    :meth:`_stop`.
    """

    def __init__(self, at: Bound, todo: Sequence[FileEntry],
                 report: WarmReport, cb: Callback, evicted: Evictions, tuner: Jobs,
                 on_loop: bool = False) -> None:
        self.at, self.todo = at, todo
        self.report, self.cb, self.evicted = report, cb, evicted
        self.tuner = tuner
        self.inflight = Inflight(on_retry=tuner.error)
        self.threads = 0
        self.on_loop = on_loop
        """Copies run as coroutines on the engine's loop (:class:`LoopWarm`)."""
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
                # per copy in flight.
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
                with charging(self.evicted):  # this warm's evictions, per source
                    outcome = fetch_retrying(self.at, entry, self.inflight)[1]
            except BaseException as exc:
                outcome = exc
            tuner.leave(entry.size if outcome is True else 0)
            self.results.put([(entry, outcome)])

    def fetch_once(self, entry: FileEntry) -> tuple[str, bool]:
        """:func:`ucstage.cache.fetch.fetch_once` of ``entry`` for this warm,
        in the calling thread (the loop driver's thread for a copy that may wait)."""
        with charging(self.evicted):
            return fetch_once(self.at, entry, self.inflight)

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
            self.inflight.abandon(self.at.cache.space.abandon)
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
            if self.at.lookup(entry, touch=False) is not None:
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


# -- a warm of some ranks' files: which ranks, the slice of the listing ---------
#
# The numbering is torchrun's (:meth:`ucstage.sharding.Layout.node_ranks`), the
# files the slot rule's (:func:`ucstage.sharding.rank_entries`); with shuffle
# under the "node" scope a warm covers its nodes' whole share, and says so.

def warm_ranks(rank: int | None = None, node_rank: int | None = None, *,
               world_size: int | None = None, num_workers: int | None = None,
               nproc_per_node: int | None = None) -> list[int] | None:
    """The ranks a warm covers: ``[rank]``, every rank of node ``node_rank``
    (``nproc_per_node`` ranks each, as torchrun numbers them), or None (neither:
    the whole source).

    Raises:
        InvalidArgument: both ranks given, a job shape without a rank, a rank
            without ``world_size`` and ``num_workers``, ``node_rank`` without
            ``nproc_per_node``, or a node outside the job.
    """
    # Messages name the parameters; in backquotes where a plain word would read
    # as the thing (the CLI says each as its flag, ucstage.cli.output.flag_names).
    if rank is None and node_rank is None:
        if world_size is not None or num_workers is not None or nproc_per_node is not None:
            raise InvalidArgument("world_size/num_workers/nproc_per_node need `rank` "
                                  "or node_rank")
        return None
    if rank is not None and node_rank is not None:
        raise InvalidArgument("give `rank` or node_rank, not both")
    if world_size is None or num_workers is None:
        raise InvalidArgument("`rank` and node_rank need world_size and num_workers",
                              hint="e.g. `rank` 3 world_size 8 num_workers 6")
    if rank is not None:
        return [rank]
    if nproc_per_node is None:
        raise InvalidArgument("node_rank needs nproc_per_node P (ranks per node)")
    assert node_rank is not None
    return list(Layout(world_size, num_workers, nproc_per_node).node_ranks(node_rank))


def rank_slice(entries: Sequence[FileEntry], ranks: Sequence[int], layout: Layout,
               order: ReadOrder, groups: Groups | None = None
               ) -> tuple[list[FileEntry], RankSlice]:
    """The entries ``ranks`` read (:func:`ucstage.sharding.rank_entries`) and the
    :class:`RankSlice` that says so. With ``order.shuffle`` under the node
    scope, that is the whole share of the ranks' nodes (``RankSlice.nodes``).
    With ``groups`` (a grouped manifest's), the slot rule deals samples
    (``order.n`` is their count) and every member of each is taken."""
    share = order.shuffle and order.shuffle_scope == "node"
    nodes = sorted({layout.node_of(r) for r in ranks}) if share else None
    found = RankSlice(list(ranks), layout, order, nodes)
    if groups is None:
        return rank_entries(entries, ranks, layout, order), found
    picked = rank_entries(range(groups.count), ranks, layout, order)
    return [entries[int(r)] for r in groups.rows(picked)], found


def share_text(nodes: Sequence[int], layout: Layout) -> str:
    """``node 1's whole share (ranks 8..15)``: the nodes a node-scope warm covers."""
    if layout.nodes == 1:
        return "the whole share of the job's one node (every file)"
    ranks = ", ".join(f"{r[0]}..{r[-1]}" for r in map(layout.node_ranks, nodes))
    which = f"node {nodes[0]}'s" if len(nodes) == 1 else \
        "nodes " + ", ".join(str(n) for n in nodes) + "'"
    return f"{which} whole share (ranks {ranks})"


def warm_slice(cache: LocalCache, volume: Volume, entries: Sequence[FileEntry],
               rank_slice: RankSlice | None = None, *, jobs: int | str = AUTO,
               callback: Callback = NO_PROGRESS) -> WarmReport:
    """:meth:`LocalCache.warm` of the entries :func:`rank_slice` chose (or of a
    whole source, ``rank_slice`` None).

    Raises:
        CacheFull: as :meth:`LocalCache.warm`; for a node's whole share the
            message names the share and the hint what makes it fit, since the
            node reads those files every epoch.
    """
    try:
        return cache.warm(volume, entries, jobs=jobs, callback=callback)
    except CacheFull as exc:
        if rank_slice is None or rank_slice.nodes is None:
            raise
        raise CacheFull(
            f"{share_text(rank_slice.nodes, rank_slice.layout)} does not fit: {exc.message}",
            hint="the node reads these files every epoch; give it a cache that holds them "
                 "(raise max_bytes, a larger disk) or run on more nodes; shuffle_scope "
                 "global needs one epoch's slice but fetches again every epoch") from exc


# -- the cache seen from a SOURCE: the bodies of `ucstage cache status/clear/verify/lazy`,
# on the SOURCE as :func:`ucstage.source.open_source` decided it.

def unusable_status(exc: CacheUnusable, source: str | None = None) -> CacheStatus:
    """What ``cache status`` can still say of a root :class:`LocalCache` refused
    (``exc``): the namespaces found under it (of ``source``, or all), counted
    without writing or locking anything, and why it is unusable
    (:attr:`CacheStatus.unusable`). A root that is no folder holds nothing."""
    root = exc.root
    cap = local.env_max_bytes()
    if not os.path.isdir(root):
        parent = os.path.dirname(root)
        while parent and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        return CacheStatus(root, 0, 0, cap, free_bytes(parent or "/"), [],
                           unusable=exc.message)
    cache = local.LocalCache.unopened(root, max_bytes=cap)
    found = cache.status(cached_volumes(cache, source))
    return dataclasses.replace(found, unusable=exc.message)


def cached_volumes(cache: LocalCache, source: str | None) -> list[Volume] | None:
    """The cached volumes ``source`` names, or None (no ``source``) for every one.

    Found as the cache recorded them (:meth:`LocalCache.find`): a source that
    is gone still names its namespace (clearing the cache of a deleted volume
    works), and a ``/Volumes/...`` path is found whatever
    $UCSTAGE_VOLUMES_ROOT says now. A manifest names its source.

    Raises:
        SourceNotFound: ``source`` neither exists nor has anything cached
            (most likely a typo).
    """
    if source is None:
        return None
    opened = open_source(source)
    if isinstance(opened, ManifestSource):
        source = opened.manifest.source
    found = cache.find(source)
    if found:
        return found
    try:
        return [opened.volume()]
    except SourceNotFound as exc:
        raise SourceNotFound(f"nothing cached for {source} (and {source} does not exist)",
                             hint="`ucstage cache status` lists the cached sources") from exc


def verify_source(cache: LocalCache, source: Source | None, *, checksum: bool = False,
                  include: Sequence[str] = (), exclude: Sequence[str] = (),
                  include_hidden: bool = False, skip_unreadable: bool = False,
                  listed: Callable[[Manifest], None] | None = None,
                  fix: bool = False) -> VerifyReport:
    """:meth:`LocalCache.verify` of what the cache holds for ``source``, or
    (None) of every cached source, each against a fresh listing.

    A volume is checked against where the cache copied it from, as
    :meth:`LocalCache.find` finds it (a ``/Volumes`` path may map elsewhere
    now), one :class:`~ucstage.cache.reports.SourceCheck` per place; a
    manifest, or a volume with nothing cached, against its own listing. The
    filters apply to those listings; ``listed`` hears each one made (to
    warn of the entries and folders it skipped). Orphans (cached files the
    source no longer has) are reported against an unfiltered fresh listing
    only, and deleted with ``fix``; a cached place that no longer exists is
    reported ``vanished``.
    """
    if source is None:
        return cache.verify(checksum=checksum, fix=fix)
    found = cache.find(source.text) if isinstance(source, VolumeSource) else []
    # A manifest is the source as it was; a filtered listing a part of it.
    complete = isinstance(source, VolumeSource) and not (include or exclude or skip_unreadable)

    def snapshot(opened: Source) -> Manifest:
        m = opened.snapshot(include=include, exclude=exclude, include_hidden=include_hidden,
                            skip_unreadable=skip_unreadable)
        if listed is not None:
            listed(m)
        return m

    if not found:
        m = snapshot(source)
        return cache.verify(m.volume(), m.entries, checksum=checksum, complete=complete, fix=fix)
    report = VerifyReport([], checksum)
    for volume in found:
        try:
            m = snapshot(open_source(volume.url))
        except SourceNotFound as exc:
            report.sources.append(SourceCheck(volume.source, vanished=exc.message))
            continue
        label = volume.source if is_volumes_path(volume.source) else m.source
        checked = cache.verify(dataclasses.replace(m.volume(), source=label), m.entries,
                               checksum=checksum, complete=complete, fix=fix)
        report.sources.extend(checked.sources)
    return report


def job_env(manifest: Manifest, cache: LocalCache) -> dict[str, str]:
    """The variables a training job needs to read ``manifest`` through ``cache``:
    the ones this process used that differ from the defaults."""
    env = {}
    root = os.environ.get(VOLUMES_ROOT_ENV, "")
    if is_volumes_path(manifest.source) and root:
        env[VOLUMES_ROOT_ENV] = root  # the manifest names /Volumes/...; this maps it
    if cache.root != user_root():
        env[CACHE_DIR_ENV] = cache.root
    cap = local.MAX_BYTES_ENV
    if os.environ.get(cap, "").strip():
        env[cap] = os.environ[cap].strip()
    return env
