"""The pure half of ``ucstage bench``: which files to read, what the timings say.

Sampling, a run's rates and percentiles, and the worker-count advice are
plain functions of their inputs (no threads, no I/O), so they can be tested
on hand-made numbers. Percentiles are :func:`ucstage.percentile.percentile`,
the one definition the DataLoader's metrics use too.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from ..errors import InvalidArgument
from ..percentile import percentile
from ..volumes import FileEntry
from .report import PAGE_CACHED, Recommendation, RunResult

__all__ = [
    "ALL",
    "DEFAULT_SAMPLE_BYTES",
    "DEFAULT_SAMPLE_FILES",
    "MODES",
    "NOISY_SECONDS",
    "PAGE_CACHED",
    "WITHIN",
    "check_sample_size",
    "recommend",
    "run_result",
    "sample",
    "spread_sample",
]

MODES = ("direct", "cold", "warm", "loader")
"""Every mode, in the order :func:`ucstage.bench.run` measures them (warm needs cold's cache)."""

WITHIN = 0.10
"""A worker count is "as good as the best" when its MB/s is within this fraction."""
NOISY_SECONDS = 0.5
"""Runs shorter than this are too short for their rates to mean much."""
DEFAULT_SAMPLE_FILES = 500
DEFAULT_SAMPLE_BYTES = 2 * 1024**3
"""The default sample: at most this many files and bytes, whichever bound is hit first."""
ALL = "all"
"""``files=ALL``: bench every listed file."""


# ---------------------------------------------------------------- sampling


def _rank_key(seed: int, path: str) -> bytes:
    return hashlib.sha256(f"{seed}\0{path}".encode()).digest()


def check_sample_size(files: int | str | None, size: int | None, size_name: str) -> None:
    """Refuse a sample of no files, or one bounded by count and size at once.

    ``files`` is a count or :data:`ALL`. ``size_name`` is the caller's name for
    the byte bound (``max_bytes`` here, ``sample_bytes`` in
    :func:`ucstage.bench.run`), so the message names the parameter the caller
    was given.
    """
    if files is not None and size is not None:
        raise InvalidArgument(f"give `files` or {size_name}, not both")
    if isinstance(files, (str, bool)):
        if files != ALL:
            raise InvalidArgument(f"files must be a number of files or {ALL!r}, got {files!r}")
    elif files is not None and files < 1:
        raise InvalidArgument(f"files must be at least 1, got {files}")
    if size is not None and size < 1:
        raise InvalidArgument(f"{size_name} must be at least 1 byte, got {size}")


def sample(
    entries: Sequence[FileEntry],
    *,
    files: int | str | None = None,
    max_bytes: int | None = None,
    seed: int = 0,
) -> list[FileEntry]:
    """A deterministic sample of a listing, returned in listing order.

    With ``files`` or ``max_bytes``, files are ranked by a hash of ``(seed,
    path)``, so the same listing and seed always give the same sample, on any
    machine and Python version, and adding files to the volume does not
    reshuffle the ones already chosen. With neither, the default sample is
    :func:`spread_sample`'s.

    Args:
        files: take this many files; :data:`ALL` takes every file.
        max_bytes: take files, in rank order, until their sizes reach this many bytes
            (at least one file).
        seed: changes which files are chosen.
    """
    check_sample_size(files, max_bytes, "max_bytes")
    if files == ALL:
        return list(entries)
    if files is None and max_bytes is None:
        return spread_sample(entries, seed=seed)
    position = {e.path: i for i, e in enumerate(entries)}
    ranked = sorted(entries, key=lambda e: _rank_key(seed, e.path))
    if isinstance(files, int):
        chosen = ranked[:files]
    else:
        chosen, total = [], 0
        for entry in ranked:
            if chosen and total >= (max_bytes or 0):
                break
            chosen.append(entry)
            total += entry.size
    return sorted(chosen, key=lambda e: position[e.path])


def spread_sample(
    entries: Sequence[FileEntry],
    *,
    max_files: int = DEFAULT_SAMPLE_FILES,
    max_bytes: int = DEFAULT_SAMPLE_BYTES,
    seed: int = 0,
) -> list[FileEntry]:
    """Every k-th file from a seeded offset: at most ``max_files`` files and
    ``max_bytes`` bytes (one file even if it is bigger), in listing order.

    A fixed stride covers the whole listing evenly, every folder in
    proportion, where the first files would be one folder. When the files
    exceed ``max_bytes``, the stride widens (fewer files, still spread over
    the whole listing) until they fit.
    """
    n = len(entries)
    if n == 0:
        return []
    # Where in its stride each pick falls: the same for every pick, so the
    # spacing stays even; random.Random with a str seed is stable everywhere.
    offset = random.Random(f"ucstage-bench:{seed}").random()
    count = min(n, max_files)
    while True:
        stride = n / count
        chosen = [entries[int((offset + i) * stride)] for i in range(count)]
        total = sum(e.size for e in chosen)
        if total <= max_bytes or count == 1:
            return chosen
        count = max(1, min(count - 1, int(count * max_bytes / total)))


# ---------------------------------------------------------------- statistics


def run_result(mode: str, workers: int, files: int, nbytes: int, latencies: Sequence[float],
               seconds: float, complete: bool, page_cache: float | None = None) -> RunResult:
    """One run's rates and latency percentiles (ms) from what it counted."""
    lat = sorted(v * 1000.0 for v in latencies)
    # A run that read nothing in no time must not divide by zero.
    secs = max(seconds, 1e-9)
    return RunResult(
        mode=mode, workers=workers, files=files, bytes=nbytes, seconds=seconds,
        files_per_s=files / secs, mb_per_s=nbytes / 1e6 / secs,
        p50_ms=percentile(lat, 50), p95_ms=percentile(lat, 95), p99_ms=percentile(lat, 99),
        complete=complete, page_cache=page_cache,
    )


# ---------------------------------------------------------------- advice


def _best(results: Sequence[RunResult]) -> RunResult | None:
    measured = [r for r in results if r.files > 0]
    return max(measured, key=lambda r: r.mb_per_s) if measured else None


def _smallest_within(results: Sequence[RunResult]) -> tuple[int, int, float] | None:
    """(recommended workers, best workers, best MB/s) for one mode's runs."""
    best = _best(results)
    if best is None:
        return None
    good = [r for r in results if r.files > 0 and r.mb_per_s >= (1 - WITHIN) * best.mb_per_s]
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

    warm_direct, cold_direct = ratio("warm", "direct"), ratio("cold", "direct")
    # Direct runs shorter than NOISY_SECONDS mean the sample is too small to
    # tell the volume from local disk: a ratio of two timer blips is no verdict.
    timed = any(r.seconds >= NOISY_SECONDS for r in results if r.mode == "direct")
    # Nor is a direct rate read from memory: it says nothing about the volume.
    best_direct = _best([r for r in results if r.mode == "direct"])
    in_memory = best_direct is not None and best_direct.page_cached
    bottleneck = (None if warm_direct is None or not timed or in_memory
                  else "volume" if warm_direct >= 1.5 else "local")
    return Recommendation(
        workers=by_mode.get(mode) if mode else None, mode=mode,
        best_workers=best[mode][1] if mode else None,
        best_mb_per_s=best[mode][2] if mode else None, by_mode=by_mode,
        warm_vs_direct=warm_direct, cold_vs_direct=cold_direct,
        bottleneck=bottleneck, caching=_caching(bottleneck, cold_direct, in_memory),
        direct_page_cache=in_memory,
    )


def _caching(bottleneck: str | None, cold_direct: float | None, in_memory: bool) -> str | None:
    """What caching does for this source (see :attr:`Recommendation.caching`)."""
    if bottleneck == "volume":
        return "later_epochs" if cold_direct is not None and cold_direct < 1 else "helps"
    if bottleneck == "local":
        return "no_help"
    if cold_direct is not None and cold_direct < 1 and not in_memory:
        return "no_help"  # the first epoch is slower, and nothing says later ones gain
    return None
