"""GETs of the object-store engine: one event loop per process, responses
streamed straight into the cache's preallocated temp file, late ones hedged.

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

Every request (a whole GET or one part) is read through :func:`read`: a late
response gets a hedged second request, and none outlives the deadline
(below). A copy is returned only after its bytes passed :mod:`ucstage.engines.checks`'s check (the ETag's MD5, hashed
as a whole GET streams or over the file once every part is written; else the
size), which it records on the temp file; a mismatch raises
:exc:`~ucstage.engines.checks.Mismatch`, an ``OSError`` the cache retries.

The loop and its thread belong to the process that made them; a forked child
(a DataLoader worker) starts its own on first use. asyncio is imported inside
the functions that run on the loop: importing this module (every CLI command
does, through the cache's fetch) then does not load asyncio, ssl and
concurrent.futures (tens of ms of start-up).

**Deadlines and hedges**: a stalled request costs seconds, not minutes.
Every GET (:func:`read`) is read as *legs*: one response of
the object's bytes from some offset. A leg whose headers, or whose next chunk,
are late against the source's running latency (:class:`Latency`:
:data:`LATE` times the 95th percentile of recent times to first byte and of
recent seconds per byte, never under :data:`FLOOR`) gets a second leg, hedged:
the same request while nothing was received, else a ranged GET from the bytes
already written, with ``If-Match`` the ETag (never a mix of two versions).
Whichever leg delivers first goes on; the other is cancelled, which closes its
connection. Hedges in flight are bounded per process (:data:`MAX_HEDGES`), so
a sick store is not stormed, and a request is given at most
:data:`HEDGES_PER_REQUEST`.

Every leg also has a hard deadline (:func:`ucstage.engines.objstore.deadline`,
``$UCSTAGE_REQUEST_DEADLINE``, default 30 s, ``object_store``'s own overall
request timeout, which the client gets a little beyond it):
a leg that has not finished by then is dropped, and a request with no leg
left fails with :exc:`TimeoutError`, which the cache retries.

Hedging is on by default; ``UCSTAGE_HEDGE=0`` (or ``cache warm --no-hedge``)
turns it off, leaving only the deadline.

Every leg waits for its source's :mod:`~ucstage.engines.pace` before it is
sent; its time to first byte, and its deadline, start when it is sent, so
ucstage's own queueing is not counted as the store's latency (which would
make every queued request look late and hedge it, adding load to a slow or
throttling store). A throttled leg fails as :exc:`~ucstage.engines.pace.Paced`.

Everything of a GET runs on the engine's event loop (one thread): no locks.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ..percentile import percentile
from . import azranges, checks, objstore, pace, reset_after_fork
from .context import FetchContext, Requests, Stopped
from .objstore import DEADLINE_ENV, concise

if TYPE_CHECKING:
    import asyncio
    import concurrent.futures

    from ..volumes.location import Volume

__all__ = ["FLOOR", "HASH_THREADS", "HEDGES_PER_REQUEST", "LATE", "MAX_HEDGES",
           "OFF_LOOP", "PART",
           "PARTS_IN_FLIGHT", "SPLIT_AT", "STATS", "Budget", "Got", "Latency",
           "budget", "fetch", "get_into", "latency", "loop", "read",
           "split", "unabandoned"]

T = TypeVar("T")

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

OFF_LOOP = 64 * 1024
"""Chunks this large or larger are hashed and written in a thread
(:data:`HASH_THREADS`), not on the loop: the MD5 of a 256 KiB body alone took
18% of the loop's time. Smaller ones cost less than the hand-off."""
HASH_THREADS = 2
"""Threads hashing and writing large chunks, per process."""

LATE = 4.0
"""A step is late at this many times the source's 95th percentile."""
FLOOR = 0.5
"""A step is never late before this many seconds (loopback and a loaded
machine have millisecond percentiles that a scheduler hiccup exceeds)."""
INITIAL = 2.0
"""Seconds before a step is late while a source has too few samples."""
MIN_SAMPLES = 16
MAX_HEDGES = 16
"""Hedged legs in flight per process at most."""
HEDGES_PER_REQUEST = 2
"""Hedged legs one request may start at most."""
_WINDOW = 256


class _Window:
    """Recent samples and their 95th percentile, recomputed every few samples."""

    def __init__(self) -> None:
        self.values: collections.deque[float] = collections.deque(maxlen=_WINDOW)
        self._p95 = 0.0
        self._stale = 0

    def add(self, value: float) -> None:
        self.values.append(value)
        self._stale += 1

    def p95(self) -> float | None:
        if len(self.values) < MIN_SAMPLES:
            return None
        if self._stale >= 8 or not self._p95:
            self._p95 = percentile(sorted(self.values), 95)
            self._stale = 0
        return self._p95


class Latency:
    """A source's running latency: time to first byte, and seconds per byte
    of its bodies' chunks."""

    def __init__(self) -> None:
        self.first_byte = _Window()
        self.per_byte = _Window()

    def headers_late(self) -> float:
        """Seconds after which a leg's headers are late."""
        p95 = self.first_byte.p95()
        return INITIAL if p95 is None else max(FLOOR, LATE * p95)

    def chunk_late(self, nbytes: int) -> float:
        """Seconds after which a chunk of about ``nbytes`` is late."""
        p95 = self.per_byte.p95()
        return INITIAL if p95 is None else max(FLOOR, LATE * p95 * max(1, nbytes))


class Budget:
    """Hedged legs in flight in this process, at most :data:`MAX_HEDGES`."""

    def __init__(self, limit: int = MAX_HEDGES) -> None:
        self.limit = limit
        self.in_flight = 0

    def take(self) -> bool:
        if self.in_flight >= self.limit:
            STATS["hedges_refused"] += 1
            return False
        self.in_flight += 1
        return True

    def give(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)


STATS: collections.Counter[str] = collections.Counter()
"""This process's hedges (``hedges``, ``hedges_won``, ``hedges_refused``) and
``timeouts`` (legs dropped at the deadline), for reports and tests."""
_latency: dict[str, Latency] = {}
_budget: list[Budget] = []


def latency(source: str) -> Latency:
    """The running latency of ``source`` (``kind://bucket``)."""
    found = _latency.get(source)
    if found is None:
        found = _latency[source] = Latency()
    return found


def budget() -> Budget:
    """This process's hedge budget."""
    if not _budget:
        _budget.append(Budget())
    return _budget[0]


@reset_after_fork
def _forget_samples_after_fork() -> None:
    _hashers.clear()  # its threads did not survive the fork
    _latency.clear()
    _budget.clear()
    STATS.clear()


class _End:
    """A leg's body ended."""


class _Failed:
    """A leg's request failed."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


_HEADERS = object()
_SENT = object()
_END = _End()


class _Leg:
    """One GET of an object's bytes from ``start`` (to ``end``, exclusive, or
    the end of the object): a task that puts its headers' arrival, its body's
    chunks, then the end (or its error) in :attr:`items`, and rings the
    reader's :attr:`bell` (a future :func:`_next` waits on) when one arrives.

    Not an ``asyncio.Queue`` per leg waited on with ``asyncio.wait``: that
    made a task per leg and per wait, and a small object's three waits cost
    more CPU on the loop than the rest of its copy (docs/benchmarks.md,
    "Per-file cost of a warm")."""

    def __init__(self, client: Any, key: str, start: int, end: int | None, if_match: str,
                 chunk: int, hedged: bool, source: str = "") -> None:
        import asyncio

        self.start, self.hedged, self.source = start, hedged, source
        self.began = time.monotonic()
        """When it was sent (made, until then)."""
        self.sent = pace.send_now(source)
        """Whether the request left (its pace let it); until then it is not
        late. Decided here when the pace lets it go at once (the common case:
        no wake-up of the reader to say so)."""
        self.last = self.began
        self.meta: Any = None
        self.items: collections.deque[Any] = collections.deque()
        self.bell: asyncio.Future[None] | None = None
        """The future the reader waits on while :attr:`items` is empty."""
        options: Any = {}
        if start or end is not None:
            options["range"] = (start, end) if end is not None else {"offset": start}
        if if_match:
            options["if_match"] = if_match
        self.task = asyncio.ensure_future(self._run(client, key, options, end, chunk))

    def _put(self, item: Any) -> None:
        self.items.append(item)
        bell = self.bell
        if bell is not None and not bell.done():
            bell.set_result(None)

    async def _run(self, client: Any, key: str, options: Any, end: int | None,
                   chunk: int) -> None:
        import asyncio

        import obstore

        sent_at = self.began
        try:
            if not self.sent:
                sent_at = await pace.send(self.source)
                self._put(_SENT)
            # An Azure blob without a stored MD5 is read through the SDK
            # (:mod:`~ucstage.engines.azranges`), which answers the same way.
            result = await (client.get_async(key, options=options or None)
                            if isinstance(client, azranges.Blobs)
                            else obstore.get_async(client, key, options=options or None))
            pace.pace(self.source).answered()
            self.meta = result.meta
            self._put(_HEADERS)
            length = min(end, self.meta["size"]) if end is not None else self.meta["size"]
            if length - self.start <= chunk:
                # One await for the body instead of a stream's two or more:
                # each await of a Rust future is a wake-up of the loop and a
                # GIL hand-off, which cost more CPU than a small body's bytes.
                self._put(await result.bytes_async())
            else:
                async for block in result.stream(min_chunk_size=chunk):
                    self._put(block)
            self._put(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the reader, which decides
            if self.meta is None and pace.throttled(exc):
                pace.pace(self.source).throttle(sent_at)
                exc = pace.Paced(str(concise(exc)))
            self._put(_Failed(exc))

    def cancel(self) -> None:
        """Stop the request; cancelling drops its response, closing the connection."""
        self.task.cancel()


def _ring(bell: asyncio.Future[None]) -> None:
    if not bell.done():
        bell.set_result(None)


async def _next(legs: list[_Leg], timeout: float) -> tuple[_Leg, Any] | None:
    """The first item any of ``legs`` delivers within ``timeout`` seconds
    (the earliest leg's when several have one), or None."""
    for leg in legs:
        if leg.items:
            return leg, leg.items.popleft()
    if timeout <= 0:
        return None
    loop = legs[0].task.get_loop()
    bell: asyncio.Future[None] = loop.create_future()
    for leg in legs:
        leg.bell = bell
    timer = loop.call_later(timeout, _ring, bell)
    try:
        await bell
    finally:
        timer.cancel()
        for leg in legs:
            leg.bell = None
    for leg in legs:
        if leg.items:
            return leg, leg.items.popleft()
    return None


async def read(client: Any, key: str, fd: int, start: int, end: int | None, *,
               source: str, write: Callable[[int, int, Any], int], chunk: int,
               if_match: str = "", digest_for: Callable[[Any], Any] | None = None,
               on_meta: Callable[[Any], None] | None = None,
               requests: Requests | None = None) -> tuple[int, Any]:
    """GET the bytes ``[start, end)`` of ``key`` (``end`` None: to the end of
    the object) into ``fd`` at their offsets, hedged and deadline-bound as the
    module says; returns ``(bytes written, the first response's meta)``.

    ``digest_for(meta)`` may return a hash object to update with the bytes in
    order; ``on_meta(meta)`` hears the first headers.

    Raises:
        TimeoutError: no leg finished within the deadline.
        Exception: the request's own error (obstore's), when no other leg is left.
    """
    # ``requests``: the cache's settings; None (a caller without a cache) the environment's.
    requests = Requests.of() if requests is None else requests
    hedging, limit, est, pool = requests.hedge, requests.deadline, latency(source), budget()
    legs = [_Leg(client, key, start, end, if_match, chunk, hedged=False, source=source)]
    pos, meta, digest, hedges, retry_at = start, None, None, 0, 0.0
    try:
        while True:
            now = time.monotonic()
            for leg in [leg for leg in legs if leg.sent and now - leg.began >= limit]:
                STATS["timeouts"] += 1
                _drop(legs, leg, pool)
            if not legs:
                raise TimeoutError(f"no complete response within the {limit:g} s deadline "
                                   f"({DEADLINE_ENV})")
            first = legs[0]
            if first.meta is None:
                late = est.headers_late()
            else:
                total = end if end is not None else int(meta["size"]) if meta else pos + chunk
                late = est.chunk_late(max(1, min(chunk, total - pos)))
            # A leg still waiting for its pace has no deadline running yet.
            hard_at = min((leg.began for leg in legs if leg.sent), default=now) + limit
            may_hedge = hedging and first.sent and len(legs) == 1 \
                and hedges < HEDGES_PER_REQUEST
            wake_at = max(first.last + late, retry_at) if may_hedge else hard_at
            got = await _next(legs, min(hard_at, wake_at) - now)
            if got is None:
                now = time.monotonic()
                if may_hedge and now >= first.last + late and now >= retry_at:
                    if pool.take():
                        # Late: a second leg, from the bytes already written,
                        # of the same version.
                        tag = if_match or (str(meta["e_tag"]) if meta and meta["e_tag"] else "")
                        hedges += 1
                        STATS["hedges"] += 1
                        legs.append(_Leg(client, key, pos, end, tag, chunk, hedged=True,
                                         source=source))
                    else:
                        retry_at = now + late  # no room for a hedge now: ask again later
                continue
            leg, item = got
            if item is _SENT:
                leg.sent = True
                leg.began = leg.last = time.monotonic()
                continue
            if isinstance(item, _Failed):
                if len(legs) == 1:
                    raise item.exc
                _drop(legs, leg, pool)  # the other leg goes on
                continue
            # Whichever leg delivered first goes on; the other is cancelled.
            for other in [o for o in legs if o is not leg]:
                _drop(legs, other, pool)
            if leg.hedged:
                STATS["hedges_won"] += 1
                leg.hedged = False
                pool.give()  # the request now, no longer a hedge in flight
            now = time.monotonic()
            step_s, leg.last = now - leg.last, now
            if item is _HEADERS:
                est.first_byte.add(step_s)
                if meta is None:
                    meta = leg.meta
                    digest = digest_for(meta) if digest_for is not None else None
                    if on_meta is not None:
                        on_meta(meta)
                continue
            if item is _END:
                return pos - start, meta
            if len(item):
                est.per_byte.add(step_s / len(item))
            if len(item) >= OFF_LOOP:
                pos += await _off_loop(write, fd, pos, item, digest)
                continue
            if digest is not None:
                digest.update(item)
            pos += write(fd, pos, item)
    finally:
        for leg in list(legs):
            _drop(legs, leg, pool)


def _write_hashed(write: Callable[[int, int, Any], int], fd: int, pos: int, item: Any,
                  digest: Any) -> int:
    if digest is not None:
        digest.update(item)
    return write(fd, pos, item)


_hashers: list[concurrent.futures.ThreadPoolExecutor] = []


def _hasher_pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _hashers:
        import concurrent.futures

        _hashers.append(concurrent.futures.ThreadPoolExecutor(
            HASH_THREADS, thread_name_prefix="ucstage-hash"))
    return _hashers[0]


async def _off_loop(write: Callable[[int, int, Any], int], fd: int, pos: int, item: Any,
                    digest: Any) -> int:
    """Hash and write one large chunk in a thread (both release the GIL), so
    the loop goes on with other copies meanwhile. A cancelled caller still
    waits for the thread: no write may land after the copy gave its file up."""
    import asyncio

    return await unabandoned(asyncio.get_running_loop().run_in_executor(
        _hasher_pool(), _write_hashed, write, fd, pos, item, digest))


async def unabandoned(job: asyncio.Future[T]) -> T:
    """Await ``job`` (a thread's work) to its end even when the caller is
    cancelled: the caller then waits for it and re-raises the cancellation, so
    nothing the thread does (a write into a file the caller gives up) lands
    after the caller moved on."""
    import asyncio

    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await job
        raise


def _drop(legs: list[_Leg], leg: _Leg, pool: Budget) -> None:
    leg.cancel()
    legs.remove(leg)
    if leg.hedged:
        pool.give()


_loop_lock = threading.Lock()
_loop: tuple[int, asyncio.AbstractEventLoop] | None = None


class Got(NamedTuple):
    """What one object GET wrote."""

    size: int
    etag: str
    mtime_ns: int | None
    check: str = ""
    """The check its bytes passed (:data:`ucstage.engines.checks.CHECKS`)."""


_forked_away: list[Any] = []
"""What a forked child keeps but never uses: the parent's loop."""


@reset_after_fork
def _forget_after_fork() -> None:
    global _loop, _loop_lock
    # The loop's thread did not survive the fork. The loop is set aside, not
    # freed: its tasks hold obstore requests, whose Rust drop can block in
    # the child on a lock of the runtime left in the parent.
    if _loop is not None:
        _forked_away.append(_loop)
    _loop = None
    _loop_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """This process's GET loop, started on first use."""
    global _loop
    current = _loop
    if current is not None and current[0] == os.getpid():
        return current[1]
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():
            import asyncio

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
               parts: int = PARTS_IN_FLIGHT, source: str = "",
               ctx: FetchContext | None = None) -> Got:
    import asyncio

    evidence, requests, listed = (None, None, "") if ctx is None else \
        (ctx.evidence, ctx.requests, ctx.listed)
    # One expectation per GET (checks.expect), worked out from the first
    # response's headers, and one verdict (checks.judge).
    if azranges.wanted(source, listed, size_hint):
        size, meta, verdict = await _get_md5_ranges(key, fd, size_hint, parts, source, requests)
        want = checks.expect(source, meta, listed)
    elif size_hint < SPLIT_AT or _part_size(size_hint, parts) >= size_hint:
        got_for: list[tuple[checks.Expect, Any]] = []

        def digest_for(meta: Any) -> Any:
            # The digest as the bytes arrive: no second pass over the copy.
            want = checks.expect(source, meta, listed)
            got_for.append((want, checks.hasher(want.check)))
            return got_for[-1][1]

        size, meta = await read(client, key, fd, 0, None, source=source, write=_write,
                                chunk=WHOLE, digest_for=digest_for, requests=requests)
        if size != meta["size"]:
            raise OSError(f"short read: {size} of {meta['size']} bytes")
        want, digest = got_for[-1]
        got = digest.hexdigest() if digest is not None else ""
        verdict = checks.judge(source, key, want, got, evidence=evidence)
    else:
        size, meta = await _get_ranged(client, key, fd, size_hint, parts, source, requests)
        want = checks.expect(source, meta, listed)
        # A digest needs the bytes in order: hashed once every part is written
        # (the copy is in the page cache then), off the loop.
        got = await asyncio.get_running_loop().run_in_executor(
            None, checks.digest_file, fd, size, want.check) if want.check else ""
        verdict = checks.judge(source, key, want, got, evidence=evidence)
    os.ftruncate(fd, size)  # the caller may have preallocated more
    checks.record(fd, verdict)
    # GCS and Azure copies are stamped with the listed version (it carries the
    # checksum) while the object is the one listed; S3's with the ETag.
    return Got(size, want.stamp, objstore.mtime_ns(meta["last_modified"]), verdict.check)


async def _cancelled(tasks: list[Any]) -> None:
    """Cancel the parts of a copy and wait until each has ended.

    One part failed (or the copy was cancelled): no other part may go on
    writing into a file the caller is about to close.
    """
    import asyncio

    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _get_md5_ranges(key: str, fd: int, size_hint: int, parts: int, source: str,
                          requests: Requests | None) -> tuple[int, Any, checks.Verdict]:
    """An Azure blob the store keeps no MD5 for, read in ranges of at most
    :data:`~ucstage.engines.azranges.RANGE` whose MD5 Azure gives
    (:mod:`~ucstage.engines.azranges`), ``parts`` in flight, every range after
    the first ``If-Match`` its ETag: every byte is checked as it arrives. A
    range whose bytes mismatch is read again, :data:`~ucstage.engines.azranges.TRIES`
    times at most; returns (size, the first range's meta, the verdict).

    Raises:
        checks.Mismatch: a range mismatched on every read.
        OSError: a range came without its MD5, or short.
    """
    import asyncio

    blobs = azranges.blobs(source.split("://", 1)[1], None if requests is None else
                           requests.deadline)
    step = azranges.RANGE

    async def checked(start: int, end: int, etag: str, whole: bool = False) -> tuple[Any, str]:
        for attempt in range(1, azranges.TRIES + 1):
            digest = checks.hasher("md5")

            def digest_for(_meta: Any, this: Any = digest) -> Any:
                return this

            done, meta = await read(blobs, key, fd, start, end, source=source, write=_write,
                                    chunk=step, if_match=etag, digest_for=digest_for,
                                    requests=requests)
            want, got = meta["range_md5"], digest.hexdigest()
            if done != min(end, int(meta["size"])) - start:
                raise OSError(f"short read: {done} bytes of the range from {start}")
            if not want:
                raise OSError(f"Azure sent no MD5 of the bytes {start}-{start + done - 1} "
                              "(x-ms-range-get-content-md5)")
            if got == want:
                return meta, got
            # A transfer error (or a bad replica): this range again, not the file.
            checks.TALLY.add("mismatches")
            if attempt == azranges.TRIES:
                raise checks.Mismatch(key, "md5", want, got)
        raise AssertionError("unreachable")

    # The first range (of the listed size) names the size and the ETag the
    # others must match.
    first = min(step, size_hint)
    meta, first_md5 = await checked(0, first, "")
    size, etag = int(meta["size"]), str(meta["e_tag"] or "")
    gate = asyncio.Semaphore(max(1, parts))

    async def rest(start: int) -> None:
        async with gate:
            await checked(start, min(size, start + step), etag)

    tasks = [asyncio.ensure_future(rest(start)) for start in range(first, size, step)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        await _cancelled(tasks)
        raise
    # The MD5 of the whole copy, recorded for ``cache verify --checksum``: a
    # single range's is at hand; ranges are hashed again once all are written.
    whole = first_md5 if size <= first else await asyncio.get_running_loop().run_in_executor(
        None, checks.digest_file, fd, size, "md5")
    return size, meta, azranges.passed(whole)


def _etag(meta: Any) -> str:
    return objstore._etag(meta["e_tag"])


async def _get_ranged(client: Any, key: str, fd: int, size_hint: int,
                      parts: int, source: str,
                      requests: Requests | None = None) -> tuple[int, Any]:
    """Parallel ranged GETs of one large object; returns (size, first part's meta)."""
    import asyncio

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
            done, meta = await read(client, key, fd, 0, step, source=source, write=_write,
                                    chunk=WHOLE, on_meta=heard, requests=requests)
            wrote.append(done)
            return meta
        finally:
            gate.release()

    async def part(start: int, size: int, etag: str) -> None:
        async with gate:
            done, _ = await read(client, key, fd, start, min(size, start + step),
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
        await _cancelled(tasks)
        raise
    if sum(wrote) != size:
        raise OSError(f"short read: {sum(wrote)} of {size} bytes")
    return size, meta


def get_into(volume: Volume, path: str, fd: int, ctx: FetchContext,
             parts: int = PARTS_IN_FLIGHT) -> Got:
    """GET the object at ``path`` (an fsspec path of ``volume``) into the open
    file ``fd`` from offset 0; returns what was written.

    ``ctx.size`` (the listed size) chooses between one GET and ranged GETs;
    ``parts`` is how many requests the object may have in flight; a stop of
    ``ctx.inflight`` cancels the requests.

    Raises:
        Stopped: ``ctx.inflight`` stopped; the request was cancelled.
        FileNotFoundError: the object is gone.
        PermissionError: the store refused (credentials, policy).
        OSError: any other store or disk error (the caller retries).
    """
    import asyncio

    kind, bucket, key = objstore.location(volume, path)
    client = objstore.store(kind, bucket, ctx.deadline)
    inflight = ctx.inflight
    if inflight is not None:
        inflight.check()
    future = asyncio.run_coroutine_threadsafe(
        _get(client, key, fd, ctx.size, parts, f"{kind}://{bucket}", ctx), loop())
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


async def fetch(volume: Volume, path: str, fd: int, ctx: FetchContext,
                parts: int = PARTS_IN_FLIGHT, client: Any = None) -> Got:
    """:func:`get_into` for a caller already running on :func:`loop` (a copy
    that is itself a coroutine): the same GET, awaited in place, with the
    same errors. Cancelling the caller cancels the requests; none of their
    writes lands after this returns or raises. ``client``: the bucket's
    client (:func:`ucstage.engines.objstore.store`) when the caller already holds
    it (a warm asks once, not per file: building its key reads a dozen
    environment variables)."""
    kind, bucket, key = objstore.location(volume, path)
    if client is None:
        client = objstore.store(kind, bucket, ctx.deadline)
    try:
        return await _get(client, key, fd, ctx.size, parts, f"{kind}://{bucket}", ctx)
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
