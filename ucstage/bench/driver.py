"""The bench driver: every mode at every worker count, within the time bound.

A *worker* here is a reader thread that takes the next file of the sample and
reads every byte of it with a large buffer, as a DataLoader worker does. Each
(mode, workers) run reports files/s, MB/s (10^6 bytes) and per-file latency
percentiles, and :func:`~ucstage.bench.sampling.recommend` turns the runs into
advice. How each mode reads is in :mod:`ucstage.bench.modes`; this module
only orders the runs, shares out the time and collects the results.

The library never prints: progress goes to a :class:`ucstage.progress.Callback`
(a no-op by default), and results come back as a
:class:`~ucstage.bench.report.BenchReport`. ``ucstage bench`` renders it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence

from ..engines import engine
from ..engines.mounts import mount_of
from ..manifest import Manifest
from ..progress import NO_PROGRESS, Callback
from ..sharding import DEFAULT_SHUFFLE_SCOPE
from ..volumes import Volume
from .measure import Meter
from .modes import MODE_TYPES, Job
from .report import PAGE_CACHED, BenchReport, RunResult
from .sampling import ALL, NOISY_SECONDS, recommend, run_result, sample
from .scratch import scratch_folder
from .settings import DEFAULT_MODES, DEFAULT_WORKERS, check_options

__all__ = ["run"]


def run(
    manifest: Manifest,
    *,
    files: int | str | None = None,
    sample_bytes: int | None = None,
    seed: int = 0,
    workers: Sequence[int] = DEFAULT_WORKERS,
    modes: Sequence[str] = DEFAULT_MODES,
    batch_size: int = 32,
    max_seconds: float | None = None,
    scratch_dir: str | None = None,
    callback: Callback = NO_PROGRESS,
    shuffle: bool = False,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> BenchReport:
    """Measure read throughput for every mode and worker count.

    The cold, warm and loader modes use a private cache in a fresh folder
    under ``scratch_dir``, never the user's cache; it is removed when this
    returns or raises, including on ``KeyboardInterrupt``.

    Args:
        manifest: the listing to sample (from :func:`ucstage.snapshot`).
        files, sample_bytes, seed: see :func:`~ucstage.bench.sampling.sample`
            (``sample_bytes`` is its ``max_bytes``). Neither means the default
            sample: every k-th file from a seeded offset, at most 500 files
            or 2 GiB (:func:`~ucstage.bench.sampling.spread_sample`);
            ``files="all"`` reads every listed file.
        workers: reader thread counts, e.g. ``[1, 2, 4]`` (DataLoader
            ``num_workers`` in loader mode); measured in ascending order.
            0 is allowed with the loader mode (``num_workers=0``: the main
            process reads), which alone runs it.
        modes: any of ``"direct"``, ``"cold"``, ``"warm"``, ``"loader"``; always
            measured in that order, because warm reuses the last cold run's cache.
        batch_size: DataLoader batch size in loader mode.
        max_seconds: bound on the whole run. Each remaining run gets an equal
            share of the remaining time, so every mode and worker count is
            measured on part of the sample rather than some not at all; runs
            cut short are marked ``complete=False``.
        shuffle, shuffle_scope, nproc_per_node: the loader mode's
            ``VolumeDataset`` arguments (it runs one rank, so
            ``nproc_per_node`` may only be 1: a job of one node, where both
            scopes read the same order).
        scratch_dir: where the private cache folder is made (default: the
            system temp folder, the node's local disk on the platform).
        callback: progress, called from this thread about ten times a second.
            Each run (and the untimed warm-cache fill) starts with
            ``set_description`` ("2/10 cold x4", "3/10 filling warm cache") and
            ``set_size(bytes, items=files)``, then gets ``relative_update(bytes)``
            and ``item_done(path, "read")`` as files finish.

    Raises:
        InvalidArgument: bad workers, modes or sample options (the message
            names the parameter); not enough scratch space for the cold cache.
        FetchFailed: a file could not be read.
        MissingDependency: loader mode without torch.
    """
    started = time.monotonic()
    worker_counts, mode_list = check_options(
        files=files, sample_bytes=sample_bytes, workers=workers, modes=modes,
        batch_size=batch_size, max_seconds=max_seconds, shuffle_scope=shuffle_scope,
        nproc_per_node=nproc_per_node)
    deadline = None if max_seconds is None else started + max_seconds
    chosen = sample(manifest.entries, files=files, max_bytes=sample_bytes, seed=seed)
    total_bytes = sum(e.size for e in chosen)
    volume = manifest.volume()
    mode_types = [MODE_TYPES[name] for name in mode_list]

    results: list[RunResult] = []
    # Notes are report data (the JSON's "notes", docs/bench.md), not errors,
    # so the CLI's mapper never sees them; they keep their wording, flags included.
    notes: list[str] = []
    stopped_early = False
    with contextlib.ExitStack() as stack:
        scratch = None
        if any(m.needs_scratch for m in mode_types):
            scratch = stack.enter_context(scratch_folder(scratch_dir, total_bytes))
        job = Job(manifest=manifest, volume=volume, files=chosen,
                  batch_size=batch_size, fill_workers=max(worker_counts), deadline=deadline,
                  callback=callback, scratch=scratch, notes=notes,
                  shuffle=(shuffle, seed, shuffle_scope, nproc_per_node))
        # 0 workers is a DataLoader's main process reading: the loader's alone.
        runs = [(mode, k) for mode in [t(job) for t in mode_types] for k in worker_counts
                if k > 0 or not mode.threads]
        if 0 in worker_counts and any(t.threads for t in mode_types):
            notes.append("0 workers ran in loader mode only: it is DataLoader num_workers=0 "
                         "(the main process reads); direct, cold and warm need a reader thread")
        for index, (mode, k) in enumerate(runs):
            run_deadline = None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    stopped_early = True
                    notes.append(f"{mode.name} x{k} skipped: --max-seconds reached")
                    continue
                run_deadline = time.monotonic() + left / (len(runs) - index)
            label = f"{index + 1}/{len(runs)}"
            try:
                targets = mode.prepare(k, label)
                mode.probe_page_cache(targets)
                meter = Meter(callback, f"{label} {mode.name} x{k}", targets)
                tally, seconds, complete = mode.measure(k, targets, run_deadline, meter)
            finally:
                mode.cleanup()
            result = run_result(mode.name, k, tally.files, tally.bytes, tally.latencies,
                                seconds, complete and len(targets) == len(chosen),
                                page_cache=mode.page_cache)
            stopped_early = stopped_early or not result.complete
            results.append(result)
    if any(r.seconds < NOISY_SECONDS for r in results):
        notes.append(f"some runs took under {NOISY_SECONDS:g} s, so their rates are noisy; "
                     "bench more files (--files, --sample-bytes)")
    cached = [r for r in results if r.page_cached]
    if cached:
        by_mode: dict[str, list[str]] = {}
        for r in cached:
            by_mode.setdefault(r.mode, []).append(f"x{r.workers}")
        runs_text = " and ".join(f"{m} {', '.join(ks)}" for m, ks in by_mode.items())
        notes.append(
            f"{runs_text} read files that were already in the OS page cache (at least "
            f"{PAGE_CACHED:.0%} of their bytes, asked of the kernel before each run): those "
            "rates show memory, not the source. Bench files not read recently (another "
            "--seed) to measure the source itself")
    local = local_disk(volume)
    if local:
        notes.append(
            f"the source is a folder on a local disk ({local}): direct, cold and warm all "
            "read local storage, so the cache-vs-direct comparison is not meaningful; bench "
            "a remote volume (a FUSE mount or an object-store URL) to see what the cache gains")
    return BenchReport(
        source=manifest.source, local_disk=local, sample_files=len(chosen), sample_bytes=total_bytes,
        listed_files=len(manifest.entries), listed_bytes=manifest.total_bytes,
        sampled_by=("all" if files == ALL else "files" if files is not None
                    else "bytes" if sample_bytes is not None else "default"),
        seed=seed, modes=mode_list, workers=worker_counts, results=results,
        recommendation=recommend(results), max_seconds=max_seconds,
        seconds=time.monotonic() - started, stopped_early=stopped_early,
        batch_size=batch_size if "loader" in mode_list else None,
        engine=engine.of(volume).name,
        # A note repeated by several runs (warm's partial fill) is said once.
        notes=list(dict.fromkeys(notes)),
    )


NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "9p", "ceph", "glusterfs", "lustre",
                       "gpfs", "afs", "davfs")
"""Kernel filesystems that reach a server: a folder on one is remote."""


def local_disk(volume: Volume) -> str:
    """The filesystem type when ``volume`` is a folder on local storage (not
    an object store, a FUSE mount or a network filesystem); '' otherwise."""
    if not volume.is_local:
        return ""
    _, fstype = mount_of(volume.root)
    if not fstype or fstype.startswith("fuse") or fstype in NETWORK_FILESYSTEMS:
        return ""
    return fstype
