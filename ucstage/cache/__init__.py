"""The local cache: a private, path-mirrored copy of source files on local disk.

``local`` holds :class:`LocalCache` (lookup and the validity rule), ``fetch``
the fetch protocol (copying one entry once), ``warm`` copying many at once,
``space`` the on-disk state (:class:`CacheSpace`: ``namespaces``, the byte
``ledger``, the tree ``walk``, the ``stamps`` memo, eviction) it shares with
``maintenance`` (status, verify, clear, prune), ``reports`` what they return,
``inflight`` how a job stops its copies (:class:`Inflight`); ``leases``,
``policy`` and ``runstats`` how a dataset's reader holds its files, the
eviction order and a run's counters (:class:`RunStats`); ``paths``, ``copy``
and ``locks`` are the pieces below. See docs/cache.md and docs/design.md.
"""

from .inflight import Inflight, Stopped
from .local import MAX_BYTES_ENV, LocalCache, rank_entries
from .paths import CACHE_DIR_ENV
from .reports import (
    CacheStatus,
    ClearReport,
    EvictedSource,
    NamespaceStatus,
    PruneReport,
    RankSlice,
    SourceCheck,
    VerifyReport,
    WarmReport,
)
from .runstats import RunStats
from .space import CacheSpace

__all__ = [
    "CACHE_DIR_ENV",
    "MAX_BYTES_ENV",
    "CacheSpace",
    "CacheStatus",
    "ClearReport",
    "EvictedSource",
    "Inflight",
    "LocalCache",
    "NamespaceStatus",
    "PruneReport",
    "RankSlice",
    "RunStats",
    "SourceCheck",
    "Stopped",
    "VerifyReport",
    "WarmReport",
    "rank_entries",
]
