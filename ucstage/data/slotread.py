"""A slot's items to held local paths: the one read path of every dataset.

Every sharded dataset (files, grouped samples, a table's row groups, a shard
set's blocks) hands its slot's items to :func:`read`, with the item's
:class:`Kind` decided once (:data:`FILES` or :data:`SAMPLES`) and the slot's
:class:`~ucstage.cache.leases.Reader`, which is always there (without a byte
cap it holds nothing and only counts). :func:`read` runs one path:

- **Hit runs** (no cap: nothing needs holding): the leading run of hits is
  looked up :data:`BLOCK` items at a time through the cache's one validity
  rule (:meth:`ucstage.cache.local.Bound.lookup_rows`, from the manifest's
  columns when the slot is a :class:`~ucstage.data.samples.SlotRows` of
  files) and handed out with ``yield from`` a list, so a warm epoch pays per
  file for the lookup and nothing else. The first miss ends the run.
- **Read-ahead** (:class:`ReadAhead`) for the rest: each item is looked up in
  the consumer's thread as it enters a window of ``read_ahead`` items (held
  and counted by the reader); only misses go to threads, which copy through
  the cache and can be stopped (:meth:`ReadAhead.close`).
- **Holds** (:func:`follow`): under a cap each path stays held until the
  consumer is ``slack`` items further and, under a ucstage DataLoader, its
  loop is past the batch it went into (:mod:`ucstage.data.channel`).

Under a cap every path handed out is held, and
:func:`ucstage.cache.leases.check_window` counts on a window of
``read_ahead + 1 + slack`` held files per reader: looking up a block ahead
would hold too many, so the capped path skips the hit runs.

**Stopping.** :meth:`ReadAhead.close` (the loop broke out, a
``KeyboardInterrupt``, the DataLoader shut its workers down, or the iterator
was collected) starts no new fetch and stops the copies in flight at their
next chunk (their temp files removed); one still blocked in a read after
:data:`GRACE_SECONDS` is abandoned. A fetch that cannot be stopped (a test's
plain callable) is finished first, within :data:`JOIN_SECONDS`.

**How many in flight** (``read_ahead="auto"``, the default): every reader of
a node (``LOCAL_WORLD_SIZE`` x DataLoader workers) takes an equal share of
the node's budget (:func:`node_share`): the first guess ``cache warm --jobs
auto`` starts from for the source's kind (:data:`ucstage.cache.tuning.FIRST_GUESS`)
and its ceiling, tuned as it runs by the same rule as ``--jobs auto``
(:class:`ucstage.cache.tuning.Jobs`). Under a byte cap the share's ceiling is
cut so that the node's read-ahead takes at most 1/:data:`CAP_SHARE` of the
cap, and every reader's window fits under the cap (:func:`check_loader_window`).
"""

from __future__ import annotations

import collections
import functools
import operator
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from ..cache import runstats, tuning
from ..cache.inflight import Inflight
from ..cache.leases import DEFAULT_SLACK, Reader, check_window
from ..cache.runstats import Counters, RunStats
from ..manifest.groups import split_name
from ..sharding import World
from ..shutdown import exiting
from ..volumes import FileEntry
from . import channel
from .channel import LoopView
from .samples import Sample, SlotRows

if TYPE_CHECKING:
    from ..cache import LocalCache
    from ..cache.local import Bound
    from ..volumes import Volume
    from .state import Sharded

__all__ = ["AUTO", "BLOCK", "CAP_SHARE", "FILES", "SAMPLES", "UNTRACKED", "Kind", "ReadAhead",
           "Share", "Tracker", "check_loader_window", "check_read_ahead", "epoch_metrics",
           "follow", "holds_files", "node_share", "open_reader", "rank_stats", "read",
           "source_metrics"]

AUTO = "auto"
FALLBACK = 4
"""The read-ahead of ``"auto"`` when there is no volume to size it by."""
CAP_SHARE = 16
"""Under a byte cap, ``"auto"``'s read-ahead takes at most 1/16 of it (over
every reader of the node): copies in flight are held, so a window near the
cap would leave nothing to keep files in for the next epoch (a hit rate near
0 instead of about cap / dataset)."""
READER_CEILING = 64
"""The most copies one reader (a DataLoader worker's slot iterator) keeps in
flight, whatever its share: each is a thread waiting on its copy."""

GRACE_SECONDS = 2.0
"""How long :meth:`ReadAhead.close` lets stopped copies reach their next
chunk before abandoning them (when the cache can abandon copies)."""
JOIN_SECONDS = 60.0
"""How long :meth:`ReadAhead.close` waits for a copy in flight to finish when
the fetch cannot be stopped: a hung mount must not hang the training loop's exit."""

BLOCK = 16
"""Items looked up before their run of hits is handed out: enough that the
per-run work (a list, a count) is small beside the lookups, few enough that
a path's proof is at most this many files old when it is handed out (the
read-ahead's lookups run its window ahead: ``read_ahead`` files, or under
``"auto"`` the reader's share, :func:`node_share`)."""
ROWS = 1024
"""Items made from the manifest at once (making them has a fixed cost per call)."""
_size = operator.attrgetter("size")


# -- the kinds of item ----------------------------------------------------------


class Kind:
    """What one item of a slot is to the read path: one file (a volume's file,
    a table's row group, a shard set's block: a :class:`FileEntry` each), the
    base; :class:`_Samples` for a grouped sample. Each kind gives its fetch,
    its lookup and its release over the file ones."""

    @staticmethod
    def fetcher(fetch: Callable[[FileEntry], str]) -> Callable[[Any], Any]:
        """``fetch(item)`` over the file ``fetch``."""
        return fetch

    @staticmethod
    def looker(lookup: Callable[[FileEntry], str | None],
               reader: Reader) -> Callable[[Any], Any]:
        """``lookup(item)``: its path(s) when valid hits, else None."""
        return lookup

    @staticmethod
    def run_lookup(lookup_run: Callable[[Sequence[FileEntry]], list[str]]
                   ) -> Callable[[Sequence[Any]], list[Any]]:
        """The hit runs' ``lookup_run`` over items: the leading run of valid ones."""
        return lookup_run

    @staticmethod
    def files(run: Sequence[Any]) -> int:
        """Files in a run of items."""
        return len(run)

    @staticmethod
    def paths(item: Any) -> tuple[str, ...]:
        """The paths a handed-out item holds."""
        return (item,)

    def release(self, reader: Reader, item: Any, *, consumed: bool = True) -> None:
        """Let a handed-out item go (every path of it)."""
        for path in self.paths(item):
            reader.release(path, consumed=consumed)


class _Samples(Kind):
    """A grouped sample (:class:`~ucstage.data.samples.Sample`): handed out as
    ``{suffix: local path}`` only once every member is valid in the cache, so
    a sample is never handed out half cached."""

    @staticmethod
    def fetcher(fetch: Callable[[FileEntry], str]) -> Callable[[Sample], dict[str, str]]:
        def fetch_sample(sample: Sample) -> dict[str, str]:
            return dict(zip(sample.suffixes, map(fetch, sample.members), strict=True))

        return fetch_sample

    @staticmethod
    def looker(lookup: Callable[[FileEntry], str | None],
               reader: Reader) -> Callable[[Sample], dict[str, str] | None]:
        def lookup_sample(sample: Sample) -> dict[str, str] | None:
            found: dict[str, str] = {}
            for suffix, entry in zip(sample.suffixes, sample.members, strict=True):
                path = lookup(entry)
                if path is None:  # the members already held are let go; the fetch takes them
                    SAMPLES.release(reader, found, consumed=False)
                    return None
                found[suffix] = path
            return found

        return lookup_sample

    @staticmethod
    def run_lookup(lookup_run: Callable[[Sequence[FileEntry]], list[str]]
                   ) -> Callable[[Sequence[Sample]], list[dict[str, str]]]:
        def samples_run(block: Sequence[Sample]) -> list[dict[str, str]]:
            paths = lookup_run([e for s in block for e in s.members])
            out: list[dict[str, str]] = []
            at = 0
            for sample in block:
                end = at + len(sample)
                if end > len(paths):
                    break
                out.append(dict(zip(sample.suffixes, paths[at:end], strict=True)))
                at = end
            return out

        return samples_run

    @staticmethod
    def files(run: Sequence[Any]) -> int:
        return sum(map(len, run))

    @staticmethod
    def paths(item: Any) -> tuple[str, ...]:
        return tuple(item.values())


FILES = Kind()
SAMPLES: Kind = _Samples()


# -- the reader -----------------------------------------------------------------


def holds_files(cache: LocalCache) -> bool:
    """Whether paths handed out from ``cache`` are held until the loop is past
    them: only under a byte cap (without one nothing of a reader's is evicted
    for its copies)."""
    return cache.space.max_bytes is not None


def open_reader(dataset: Sharded, rank: int) -> Reader:
    """The reader of one slot iterator of ``dataset``: its holds (under a
    cap) and the run's counters (:mod:`ucstage.cache.runstats`)."""
    cache = dataset.cache()
    counters = runstats.counters(cache.root, dataset.run, rank)
    return Reader(counters, slack=DEFAULT_SLACK, holding=holds_files(cache))


class Tracker(Protocol):
    """What the read path tells the slot's position to
    (:class:`ucstage.data.state.SlotTracker`, or :data:`UNTRACKED`)."""

    @property
    def position(self) -> int: ...

    def run(self, paths: list[Any]) -> Iterator[Any]: ...

    def count(self, paths: Iterator[Any]) -> Iterator[Any]: ...

    def end(self) -> None: ...


class _Untracked:
    """A tracker that counts nothing: a mix counts its own positions, a table
    and a shard set count theirs per row."""

    position = 0

    @staticmethod
    def run(paths: list[Any]) -> Iterator[Any]:
        return iter(paths)

    @staticmethod
    def count(paths: Iterator[Any]) -> Iterator[Any]:
        return paths

    @staticmethod
    def end() -> None:
        return None


UNTRACKED: Tracker = _Untracked()


# -- the read path ----------------------------------------------------------------


def read(items: Sequence[Any], kind: Kind, reader: Reader, bound: Bound,
         read_ahead: int | Share, *, tracker: Tracker = UNTRACKED,
         loop: LoopView | None = None) -> Iterator[Any]:
    """The local paths of a slot's ``items`` (of ``kind``), in order, through
    ``bound`` (the cache at their volume), held by ``reader``: the leading run
    of hits handed out in blocks when nothing is held, then the rest fetched
    ``read_ahead`` items ahead (a :class:`Share` of the node's copies in
    flight, or a fixed count), each held until :func:`follow` lets it go.
    ``tracker`` counts what the consumer takes; ``loop``: what the holds
    follow under a ucstage DataLoader."""
    done = 0
    if not reader.holding:
        done = yield from _hits(items, kind, bound, reader.counters, tracker)
    if done == len(items):
        return
    if done:  # what the hits handed out is skipped (a SlotRows' view makes no item)
        items = items.tail(done) if isinstance(items, SlotRows) else items[done:]
    # In order, each held by the reader: fetched here without read-ahead, else
    # by a ReadAhead, whose copies follow() stops when it closes it.
    share = read_ahead if isinstance(read_ahead, Share) else \
        Share(int(read_ahead), int(read_ahead), False)
    paths: Iterator[Any] | ReadAhead
    # The hits' run stopped at the first item because it is missing: its fetch
    # skips the check before the lock (a miss is checked there once, and once
    # under it).
    checked = 0 if reader.holding else 1
    if share.ceiling == 0:
        paths = map(kind.fetcher(reader.fetcher(bound, bound.fetch_missing, checked=checked)),
                    items)
        if not reader.holding:  # nothing to let go, no copy to stop: follow() has no work
            yield from tracker.count(paths)
            return
    else:
        inflight = Inflight()
        # Read-ahead looks every entry up before it queues it: a queued one is missing.
        held = kind.fetcher(reader.fetcher(bound, functools.partial(bound.fetch_missing,
                                                                    inflight=inflight),
                                           checked=None))
        jobs = tuning.Jobs(None, ceiling=share.ceiling, start=share.start) if share.tuned \
            else None
        paths = ReadAhead(held, items, share.ceiling, stop=inflight.stop,
                          abandon=functools.partial(inflight.abandon, bound.space.abandon),
                          lookup=kind.looker(reader.looker(bound), reader), jobs=jobs,
                          checked=checked)
    yield from tracker.count(follow(paths, reader, kind, loop, tracker.position))


def _hits(items: Sequence[Any], kind: Kind, bound: Bound, counters: Counters | None,
          tracker: Tracker) -> Generator[Any, None, int]:
    """Hand out the leading run of hits of ``items``, in order, :data:`BLOCK`
    at a time; return how many (``yield from`` gives it). A slot of files
    (:class:`~ucstage.data.samples.SlotRows`) is checked from the manifest's
    columns: no entry object is made on the warm path."""
    columns = getattr(items, "columns", None) if kind is FILES else None
    lookup_run = kind.run_lookup(bound.lookup_run) if columns is None else None
    count = len(items)
    done = 0
    while done < count:
        if columns is not None:  # ROWS rows' columns, checked BLOCK rows at a time
            rels, sizes, versions = columns(done, done + ROWS)
            rows = len(rels)
        else:
            window = items[done:done + ROWS]
            rows = len(window)
        for first in range(0, rows, BLOCK):
            last = min(first + BLOCK, rows)
            try:
                if columns is not None:
                    paths = bound.lookup_rows(rels[first:last], sizes[first:last],
                                              versions[first:last])
                else:
                    assert lookup_run is not None
                    paths = lookup_run(window[first:last])
            except Exception:  # the read-ahead's fetch raises it again, in its turn
                paths = []
            if paths:
                if counters is not None:
                    n = len(paths)
                    if columns is not None:
                        counters.count(True, sum(sizes[first:first + n]), n)
                    else:
                        run = window[first:first + n]
                        counters.count(True, sum(map(_size, run)), kind.files(run))
                yield from tracker.run(paths)
                done += len(paths)
            if len(paths) < last - first:
                return done
    return done


def follow(paths: Iterable[Any], reader: Reader, kind: Kind = FILES,
           loop: LoopView | None = None, first: int = 0,
           _exiting: Callable[[], bool] = exiting) -> Iterator[Any]:
    """Yield ``paths`` (items of ``kind``); each stays held until the consumer
    has asked for ``reader.slack`` more and, under a ucstage DataLoader
    (``loop``), the training loop has moved past the batch it went into (then
    it is marked consumed and let go). ``first``: the slot position before the
    first path (a resumed slot's). Closing this closes ``paths`` first, then
    lets every file go, except those the loop is not past yet: they linger
    until it is (:func:`ucstage.data.channel.linger`)."""
    recent: collections.deque[tuple[int, Any]] = collections.deque()
    position = first
    try:
        if not reader.holding:  # no cap: nothing is held, nothing needs marking
            yield from paths
            return
        channel.sweep()  # an earlier iterator's holds the loop is past by now
        slack = reader.slack
        for path in paths:
            yield path
            # The consumer asked for the next item: it has opened this one.
            position += 1
            recent.append((position, path))
            if len(recent) > slack:
                past = loop.past() if loop is not None else position
                while len(recent) > slack and recent[0][0] <= past:
                    kind.release(reader, recent.popleft()[1])
    finally:
        close = getattr(paths, "close", None)
        if close is not None:
            close()  # stops the read-ahead, also at exit
        # A generator left unfinished and collected while Python exits skips
        # the rest: the modules it would call are being torn down, and the
        # process's holds end with it (``_exiting`` is bound early for that).
        if not _exiting():
            past = loop.past() if loop is not None else channel.PAST_ALL
            while recent and recent[0][0] <= past:
                kind.release(reader, recent.popleft()[1])
            if loop is not None and recent:
                reader.close(keep=[p for _, item in recent for p in kind.paths(item)])
                channel.linger(loop, functools.partial(kind.release, reader), recent)
            reader.close()


# -- how many in flight, and what fits under the cap --------------------------------


def check_read_ahead(value: int | str) -> int | str:
    """``"auto"`` or the read-ahead as a non-negative int.

    Raises:
        ValueError: anything else (the caller names its parameter).
    """
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"read_ahead must be 0 or more, or 'auto', got {value!r}")
    return int(value)


def check_loader_window(dataset: Sharded, cache: LocalCache, num_workers: int,
                        volume: Volume | None = None, *, sharers: int = 1,
                        in_loop: int = 0) -> Share:
    """This node's readers' share of copies in flight (:func:`node_share`;
    ``volume`` picks the first guess, the dataset's own by default), after
    refusing at once (``CacheFull``) a read that can never fit under the cap:
    a file larger than the cap, or what every reader on this node
    (``LOCAL_WORLD_SIZE`` x workers) holds at once larger than it: its share
    of read-ahead, the current file, the slack and ``in_loop`` items (the
    batches its DataLoader may hold before the loop moves past them), each of
    the largest file. Under ``read_ahead="auto"`` the share is cut first to
    fit, and to at most 1/:data:`CAP_SHARE` of the cap over the node (the
    rest keeps files for later epochs). ``sharers``: readers per worker (a
    mix's sources), each taking its part."""
    cap = cache.space.max_bytes
    if cap is None and dataset.read_ahead != AUTO:
        return node_share(dataset.read_ahead, None, 0)  # a fixed N: nothing to size or check
    readers = World.detect().node_readers(num_workers) * max(1, sharers)
    if volume is None:
        volume = dataset._get_volume()
    if cap is None:
        return node_share(dataset.read_ahead, volume, readers)
    manifest = dataset.freeze()
    sizes = manifest.sizes()
    groups = manifest.groups
    if groups is not None:  # a grouped dataset holds whole samples
        sizes = groups.sample_sizes(sizes)
    if not len(sizes):
        return node_share(dataset.read_ahead, volume, readers)
    largest_at = int(np.argmax(np.asarray(sizes)))
    largest = int(sizes[largest_at])
    row = int(groups.offsets[largest_at]) if groups is not None else largest_at
    name = manifest.entries[row].path
    if groups is not None:
        name = f"sample {split_name(manifest.entries[row].path)[0]!r}"
    per_reader = cap // max(1, readers * largest)
    fits = per_reader - 1 - DEFAULT_SLACK - in_loop
    share = node_share(dataset.read_ahead, volume, readers,
                       cap_depth=max(1, min(fits, per_reader // CAP_SHARE)))
    check_window(cap, readers=readers, depth=share.ceiling + 1 + DEFAULT_SLACK + in_loop,
                 largest=largest, largest_name=name,
                 unit="file" if groups is None else "sample", in_loop=in_loop)
    return share


class Share(NamedTuple):
    """One reader's part of the node's copies in flight."""

    start: int
    """Where its tuning starts."""
    ceiling: int
    """The most it keeps in flight (its window beyond the current file)."""
    tuned: bool
    """False for a fixed ``read_ahead=N``: ``start == ceiling == N``."""


def node_share(read_ahead: int | str, volume: Volume | None, readers: int,
               cap_depth: int | None = None) -> Share:
    """One reader's :class:`Share` of the node's copies in flight.

    Args:
        read_ahead: the dataset's ``read_ahead``: a fixed N (used as given), or
            :data:`AUTO`.
        volume: the source (its kind picks the first guess, see
            :func:`ucstage.cache.tuning.first_guess`).
        readers: readers on this node (``LOCAL_WORLD_SIZE`` x workers).
        cap_depth: the most files a reader may fetch ahead under the cache's
            byte cap (None: no cap).
    """
    if read_ahead != AUTO:
        depth = int(read_ahead)
        return Share(depth, depth, False)
    if volume is None:  # a dataset with no volume to size by
        return Share(FALLBACK, FALLBACK, False)
    from ..engines import engine

    reader = engine.of(volume)
    readers = max(1, readers)
    total = tuning.first_guess(volume, reader)
    top = tuning.ceiling(reader)
    ceiling = min(READER_CEILING, max(1, -(-top // readers)))
    if cap_depth is not None:
        ceiling = max(1, min(ceiling, cap_depth))
    return Share(min(ceiling, max(1, -(-total // readers))), ceiling, True)




class ReadAhead:
    """Fetch ``entries`` with up to ``depth`` threads; iterating returns their paths in order.

    Args:
        fetch: ``fetch(entry)`` -> local path.
        entries: the slot's files, in read order.
        depth: how many files beyond the one being consumed may be fetched.
        stop: called by :meth:`close` to stop the copies in flight, if the
            fetch can (:meth:`ucstage.cache.inflight.Inflight.stop`).
        abandon: called by :meth:`close` when stopped copies have not ended
            within :data:`GRACE_SECONDS`: removes what they left.
        lookup: ``lookup(entry)`` -> the local path of a valid cached copy,
            or None; never copies (the reader's held lookup). With it, the
            consumer's thread looks each entry up as it enters the window and
            only misses go to the threads, which start at the first miss: an
            epoch over a warm cache pays no thread hand-off and starts none.
        jobs: how many of the ``depth`` threads may copy at once, tuned as
            they run (``read_ahead="auto"``: :func:`node_share`); None lets
            every thread copy.
        checked: how many of the first entries the caller has just found
            missing: they are queued without a lookup.
    """

    def __init__(self, fetch: Callable[[Any], Any], entries: Sequence[Any],
                 depth: int, *, stop: Callable[[], None] | None = None,
                 abandon: Callable[[], object] | None = None,
                 lookup: Callable[[Any], Any] | None = None,
                 jobs: tuning.Jobs | None = None, checked: int = 0) -> None:
        self._fetch = fetch
        self._jobs = jobs
        self._lookup = lookup
        self._checked = checked
        self._stop_copies = stop
        self._abandon = abandon
        self._entries = entries
        self._depth = depth
        self._count = len(entries)
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        """The threads wait on it for a miss (one woken per miss queued)."""
        self._done = threading.Condition(lock)
        """The consumer waits on it for a result."""
        self._stop = threading.Event()
        self._window = 0
        """The threads may end once this reaches the entry count and no miss
        is queued; only the consumer's thread moves it."""
        self._misses: collections.deque[int] = collections.deque()
        """Indices for the threads to fetch, in order (guarded by ``_cond``)."""
        self._results: dict[int, tuple[bool, Any]] = {}
        self._threads: list[threading.Thread] = []

    def _queue(self, index: int) -> None:
        """Hand entry ``index`` to the threads (started at the first miss)."""
        with self._cond:
            # The window moves with the queue, under the lock: a thread that
            # saw the window at the end and nothing queued would end for good.
            self._window = index + 1
            self._misses.append(index)
            self._cond.notify()
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._work, name=f"ucstage-read-ahead-{i}",
                                     daemon=True)
                    for i in range(max(1, min(self._depth, self._count)))]
                for thread in self._threads:
                    thread.start()

    def _claim(self) -> int | None:
        """The next index to fetch; None once stopped or every entry is handed out."""
        with self._cond:
            while not self._stop.is_set() and not self._misses and self._window < self._count:
                self._cond.wait()
            if self._stop.is_set() or not self._misses:
                return None
            return self._misses.popleft()

    def _work(self) -> None:
        jobs = self._jobs
        while (index := self._claim()) is not None:
            entry = self._entries[index]
            copied = 0
            try:
                if jobs is not None and not jobs.enter():
                    raise RuntimeError("read-ahead closed")  # never reaches the consumer
                try:
                    result: tuple[bool, Any] = (True, self._fetch(entry))
                    copied = int(getattr(entry, "size", 0) or 0)
                finally:
                    if jobs is not None:
                        jobs.leave(copied, counted=bool(copied))
            except BaseException as exc:  # handed to the consumer, which raises it
                result = (False, exc)
            with self._cond:
                self._results[index] = result
                self._done.notify()

    def _fetched(self, index: int) -> Any:
        """Wait for a thread's fetch of entry ``index``; raise what it raised
        (a path, or what the fetch returns: a grouped sample's dict)."""
        with self._done:
            while index not in self._results:
                self._done.wait()
            ok, value = self._results.pop(index)
        if not ok:
            raise value
        return value

    def __iter__(self) -> Iterator[str]:
        """The local paths of the entries, in order, each once its fetch is done.

        While the consumer holds entry ``i``, entries up to ``i + depth`` may
        be fetched, never more. The first fetch that fails raises here, in its
        turn (``FetchFailed``, ``CacheFull``, ...).
        """
        # The hot loop of a warm epoch: locals only, one lookup per entry,
        # no lock unless there is a miss.
        entries, lookup, depth, count = self._entries, self._lookup, self._depth, self._count
        hits: dict[int, str] = {}
        queue = self._queue
        for index in range(-depth, count):
            ahead = index + depth  # the entry that enters the window now
            if 0 <= ahead < count:
                path = None
                if lookup is not None and ahead >= self._checked:
                    try:
                        path = lookup(entries[ahead])
                    except Exception:  # the fetch raises it again, in its turn
                        path = None
                if path is None:
                    queue(ahead)
                else:
                    hits[ahead] = path
                if ahead + 1 == count and self._window < count:
                    with self._cond:
                        self._window = count
                        self._cond.notify_all()  # nothing more to come: idle threads end
            if index >= 0:
                path = hits.pop(index, None)
                yield path if path is not None else self._fetched(index)

    def close(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        """Start no new fetch; stop (or finish) the copies in flight; wait for the threads."""
        # ``_finalizing`` is bound early: at exit this module's globals may be gone.
        if _finalizing():
            # A generator left open is closed while the interpreter shuts down,
            # after its daemon threads were frozen: one frozen holding this lock
            # (woken from its wait, never to run again) would hang the exit for
            # good (seen: a Mix left unfinished, 1 exit in 13 under load). The
            # threads are gone with the process; nothing is left to stop.
            return
        with self._cond:
            self._stop.set()
            self._cond.notify_all()
            threads = list(self._threads)
        if self._jobs is not None:
            self._jobs.close()  # threads waiting for a place in flight give up
        if not threads:
            return  # nothing was ever copied by this iterator
        if self._stop_copies is not None:
            self._stop_copies()
        wait = GRACE_SECONDS if self._abandon is not None else JOIN_SECONDS
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._abandon is not None and self.alive:
            # Threads blocked in a read on a slow or hung mount: their copies
            # are given up (temp files removed); they end when the read returns.
            self._abandon()

    @property
    def alive(self) -> int:
        """Threads still running."""
        return sum(t.is_alive() for t in self._threads)


# -- what the DataLoader logs per epoch ------------------------------------------


def rank_stats(dataset: Sharded | None, rank: int) -> RunStats | None:
    """This rank's counters in the dataset's run."""
    if dataset is None:
        return None
    return runstats.read_run(dataset.cache().root, dataset.run, rank)


def epoch_metrics(dataset: Sharded | None, rank: int,
                  before: RunStats | None) -> dict[str, float]:
    """The epoch's cache metrics for MLflow: ``epoch_cache_hit_rate`` (hits /
    files this rank read), ``epoch_cache_wait_s`` (time copies waited for
    room under the cap), ``epoch_cache_evictions``, and the checks the
    copies' bytes got (``epoch_checked_md5``, ``epoch_checked_crc32c``,
    ``epoch_checked_page_crc``, ``epoch_checked_size``, ``epoch_check_mismatches``)."""
    after = rank_stats(dataset, rank)
    if after is None or before is None:
        return {}
    delta = after.minus(before)
    found: dict[str, float] = {"epoch_cache_wait_s": delta.wait_s,
                               "epoch_cache_evictions": float(delta.evictions)}
    if delta.hit_rate is not None:
        found["epoch_cache_hit_rate"] = delta.hit_rate
    # Which check the copies' bytes got: a store without usable checksums
    # shows as size checks only.
    found.update({"epoch_checked_md5": float(delta.checked_md5),
                  "epoch_checked_crc32c": float(delta.checked_crc32c),
                  "epoch_checked_page_crc": float(delta.checked_page_crc),
                  "epoch_checked_size": float(delta.checked_size),
                  "epoch_check_mismatches": float(delta.mismatches)})
    return found


def source_metrics(dataset: Sharded | None) -> dict[str, float]:
    """A mix's items per source this rank's loader returned this epoch
    (``epoch_items_<source>``); nothing for a single source."""
    delivered = getattr(dataset, "delivered", None)
    if not isinstance(delivered, dict):
        return {}
    # By the mix's distinct labels: its keys 1 and "1" are two metrics.
    names = getattr(dataset, "names", None) or [str(k) for k in delivered]
    return {f"epoch_items_{name}": float(count)
            for name, count in zip(names, delivered.values(), strict=True)}
