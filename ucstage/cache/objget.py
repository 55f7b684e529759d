"""GETs of the object-store engine: one event loop per process, responses
streamed straight into the cache's preallocated temp file.

Every GET of a process runs on one asyncio loop in a daemon thread, so many
requests are in flight without a thread each inside the HTTP client; obstore
signs, sends and parses them in Rust. A copy sleeps on an event that the
GET's end and the job's stop both set, so a stop
(:class:`~ucstage.cache.inflight.Inflight`) or a Ctrl-C
in the waiting thread cancels the request through the loop: a blocking call
inside Rust would not see the signal.

An object of :data:`SPLIT_AT` bytes or more may be read as parallel ranged
GETs, each written at its offset with ``pwrite``, so one large file is not
held to one connection. How many: the caller says how many requests the
object may have in flight (``parts``): a lone fetch :data:`PARTS_IN_FLIGHT`,
a warm that many only when the places it has left allow it for every object
left (:func:`split`); otherwise whole GETs already fill its connections and
ranges would only add requests (and cost a server that reads the whole object
for every range, as moto does, a full read each). Parts are ``size / parts``
bytes, between :data:`PART` and :data:`MAX_PART`. Every part after the first
asks ``If-Match`` the first one's ETag: an object replaced mid-copy fails the
copy (and the cache retries it) instead of mixing two versions. The first
part streams while the others run; only its headers are awaited first.

Every request (a whole GET or one part) is read through
:func:`ucstage.cache.hedge.read`: a late response gets a hedged second
request, and none outlives the deadline. A copy is returned only after its
bytes passed :mod:`ucstage.cache.integrity`'s check (the ETag's MD5, hashed
as a whole GET streams or over the file once every part is written; else the
size), which it records on the temp file; a mismatch raises
:exc:`~ucstage.cache.integrity.Mismatch`, an ``OSError`` the cache retries.

The loop and its thread belong to the process that made them; a forked child
(a DataLoader worker) starts its own on first use.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from typing import Any, NamedTuple

from .. import objstore
from . import checksums, hedge, integrity
from .inflight import Inflight, Stopped

__all__ = ["PART", "PARTS_IN_FLIGHT", "SPLIT_AT", "Got", "fetch", "get_into", "loop", "split"]

PART = 16 * 1024 * 1024
"""The smallest ranged GET of a large object: the top of the 8-16 MiB range
object stores serve best; fewer parts also cost a server that reads the
whole object for each range (moto) less."""
MAX_PART = 4 * PART
"""The largest ranged GET: a failed part is retried with its object, so parts
stay small enough that a retry repeats little."""
SPLIT_AT = 2 * PART
"""Objects this large or larger may be fetched as parallel ranged GETs."""
PARTS_IN_FLIGHT = 4
"""Ranged GETs of one object in flight at most."""

WHOLE = 1024 * 1024
"""Objects up to this size are read in one piece (the stream's chunk size:
it would have delivered them in one chunk anyway)."""

_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


class Got(NamedTuple):
    """What one object GET wrote."""

    size: int
    etag: str
    mtime_ns: int | None
    check: str = ""
    """The check its bytes passed (:data:`ucstage.cache.integrity.CHECKS`)."""


_forked_away: list[Any] = []
"""What a forked child keeps but never uses: the parent's loop."""


def _forget_after_fork() -> None:
    global _loop, _loop_lock
    # The loop's thread did not survive the fork. The loop is set aside, not
    # freed: its tasks hold obstore requests, whose Rust drop can block in
    # the child on a lock of the runtime left in the parent.
    if _loop is not None:
        _forked_away.append(_loop)
    _loop = None
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def loop() -> asyncio.AbstractEventLoop:
    """This process's GET loop, started on first use."""
    global _loop
    current = _loop
    if current is not None and current[0] == os.getpid():
        return current[1]
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            new = asyncio.new_event_loop()
            thread = threading.Thread(target=new.run_forever, name="ucstage-objget",
                                      daemon=True)
            thread.start()
            _loop = (os.getpid(), new)
            atexit.register(_stop_loop, new, thread)
        return _loop[1]


def _stop_loop(old: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    """At exit, stop the loop before the interpreter tears down under it:
    a daemon thread still inside a native extension during finalization can
    crash the process after its work is done."""
    if _loop is None or _loop[1] is not old:
        return  # a forked child's copy: its thread is not here
    with contextlib.suppress(RuntimeError):
        old.call_soon_threadsafe(old.stop)
    thread.join(2.0)


def _write(fd: int, offset: int, data: Any) -> int:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)
    return done


def split(limit: int, objects_left: int) -> int:
    """Requests one object of a warm may have in flight: :data:`PARTS_IN_FLIGHT`
    when the job's ``limit`` leaves that many places for each of the
    ``objects_left`` (this one included) that have not ended, else 1.

    Why all or nothing: while the objects left fill most places with whole
    GETs, ranges add requests but not throughput, and a server that reads the
    whole object for each range pays a full read per part (moto: 16 x 64 MiB
    on 32 places took 1.1-1.7 s read whole and 1.6-1.7 s in halves). Ranges
    pay when few objects are left (a lone large file, a job's tail)."""
    share = limit // max(1, objects_left)
    return PARTS_IN_FLIGHT if share >= PARTS_IN_FLIGHT else 1


def _part_size(size: int, parts: int) -> int:
    """Bytes per ranged GET of an object of ``size`` with ``parts`` in flight:
    ``size / parts`` rounded up to a MiB, between :data:`PART` and :data:`MAX_PART`."""
    mib = 1024 * 1024
    share = -(-size // max(1, parts))
    return min(MAX_PART, max(PART, -(-share // mib) * mib))


async def _get(client: Any, key: str, fd: int, size_hint: int,
               parts: int = PARTS_IN_FLIGHT, source: str = "", root: str = "",
               requests: hedge.Requests | None = None, listed: str = "") -> Got:
    store_sum: checksums.Expect | None = None
    if size_hint < SPLIT_AT or _part_size(size_hint, parts) >= size_hint:
        check: dict[str, Any] = {"want": "", "digest": None, "store": None}

        def digest_for(meta: Any) -> Any:
            # The MD5 as the bytes arrive: no second pass over the copy.
            check["store"] = checksums.expect(source, meta, listed)
            kind = check["store"].check if check["store"] is not None else "md5"
            check["want"] = check["store"].want if check["store"] is not None else \
                integrity.expect_md5(source, _etag(meta))
            check["digest"] = checksums.hasher(kind) if check["want"] else None
            return check["digest"]

        size, meta = await hedge.read(client, key, fd, 0, None, source=source, write=_write,
                                      chunk=WHOLE, digest_for=digest_for, requests=requests)
        if size != meta["size"]:
            raise OSError(f"short read: {size} of {meta['size']} bytes")
        digest = check["digest"]
        store_sum = check["store"]
        got = digest.hexdigest() if digest is not None else ""
        verdict = checksums.judge(source, key, store_sum, got) if store_sum is not None else \
            integrity.judge(source, key, check["want"], got, root=root)
    else:
        size, meta = await _get_ranged(client, key, fd, size_hint, parts, source, requests)
        store_sum = checksums.expect(source, meta, listed)
        want = store_sum.want if store_sum is not None else integrity.expect_md5(source, _etag(meta))
        kind = store_sum.check if store_sum is not None else "md5"
        # A digest needs the bytes in order: hashed once every part is written
        # (the copy is in the page cache then), off the loop.
        got = await asyncio.get_running_loop().run_in_executor(
            None, integrity.digest_file, fd, size, kind) if want else ""
        verdict = checksums.judge(source, key, store_sum, got) if store_sum is not None else \
            integrity.judge(source, key, want, got, root=root)
    os.ftruncate(fd, size)  # the caller may have preallocated more
    integrity.record(fd, verdict)
    # GCS and Azure copies are stamped with the listed version (it carries the
    # checksum) while the object is the one listed.
    stamp = store_sum.stamp if store_sum is not None else _etag(meta)
    return Got(size, stamp, objstore.mtime_ns(meta["last_modified"]), verdict.check)


def _etag(meta: Any) -> str:
    return objstore._etag(meta["e_tag"])


async def _get_ranged(client: Any, key: str, fd: int, size_hint: int,
                      parts: int, source: str,
                      requests: hedge.Requests | None = None) -> tuple[int, Any]:
    """Parallel ranged GETs of one large object; returns (size, first part's meta)."""
    step = _part_size(size_hint, parts)
    gate = asyncio.Semaphore(max(1, parts))
    await gate.acquire()  # the first part's place, held while it streams
    headers: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    wrote: list[int] = []

    def heard(meta: Any) -> None:
        if not headers.done():
            headers.set_result(meta)

    async def first_part() -> Any:
        try:
            done, meta = await hedge.read(client, key, fd, 0, step, source=source, write=_write,
                                          chunk=WHOLE, on_meta=heard, requests=requests)
            wrote.append(done)
            return meta
        finally:
            gate.release()

    async def part(start: int, size: int, etag: str) -> None:
        async with gate:
            done, _ = await hedge.read(client, key, fd, start, min(size, start + step),
                                       source=source, write=_write, chunk=WHOLE,
                                       if_match=etag, requests=requests)
            wrote.append(done)

    # The others start as soon as the first part's headers name the size and
    # the ETag; the first part streams meanwhile.
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(first_part())]
    try:
        await asyncio.wait([headers, tasks[0]], return_when=asyncio.FIRST_COMPLETED)
        if not headers.done():
            await tasks[0]  # failed before its headers: raises its error
        meta = headers.result()
        size, etag = int(meta["size"]), str(meta["e_tag"] or "")
        tasks += [asyncio.ensure_future(part(start, size, etag))
                  for start in range(step, size, step)]
        await asyncio.gather(*tasks)
    except BaseException:
        # One part failed (or the copy was cancelled): no other part may
        # go on writing into a file the caller is about to close.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if sum(wrote) != size:
        raise OSError(f"short read: {sum(wrote)} of {size} bytes")
    return size, meta


def get_into(volume: Any, path: str, fd: int, *, size_hint: int = 0,
             inflight: Inflight | None = None, parts: int = PARTS_IN_FLIGHT,
             root: str = "", requests: hedge.Requests | None = None,
             listed: str = "") -> Got:
    """GET the object at ``path`` (an fsspec path of ``volume``) into the open
    file ``fd`` from offset 0; returns what was written.

    ``size_hint`` (the listed size) chooses between one GET and ranged GETs;
    ``parts`` is how many requests the object may have in flight; ``root``
    (the cache's) keeps what the checks learnt of the source
    (:func:`ucstage.cache.integrity.judge`); ``requests`` the cache's hedging
    and deadline (None: the environment's); ``listed`` is the entry's version
    (GCS and Azure versions carry the store's MD5: :mod:`ucstage.cache.checksums`).

    Raises:
        Stopped: ``inflight`` stopped; the request was cancelled.
        FileNotFoundError: the object is gone.
        PermissionError: the store refused (credentials, policy).
        OSError: any other store or disk error (the caller retries).
    """
    kind, bucket, key = objstore.location(volume, path)
    client = objstore.store(kind, bucket, None if requests is None else requests.deadline)
    if inflight is not None:
        inflight.check()
    future = asyncio.run_coroutine_threadsafe(
        _get(client, key, fd, size_hint, parts, f"{kind}://{bucket}", root, requests, listed),
        loop())
    # Sleep until the GET ends or the job stops; no polling, so hundreds of
    # waiting copies cost nothing. Event.wait is interruptible by Ctrl-C in
    # the main thread (a library fetch).
    wake = threading.Event()
    future.add_done_callback(lambda _: wake.set())
    unwatch = inflight.watch(wake.set) if inflight is not None else None
    try:
        wake.wait()
        if inflight is not None and inflight.stopped and not future.done():
            raise Stopped()
        return future.result()
    except BaseException as exc:
        # Ctrl-C in this thread, a stop, or the GET's own error: make sure no
        # request of this copy is still writing into the file afterwards.
        future.cancel()
        if isinstance(exc, (Stopped, KeyboardInterrupt, SystemExit)):
            _wait_cancelled(future)
            raise
        raise _oserror(exc, path) from exc
    finally:
        if unwatch is not None:
            unwatch()


async def fetch(volume: Any, path: str, fd: int, *, size_hint: int = 0,
                parts: int = PARTS_IN_FLIGHT, root: str = "",
                requests: hedge.Requests | None = None, listed: str = "") -> Got:
    """:func:`get_into` for a caller already running on :func:`loop` (a copy
    that is itself a coroutine): the same GET, awaited in place, with the
    same errors. Cancelling the caller cancels the requests; none of their
    writes lands after this returns or raises."""
    kind, bucket, key = objstore.location(volume, path)
    client = objstore.store(kind, bucket, None if requests is None else requests.deadline)
    try:
        return await _get(client, key, fd, size_hint, parts, f"{kind}://{bucket}", root,
                          requests, listed)
    except Exception as exc:
        raise _oserror(exc, path) from exc


def _wait_cancelled(future: concurrent.futures.Future[Got]) -> None:
    """Let a cancelled GET unwind on the loop (briefly) so that none of its
    writes lands after the caller removed the temp file."""
    # Cancelled or timed out: either way there is nothing more to learn.
    with contextlib.suppress(BaseException):
        future.exception(timeout=1.0)


def _oserror(exc: BaseException, path: str) -> BaseException:
    """obstore's errors as the OSErrors the cache's retry rule knows."""
    return objstore.concise(exc, path)
