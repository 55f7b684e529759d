"""The engines: everything that moves a source's bytes to this process.

One package, because every byte between a source and a local descriptor
passes through the same interface (:class:`ucstage.engines.engine.Engine`:
walk, ranges, keep-clean and the whole-file copy), and the pieces that serve
it (object GETs, their pace, their checks, Azure's checked ranges, a Parquet
chunk's page CRCs, the mount table, the obstore clients) keep process-global
state that a forked child must drop. Kept together, one fork hook here
(:func:`reset_after_fork`) resets them all, and the cache is a caller: this
package imports nothing from :mod:`ucstage.cache` (what the cache lends a
copy, such as where it keeps its MD5 evidence, is passed in as a value:
:class:`ucstage.engines.context.FetchContext`). It sits in the core's layer
(tests/test_layout.py): the volumes read through it, the cache, the tables
and the data side call it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__: list[str] = []

_RESETS: list[Callable[[], None]] = []


def reset_after_fork(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn`` in every child forked from this process, before anything
    else of the child does: a module of this package forgets its
    process-global state (loops, clients, locks another thread held) with it.
    In the order the modules registered, as ``os.register_at_fork`` would."""
    _RESETS.append(fn)
    return fn


def _after_fork_in_child() -> None:
    for fn in _RESETS:
        fn()


os.register_at_fork(after_in_child=_after_fork_in_child)
