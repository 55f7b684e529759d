"""Deadlines and hedged GETs on the object-store engine: a stalled request
costs seconds, not minutes.

Every GET of :mod:`ucstage.cache.objget` is read as *legs*: one response of
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

Every leg also has a hard deadline (:func:`ucstage.objstore.deadline`,
``$UCSTAGE_REQUEST_DEADLINE``, default 30 s, ``object_store``'s own overall
request timeout, which the client gets a little beyond it):
a leg that has not finished by then is dropped, and a request with no leg
left fails with :exc:`TimeoutError`, which the cache retries.

Hedging is on by default; ``UCSTAGE_HEDGE=0`` (or ``cache warm --no-hedge``)
turns it off, leaving only the deadline.

Every leg waits for its source's :mod:`~ucstage.cache.pace` before it is
sent; its time to first byte, and its deadline, start when it is sent, so
ucstage's own queueing is not counted as the store's latency (which would
make every queued request look late and hedge it, adding load to a slow or
throttling store). A throttled leg fails as :exc:`~ucstage.cache.pace.Paced`.

Everything here runs on the engine's event loop (one thread): no locks.
"""

from __future__ import annotations

# asyncio is imported inside the functions that run on the loop: importing
# this module (every CLI command does, through the cache package) then does
# not load asyncio, ssl and concurrent.futures (tens of ms of start-up).
import collections
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..objstore import DEADLINE_ENV, concise, deadline
from ..percentile import percentile
from . import pace

__all__ = ["FLOOR", "HEDGES_PER_REQUEST", "HEDGE_ENV", "LATE", "MAX_HEDGES",
           "STATS", "Budget", "Latency", "Requests", "budget", "enabled", "latency", "read"]

HEDGE_ENV = "UCSTAGE_HEDGE"
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


def enabled() -> bool:
    """Whether GETs are hedged: ``$UCSTAGE_HEDGE`` unset or not ``0``/``off``/``false``/``no``."""
    return os.environ.get(HEDGE_ENV, "").strip().lower() not in ("0", "off", "false", "no")


@dataclass(frozen=True)
class Requests:
    """How the engine sends one cache's GETs: hedge late ones or not, and the
    seconds one request may take. Passed as a parameter (``LocalCache(hedge=,
    request_deadline=)``, ``cache warm --no-hedge --deadline``); the
    environment (``$UCSTAGE_HEDGE``, ``$UCSTAGE_REQUEST_DEADLINE``) is only
    the default, read by :meth:`of` when a value is not given."""

    hedge: bool
    deadline: float

    @classmethod
    def of(cls, hedge: bool | None = None, deadline_s: float | None = None) -> Requests:
        """The values given, the environment's for the others.

        Raises:
            InvalidArgument: ``request_deadline`` is not a positive finite
                number, ``hedge`` not a bool (or the environment's value is bad).
        """
        if hedge is not None and not isinstance(hedge, bool):
            raise InvalidArgument(f"hedge must be True or False, got {hedge!r}")
        if deadline_s is not None and (
                isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float))
                or not (0 < deadline_s < math.inf)):
            raise InvalidArgument(f"request_deadline must be a positive, finite number of "
                                  f"seconds, got {deadline_s!r}")
        return cls(enabled() if hedge is None else hedge,
                   deadline() if deadline_s is None else float(deadline_s))


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


def _forget_after_fork() -> None:
    _latency.clear()
    _budget.clear()
    STATS.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


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
    chunks, then the end (or its error) on :attr:`items`."""

    def __init__(self, client: Any, key: str, start: int, end: int | None, if_match: str,
                 chunk: int, hedged: bool, source: str = "") -> None:
        import asyncio

        self.start, self.hedged, self.source = start, hedged, source
        self.sent = False
        """Whether the request left (its pace let it); until then it is not late."""
        self.began = time.monotonic()
        """When it was sent (made, until then)."""
        self.last = self.began
        self.meta: Any = None
        self.items: asyncio.Queue[Any] = asyncio.Queue()
        self.held: collections.deque[Any] = collections.deque()
        """Items taken off :attr:`items` while another leg's was handed out."""
        options: Any = {}
        if start or end is not None:
            options["range"] = (start, end) if end is not None else {"offset": start}
        if if_match:
            options["if_match"] = if_match
        self.task = asyncio.ensure_future(self._run(client, key, options, end, chunk))

    async def _run(self, client: Any, key: str, options: Any, end: int | None,
                   chunk: int) -> None:
        import asyncio

        import obstore

        sent_at = self.began
        try:
            sent_at = await pace.send(self.source)
            self.items.put_nowait(_SENT)
            result = await obstore.get_async(client, key, options=options or None)
            pace.pace(self.source).answered()
            self.meta = result.meta
            self.items.put_nowait(_HEADERS)
            length = min(end, self.meta["size"]) if end is not None else self.meta["size"]
            if length - self.start <= chunk:
                # One await for the body instead of a stream's two or more:
                # each await of a Rust future is a wake-up of the loop and a
                # GIL hand-off, which cost more CPU than a small body's bytes.
                self.items.put_nowait(await result.bytes_async())
            else:
                async for block in result.stream(min_chunk_size=chunk):
                    self.items.put_nowait(block)
            self.items.put_nowait(_END)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the reader, which decides
            if self.meta is None and pace.throttled(exc):
                pace.pace(self.source).throttle(sent_at)
                exc = pace.Paced(str(concise(exc)))
            self.items.put_nowait(_Failed(exc))

    def cancel(self) -> None:
        """Stop the request; cancelling drops its response, closing the connection."""
        self.task.cancel()


def _take(leg: _Leg) -> Any:
    return leg.held.popleft() if leg.held else leg.items.get_nowait()


async def _next(legs: list[_Leg], timeout: float) -> tuple[_Leg, Any] | None:
    """The first item any of ``legs`` delivers within ``timeout`` seconds
    (the earliest leg's when several have one), or None."""
    import asyncio

    for leg in legs:
        if leg.held or not leg.items.empty():
            return leg, _take(leg)
    if timeout <= 0:
        return None
    getters = {asyncio.ensure_future(leg.items.get()): leg for leg in legs}
    try:
        done, _ = await asyncio.wait(getters, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for getter in getters:
            getter.cancel()
    found: tuple[_Leg, Any] | None = None
    for getter, leg in getters.items():
        if getter in done and not getter.cancelled():
            if found is None:
                found = leg, getter.result()
            else:
                leg.held.append(getter.result())  # kept in order for its leg
    return found


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
            if digest is not None:
                digest.update(item)
            pos += write(fd, pos, item)
    finally:
        for leg in list(legs):
            _drop(legs, leg, pool)


def _drop(legs: list[_Leg], leg: _Leg, pool: Budget) -> None:
    leg.cancel()
    legs.remove(leg)
    if leg.hedged:
        pool.give()
