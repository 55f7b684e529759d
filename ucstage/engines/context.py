"""What one copy is given beside its path, and what it gives back.

A copy reads its source with one value (:class:`FetchContext`): the caller's
request settings (:class:`Requests`), the listed size and version, what may
stop it (any :class:`Stoppable`, such as the cache's
:class:`~ucstage.cache.inflight.Inflight`) and where the caller keeps its MD5
evidence (:data:`ucstage.engines.checks.Evidence`). Everything the cache lends
a copy comes in here as a value, so the engines import nothing from the cache.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from ..errors import InvalidArgument
from .checks import Evidence
from .objstore import deadline

__all__ = ["HEDGE_ENV", "Copied", "FetchContext", "Requests", "Stoppable", "Stopped", "enabled"]

HEDGE_ENV = "UCSTAGE_HEDGE"


class Stopped(Exception):
    """Raised inside a copy's thread once the warm stops: the copy must not go on."""


class Stoppable(Protocol):
    """What stops a copy (a warm's or a read-ahead's
    :class:`~ucstage.cache.inflight.Inflight`), as a copy sees it."""

    @property
    def stopped(self) -> bool:
        """Whether the job stopped."""

    def check(self) -> None:
        """Raise :exc:`Stopped` once the job has stopped."""

    def watch(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` when the job stops; returns what unregisters it."""


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


class FetchContext(NamedTuple):
    """What one copy reads its source with beyond the path: one value down the
    copy path (:meth:`ucstage.engines.engine.Engine.copy`,
    :func:`ucstage.engines.engine.copy_ranges`, :func:`ucstage.engines.objget.get_into`)."""

    evidence: Evidence | None = None
    """Where the caller keeps what the checks learnt of a source (which
    sources serve MD5 ETags: :func:`ucstage.engines.checks.judge`); None: kept
    in this process only."""
    requests: Requests | None = None
    """The cache's hedging and per-request deadline (None: the environment's)."""
    size: int = 0
    """The listed size: one GET or ranged GETs."""
    listed: str = ""
    """The listed version (a GCS or Azure one carries the store's checksum:
    :func:`ucstage.engines.checks.listed_expect`)."""
    inflight: Stoppable | None = None
    """The job that may stop the copy (a warm, a read-ahead), or None."""
    read_size: int = 0
    """Bytes per read of a local-like source (0: ``engine.READ_CHUNK``). A
    small one bounds how long a stop waits on a slow mount (see
    :func:`ucstage.engines.engine.pump`)."""

    @property
    def deadline(self) -> float | None:
        """Seconds per request (None: the environment's)."""
        return None if self.requests is None else self.requests.deadline


class Copied(NamedTuple):
    """What was actually copied, to stamp the cache entry with."""

    size: int
    version: str
    """The version observed while copying ('' when the source gave none)."""
    mtime_ns: int | None
