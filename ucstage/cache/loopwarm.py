"""A warm's copy phase on the object-store engine: every copy is a coroutine
on the engine's event loop (:func:`ucstage.engines.objget.loop`).

With threads, each copy in flight was a thread that waited for its GET on
the loop: at a hundred copies in flight the threads' wake-ups and the GIL
hand-offs between them cost more CPU than the requests. Here one driver
coroutine keeps as many copies in flight as the tuner allows, and each copy
takes its stripe lock, reserves its temp file, awaits its GET and commits on
the loop itself: those steps are short syscalls. The steps are the fetch
protocol's own (:class:`ucstage.cache.fetch.Fetcher` ``where``, ``begin``,
``reserve_tmps``, ``commit_tmps``, ``drop_tmp``, ``retry_pause``), so every
guarantee holds unchanged.

Reserving and committing are batched: the copies that reach either step in
one pass of the loop go through it together at the end of that pass, under
one hold of the byte ledger's lock (one read and one write of the ledger per
batch, not per file). A batch holds no more than a pass gathers, so no copy
waits for others to arrive; the ledger still counts every temp file the
moment it exists at its reserved size, so the cap's walks and recounts agree
with it exactly as before (docs/benchmarks.md, "Per-file cost of a warm").

Two cases go to a thread instead, because they may wait: a stripe another
copy holds (``flock`` without ``LOCK_NB`` would block the loop; another
process, or an entry sharing the stripe), and a copy under a byte cap
(reserving may evict or wait for a reader to make room). Those run the
threaded fetch, the one ``LocalCache.fetch`` uses (``Fetcher.fetch_once``).

Stopping: the warm's :class:`~ucstage.cache.inflight.Inflight` stop cancels
every copy's coroutine; a cancelled copy removes its temp file and gives its
reservation back unless the waiting thread abandoned it first (the same
state machine as the threads'), and reports :exc:`Stopped`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ..engines import objget, objstore
from ..engines.context import Copied
from ..volumes import FileEntry, RangeEntry
from .fetch import Copy, Pending, Retries
from .inflight import Stopped
from .locks import FileLock
from .tuning import THREAD_CEILING

__all__ = ["LoopWarm"]

T = TypeVar("T")


class LoopWarm:
    """Drives one warm's copies (``warm.todo``) on the engine's loop and puts
    each outcome on ``warm.results``, as the warm's threads would."""

    def __init__(self, warm: Any) -> None:
        # ``warm`` is warm.py's ``WarmCopies`` (not imported: warm imports this module).
        self.warm = warm
        self.fetcher, self.volume, self.inflight = warm.fetcher, warm.volume, warm.inflight
        self.threaded = 0
        """Copies handed to a thread (a contended stripe, a byte cap)."""
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._store: Any = None
        self._commits: _PassBatch[tuple[Copy, Pending, Copied], BaseException | None] = \
            _PassBatch(lambda done: self.fetcher.commit_tmps(done))
        """Copies whose bytes are in, committed together at the end of the pass."""
        self._reserves: _PassBatch[Copy, Pending | BaseException] = \
            _PassBatch(lambda copies: self.fetcher.reserve_tmps(copies))
        """Copies about to GET, reserved together at the end of the pass."""
        self._batch: list[tuple[FileEntry, bool | BaseException]] = []
        self._left = len(warm.todo)
        """Copies not ended yet: a large object's share of the places in
        flight is the limit over these (:func:`objget.split`)."""

    def start(self) -> None:
        """Start the driver on the loop; returns at once."""
        done = asyncio.run_coroutine_threadsafe(self._drive(), objget.loop())
        done.add_done_callback(self._failed)

    def _failed(self, done: concurrent.futures.Future[None]) -> None:
        """A driver that died (a bug) must not leave the waiting thread
        waiting forever: hand it the error, which stops the warm."""
        if not done.cancelled() and done.exception() is not None:
            self.warm.results.put([(FileEntry("", 0, ""), done.exception() or Exception())])

    async def _drive(self) -> None:
        warm = self.warm
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        room = asyncio.Event()

        def stop_all() -> None:
            for task in tasks:
                task.cancel()
            room.set()

        def wake() -> None:  # called by the thread that stops the warm
            loop.call_soon_threadsafe(stop_all)

        unwatch = self.inflight.watch(wake)
        try:
            pending = iter(warm.todo)
            while not self.inflight.stopped:
                started = self._start(pending, tasks, room)
                if started is None:
                    break  # every entry is started
                room.clear()
                await room.wait()  # a copy ended (the limit may have moved) or a stop
            if tasks:
                await asyncio.wait(tasks)
        finally:
            unwatch()
            if self._pool is not None:
                self._pool.shutdown(wait=False)

    def _start(self, pending: Any, tasks: set[asyncio.Task[None]],
               room: asyncio.Event) -> int | None:
        """Start copies while the tuner has room; None once none is left."""
        warm, tuner = self.warm, self.warm.tuner
        started = 0
        while tuner.try_enter():
            entry = next(pending, None)
            if entry is None or self.inflight.stopped:
                tuner.leave(0, counted=False)
                return None
            with warm._take:
                warm.took(entry)
            task = asyncio.ensure_future(self._one(entry))
            tasks.add(task)
            task.add_done_callback(self._ended(entry, tasks, room))
            started += 1
        return started

    def _ended(self, entry: FileEntry, tasks: set[asyncio.Task[None]],
               room: asyncio.Event) -> Callable[[asyncio.Task[None]], None]:
        def ended(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if task.cancelled():  # cancelled before it ran: it reported nothing
                self._left -= 1
                self.warm.tuner.leave(0)
                self._report(entry, Stopped())
            room.set()
        return ended

    async def _one(self, entry: FileEntry) -> None:
        outcome: bool | BaseException
        try:
            outcome = (await self._fetch_retrying(entry))[1]
        except asyncio.CancelledError:
            outcome = Stopped()
        except BaseException as exc:
            outcome = exc
        self._left -= 1
        self.warm.tuner.leave(entry.size if outcome is True else 0)
        self._report(entry, outcome)

    def _report(self, entry: FileEntry, outcome: bool | BaseException) -> None:
        """Hand an outcome to the waiting thread with the others that end in
        this pass of the loop: one wake-up of that thread per batch."""
        self._batch.append((entry, outcome))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        self.warm.results.put(batch)

    async def _fetch_retrying(self, entry: FileEntry) -> tuple[str, bool]:
        """``Fetcher.fetch_retrying``, awaiting instead of sleeping."""
        state = Retries(self.fetcher.cache.backoff)
        while True:
            try:
                return await self._fetch_once(entry)
            except Stopped:
                raise
            except Exception as exc:
                pause, slow_down = state.next(self.fetcher, exc, entry)
            await self.inflight.asleep(pause, slow_down=slow_down)

    async def _fetch_once(self, entry: FileEntry) -> tuple[str, bool]:
        """``Fetcher.fetch_once`` with the GET awaited on the loop."""
        fetcher, inflight, volume = self.fetcher, self.inflight, self.volume
        copy = fetcher.where(volume, entry, inflight, self.warm.evicted)
        inflight.check()
        lock = FileLock(copy.lock)
        # Byte ranges (a table's row groups) are ranged reads: copy_ranges, in a thread.
        if isinstance(entry, RangeEntry) or fetcher.cache.max_bytes is not None or \
                not lock.acquire(blocking=False):
            self.threaded += 1
            return await self._in_thread(fetcher.fetch_once, volume, entry, inflight,
                                         self.warm.evicted)
        try:
            hit = fetcher.cache.lookup(volume, entry)
            if hit is not None:
                return hit, False
            copy = fetcher.begin(copy)
            try:
                pending = await self._reserve(copy)
                try:
                    try:
                        got = await objget.fetch(
                            volume, volume.full_path(copy.rel), pending.fd,
                            fetcher.context(copy),
                            parts=objget.split(self.warm.tuner.limit, self._left),
                            client=self._client(copy))
                    finally:
                        os.close(pending.fd)
                    await self._commit(copy, pending, Copied(got.size, got.etag, got.mtime_ns))
                except BaseException as exc:
                    fetcher.drop_tmp(copy, pending, exc)
            finally:
                inflight.release(copy.token)
        finally:
            lock.release()
        return copy.local, True

    async def _reserve(self, copy: Copy) -> Pending:
        """``Fetcher.reserve_tmp``, batched: the copies that start in one pass
        of the loop reserve their temp files together
        (:meth:`Fetcher.reserve_tmps`, one hold of the ledger lock), at the
        end of that pass (:class:`_PassBatch`).

        Raises:
            Exception: as ``reserve_tmp`` (nothing is left behind).
        """
        done = self._reserves.add(copy)
        try:
            got = await done
        except asyncio.CancelledError:
            # Stopped before the batch ran: ``done`` is cancelled, the batch
            # skips it, and nothing was reserved. Stopped after it: give back
            # what it reserved for this copy.
            if not done.done() or done.cancelled():
                raise
            got = done.result()
            if not isinstance(got, BaseException):
                os.close(got.fd)
                self.fetcher.drop_tmp(copy, got, Stopped())
            raise
        if isinstance(got, BaseException):
            raise got
        return got

    async def _commit(self, copy: Copy, pending: Pending, copied: Copied) -> None:
        """``Fetcher.commit_tmp``, batched: the copies that finish in one pass
        of the loop are committed together (:meth:`Fetcher.commit_tmps`, one
        hold of the ledger lock), at the end of that pass.

        Raises:
            Exception: this copy's commit failed (the caller drops it).
        """
        done = self._commits.add((copy, pending, copied))
        try:
            failed = await done
        except asyncio.CancelledError:
            # Stopped before the batch ran: ``done`` is cancelled, the batch
            # skips it, and the copy drops its temp file as any stopped copy.
            # Stopped after it: the copy is in place, done.
            if not done.done() or done.cancelled():
                raise
            failed = done.result()
        if failed is not None:
            raise failed

    def _client(self, copy: Copy) -> Any:
        """The bucket's client, asked for once per warm (one volume, one bucket)."""
        if self._store is None:
            kind, bucket, _ = objstore.location(self.volume, self.volume.full_path(copy.rel))
            self._store = objstore.store(kind, bucket, self.fetcher.context(copy).deadline)
        return self._store

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn`` in this warm's thread pool. A stop cancels the caller
        but not the thread: it sees the stop itself (the threaded fetch checks
        it), and the caller waits for it so that it leaves the cache as it should."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                THREAD_CEILING, thread_name_prefix="ucstage-warm-wait")
        return await objget.unabandoned(
            asyncio.get_running_loop().run_in_executor(self._pool, fn, *args))


Item = TypeVar("Item")
Result = TypeVar("Result")


class _PassBatch(Generic[Item, Result]):
    """One step of the copies (reserving, committing) for everything that
    reaches it in one pass of the loop, run together at the end of that pass
    by ``run`` (items in, one result per item out, in order)."""

    def __init__(self, run: Callable[[list[Item]], Sequence[Result]]) -> None:
        self._run = run
        self._items: list[tuple[Item, asyncio.Future[Result]]] = []

    def add(self, item: Item) -> asyncio.Future[Result]:
        """Queue ``item``; the future gets its result when the batch runs.
        Cancelled before then, the item is left out of the batch."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Result] = loop.create_future()
        self._items.append((item, done))
        if len(self._items) == 1:
            loop.call_soon(self._flush)
        return done

    def _flush(self) -> None:
        batch, self._items = self._items, []
        batch = [(item, done) for item, done in batch if not done.cancelled()]
        try:
            got: Sequence[Any] = self._run([item for item, _ in batch])
        except BaseException as exc:  # a bug: every item of the batch fails with it
            got = [exc] * len(batch)
        for (_, done), one in zip(batch, got, strict=True):
            done.set_result(one)
