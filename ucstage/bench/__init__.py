"""Read throughput of a source: direct, through a cold cache, from a warm cache,
and through the DataLoader, across worker counts, with a recommendation.

:mod:`.driver` runs the measurements (:func:`run`), one small class per mode in
:mod:`.modes`; :mod:`.settings` checks what ``run`` is given; :mod:`.measure`
times reader threads; :mod:`.scratch` holds the private caches;
:mod:`.sampling` samples the files and turns runs into advice;
:mod:`.pagecache` asks the kernel how much of the sample is in memory;
:mod:`.report` holds the result types and builds the JSON; :mod:`.loadermode`
(torch, imported lazily) measures the DataLoader path; :mod:`.plot` draws the
chart. This package re-exports what the CLI and users
(docs/bench.md) import.
"""

from .driver import run
from .plot import plot
from .report import BenchReport, Recommendation
from .sampling import ALL, DEFAULT_SAMPLE_BYTES, DEFAULT_SAMPLE_FILES, NOISY_SECONDS, WITHIN
from .settings import check_modes, check_options

__all__ = [
    "ALL",
    "DEFAULT_SAMPLE_BYTES",
    "DEFAULT_SAMPLE_FILES",
    "NOISY_SECONDS",
    "WITHIN",
    "BenchReport",
    "Recommendation",
    "check_modes",
    "check_options",
    "plot",
    "run",
]
