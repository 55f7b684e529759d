"""The channel from a ucstage DataLoader to its slot iterators: each epoch's
parameters, and where the training loop stands.

One private folder per loader (mode 0700, in ``/dev/shm`` when there is one:
memory, not disk; else the temp folder; removed when the loader is collected
or at exit) holds both, and one small link pickled with the dataset
(:class:`ChannelLink`) points a worker at them.

**The epoch record.** torch keeps persistent workers alive across epochs and,
at each epoch's start, makes every worker iterate *its own old copy* of the
dataset again (``_ResumeIteration`` carries only a seed, for IterDataPipes).
Nothing set in the main process since the workers started (``set_epoch``, a
loaded state, ``equal_length``, the environment) would reach them. So the
loader writes each epoch's parameters, before torch resets its workers, into
the record (:meth:`Channel.write`), and a sharded dataset's ``__iter__`` in a
worker reads it first (:func:`apply`). Fresh (non-persistent) workers read
the same record, so there is one route. Every record carries a generation
number, one per started epoch iterator. A worker knows which one it must read
next: a different one is refused loudly (:class:`StaleEpochRecord`) rather
than silently dealing an old epoch. An epoch given up before its end (a
``break``) is marked ``stopped``; a watcher thread in each persistent worker
(:func:`guarded`) then closes that epoch's slot iterator, which ends its
read-ahead copies and lets go of its holds, even while the worker waits idle.

**The loop's board.** A path a :class:`~ucstage.VolumeDataset` hands out must
stay in the cache until the training loop has moved past the batch it went
into. The slot iterator cannot see that by itself: a DataLoader worker's
collate pulls the items of the next ``prefetch_factor`` batches long before
the loop reaches them, and even without workers the collate pulls a whole
batch before the loop opens its first path. So under a byte cap the loader
publishes, each time the loop asks for its next batch, how many items of each
of its slots the loop has moved past (the positions of
:mod:`ucstage.data.state`, which the batches carry in their tags), on a
:class:`Board`: without workers, a Python object the slot iterator of the main
process reads; with workers, a small file of 64-bit counters in the channel's
folder, ``[generation, past of worker 0, ..., past of worker k-1]``, that
every worker maps read-only. The generation is the record's: a worker's
:class:`LoopView` of an earlier epoch reads "everything is past". A slot
iterator lets a path go once its view's count reaches the path's position
(:func:`ucstage.data.slotread.follow`). Paths still held when the slot
iterator ends (its last batches still queued for the loop) linger
(:func:`linger`): a daemon thread lets them go as the board moves on, or the
process's exit does. Outside a ucstage DataLoader there is no board, and a
path is let go once the consumer asked for a few more (``DEFAULT_SLACK`` of
:mod:`ucstage.cache.leases`).
"""

from __future__ import annotations

import collections
import json
import logging
import mmap
import os
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..atomic import write_atomic
from ..errors import UcstageError
from .state import Wrapping

if TYPE_CHECKING:
    from .state import Sharded

__all__ = ["PAST_ALL", "Board", "Channel", "ChannelLink", "Following", "LoopView",
           "StaleEpochRecord", "apply", "guarded", "linger", "sweep", "view_for"]

_log = logging.getLogger("ucstage")

POLL_SECONDS = 0.05
"""How often a persistent worker's watcher looks for a stopped epoch, and
lingering holds look at the board again."""
PAST_ALL = 1 << 62
"""The count that says the loop is past every item (the epoch is over)."""
_SHM = "/dev/shm"

_FIELDS = ("epoch", "shuffle", "seed", "shuffle_scope", "equal_length", "nproc_per_node",
           "read_ahead")
"""The dataset attributes a worker takes from the record every epoch."""


def _private_folder(prefix: str) -> str:
    """A new private folder (mode 0700) in ``/dev/shm`` when usable, else the temp folder."""
    base = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK) else None
    return tempfile.mkdtemp(prefix=prefix, dir=base)


class StaleEpochRecord(UcstageError):
    """A DataLoader worker found another epoch's record than the one it must read."""

    exit_code = 1


class Channel:
    """The main process's side: one per loader; the record is written once
    per epoch iterator, the board (under a cap) published at each batch."""

    def __init__(self) -> None:
        self.gen = 0
        self.path = ""
        """The record's file (empty until the first :meth:`write`)."""
        self.board: Board | None = None
        self.base_env: dict[str, str] = {}
        """The environment the current workers started with."""
        self._payload: dict[str, Any] = {}
        self._done: set[int] = set()
        self._finalizer: weakref.finalize | None = None

    def _ensure(self) -> None:
        if self.path:
            return
        folder = _private_folder("ucstage-epoch-")
        self.path = os.path.join(folder, f"{secrets.token_hex(8)}.json")
        # Not a method of self: the finalizer must not keep the record alive.
        self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)

    @property
    def folder(self) -> str | None:
        return os.path.dirname(self.path) if self.path else None

    def write(self, dataset: Sharded, *, persistent: bool, fresh: bool) -> int:
        """Publish the epoch about to start; returns its generation.

        ``fresh``: the workers start now, with this process's environment.
        """
        self._ensure()
        if fresh:
            self.base_env = dict(os.environ)
        env = os.environ
        resume = dataset._link.resume
        self.gen += 1
        self._payload = {
            "gen": self.gen,
            "persistent": persistent,
            "stopped": False,
            **{name: getattr(dataset, name) for name in _FIELDS},
            "resume": resume.to_dict() if resume is not None else None,
            "env_set": {k: v for k, v in env.items() if self.base_env.get(k) != v},
            "env_unset": [k for k in self.base_env if k not in env],
        }
        self._flush()
        return self.gen

    def done(self, gen: int) -> None:
        """The epoch ran to its end: its workers closed their iterators themselves."""
        self._done.add(gen)

    def stop(self, gen: int) -> None:
        """The epoch of ``gen`` was given up: its workers close their iterators."""
        if gen != self.gen or gen in self._done or not self.path:
            return  # superseded (a newer record stops it too) or over
        self._payload["stopped"] = True
        try:
            self._flush()
        except OSError as exc:  # at exit the folder may be gone: nothing to stop
            _log.debug("could not mark epoch record %s stopped: %s", self.path, exc)

    def _flush(self) -> None:
        write_atomic(self.path, json.dumps(self._payload), mode=0o600)

    def start_board(self, slots: int, *, shared: bool, in_loop: int) -> Board:
        """The loop's board (made at the first call: ``shared``, a file in this
        channel's folder that workers map, after the first :meth:`write`)."""
        if self.board is None:
            self.board = Board(slots, shared=shared, in_loop=in_loop,
                               folder=self.folder if shared else None)
        return self.board

    def link(self, gen: int) -> ChannelLink:
        """What workers that start now take along: the record, the
        generation due next, and the board when there is a shared one."""
        board = self.board
        return ChannelLink(self.path, gen, board.path if board is not None else "",
                           board.in_loop if board is not None else 0)

    def close(self) -> None:
        """Remove the channel's folder (also done when collected, or at exit)."""
        if self._finalizer is not None:
            self._finalizer()


class ChannelLink:
    """Pickled with the dataset into workers: the record's file and the
    generation due next; the board's file (empty: none) and the room it needs."""

    def __init__(self, path: str, expect: int, board: str = "", in_loop: int = 0) -> None:
        self.path = path
        self.expect = expect
        self.board = board
        self.in_loop = in_loop

    def view(self, slot: int, gen: int) -> LoopView | None:
        """A worker's view of ``slot`` in epoch ``gen``; None when there is no
        board (or it is gone)."""
        buf = _mapped(self.board) if self.board else None
        return None if buf is None else LoopView(buf, slot, gen, self.in_loop)

    def read(self) -> dict[str, Any]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                payload: dict[str, Any] = json.load(fh)
        except (OSError, ValueError) as exc:
            raise StaleEpochRecord(
                f"DataLoader worker could not read its epoch record {self.path}: {exc}",
                hint="the loader that started this worker is gone") from exc
        gen = payload.get("gen")
        if gen == self.expect - 1 and not payload.get("persistent", True):
            return payload  # a worker of this epoch alone, iterating its dataset again
        if gen != self.expect:
            raise StaleEpochRecord(
                f"DataLoader worker expected epoch record {self.expect}, found {gen}: it "
                "would deal another epoch's files",
                hint="iterate the VolumeDataset once per epoch inside a worker, or pass "
                     "persistent_workers=False")
        self.expect = gen + 1
        return payload


def apply(dataset: Sharded) -> dict[str, Any] | None:
    """In a worker: take this epoch's parameters from the record (None without one)."""
    link = dataset._link.channel
    if link is None:
        return None
    import torch.utils.data as tud

    if tud.get_worker_info() is None:
        return None  # the main process has the values itself
    payload = link.read()
    for name in _FIELDS:
        setattr(dataset, name, payload[name])
    resume = payload["resume"]
    if resume is None:
        dataset._link.resume = None
    else:
        from ..resume import LoaderState
        from .state import with_groups

        dataset._link.resume = with_groups(dataset, LoaderState.from_dict(resume))
    for name in payload["env_unset"]:
        os.environ.pop(name, None)
    os.environ.update(payload["env_set"])
    return payload


class _Watcher:
    """One daemon thread per worker process: stops runs whose epoch was given up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[int, Any]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, path: str, gen: int, stop: Any) -> None:
        with self._lock:
            self._runs[path] = (gen, stop)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ucstage-epoch-watch",
                                                daemon=True)
                self._thread.start()

    def forget(self, path: str, gen: int) -> None:
        with self._lock:
            if self._runs.get(path, (None,))[0] == gen:
                del self._runs[path]

    def _loop(self) -> None:
        seen: dict[str, tuple[int, int]] = {}
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                runs = dict(self._runs)
            for path, (gen, stop) in runs.items():
                try:
                    st = os.stat(path)
                except OSError:
                    continue  # the loader is gone; torch ends this worker
                key = (st.st_ino, st.st_mtime_ns)
                if seen.get(path) == key:
                    continue
                try:
                    with open(path, encoding="utf-8") as fh:
                        payload = json.load(fh)
                except (OSError, ValueError):
                    continue
                seen[path] = key
                if payload.get("gen", 0) > gen or (payload.get("gen") == gen
                                                    and payload.get("stopped")):
                    self.forget(path, gen)
                    stop()


_WATCHER = _Watcher()


def guarded(inner: Iterator[str], link: ChannelLink, gen: int) -> Iterator[str]:
    """``inner`` (a slot's iterator in a persistent worker), closed as soon as
    its epoch is given up, also while the worker waits for its next task."""
    lock = threading.Lock()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        with lock:  # never while the worker's own thread is inside next(inner)
            if stopped:
                return
            stopped = True
            try:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()  # its finally blocks stop the read-ahead, drop the holds
            except Exception:  # a close that fails must not kill the watcher
                _log.exception("closing an abandoned epoch's iterator failed")

    _WATCHER.watch(link.path, gen, stop)
    try:
        while True:
            with lock:
                if stopped:
                    return
                try:
                    item = next(inner)
                except StopIteration:
                    return
            yield item
    finally:
        _WATCHER.forget(link.path, gen)
        stop()


# -- the loop's board ---------------------------------------------------------


class Board:
    """The main process's side: the loop's position in each slot of this rank.

    Args:
        slots: this rank's slots (its DataLoader workers; 1 without workers).
        shared: a file workers can map (else memory of this process only).
        in_loop: items per slot the loop may hold beyond the slot iterator
            (``(prefetch_factor + 1) x batch_size`` with workers, else
            ``batch_size``): what the cap must leave room for.
    """

    def __init__(self, slots: int, *, shared: bool, in_loop: int,
                 folder: str | None = None) -> None:
        self.slots = slots
        self.in_loop = in_loop
        self.path = ""
        self.gen = 0
        size = 8 * (1 + slots)
        self._finalizer: weakref.finalize | None = None
        if shared:
            if folder is None:  # a board of its own (else its channel's folder, removed with it)
                folder = _private_folder("ucstage-loop-")
                self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)
            self.path = os.path.join(folder, "board")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size)
                self._map: Any = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._buf = memoryview(self._map).cast("q")
        else:
            self._buf = memoryview(bytearray(size)).cast("q")

    def __reduce__(self) -> tuple[Any, ...]:
        # The in-memory board is the main process's alone: a copy pickled into
        # a worker (another loader's) unpickles to no board.
        return type(None), ()

    def start(self, gen: int, counts: list[int]) -> None:
        """A new epoch (generation ``gen``) starts with the slots at ``counts``
        (a resumed epoch's positions). Counts first: a view of ``gen`` that
        still reads the old generation sees nothing past."""
        for i, count in enumerate(counts[:self.slots]):
            self._buf[1 + i] = count
        self._buf[0] = self.gen = gen

    def publish(self, slot: int, past: int) -> None:
        """The loop has moved past the first ``past`` items of ``slot``."""
        if past > self._buf[1 + slot]:
            self._buf[1 + slot] = past

    def finish(self) -> None:
        """The epoch is over (ended or given up): every item is past."""
        for i in range(self.slots):
            self._buf[1 + i] = PAST_ALL

    def view(self, slot: int) -> LoopView:
        """A view of the current epoch's ``slot``, in this process."""
        return LoopView(self._buf, slot, self.gen, self.in_loop)

    def link(self) -> ChannelLink:
        """What a worker needs to map the board (no record)."""
        return ChannelLink("", 0, self.path, self.in_loop)

    def close(self) -> None:
        """Remove the board's own folder (also done when collected, or at exit;
        a board in its channel's folder goes with the channel's)."""
        if self._finalizer is not None:
            self._finalizer()


_maps: dict[str, Any] = {}
_maps_lock = threading.Lock()


def _mapped(path: str) -> Any:
    """The board file mapped read-only, once per process (None when it is gone)."""
    with _maps_lock:
        buf = _maps.get(path)
        if buf is None:
            try:
                with open(path, "rb") as fh:
                    mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return None
            buf = _maps[path] = memoryview(mapped).cast("q")
        return buf


class LoopView:
    """One slot iterator's view of the board: how many of its items the loop is past."""

    def __init__(self, buf: Any, slot: int, gen: int, in_loop: int) -> None:
        self._buf, self._slot, self._gen = buf, slot, gen
        self.in_loop = in_loop

    def past(self) -> int:
        """Items of this slot (by position) the loop has moved past."""
        gen = self._buf[0]
        if gen != self._gen:
            # A later epoch started: this one is over. (An earlier one cannot
            # be there: the board is written before the workers start.)
            return PAST_ALL if gen > self._gen else 0
        return int(self._buf[1 + self._slot])


def view_for(board: Board | None, link: ChannelLink | None, gen: int | None,
             worker: int) -> LoopView | None:
    """The view the slot iterator ``worker`` follows, if a ucstage DataLoader
    runs its dataset: in a worker, through the pickled ``link`` and the
    record's generation ``gen``; in the main process, the loader's in-memory
    ``board`` (the caller takes it once: a later plain iteration has none)."""
    import torch.utils.data as tud

    if tud.get_worker_info() is None:
        return board.view(0) if board is not None else None
    if link is None or gen is None:
        return None
    return link.view(worker, gen)


class Following(Wrapping):
    """The loader's iterator as the loop sees it: each ``next()`` first tells
    the board the loop is past every batch returned before; the epoch's end
    (or its being given up, :meth:`done`) tells it everything is past.
    ``link``: the dataset's :class:`~ucstage.data.sharded.LoaderLink`."""

    def __init__(self, inner: Iterator[Any], board: Board, link: Any, live: bool) -> None:
        self._inner, self._board, self._link, self._live = inner, board, link, live

    def __next__(self) -> Any:
        self._publish()
        try:
            return next(self._inner)
        except StopIteration:
            self._board.finish()
            raise

    def _publish(self) -> None:
        progress = self._link.progress
        if progress is None:
            return
        if self._live:  # the slot iterates here: its tracker counts what was pulled
            tracker = self._link.tracker
            if tracker is not None and tracker.epoch == progress.epoch:
                self._board.publish(0, tracker.position)
            return
        for i, slot in enumerate(progress.own):
            self._board.publish(i, progress.counts[slot])

    def done(self, on_done: Callable[..., None]) -> Callable[..., None]:
        """``on_done`` that first marks the epoch over on the board."""
        board = self._board

        def finished(*args: Any) -> None:
            board.finish()
            on_done(*args)
        return finished


class _Lingering:
    """Holds of ended slot iterators, let go as their loop moves past them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: list[tuple[LoopView, Callable[[Any], None], collections.deque[Any]]] = []
        self._thread: threading.Thread | None = None

    def add(self, view: LoopView, release: Callable[[Any], None],
            items: collections.deque[tuple[int, Any]]) -> None:
        with self._lock:
            self._groups.append((view, release, items))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="ucstage-linger",
                                                daemon=True)
                self._thread.start()
        self.sweep()

    def sweep(self) -> None:
        """Let go of every lingering item the loop is past now."""
        with self._lock:
            groups = list(self._groups)
        for view, release, items in groups:
            past = view.past()
            while items and items[0][0] <= past:
                release(items.popleft()[1])
        with self._lock:
            self._groups = [g for g in self._groups if g[2]]

    def _loop(self) -> None:
        while True:
            self.sweep()
            with self._lock:
                if not self._groups:
                    self._thread = None
                    return
            time.sleep(POLL_SECONDS)


_lingering = _Lingering()


def linger(view: LoopView, release: Callable[[Any], None],
           items: collections.deque[tuple[int, Any]]) -> None:
    """Keep ``items`` ((position, item), in order) held after their slot
    iterator ended; ``release(item)`` lets each go once ``view`` is past it."""
    if items:
        _lingering.add(view, release, items)


def sweep() -> None:
    """Let go of lingering holds the loop is past (a new slot iterator starts)."""
    _lingering.sweep()
