"""The pure half of ``ucstage bench``: which files to read, what the timings say.

Sampling, percentiles and the worker-count advice are plain functions of
their inputs (no threads, no I/O), so they can be tested on hand-made numbers.
Re-exported from :mod:`ucstage.bench.driver`; import them from there.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidArgument
from ..volumes import FileEntry

__all__ = [
    "MODES",
    "NOISY_SECONDS",
    "WITHIN",
    "Recommendation",
    "RunResult",
    "percentile",
    "recommend",
    "sample",
]

MODES = ("direct", "cold", "warm", "loader")
"""Every mode, in the order :func:`ucstage.bench.driver` measures them (warm needs cold's cache)."""

WITHIN = 0.10
"""A worker count is "as good as the best" when its MB/s is within this fraction."""
NOISY_SECONDS = 0.5


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

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("seconds", "files_per_s", "mb_per_s", "p50_ms", "p95_ms", "p99_ms"):
            data[key] = round(float(data[key]), 3)
        return data


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
    model), None when warm or direct was not measured or every direct run took
    under NOISY_SECONDS (too short to tell)."""


# ---------------------------------------------------------------- sampling


def _rank_key(seed: int, path: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{path}".encode()).digest()


def sample(
    entries: Sequence[FileEntry],
    *,
    files: int | None = None,
    max_bytes: int | None = None,
    seed: int = 0,
) -> list[FileEntry]:
    """A deterministic sample of a listing, returned in listing order.

    Files are ranked by a hash of ``(seed, path)``, so the same listing and
    seed always give the same sample, on any machine and Python version, and
    adding files to the volume does not reshuffle the ones already chosen.

    Args:
        files: take this many files.
        max_bytes: take files, in rank order, until their sizes reach this many bytes
            (at least one file).
        seed: changes which files are chosen.
    """
    if files is not None and max_bytes is not None:
        raise InvalidArgument("give --files or --sample-bytes, not both")
    if files is not None and files < 1:
        raise InvalidArgument(f"--files must be at least 1, got {files}")
    if max_bytes is not None and max_bytes < 1:
        raise InvalidArgument(f"--sample-bytes must be at least 1 byte, got {max_bytes}")
    if files is None and max_bytes is None:
        return list(entries)
    position = {e.path: i for i, e in enumerate(entries)}
    ranked = sorted(entries, key=lambda e: _rank_key(seed, e.path))
    if files is not None:
        chosen = ranked[:files]
    else:
        chosen, total = [], 0
        for entry in ranked:
            if chosen and total >= (max_bytes or 0):
                break
            chosen.append(entry)
            total += entry.size
    return sorted(chosen, key=lambda e: position[e.path])


# ---------------------------------------------------------------- statistics


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of sorted values."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


# ---------------------------------------------------------------- advice


def _smallest_within(results: Sequence[RunResult]) -> tuple[int, int, float] | None:
    """(recommended workers, best workers, best MB/s) for one mode's runs."""
    measured = [r for r in results if r.files > 0]
    if not measured:
        return None
    best = max(measured, key=lambda r: r.mb_per_s)
    good = [r for r in measured if r.mb_per_s >= (1 - WITHIN) * best.mb_per_s]
    return min(r.workers for r in good), best.workers, best.mb_per_s


def recommend(results: Sequence[RunResult]) -> Recommendation:
    """The smallest worker count within 10% of the best MB/s, per mode and overall.

    The overall recommendation is for the mode training will depend on most:
    the loader when it was measured, else the cold cache (the first epoch),
    else direct reads, else the warm cache.
    """
    by_mode: dict[str, int] = {}
    best: dict[str, tuple[int, int, float]] = {}
    for name in MODES:
        found = _smallest_within([r for r in results if r.mode == name])
        if found:
            by_mode[name] = found[0]
            best[name] = found
    mode = next((m for m in ("loader", "cold", "direct", "warm") if m in best), None)

    def ratio(a: str, b: str) -> float | None:
        if a in best and b in best and best[b][2] > 0:
            return best[a][2] / best[b][2]
        return None

    warm_direct = ratio("warm", "direct")
    # Direct runs shorter than NOISY_SECONDS mean the sample is too small to
    # tell the volume from local disk: a ratio of two timer blips is no verdict.
    timed = any(r.seconds >= NOISY_SECONDS for r in results if r.mode == "direct")
    bottleneck = (None if warm_direct is None or not timed
                  else "volume" if warm_direct >= 1.5 else "local")
    return Recommendation(
        workers=by_mode.get(mode) if mode else None, mode=mode,
        best_workers=best[mode][1] if mode else None,
        best_mb_per_s=best[mode][2] if mode else None, by_mode=by_mode,
        warm_vs_direct=warm_direct, cold_vs_direct=ratio("cold", "direct"),
        bottleneck=bottleneck,
    )
