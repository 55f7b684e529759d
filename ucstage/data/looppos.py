"""Where the training loop stands: what the holds of the slot iterators follow.

A path a :class:`~ucstage.VolumeDataset` hands out must stay in the cache
until the training loop has moved past the batch it went into. The slot
iterator cannot see that by itself: a DataLoader worker's collate pulls the
items of the next ``prefetch_factor`` batches long before the loop reaches
them, and even without workers the collate pulls a whole batch before the
loop opens its first path. So the ucstage DataLoader publishes, each time the
loop asks for its next batch, how many items of each of its slots the loop
has moved past (the positions of :mod:`ucstage.data.state`, which the batches
carry in their tags), on a :class:`Board`:

* without workers, a Python object the slot iterator of the main process reads;
* with workers, a small file of 64-bit counters in ``/dev/shm`` (the temp
  folder without it), ``[generation, past of worker 0, ..., past of worker k-1]``,
  that every worker maps read-only (:class:`BoardLink` is pickled with the dataset).

The generation is the epoch record's (:mod:`ucstage.data.epochrecord`): a
worker's :class:`LoopView` of an earlier epoch reads "everything is past".
A slot iterator lets a path go once its view's count reaches the path's
position (``data/holding.py``'s ``follow``). Paths still held when the slot
iterator ends (its last batches still queued for the loop) linger
(:func:`linger`): a daemon thread lets them go as the board moves on (the
loop's next batch, the epoch's end, a later epoch), or the process's exit does.

Outside a ucstage DataLoader (plain iteration, torch's own DataLoader) there
is no board, and a path is let go once the consumer asked for a few more
(``DEFAULT_SLACK`` of :mod:`ucstage.cache.leases`).
"""

from __future__ import annotations

import collections
import mmap
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from .wrapping import Wrapping

__all__ = ["PAST_ALL", "Board", "BoardLink", "Following", "LoopView", "linger", "view_for"]

PAST_ALL = 1 << 62
"""The count that says the loop is past every item (the epoch is over)."""
POLL_SECONDS = 0.05
"""How often lingering holds look at the board again."""
_SHM = "/dev/shm"


class Board:
    """The main process's side: the loop's position in each slot of this rank.

    Args:
        slots: this rank's slots (its DataLoader workers; 1 without workers).
        shared: a file workers can map (else memory of this process only).
        in_loop: items per slot the loop may hold beyond the slot iterator
            (``(prefetch_factor + 1) x batch_size`` with workers, else
            ``batch_size``): what the cap must leave room for.
    """

    def __init__(self, slots: int, *, shared: bool, in_loop: int) -> None:
        self.slots = slots
        self.in_loop = in_loop
        self.path = ""
        self.gen = 0
        size = 8 * (1 + slots)
        self._finalizer: weakref.finalize | None = None
        if shared:
            base = _SHM if os.path.isdir(_SHM) and os.access(_SHM, os.W_OK | os.X_OK) else None
            folder = tempfile.mkdtemp(prefix="ucstage-loop-", dir=base)
            self.path = os.path.join(folder, "board")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.ftruncate(fd, size)
                self._map: Any = mmap.mmap(fd, size)
            finally:
                os.close(fd)
            self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)
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

    def link(self) -> BoardLink:
        """What a worker needs to map the board (pickled with the dataset)."""
        return BoardLink(self.path, self.in_loop)

    def close(self) -> None:
        """Remove the board's file (also done when collected, or at exit)."""
        if self._finalizer is not None:
            self._finalizer()


class BoardLink:
    """Pickled with the dataset into workers: the board's file and the room it needs."""

    def __init__(self, path: str, in_loop: int) -> None:
        self.path = path
        self.in_loop = in_loop

    def view(self, slot: int, gen: int) -> LoopView | None:
        """A worker's view of ``slot`` in epoch ``gen``; None when the board is gone."""
        buf = _mapped(self.path)
        return None if buf is None else LoopView(buf, slot, gen, self.in_loop)


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


def view_for(link: Any, gen: int | None, worker: int) -> LoopView | None:
    """The view the slot iterator ``worker`` follows, if a ucstage DataLoader
    runs its dataset (``link``: the dataset's
    :class:`~ucstage.data.sharded.LoaderLink`): in a worker, through the
    pickled :class:`BoardLink` and the epoch record's generation; in the main
    process, the loader's in-memory :class:`Board`, taken once (a later plain
    iteration has none)."""
    import torch.utils.data as tud

    board = link.board
    if tud.get_worker_info() is None:
        if not isinstance(board, Board):
            return None
        link.board = None
        return board.view(0)
    if not isinstance(board, BoardLink) or gen is None:
        return None
    return board.view(worker, gen)


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
