"""What a bench measured: one :class:`RunResult` per (mode, workers), the
:class:`Recommendation` drawn from them, and the :class:`BenchReport` that
holds both and builds the JSON document.

Plain data in a module of its own, so the driver, the advice and the chart
all import it and none of them imports another for its types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["FORMAT", "FORMAT_VERSION", "PAGE_CACHED", "BenchReport", "Recommendation", "RunResult"]

FORMAT = "ucstage.bench"
FORMAT_VERSION = 1

PAGE_CACHED = 0.5
"""A run whose files had at least this share of their bytes in the OS page
cache before it started measured memory, not the source."""


@dataclass(frozen=True)
class RunResult:
    """One (mode, workers) measurement."""

    mode: str
    workers: int
    files: int
    """Files read completely (a run cut short by ``max_seconds`` reads fewer)."""
    bytes: int
    """Bytes of those files."""
    seconds: float
    files_per_s: float
    mb_per_s: float
    """Throughput in MB/s (10^6 bytes per second)."""
    p50_ms: float
    p95_ms: float
    p99_ms: float
    complete: bool
    """False when the time budget stopped the run before every file was read."""
    page_cache: float | None = None
    """Share (0..1) of the run's bytes that were in the OS page cache when it
    started; None for runs that do not read a local or mounted source, or
    when the kernel cannot tell."""

    def to_json(self) -> dict[str, Any]:
        """One row of the document's ``results`` (docs/bench.md#json)."""
        data = asdict(self)
        for key in ("seconds", "files_per_s", "mb_per_s", "p50_ms", "p95_ms", "p99_ms",
                    "page_cache"):
            if data[key] is not None:
                data[key] = round(float(data[key]), 3)
        return data

    @property
    def page_cached(self) -> bool:
        """Most of what this run read came from memory, not from the source."""
        return self.page_cache is not None and self.page_cache >= PAGE_CACHED


@dataclass(frozen=True)
class Recommendation:
    """What the measurements say to do."""

    workers: int | None
    """The smallest worker count within 10% of the best MB/s in ``mode``."""
    mode: str | None
    """The mode the recommendation is for: loader, else cold, else direct, else warm."""
    best_workers: int | None
    best_mb_per_s: float | None
    by_mode: dict[str, int]
    """The same rule applied to each measured mode."""
    warm_vs_direct: float | None
    """Best warm MB/s / best direct MB/s; None unless both were measured."""
    cold_vs_direct: float | None
    """Best cold MB/s / best direct MB/s: the price (or gain) of filling the cache."""
    bottleneck: str | None
    """"volume" when a warm cache reads at least 1.5x faster than the volume,
    "local" when it does not (the volume keeps up; look at the loader or the
    model), None when warm or direct was not measured, every direct run took
    under NOISY_SECONDS (too short to tell), or the best direct run read from
    the OS page cache (it measured memory)."""
    caching: str | None = None
    """What the cache does for this source: "helps" (the volume is the
    bottleneck and the cold cache is no slower than direct reads),
    "later_epochs" (the volume is the bottleneck but the cold cache is slower:
    the first epoch pays for the copy), "no_help" (a warm cache is not 1.5x
    faster, or the cold cache is slower and no warm run says otherwise), or
    None when too little was measured."""
    direct_page_cache: bool = False
    """The best direct run read files that were mostly in the OS page cache."""


@dataclass(frozen=True)
class BenchReport:
    """Everything :func:`ucstage.bench.run` measured."""

    source: str
    sample_files: int
    sample_bytes: int
    listed_files: int
    listed_bytes: int
    sampled_by: str
    """"default", "files", "bytes" or "all": how the sample was chosen."""
    seed: int
    modes: list[str]
    workers: list[int]
    results: list[RunResult]
    recommendation: Recommendation
    max_seconds: float | None
    seconds: float
    stopped_early: bool
    """True when ``max_seconds`` cut a run short or skipped one."""
    batch_size: int | None = None
    notes: list[str] = field(default_factory=list)
    engine: str = "fsspec"
    """The engine that read the source (``obstore`` or ``fsspec``)."""
    local_disk: str = ""
    """The filesystem type when the source is a folder on a local disk (the
    cache's comparisons with direct reads then mean nothing); '' otherwise."""

    def result(self, mode: str, workers: int) -> RunResult | None:
        """The run of ``mode`` at ``workers``, or None when it did not run."""
        for r in self.results:
            if r.mode == mode and r.workers == workers:
                return r
        return None

    def to_json(self, plot: str | None = None) -> dict[str, Any]:
        """The stable JSON document (docs/bench.md#json); the CLI prints it as is.

        Args:
            plot: the chart's path, when one was drawn (the ``plot`` key is
                only present then).
        """
        rec = self.recommendation
        doc: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "sample": {
                "files": self.sample_files,
                "bytes": self.sample_bytes,
                "listed_files": self.listed_files,
                "listed_bytes": self.listed_bytes,
                "by": self.sampled_by,
                "seed": self.seed,
            },
            "modes": self.modes,
            "workers": self.workers,
            "batch_size": self.batch_size,
            "max_seconds": self.max_seconds,
            "seconds": round(self.seconds, 3),
            "stopped_early": self.stopped_early,
            "engine": self.engine,
            "results": [r.to_json() for r in self.results],
            "recommended_workers": rec.workers,
            "recommended_mode": rec.mode,
            "recommended_by_mode": rec.by_mode,
            "best": {"workers": rec.best_workers, "mb_per_s": _round(rec.best_mb_per_s)},
            "speedup_warm_vs_direct": _round(rec.warm_vs_direct),
            "speedup_cold_vs_direct": _round(rec.cold_vs_direct),
            "bottleneck": rec.bottleneck,
            "caching": rec.caching,
            "notes": self.notes,
        }
        if plot is not None:
            doc["plot"] = plot
        return doc


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
