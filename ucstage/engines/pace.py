"""A client-side request rate per source that follows the store's throttling,
as the AWS SDKs' adaptive retry mode does.

A store that throttles (S3's ``503 SlowDown`` above a prefix's request rate)
answers every request above its rate with an error; backing off each throttled
request on its own (exponential delays) leaves a warm far below the rate the
store allows. Instead, each source (``kind://bucket``) of the object-store
engine has a :class:`Pace`:

* until the source first throttles, requests go out unpaced;
* a throttle cuts the rate to :data:`BETA` times the rate requests were sent
  at (measured over the last second), once per cut: throttles of requests
  sent before the last cut say nothing new, so a burst of them does not
  collapse the rate;
* every answered request lets the rate climb back along a cubic of the time
  since the cut (CUBIC's, as the SDKs use): fast at first, flat near the rate
  that was throttled, then probing above it;
* requests take a token of a bucket filled at that rate, holding
  :data:`BURST_S` seconds' worth, so they leave evenly.

A throttled GET is then retried after a short jittered delay (:func:`pause`)
without spending one of the copy's retries (up to :data:`FREE_RETRIES`): the
pace, not the retry, does the waiting (:class:`Paced`).

Everything here runs on the engine's event loop (one thread): no locks.
"""

from __future__ import annotations

import collections
import random
import re
import time
from collections.abc import Callable
from typing import Any

from . import reset_after_fork

__all__ = ["BETA", "FREE_RETRIES", "Pace", "Paced", "forget", "pace", "pause", "send",
           "send_now", "throttled"]

BETA = 0.7
"""The rate after a throttle, as a share of the rate requests were sent at."""
SCALE = 0.4
"""CUBIC's constant (requests/s per second cubed): how fast the rate climbs back."""
MIN_RATE = 0.5
"""Requests per second at least, however often the store throttles."""
BURST_S = 0.05
"""Seconds' worth of requests the token bucket holds (at least one)."""
WINDOW_S = 1.0
"""Seconds over which the rate requests are sent at is measured."""
PAUSE_S = 0.05
"""A throttled GET is retried after up to this many seconds (jittered)."""
FREE_RETRIES = 8
"""Throttled attempts of one copy that do not count against its retries (a
key throttled on every GET still fails, after these and its retries)."""

_THROTTLED = re.compile(r"status(?: code)?:? (?:503|429)\b|\b(?:503|429) (?:Service Unavailable|"
                        r"Slow ?Down|Too Many Requests)|SlowDown|Too ?Many ?Requests|"
                        r"reduce your request rate|Throttl|RequestLimitExceeded", re.I)


def throttled(exc: BaseException) -> bool:
    """Whether ``exc`` is the store asking for fewer requests (503 SlowDown,
    429): the one error a retry must back off for from the start."""
    return bool(_THROTTLED.search(str(exc)))


class Paced(OSError):
    """A GET the store throttled, now paced: retried after :func:`pause`."""


def pause() -> float:
    """Seconds before retrying a :class:`Paced` GET: short and jittered, so
    the throttled requests of one moment do not return together."""
    return random.uniform(0, PAUSE_S)


class Pace:
    """One source's request rate (see the module docstring).

    Args:
        clock: seconds, monotonic (tests give their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.rate: float | None = None
        """Requests per second allowed; None until the source throttles."""
        self.peak = 0.0
        """The rate at the last cut (where the cubic flattens)."""
        self.cut_at = float("-inf")
        self.cuts = 0
        self._tokens = 0.0
        self._filled = 0.0
        self._sent: collections.deque[float] = collections.deque()
        self.queue: collections.deque[Any] = collections.deque()
        """Futures of the requests waiting for a token, oldest first."""
        self.task: Any = None
        """The task letting them go (:func:`_dispatch`), while any wait."""

    def sent_rate(self, now: float) -> float:
        """Requests per second sent over the last :data:`WINDOW_S`."""
        while self._sent and self._sent[0] < now - WINDOW_S:
            self._sent.popleft()
        if not self._sent:
            return 0.0
        return len(self._sent) / max(now - self._sent[0], WINDOW_S / 10)

    def take(self) -> float:
        """Take a token if there is one (0.0), else the seconds until there
        is (nothing taken): the waiters ask again then, at the rate as it is
        by then (a cut slows the requests already waiting too)."""
        now = self.clock()
        if self.rate is not None:
            burst = max(1.0, self.rate * BURST_S)
            self._tokens = min(burst, self._tokens + (now - self._filled) * self.rate)
            self._filled = now
            if self._tokens < 1:
                return (1 - self._tokens) / self.rate
            self._tokens -= 1
        self._sent.append(now)
        if self._sent[0] < now - WINDOW_S:
            self.sent_rate(now)  # drop what left the window: bounded memory
        return 0.0

    def throttle(self, sent_at: float) -> None:
        """A request sent at ``sent_at`` was throttled: cut the rate, unless it
        was cut since that request left."""
        if sent_at < self.cut_at:
            return
        now = self.clock()
        measured = self.sent_rate(now)
        base = measured if self.rate is None else min(self.rate, measured or self.rate)
        self.peak = max(base, MIN_RATE)
        self.rate = max(MIN_RATE, BETA * base)
        self.cut_at = now
        self.cuts += 1
        self._tokens = min(self._tokens, 0.0)

    def answered(self) -> None:
        """A request was answered (not throttled): the rate climbs back."""
        if self.rate is None:
            return
        now = self.clock()
        # CUBIC: W(t) = C (t - K)^3 + W_max, K the time to climb back to W_max.
        k = (self.peak * (1 - BETA) / SCALE) ** (1 / 3)
        cubic = SCALE * (now - self.cut_at - k) ** 3 + self.peak
        # Never far above what is actually sent (an idle source would
        # otherwise climb without bound, then burst).
        ceiling = max(2 * self.sent_rate(now), self.peak)
        self.rate = max(self.rate, min(cubic, ceiling), MIN_RATE)


_paces: dict[str, Pace] = {}


@reset_after_fork
def forget() -> None:
    """Forget every source's pace: in a forked child (the parent's go on
    there), and in a process that points the same bucket name at another
    store (tests)."""
    _paces.clear()


def pace(source: str) -> Pace:
    """The pace of ``source`` (``kind://bucket``) in this process."""
    found = _paces.get(source)
    if found is None:
        found = _paces[source] = Pace()
    return found


def send_now(source: str) -> bool:
    """Whether a request to ``source`` may go at once, taking its token if so
    (no request waits before it); else it must wait in :func:`send`. The
    common, unthrottled case, decided without a coroutine step."""
    found = pace(source)
    return not found.queue and found.take() == 0.0


async def send(source: str) -> float:
    """Wait for ``source``'s pace to let a request go, in the order they
    asked; returns when it goes (monotonic seconds), which is when its time
    to first byte starts."""
    import asyncio

    if send_now(source):
        return time.monotonic()
    found = pace(source)
    ready = asyncio.get_running_loop().create_future()
    found.queue.append(ready)
    if found.task is None:
        found.task = asyncio.ensure_future(_dispatch(found))
    await ready
    return time.monotonic()


async def _dispatch(found: Pace) -> None:
    """Let the waiting requests of one pace go, one token each, first come first."""
    import asyncio

    try:
        while found.queue:
            if found.queue[0].done():  # its request was cancelled while waiting
                found.queue.popleft()
                continue
            delay = found.take()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            found.queue.popleft().set_result(None)
    finally:
        found.task = None
