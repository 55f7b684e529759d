"""Read throughput of a source: direct, through a cold cache, from a warm cache,
and through the DataLoader, across worker counts, with a recommendation.

``driver`` runs the measurements (:func:`run`), one small class per mode in
``modes``; ``options`` checks what ``run`` is given; ``measure`` times reader
threads; ``scratch`` holds the private caches; ``stats`` samples the files and
turns runs into advice; ``pagecache`` asks the kernel how much of the sample
is in memory; ``report`` holds the result types and builds the JSON;
``loader`` (torch, imported lazily) measures the DataLoader path; ``plot``
draws the chart. This package only re-exports.
"""

from .driver import run
from .options import DEFAULT_MODES, DEFAULT_WORKERS, check_modes, check_options, check_workers
from .plot import plot
from .report import FORMAT, BenchReport, Recommendation, RunResult
from .stats import (
    ALL,
    DEFAULT_SAMPLE_BYTES,
    DEFAULT_SAMPLE_FILES,
    MODES,
    NOISY_SECONDS,
    WITHIN,
    recommend,
    sample,
    spread_sample,
)

__all__ = [
    "ALL",
    "DEFAULT_MODES",
    "DEFAULT_SAMPLE_BYTES",
    "DEFAULT_SAMPLE_FILES",
    "DEFAULT_WORKERS",
    "FORMAT",
    "MODES",
    "NOISY_SECONDS",
    "WITHIN",
    "BenchReport",
    "Recommendation",
    "RunResult",
    "check_modes",
    "check_options",
    "check_workers",
    "plot",
    "recommend",
    "run",
    "sample",
    "spread_sample",
]
