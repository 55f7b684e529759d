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

import hashlib
import math
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import FetchFailed, InvalidArgument, MissingDependency
from .manifest import Manifest
from .volumes import FileEntry, Volume

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

MODES = ("direct", "cold", "warm", "loader")
"""Every mode, in the order :func:`run` measures them (warm needs cold's cache)."""

DEFAULT_WORKERS = (1, 2, 4, 6, 8)
BUFFER_BYTES = 4 * 1024 * 1024
"""Read size per call: large, so per-call overhead does not hide the volume's speed."""
WITHIN = 0.10
"""A worker count is "as good as the best" when its MB/s is within this fraction."""
NOISY_SECONDS = 0.5
_TICK = 0.1


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


# ---------------------------------------------------------------- measuring


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method) of sorted values."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class _Stopped(Exception):
    """A reader saw the stop flag in the middle of a file."""


def _drain(fh: Any, buf: bytearray, stop: threading.Event) -> int:
    """Read a file object to its end; return the byte count."""
    view = memoryview(buf)
    total = 0
    readinto = getattr(fh, "readinto", None)
    while True:
        if stop.is_set():
            raise _Stopped
        if readinto is not None:
            n = readinto(view)
            if not n:
                return total
            total += n
        else:
            chunk = fh.read(len(buf))
            if not chunk:
                return total
            total += len(chunk)


def _read_local(path: str, buf: bytearray, stop: threading.Event) -> int:
    with open(path, "rb", buffering=0) as fh:
        return _drain(fh, buf, stop)


class _Reader:
    """How one mode reads one file: direct from the volume, or via a cache."""

    def __init__(self, volume: Volume, cache: Any | None) -> None:
        self.volume = volume
        self.cache = cache

    def read(self, entry: FileEntry, buf: bytearray, stop: threading.Event) -> int:
        if self.cache is not None:
            # fetch() copies on a miss and validates on a hit, as training does.
            return _read_local(self.cache.fetch(self.volume, entry), buf, stop)
        if self.volume.is_local:
            return _read_local(self.volume.full_path(entry.path), buf, stop)
        with self.volume.open(entry.path) as fh:
            return _drain(fh, buf, stop)


@dataclass
class _Tally:
    files: int = 0
    bytes: int = 0
    latencies: list[float] = field(default_factory=list)
    error: BaseException | None = None
    error_path: str = ""


def _measure(
    entries: Sequence[FileEntry],
    workers: int,
    read: Callable[[FileEntry, bytearray, threading.Event], int],
    *,
    deadline: float | None,
    report: Callable[[int, int], None],
) -> tuple[_Tally, float, bool]:
    """Read ``entries`` with ``workers`` threads; return (tally, seconds, complete)."""
    tally = _Tally()
    lock = threading.Lock()
    stop = threading.Event()
    cursor = iter(range(len(entries)))
    finished: list[float] = []
    all_done = threading.Event()
    running = [workers]

    def work() -> None:
        try:
            _work()
        finally:
            with lock:
                finished.append(time.perf_counter())
                running[0] -= 1
                if running[0] == 0:
                    all_done.set()

    def _work() -> None:
        buf = bytearray(BUFFER_BYTES)
        while not stop.is_set():
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            entry = entries[index]
            start = time.perf_counter()
            try:
                n = read(entry, buf, stop)
            except _Stopped:
                return
            except BaseException as exc:  # reported to the caller, which re-raises
                with lock:
                    if tally.error is None:
                        tally.error, tally.error_path = exc, entry.path
                stop.set()
                return
            elapsed = time.perf_counter() - start
            with lock:
                tally.files += 1
                tally.bytes += n
                tally.latencies.append(elapsed)

    threads = [threading.Thread(target=work, name=f"ucstage-bench-{i}", daemon=True)
               for i in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    timed_out = False
    try:
        while not all_done.wait(_TICK):  # a timed wait lets Ctrl-C reach this thread
            if deadline is not None and time.monotonic() >= deadline and not stop.is_set():
                timed_out = True
                stop.set()
            with lock:
                done = (tally.files, tally.bytes)
            report(*done)
    finally:
        stop.set()
        for t in threads:
            t.join()
    # The last reader's finish, not this loop's wake-up, ends the run.
    seconds = max(finished or [time.perf_counter()]) - started
    report(tally.files, tally.bytes)
    complete = tally.files == len(entries) and not timed_out
    return tally, seconds, complete


def _result(mode: str, workers: int, tally: _Tally, seconds: float, complete: bool) -> RunResult:
    lat = sorted(v * 1000.0 for v in tally.latencies)
    secs = max(seconds, 1e-9)
    return RunResult(
        mode=mode, workers=workers, files=tally.files, bytes=tally.bytes, seconds=seconds,
        files_per_s=tally.files / secs, mb_per_s=tally.bytes / 1e6 / secs,
        p50_ms=_percentile(lat, 0.50), p95_ms=_percentile(lat, 0.95),
        p99_ms=_percentile(lat, 0.99), complete=complete,
    )


def _raise_read_error(tally: _Tally, mode: str) -> None:
    if tally.error is None:
        return
    exc = tally.error
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        raise exc
    if isinstance(exc, FetchFailed):
        raise exc
    raise FetchFailed(f"{mode} read of {tally.error_path} failed: {type(exc).__name__}: {exc}",
                      hint="check the volume is reachable; rerun with --debug for the traceback"
                      ) from exc


def _new_cache(root: str) -> Any:
    from .cache import LocalCache

    return LocalCache(root)


def _check_space(scratch: str, needed: int) -> None:
    free = shutil.disk_usage(scratch).free
    if needed > free * 0.9:
        from .units import format_bytes

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
        from ._bench_loader import loader_run
    except MissingDependency:
        raise
    except ImportError as exc:
        raise MissingDependency("--loader needs torch",
                                hint="pip install 'ucstage[torch]' "
                                     "(on a CPU machine: pip install torch==2.13.0)") from exc
    files, nbytes, latencies, seconds, complete = loader_run(
        manifest, entries, workers, batch_size, cache_root, deadline, report)
    tally = _Tally(files=files, bytes=nbytes, latencies=latencies)
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
    if needs_cache:
        parent = scratch_dir or tempfile.gettempdir()
        os.makedirs(parent, exist_ok=True)
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
                reader = _Reader(volume, cache)
                tally, seconds, complete = _measure(targets, k, reader.read,
                                                    deadline=run_deadline, report=report)
                _raise_read_error(tally, mode)
                result = _result(mode, k, tally, seconds,
                                 complete and len(targets) == len(chosen))
            if not result.complete:
                stopped_early = True
            results.append(result)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
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

        tally, _, _ = _measure(missing, workers, fill, deadline=deadline, report=report)
        _raise_read_error(tally, "warm-cache fill")
        return [e for e in chosen if cache.lookup(volume, e) is not None]
    return list(chosen)


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


# ---------------------------------------------------------------- chart


def plot(report: BenchReport, path: str, *, title: str | None = None) -> str:
    """Write a PNG of MB/s against workers, one line per mode; return ``path``.

    Raises:
        MissingDependency: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependency("--plot needs matplotlib",
                                hint="pip install 'ucstage[plot]'") from exc
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    try:
        for mode in report.modes:
            runs = sorted((r for r in report.results if r.mode == mode), key=lambda r: r.workers)
            if runs:
                ax.plot([r.workers for r in runs], [r.mb_per_s for r in runs], marker="o",
                        label=mode)
        rec = report.recommendation
        if rec.workers is not None:
            ax.axvline(rec.workers, color="grey", linestyle=":", linewidth=1,
                       label=f"recommended ({rec.mode}): {rec.workers}")
        ax.set_xlabel("workers (concurrent readers)" if "loader" not in report.modes
                      else "workers (reader threads / DataLoader num_workers)")
        ax.set_ylabel("MB/s")
        ax.set_xticks(report.workers)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend()
        from .units import format_bytes

        ax.set_title(title or f"ucstage bench {report.source}\n{report.sample_files:,} files, "
                     f"{format_bytes(report.sample_bytes)}", fontsize=9)
        fig.tight_layout()
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
