"""The local cache: a private, path-mirrored copy of source files on local disk.

``local`` holds :class:`LocalCache` (settings, find, maintenance),
``fetch`` the cache bound to one volume (:class:`~ucstage.cache.fetch.Bound`:
lookup, the validity rule, fetch), the fetch protocol, its thread and loop
drivers (a warm's too) and the copy, ``warm`` what the CLI's cache commands
call on a SOURCE (a warm of some ranks, verify, status), ``space``
the on-disk state (:class:`CacheSpace`) and its byte ledger,
``policy`` the eviction order and its one sink, ``leases`` a dataset
reader's holds, ``inflight`` how a job stops its copies (:class:`Inflight`),
``runstats`` a run's counters (:class:`RunStats`), ``reports`` what the
operations return, ``tuning`` the copies in flight, and ``paths`` the
names and the entry locks below. What each does and why is in
docs/cache.md and docs/design.md (section 6).
"""

# What other packages and users import (docs/cache.md); the rest is imported from its module.
from .inflight import Inflight
from .local import LocalCache
from .runstats import RunStats
from .space import CacheSpace

__all__ = ["CacheSpace", "Inflight", "LocalCache", "RunStats"]
