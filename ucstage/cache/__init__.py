"""The local cache: a private, path-mirrored copy of source files on local disk.

``local`` holds :class:`LocalCache` (lookup and the validity rule), ``fetch``
the fetch protocol (copying one entry once), ``warm`` copying many at once,
``space`` the on-disk state (:class:`CacheSpace`: ``namespaces``, the byte
``ledger``, the tree ``walk``, the ``stamps`` memo, eviction) it shares with
``maintenance`` (status, verify, clear, prune), ``reports`` what they return,
``inflight`` how a job stops its copies (:class:`Inflight`); ``share`` which
ranks' files a warm covers (a node's share) and ``sources`` the cache seen from
a SOURCE (verifying one or all, a lazy job's environment); ``leases``,
``policy`` and ``runstats`` how a dataset's reader holds its files, the
eviction order and a run's counters (:class:`RunStats`); ``paths``, ``copy``
and ``locks`` are the pieces below. See docs/cache.md and docs/design.md.
"""

# What other packages and users import (docs/cache.md); the rest is imported from its module.
from .inflight import Inflight
from .local import LocalCache
from .runstats import RunStats
from .space import CacheSpace

__all__ = ["CacheSpace", "Inflight", "LocalCache", "RunStats"]
