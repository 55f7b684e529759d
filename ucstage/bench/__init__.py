"""Read throughput of a source: direct, through a cold cache, from a warm cache,
and through the DataLoader, across worker counts, with a recommendation.

``driver`` runs the measurements, ``measure`` times reader threads, ``stats``
samples the files and turns runs into advice, ``loader`` (torch, imported
lazily) measures the DataLoader path, ``plot`` draws the chart.
"""

from .driver import (
    FORMAT,
    MODES,
    NOISY_SECONDS,
    WITHIN,
    BenchReport,
    Progress,
    Recommendation,
    RunResult,
    parse_modes,
    parse_workers,
    plot,
    recommend,
    run,
    sample,
)

__all__ = [
    "FORMAT",
    "MODES",
    "NOISY_SECONDS",
    "WITHIN",
    "BenchReport",
    "Progress",
    "Recommendation",
    "RunResult",
    "parse_modes",
    "parse_workers",
    "plot",
    "recommend",
    "run",
    "sample",
]
