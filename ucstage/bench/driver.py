"""Read-throughput measurement: direct from the volume, through a cold cache,
through a warm cache, and through the PyTorch loader, across worker counts.

A *worker* here is a reader thread that takes the next file of the sample and
reads every byte of it with a large buffer, as a DataLoader worker does. Each
(mode, workers) run reports files/s, MB/s (10^6 bytes) and per-file latency
percentiles, and :func:`recommend` turns the runs into advice: the smallest
worker count within 10% of the best, and how much a warm cache beats the
volume.

The cold and warm modes use a private cache under a fresh temporary folder,
never the user's cache: each cold run starts from an empty cache, the warm
runs reuse the last one. The folder is removed when :func:`run` returns or
raises, including on ``KeyboardInterrupt``.

The library never prints: progress goes to a callback that defaults to a
no-op, and results come back as dataclasses. ``ucstage bench`` renders them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument, MissingDependency
from ..manifest import Manifest
from ..volumes import FileEntry, Volume
from .measure import BUFFER_BYTES as BUFFER_BYTES
from .measure import Reader, Tally, measure, raise_read_error
from .plot import plot
from .stats import (
    MODES,
    NOISY_SECONDS,
    Recommendation,
    RunResult,
    percentile,
    recommend,
    sample,
)
from .stats import WITHIN as WITHIN

__all__ = [
    "FORMAT",
    "MODES",
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

FORMAT = "ucstage.bench"
FORMAT_VERSION = 1

DEFAULT_WORKERS = (1, 2, 4, 6, 8)


@dataclass(frozen=True)
class BenchReport:
    """Everything :func:`run` measured."""

    source: str
    sample_files: int
    sample_bytes: int
    listed_files: int
    listed_bytes: int
    sampled_by: str
    """"all", "files" or "bytes": how the sample was chosen."""
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

    def result(self, mode: str, workers: int) -> RunResult | None:
        for r in self.results:
            if r.mode == mode and r.workers == workers:
                return r
        return None

    def to_json(self) -> dict[str, Any]:
        """The stable JSON document (docs/bench.md#json)."""
        rec = self.recommendation
        return {
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
            "results": [r.to_json() for r in self.results],
            "recommended_workers": rec.workers,
            "recommended_mode": rec.mode,
            "recommended_by_mode": rec.by_mode,
            "best": {"workers": rec.best_workers,
                     "mb_per_s": None if rec.best_mb_per_s is None
                     else round(rec.best_mb_per_s, 3)},
            "speedup_warm_vs_direct": _round(rec.warm_vs_direct),
            "speedup_cold_vs_direct": _round(rec.cold_vs_direct),
            "bottleneck": rec.bottleneck,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class Progress:
    """Passed to the progress callback about ten times a second, from the calling thread."""

    mode: str
    workers: int
    phase: str
    """"run" while measuring; "prepare" while filling the warm cache untimed."""
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int
    run_index: int
    """0-based index of this run among all planned runs."""
    runs_total: int


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _noop(_: Progress) -> None:
    return None


# ---------------------------------------------------------------- parsing


def parse_workers(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: positive integers, deduplicated, ascending."""
    raw = text.split(",") if isinstance(text, str) else list(text)
    values: list[int] = []
    for item in raw:
        token = str(item).strip()
        try:
            value = int(token)
        except ValueError:
            value = 0
        if value < 1 or str(value) != token.lstrip("+"):
            raise InvalidArgument(
                f"--workers must be positive whole numbers separated by commas, e.g. 1,2,4,8; "
                f"got {token!r}")
        values.append(value)
    if not values:
        raise InvalidArgument("--workers is empty; give e.g. 1,2,4,8")
    return sorted(set(values))


def parse_modes(text: str | Sequence[str]) -> list[str]:
    """``"warm,direct"`` -> ``["direct", "warm"]``, in measuring order."""
    raw = text.split(",") if isinstance(text, str) else list(text)
    wanted = {m.strip().lower() for m in raw if m.strip()}
    unknown = sorted(wanted - set(MODES))
    if unknown:
        raise InvalidArgument(
            f"unknown mode {unknown[0]!r} in --modes; choose from {', '.join(MODES)}")
    if not wanted:
        raise InvalidArgument(f"--modes is empty; choose from {', '.join(MODES)}")
    return [m for m in MODES if m in wanted]


# ---------------------------------------------------------------- measuring


def _result(mode: str, workers: int, tally: Tally, seconds: float, complete: bool) -> RunResult:
    lat = sorted(v * 1000.0 for v in tally.latencies)
    secs = max(seconds, 1e-9)
    return RunResult(
        mode=mode, workers=workers, files=tally.files, bytes=tally.bytes, seconds=seconds,
        files_per_s=tally.files / secs, mb_per_s=tally.bytes / 1e6 / secs,
        p50_ms=percentile(lat, 0.50), p95_ms=percentile(lat, 0.95),
        p99_ms=percentile(lat, 0.99), complete=complete,
    )


def _new_cache(root: str) -> Any:
    from ..cache.local import LocalCache

    return LocalCache(root)


def _check_space(scratch: str, needed: int) -> None:
    free = shutil.disk_usage(scratch).free
    if needed > free * 0.9:
        from ..units import format_bytes

        raise InvalidArgument(
            f"the cold and warm modes copy the sample ({format_bytes(needed)}) into {scratch}, "
            f"which has {format_bytes(free)} free",
            hint="bench a smaller sample with --files N or --sample-bytes SIZE, "
                 "or point --scratch-dir at a bigger disk")


def _loader_run(
    manifest: Manifest, entries: Sequence[FileEntry], workers: int, batch_size: int,
    cache_root: str, deadline: float | None, report: Callable[[int, int], None],
) -> RunResult:
    """The VolumeDataset + DataLoader path end to end, through a fresh private cache."""
    try:
        from .loader import loader_run
    except MissingDependency:
        raise
    except ImportError as exc:
        raise MissingDependency("--loader needs torch",
                                hint="pip install 'ucstage[torch]' "
                                     "(on a CPU machine: pip install torch==2.13.0)") from exc
    files, nbytes, latencies, seconds, complete = loader_run(
        manifest, entries, workers, batch_size, cache_root, deadline, report)
    tally = Tally(files=files, bytes=nbytes, latencies=latencies)
    return _result("loader", workers, tally, seconds, complete)


def run(
    manifest: Manifest,
    *,
    files: int | None = None,
    sample_bytes: int | None = None,
    seed: int = 0,
    workers: Sequence[int] = DEFAULT_WORKERS,
    modes: Sequence[str] = ("direct", "cold", "warm"),
    batch_size: int = 32,
    max_seconds: float | None = None,
    scratch_dir: str | None = None,
    progress: Callable[[Progress], None] = _noop,
) -> BenchReport:
    """Measure read throughput for every mode and worker count.

    Args:
        manifest: the listing to sample (from :func:`ucstage.snapshot`).
        files, sample_bytes, seed: see :func:`sample`; neither means every file.
        workers: reader thread counts (DataLoader ``num_workers`` in loader mode).
        modes: any of ``direct``, ``cold``, ``warm``, ``loader``; always measured
            in that order, because warm reuses the last cold run's cache.
        batch_size: DataLoader batch size in loader mode.
        max_seconds: bound on the whole run. Each remaining run gets an equal
            share of the remaining time, so every mode and worker count is
            measured on part of the sample rather than some not at all; runs
            cut short are marked ``complete=False``.
        scratch_dir: where the private cache folder is made (default: the
            system temp folder, the node's local disk on the platform).
        progress: called with a :class:`Progress` about ten times a second.

    Raises:
        InvalidArgument: bad workers, modes or sample options; not enough
            scratch space for the cold cache.
        FetchFailed: a file could not be read.
    """
    started = time.monotonic()
    deadline = None if max_seconds is None else started + max_seconds
    if max_seconds is not None and max_seconds <= 0:
        raise InvalidArgument(f"--max-seconds must be positive, got {max_seconds}")
    worker_counts = parse_workers(workers)
    mode_list = parse_modes(modes)
    if batch_size < 1:
        raise InvalidArgument(f"--batch-size must be at least 1, got {batch_size}")
    chosen = sample(manifest.entries, files=files, max_bytes=sample_bytes, seed=seed)
    total_bytes = sum(e.size for e in chosen)
    volume = manifest.volume()
    sampled_by = "files" if files is not None else "bytes" if sample_bytes is not None else "all"

    runs = [(m, k) for m in mode_list for k in worker_counts]
    results: list[RunResult] = []
    notes: list[str] = []
    stopped_early = False
    needs_cache = any(m in ("cold", "warm", "loader") for m in mode_list)
    scratch = None
    made_parent: str | None = None
    if needs_cache:
        parent = scratch_dir or tempfile.gettempdir()
        if not os.path.isdir(parent):
            # Make one missing folder (and remove it afterwards), never a tree:
            # a typo'd path must not leave folders behind.
            if not os.path.isdir(os.path.dirname(os.path.abspath(parent))):
                raise InvalidArgument(
                    f"scratch folder {parent}: {os.path.dirname(os.path.abspath(parent))} "
                    "does not exist", hint="create it first, or leave --scratch-dir out")
            _check_space(os.path.dirname(os.path.abspath(parent)), total_bytes)
            os.mkdir(parent)
            made_parent = parent
        else:
            _check_space(parent, total_bytes)
        scratch = tempfile.mkdtemp(prefix="ucstage-bench-", dir=parent)
    try:
        warm_cache: Any | None = None
        warm_root: str | None = None
        for index, (mode, k) in enumerate(runs):
            remaining = len(runs) - index
            run_deadline = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    stopped_early = True
                    notes.append(f"{mode} x{k} skipped: --max-seconds reached")
                    continue
                run_deadline = time.monotonic() + left / remaining

            def report(done: int, nbytes: int, _m: str = mode, _k: int = k, _i: int = index,
                       _phase: str = "run", _total: int = len(chosen),
                       _tb: int = total_bytes) -> None:
                progress(Progress(_m, _k, _phase, done, _total, nbytes, _tb, _i, len(runs)))

            report(0, 0)
            if mode == "loader":
                assert scratch is not None
                root = tempfile.mkdtemp(prefix=f"loader-{k}-", dir=scratch)
                try:
                    result = _loader_run(manifest, chosen, k, batch_size, root,
                                         run_deadline, report)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
            else:
                targets: Sequence[FileEntry] = chosen
                cache = None
                if mode == "cold":
                    assert scratch is not None
                    if warm_root is not None:  # one cold cache on disk at a time
                        shutil.rmtree(warm_root, ignore_errors=True)
                    warm_root = os.path.join(scratch, f"cold-{k}")
                    cache = warm_cache = _new_cache(warm_root)
                elif mode == "warm":
                    assert scratch is not None
                    if warm_cache is None:
                        warm_root = os.path.join(scratch, "warm")
                        warm_cache = _new_cache(warm_root)
                    targets = _prepare_warm(volume, warm_cache, chosen, max(worker_counts),
                                            deadline, progress, index, len(runs))
                    if len(targets) < len(chosen):
                        notes.append(f"warm runs read the {len(targets)} of {len(chosen)} "
                                     "sample files that were cached before the time ran out")
                    cache = warm_cache
                reader = Reader(volume, cache)
                tally, seconds, complete = measure(targets, k, reader.read,
                                                    deadline=run_deadline, report=report)
                raise_read_error(tally, mode)
                result = _result(mode, k, tally, seconds,
                                 complete and len(targets) == len(chosen))
            if not result.complete:
                stopped_early = True
            results.append(result)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if made_parent is not None:
            shutil.rmtree(made_parent, ignore_errors=True)
    if any(r.seconds < NOISY_SECONDS for r in results):
        notes.append(f"some runs took under {NOISY_SECONDS:g} s, so their rates are noisy; "
                     "bench more files (--files, --sample-bytes)")
    return BenchReport(
        source=manifest.source, sample_files=len(chosen), sample_bytes=total_bytes,
        listed_files=len(manifest.entries), listed_bytes=manifest.total_bytes,
        sampled_by=sampled_by, seed=seed, modes=mode_list, workers=worker_counts,
        results=results, recommendation=recommend(results), max_seconds=max_seconds,
        seconds=time.monotonic() - started, stopped_early=stopped_early,
        batch_size=batch_size if "loader" in mode_list else None, notes=list(dict.fromkeys(notes)),
    )


def _prepare_warm(
    volume: Volume, cache: Any, chosen: Sequence[FileEntry], workers: int,
    deadline: float | None, progress: Callable[[Progress], None], index: int, runs: int,
) -> list[FileEntry]:
    """Make sure the sample is in the warm cache (untimed); return the cached files."""
    missing = [e for e in chosen if cache.lookup(volume, e) is None]
    if missing:
        total = sum(e.size for e in missing)

        def fill(entry: FileEntry, buf: bytearray, stop: threading.Event) -> int:
            cache.fetch(volume, entry)
            return entry.size

        def report(done: int, nbytes: int) -> None:
            progress(Progress("warm", workers, "prepare", done, len(missing), nbytes, total,
                              index, runs))

        tally, _, _ = measure(missing, workers, fill, deadline=deadline, report=report)
        raise_read_error(tally, "warm-cache fill")
        return [e for e in chosen if cache.lookup(volume, e) is not None]
    return list(chosen)
