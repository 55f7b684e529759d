"""How a VolumeDataset iterator holds its files and counts its hits.

The dataset's side of :mod:`ucstage.cache.leases`: :func:`open_reader` makes
one :class:`~ucstage.cache.leases.Reader` per slot iterator (holds, and the
run's counters of :mod:`ucstage.cache.runstats`), :func:`follow` lets each
path go once the training loop is past its batch (:mod:`.looppos`) and the
consumer is ``slack`` items further, :func:`check_loader_window` refuses at
once a read whose window (batches in flight included) cannot fit under the cap, and
:func:`epoch_metrics` is what the DataLoader logs per epoch.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..cache import runstats, tuning
from ..cache.leases import DEFAULT_SLACK, Reader, check_window
from ..cache.runstats import RunStats
from ..manifest.groups import split_name
from ..sharding import World
from ..shutdown import exiting
from . import hitruns, looppos, samples
from .looppos import LoopView
from .protocol import Sharded
from .readahead import CAP_SHARE, ReadAhead, Share, cache_fetcher, cache_lookup, node_share

__all__ = ["check_loader_window", "epoch_metrics", "fetch_in_order", "follow", "holds_files",
           "lookup", "open_reader", "rank_stats", "source_metrics", "unheld_lookup", "wrap"]


def _holds(cache: Any) -> bool:
    """Only ucstage's own cache can hold files (a user's cache object cannot)."""
    return hasattr(cache, "space") and hasattr(cache, "lookup")


def holds_files(cache: Any) -> bool:
    """Whether paths handed out from ``cache`` are held until the loop is past
    them: only under a byte cap (without one nothing of a reader's is evicted
    for its copies), and only in ucstage's own cache."""
    return _holds(cache) and cache.max_bytes is not None


def open_reader(dataset: Sharded, cache: Any, rank: int) -> Reader | None:
    """The reader of one slot iterator; None for a cache object of the user's own."""
    if not _holds(cache):
        return None
    counters = runstats.counters(cache.root, dataset.run, rank)
    return Reader(counters, slack=DEFAULT_SLACK, holding=holds_files(cache))


def wrap(reader: Reader | None, cache: Any, volume: Any,
         fetch: Callable[[Any], str]) -> Callable[[Any], str]:
    """``fetch`` made to hold what it returns (unchanged without a reader)."""
    return fetch if reader is None else reader.fetcher(cache, volume, fetch)


def lookup(reader: Reader | None, cache: Any, volume: Any,
           plain: Callable[[Any], str | None] | None) -> Callable[[Any], str | None] | None:
    """The read-ahead's hit lookup made to hold and count what it returns
    (``plain``, the cache's own lookup, without a reader)."""
    return plain if reader is None else reader.looker(cache, volume)


def unheld_lookup(reader: Reader | None, cache: Any,
                  volume: Any) -> Callable[[Any], list[str]] | None:
    """The cache's ``lookup_run`` for the warm path of :mod:`ucstage.data.hitruns`
    when nothing is held (no cap, or a cache object of the user's own); None
    when paths must be held (or the cache cannot look up)."""
    if reader is not None and reader.holding:
        return None
    return hitruns.run_lookup(cache, volume)


def follow(paths: Iterator[str], reader: Reader | None, loop: LoopView | None = None,
           first: int = 0, _exiting: Callable[[], bool] = exiting) -> Iterator[str]:
    """Yield ``paths``; each stays held until the consumer has asked for
    ``reader.slack`` more and, under a ucstage DataLoader (``loop``), the
    training loop has moved past the batch it went into (then it is marked
    consumed and let go). ``first``: the slot position before the first path
    (a resumed slot's). Closing this closes ``paths`` first, then lets every
    file go, except those the loop is not past yet: they linger until it is
    (:func:`ucstage.data.looppos.linger`)."""
    if reader is None:
        yield from paths
        return
    recent: collections.deque[tuple[int, str]] = collections.deque()
    position = first
    try:
        if not reader.holding:  # no cap: nothing is held, nothing needs marking
            yield from paths
            return
        looppos.sweep()  # an earlier iterator's holds the loop is past by now
        slack = reader.slack
        for path in paths:
            yield path
            # The consumer asked for the next item: it has opened this one.
            position += 1
            recent.append((position, path))
            if len(recent) > slack:
                past = loop.past() if loop is not None else position
                while len(recent) > slack and recent[0][0] <= past:
                    samples.release(reader, recent.popleft()[1])
    finally:
        close = getattr(paths, "close", None)
        if close is not None:
            close()  # stops the read-ahead, also at exit
        # A generator left unfinished and collected while Python exits skips
        # the rest: the modules it would call are being torn down, and the
        # process's holds end with it (``_exiting`` is bound early for that).
        if not _exiting():
            past = loop.past() if loop is not None else looppos.PAST_ALL
            while recent and recent[0][0] <= past:
                samples.release(reader, recent.popleft()[1])
            if loop is not None and recent:
                kept = [p for _, item in recent
                        for p in (item.values() if isinstance(item, dict) else (item,))]
                reader.close(keep=kept)
                looppos.linger(loop, functools.partial(samples.release, reader), recent)
            reader.close()


def fetch_in_order(entries: Sequence[Any], reader: Reader | None, cache: Any, volume: Any,
                   read_ahead: int | Share, *, grouped: bool = False,
                   loop: LoopView | None = None, first: int = 0) -> Iterator[Any]:
    """The local paths of ``entries`` in order, fetched through ``cache``
    ``read_ahead`` entries ahead of the consumer, each held until it moves on.
    A :class:`~.readahead.Share` (``read_ahead="auto"``: :func:`check_loader_window`)
    runs its ceiling ahead, with as many copies at once as its tuned
    :class:`~ucstage.cache.tuning.Jobs` allows.

    A window of fetches runs ahead of the consumer; results come back in
    slot order. Fetches of one file by several processes are single-flight
    in the cache, so read-ahead never copies a file twice. Closing this
    generator (a `break`, Ctrl-C, the loader's shutdown) stops the threads
    before it returns: nothing is copied for an iterator that is gone.
    Hits are looked up in this thread; only misses are handed to threads.

    ``grouped``: the entries are samples (``data/samples.py``); the window
    counts samples, each fetched whole before it is handed out. ``loop`` and
    ``first``: what :func:`follow` lets paths go by.
    """
    share = read_ahead if isinstance(read_ahead, Share) else \
        Share(int(read_ahead), int(read_ahead), False)
    if share.ceiling == 0:
        fetch: Any = wrap(reader, cache, volume, functools.partial(cache.fetch, volume))
        if grouped:
            fetch = samples.fetcher(fetch)
        yield from follow((fetch(entry) for entry in entries), reader, loop, first)
        return
    fetch, stop, abandon = cache_fetcher(cache, volume)
    held: Any = wrap(reader, cache, volume, fetch)
    look: Any = lookup(reader, cache, volume, cache_lookup(cache, volume))
    if grouped:
        held, look = samples.fetcher(held), samples.looker(look, reader)
    jobs = tuning.Jobs(None, ceiling=share.ceiling, start=share.start) if share.tuned else None
    ahead = ReadAhead(held, entries, share.ceiling, stop=stop, abandon=abandon, lookup=look,
                      jobs=jobs)
    try:
        yield from follow(iter(ahead), reader, loop, first)
    finally:
        ahead.close()


def check_loader_window(dataset: Sharded, cache: Any, num_workers: int,
                        volume: Any = None, *, sharers: int = 1, in_loop: int = 0) -> Share:
    """This node's readers' share of copies in flight (:func:`~.readahead.node_share`;
    ``volume`` picks the first guess, the dataset's own by default), after
    refusing at once (``CacheFull``) a read that can never fit under the cap:
    a file larger than the cap, or what every reader on this node
    (``LOCAL_WORLD_SIZE`` x workers) holds at once larger than it: its share
    of read-ahead, the current file, the slack and ``in_loop`` items (the
    batches its DataLoader may hold before the loop moves past them), each of
    the largest file. Under ``read_ahead="auto"`` the share is cut first to
    fit, and to at most :data:`~.readahead.CAP_SHARE` of the cap over the
    node (the rest keeps files for later epochs). ``sharers``: readers per
    worker (a mix's sources), each taking its part."""
    readers = World.detect().node_readers(num_workers) * max(1, sharers)
    if volume is None:
        volume = getattr(dataset, "_get_volume", lambda: None)()
    cap = getattr(cache, "max_bytes", None)
    if cap is None or not _holds(cache):
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


def rank_stats(dataset: Sharded | None, rank: int) -> RunStats | None:
    """This rank's counters in the dataset's run (None for a user's cache)."""
    if dataset is None:
        return None
    cache = dataset.cache()
    if not _holds(cache):
        return None
    return runstats.read_run(cache.root, dataset.run, rank)


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


def source_metrics(dataset: Any) -> dict[str, float]:
    """A mix's items per source this rank's loader returned this epoch
    (``epoch_items_<source>``); nothing for a single source."""
    delivered = getattr(dataset, "delivered", None)
    if not isinstance(delivered, dict):
        return {}
    # By the mix's distinct labels: its keys 1 and "1" are two metrics.
    names = getattr(dataset, "names", None) or [str(k) for k in delivered]
    return {f"epoch_items_{name}": float(count)
            for name, count in zip(names, delivered.values(), strict=True)}
