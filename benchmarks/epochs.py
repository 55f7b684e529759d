"""Loaders over epochs: ucstage's DataLoader against plain torch, other loaders, cache warm.

    python -m benchmarks.epochs VARIANT [OPTIONS] [--json]

Variants, each the source the epochs read and what they are compared with:

* ``throttled``: a throttled rclone FUSE mount, two epochs (cold, warm) of
  ``VolumeDataset`` + ``DataLoader`` against plain torch; the MLflow cost;
* ``warm``: a fully warm epoch against plain torch, alternating pairs;
* ``small_cache``: 3 epochs through a cache smaller than the dataset;
* ``cap_hits``: the hit rate through a cap at the default read-ahead;
* ``lazy``: a lazy first epoch against ``cache warm`` of the same files
  (inside scripts/remote-volume.sh);
* ``loaders``: ucstage's loader, the platform's, litData's and plain torch,
  epoch 1 and later epochs (inside scripts/remote-volume.sh, the ``bench`` extra).
* ``rss``: RSS and PSS of the loader and its workers over a 200,000-file
  manifest, against plain torch;
* ``hold_cost``: a warm hit per file, with and without a byte cap;
* ``mix``: what a ``Mix`` adds per item over reading its sources;
* ``profile``: where a warm epoch's time goes, per step.

``python -m benchmarks.epochs VARIANT --help`` describes each in full. This
module imports ucstage only inside the functions that use it: a measured
child process (``lazy``, ``loaders``) imports it where the old one-module
benchmark did, inside or outside the timed region alike.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.utils.data as tud

from benchmarks.datasets import IterPaths, RawPaths, ReadBytes, keep
from benchmarks.files import write_files
from benchmarks.pairs import Comparison, alternate, order, pairs_argument
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.staging import bare_run, count_objects
from benchmarks.timing import CommandFailed, Timing, best_seconds, run_command, time_call
from benchmarks.volumes import (
    BIN,
    bytecode_env,
    fresh_mount,
    remote_env,
    remote_rclone,
    remote_server,
    throttled_mount,
    unmount,
    wait_mounted,
    which,
    with_this_checkout,
    without_ca_bundle,
)

if TYPE_CHECKING:
    from ucstage import DataLoader

SUITE = "epochs"
EPOCHS = 3
"""Epochs per run of ``small_cache`` and ``cap_hits``."""
BATCH = 32
"""Batch size of ``lazy`` and ``loaders``."""


# --- throttled ----------------------------------------------------------------

def throttled_epoch(loader: Any, n_files: int) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    elapsed = time.perf_counter() - start
    if count != n_files:
        raise RuntimeError(f"read {count} files, expected {n_files}")
    return n_files / elapsed


def throttled_runs(args: argparse.Namespace, work: str) -> dict[str, Any]:
    from ucstage import DataLoader, VolumeDataset

    backing = os.path.join(work, "backing")
    write_files(backing, args.files, args.size_kib * 1024)
    results: dict[str, Any] = {"files": args.files, "size_kib": args.size_kib,
                               "mode": args.mode, "throttle": throttle_text(args), "runs": []}
    with throttled_mount(backing, os.path.join(work, "mnt"), args.mode, args.bwlimit,
                         args.delay_ms) as mnt:
        raw = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(mnt) for f in fs)
        for k in args.workers:
            plain = tud.DataLoader(RawPaths(raw), batch_size=None, num_workers=k,
                                   prefetch_factor=4 if k else None)
            row = {"loader": "plain torch", "num_workers": k,
                   "epoch1": throttled_epoch(plain, args.files), "epoch2": throttled_epoch(plain, args.files)}
            results["runs"].append(row)
            cache_dir = os.path.join(work, f"cache-k{k}")
            paths = VolumeDataset(mnt, cache_dir=cache_dir, read_ahead=args.read_ahead)
            ours = DataLoader(ReadBytes(paths), batch_size=None, num_workers=k)
            row = {"loader": "ucstage", "num_workers": k,
                   "epoch1": throttled_epoch(ours, args.files), "epoch2": throttled_epoch(ours, args.files)}
            row["timing_overhead_share"] = max(
                s.overhead_s / s.wall_s for s in ours.epoch_stats if s.wall_s)
            results["runs"].append(row)
            if k == max(args.workers) and args.mlflow:
                results["mlflow"] = mlflow_overhead(work, ours, args.files, args.step_ms)
    return results


def mlflow_overhead(work: str, loader: DataLoader, n_files: int,
                    step_ms: float) -> dict[str, float] | None:
    """One warm epoch inside an MLflow run, with a simulated training step per batch."""
    try:
        import mlflow
    except ImportError:
        return None
    mlflow.set_tracking_uri(f"sqlite:///{work}/mlflow.db")
    with mlflow.start_run():
        loader.epoch_stats.clear()
        start = time.perf_counter()
        for _ in loader:
            time.sleep(step_ms / 1000)  # the model's step
        rate = n_files / (time.perf_counter() - start)
        start = time.perf_counter()
        loader.flush_metrics()
        background = time.perf_counter() - start
    stats = loader.epoch_stats[-1]
    return {"files_per_s": rate, "batches": stats.batches, "overhead_s": stats.overhead_s,
            "wall_s": stats.wall_s, "overhead_share": stats.overhead_s / stats.wall_s,
            "per_batch_us": stats.overhead_s / stats.batches * 1e6,
            "flush_wait_after_epoch_s": background}


def throttle_text(args: argparse.Namespace) -> str:
    if args.mode == "bwlimit":
        return f"rclone FUSE mount, --bwlimit {args.bwlimit}"
    return (f"rclone FUSE mount of `rclone serve http` through a {args.delay_ms:g} ms "
            "each-way delay proxy")


def throttled_table(results: dict[str, Any]) -> str:
    runs = {(r["loader"], r["num_workers"]): r for r in results["runs"]}
    lines = ["| loader | num_workers | epoch 1 (cold) files/s | epoch 2 (warm) files/s |",
             "|---|---:|---:|---:|"]
    for (name, k), r in runs.items():
        lines.append(f"| {name} | {k} | {r['epoch1']:,.0f} | {r['epoch2']:,.0f} |")
    lines.append("")
    lines.append("| num_workers | ucstage / plain, epoch 1 | ucstage / plain, epoch 2 |")
    lines.append("|---:|---:|---:|")
    for k in sorted({k for _, k in runs}):
        ours, plain = runs[("ucstage", k)], runs[("plain torch", k)]
        lines.append(f"| {k} | {ours['epoch1'] / plain['epoch1']:.2f}x | "
                     f"{ours['epoch2'] / plain['epoch2']:.2f}x |")
    return "\n".join(lines)


def throttled_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size-kib", type=int, default=128)
    parser.add_argument("--mode", choices=["bwlimit", "latency"], default="bwlimit",
                        help="bandwidth-bound (rclone --bwlimit) or latency-bound (HTTP "
                             "behind a delay proxy) volume")
    parser.add_argument("--bwlimit", default="16M", help="rclone --bwlimit (bytes/s)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="one-way delay for --mode latency")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--read-ahead", type=int, default=4)
    parser.add_argument("--no-mlflow", dest="mlflow", action="store_false")
    parser.add_argument("--step-ms", type=float, default=5.0,
                        help="simulated training step per batch in the MLflow cost run")
    json_argument(parser)


def run_throttled(args: argparse.Namespace) -> int:
    """ucstage's DataLoader vs a plain torch DataLoader over a throttled FUSE volume.

    Writes FILES files into a temp folder, mounts it read-only with rclone and
    ``--bwlimit`` (a token bucket over all reads of the mount: a bandwidth-bound
    remote volume), then for num_workers 0 and 2 times two epochs of:

    * ucstage: ``VolumeDataset`` + ``ucstage.DataLoader``; epoch 1 starts from an
      empty cache (cold), epoch 2 reads the local cache (warm);
    * plain: a map-style dataset over the mounted paths + ``torch.utils.data.DataLoader``
      (every epoch reads the mount).

    Every loader reads each file's bytes. Prints a Markdown table of files/s and
    ucstage/plain ratios from this one run; ``--json`` prints the contract document.
    With mlflow installed, one extra warm epoch runs inside an MLflow run (sqlite
    store in the temp folder) to measure what the timing and logging cost.

        python -m benchmarks.epochs throttled                 # bandwidth-bound, ~40 s
        python -m benchmarks.epochs throttled --mode latency --files 120 --no-mlflow
    """
    if not shutil.which("rclone"):
        print("rclone is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-loader-") as work:
        results = throttled_runs(args, work)
    lines = [f"{args.files} files x {args.size_kib} KiB; {throttle_text(args)}", throttled_table(results)]
    overhead = max(r.get("timing_overhead_share", 0) for r in results["runs"])
    lines.append(f"\nucstage timing bookkeeping, no MLflow run: at most {overhead:.3%} of an "
                 "epoch")
    summary: dict[str, Any] = {"timing_overhead_share": overhead}
    if results.get("mlflow"):
        m = results["mlflow"]
        summary["mlflow"] = m
        lines.append(
            f"with an MLflow run (sqlite store) and a {args.step_ms:g} ms step per batch: "
            f"{m['batches']} per-batch metrics + summary; in-loop cost "
            f"{m['overhead_s'] * 1000:.1f} ms ({m['per_batch_us']:.1f} us per batch) = "
            f"{m['overhead_share']:.2%} of a warm epoch of {m['wall_s']:.2f} s; "
            f"background writes finished {m['flush_wait_after_epoch_s'] * 1000:.0f} ms "
            "after the epoch")
    rows = [{"name": f"{r['loader']} k={r['num_workers']}", **r} for r in results["runs"]]
    Report(SUITE, {**params_of(args), "throttle": throttle_text(args)}, rows,
           summary).emit(args.json, "\n".join(lines))
    return 0


# --- warm ---------------------------------------------------------------------

def second_epoch(loader: Any, n_files: int, size: int) -> float:
    """Files per second of the loader's second epoch (the first is untimed)."""
    rate = 0.0
    for _ in range(2):
        start = time.perf_counter()
        total = count = 0
        for nbytes in loader:
            total += int(nbytes)
            count += 1
        rate = n_files / (time.perf_counter() - start)
        if count != n_files or total != n_files * size:
            raise RuntimeError(f"read {count} files / {total} bytes, expected {n_files}")
    return rate


def warm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    pairs_argument(parser)
    parser.add_argument("--dir", default=None, help="where to write the files (default: /tmp)")
    json_argument(parser)


def run_warm(args: argparse.Namespace) -> int:
    """An epoch over a fully warm cache, VolumeDataset vs a plain torch DataLoader.

    Writes FILES files of SIZE_KIB KiB into a local folder (read once, so their
    pages are cached), warms a ucstage cache with them, then for each
    num_workers alternates, PAIRS times:

    * plain: ``torch.utils.data.DataLoader`` (torch's defaults, but
      ``persistent_workers=True`` with workers, as ucstage's default has it since
      issue 21) over a map-style dataset of the local files' paths, each item
      opened and read whole;
    * ucstage: ``ucstage.DataLoader`` (ucstage's defaults) over an IterableDataset
      that opens and reads whole every path a ``VolumeDataset`` of the folder
      yields (its cached copies);

    each in a fresh loader, timing the *second* epoch in the process (the first
    warms the interpreter, the workers' imports and the stamp memo). Prints files/s
    per run, the median per side and the median of the per-pair ratios
    ucstage / plain.

        python -m benchmarks.epochs warm --pairs 5 [--json]
    """
    from ucstage import DataLoader, LocalCache, VolumeDataset
    from ucstage.volumes import list_files

    size = args.size_kib * 1024
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-warm-", dir=args.dir) as work:
        data = os.path.join(work, "data")
        paths = write_files(data, args.files, size)
        cache_dir = os.path.join(work, "cache")
        cache = LocalCache(cache_dir)
        listing = list_files(data)
        report = cache.warm(listing.volume, listing.entries)
        if report.failed:
            raise RuntimeError(f"warm failed: {report.failed[:3]}")
        for path in paths:  # the source's pages too, for the plain side
            with open(path, "rb") as fh:
                fh.read()
        for k in args.workers:
            def plain(k: int = k) -> float:
                return second_epoch(tud.DataLoader(RawPaths(paths), batch_size=None,
                                                   num_workers=k, persistent_workers=k > 0),
                                    args.files, size)

            def ours(k: int = k) -> float:
                return second_epoch(DataLoader(ReadBytes(VolumeDataset(data, cache_dir=cache_dir)),
                                               batch_size=None, num_workers=k), args.files, size)

            def progress(r: int, side: str, rate: float, k: int = k) -> None:
                print(f"num_workers={k} pair {r + 1}: {side} {rate:,.0f} files/s",
                      file=sys.stderr)

            sides: dict[str, Callable[[], float]] = {"plain": plain, "ucstage": ours}
            found = alternate(sides, args.pairs, progress)
            c = Comparison(found["plain"], found["ucstage"])
            rows.append({"name": f"num_workers={k}", "num_workers": k,
                         "plain_files_per_s": c.a_median, "ucstage_files_per_s": c.b_median,
                         "ratio": c.median_pair_ratio, "pair_ratios": c.pair_ratios,
                         "plain_runs": c.a, "ucstage_runs": c.b})
    lines = [f"{args.files} files x {args.size_kib} KiB, page-cached, second epoch in the "
             f"process, {args.pairs} alternating pairs per num_workers",
             "| num_workers | plain torch files/s (median) | ucstage files/s (median) | "
             "ucstage / plain (median of pairs) | pairs |", "|---:|---:|---:|---:|---|"]
    for r in rows:
        ratios = ", ".join(f"{x:.2f}x" for x in r["pair_ratios"])
        lines.append(f"| {r['num_workers']} | {r['plain_files_per_s']:,.0f} | "
                     f"{r['ucstage_files_per_s']:,.0f} | {r['ratio']:.2f}x | {ratios} |")
    Report(SUITE, params_of(args), rows).emit(args.json, "\n".join(lines))
    return 0


# --- small_cache --------------------------------------------------------------

CAPS = (0.25, 0.5, 1.0)


def _lru_mark(file: int | str, mtime_ns: int) -> None:
    """Consumption recorded as an ordinary hand-out: eviction goes LRU."""
    os.utime(file, ns=(time.time_ns(), mtime_ns))


def cached(mnt: str, work: str, cap: int, workers: int, lru: bool,
           shuffle: bool) -> list[dict[str, float]]:
    from ucstage import DataLoader, VolumeDataset
    from ucstage.cache import LocalCache, policy

    cache_dir = tempfile.mkdtemp(dir=work, prefix="cache-")
    os.chmod(cache_dir, 0o700)
    original = policy.mark_consumed
    if lru:
        policy.mark_consumed = _lru_mark  # forked workers inherit it
    try:
        cache = LocalCache(cache_dir, max_bytes=cap, lease_seconds=0 if lru else 10)
        paths = VolumeDataset(mnt, cache=cache, shuffle=shuffle, seed=1, read_ahead=2)
        loader = DataLoader(ReadBytes(paths), batch_size=None, num_workers=workers,
                            log_mlflow=False)
        rows = []
        for epoch in range(EPOCHS):
            paths.set_epoch(epoch)
            start = time.perf_counter()
            count = sum(1 for _ in loader)
            rows.append({"files_per_s": count / (time.perf_counter() - start),
                         "hit_rate": loader.epoch_stats[-1].cache_hit_rate or 0.0,
                         "cache_wait_s": loader.epoch_stats[-1].cache_wait_s})
        return rows
    finally:
        policy.mark_consumed = original
        shutil.rmtree(cache_dir, ignore_errors=True)


def uncached(raw: list[str], workers: int, ours: bool, shuffle: bool) -> list[dict[str, float]]:
    from ucstage import DataLoader

    rows = []
    for epoch in range(EPOCHS):
        gen = torch.Generator().manual_seed(epoch)
        prefetch = 4 if workers else None
        loader: Any = (
            DataLoader(RawPaths(raw), batch_size=None, num_workers=workers, shuffle=shuffle,
                       generator=gen, prefetch_factor=prefetch, log_mlflow=False) if ours
            else tud.DataLoader(RawPaths(raw), batch_size=None, num_workers=workers,
                                shuffle=shuffle, generator=gen, prefetch_factor=prefetch))
        start = time.perf_counter()
        count = sum(1 for _ in loader)
        rows.append({"files_per_s": count / (time.perf_counter() - start), "hit_rate": 0.0})
    return rows


def small_cache_rounds(args: argparse.Namespace, work: str) -> dict[str, Any]:
    backing = os.path.join(work, "backing")
    write_files(backing, args.files, args.size_kib * 1024)
    total = args.files * args.size_kib * 1024
    shuffle = args.order == "shuffled"
    results: dict[str, Any] = {"files": args.files, "size_kib": args.size_kib,
                               "bwlimit": args.bwlimit, "num_workers": args.workers,
                               "order": args.order,
                               "rounds": []}
    with throttled_mount(backing, os.path.join(work, "mnt"), "bwlimit", args.bwlimit) as mnt:
        raw = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(mnt) for f in fs)
        jobs: list[tuple[str, Any]] = []
        for share in CAPS:
            cap = int(total * share) + args.size_kib * 1024  # room for the 5% low water
            jobs.append((f"ucstage scan, cap {share:.0%}",
                         lambda cap=cap: cached(mnt, work, cap, args.workers, False, shuffle)))
            jobs.append((f"ucstage LRU, cap {share:.0%}",
                         lambda cap=cap: cached(mnt, work, cap, args.workers, True, shuffle)))
        jobs.append(("no cache (ucstage DataLoader)",
                     lambda: uncached(raw, args.workers, True, shuffle)))
        jobs.append(("plain torch DataLoader",
                     lambda: uncached(raw, args.workers, False, shuffle)))
        for r in range(args.rounds):
            found = {}
            for name, job in order(jobs, r):
                found[name] = job()
                print(f"round {r + 1}: {name}: " + ", ".join(
                    f"{e['files_per_s']:.0f}/s hit {e['hit_rate']:.2f} "
                    f"wait {e.get('cache_wait_s', 0):.2f}s" for e in found[name]),
                    file=sys.stderr)
            results["rounds"].append(found)
    return results


def small_cache_table(results: dict[str, Any]) -> str:
    rounds = results["rounds"]
    names = list(rounds[0])
    lines = ["| loader | epoch 1 files/s | epoch 2 files/s | epoch 3 files/s "
             "| hit rate 1 / 2 / 3 |", "|---|---:|---:|---:|---|"]
    for name in names:
        fps = [statistics.median(r[name][e]["files_per_s"] for r in rounds)
               for e in range(EPOCHS)]
        hits = [statistics.median(r[name][e]["hit_rate"] for r in rounds)
                for e in range(EPOCHS)]
        lines.append(f"| {name} | " + " | ".join(f"{v:,.0f}" for v in fps)
                     + " | " + " / ".join(f"{h:.2f}" for h in hits) + " |")
    lines += ["", "Ratios, epochs 2-3 together (median over the rounds of each round's "
              "pair):", "", "| cap | scan / LRU | scan / plain torch | scan / no cache |",
              "|---|---:|---:|---:|"]

    def later(r: dict[str, Any], name: str) -> float:
        return sum(1 / r[name][e]["files_per_s"] for e in (1, 2))  # seconds per file, summed

    for share in CAPS:
        scan, lru = f"ucstage scan, cap {share:.0%}", f"ucstage LRU, cap {share:.0%}"
        ratios = [statistics.median(later(r, other) / later(r, scan) for r in rounds)
                  for other in (lru, "plain torch DataLoader", "no cache (ucstage DataLoader)")]
        lines.append(f"| {share:.0%} | " + " | ".join(f"{x:.2f}x" for x in ratios) + " |")
    return "\n".join(lines)


def small_cache_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--bwlimit", default="16M", help="rclone --bwlimit (bytes/s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--order", choices=["shuffled", "in-order"], default="shuffled",
                        help="a new permutation each epoch, or listing order")
    json_argument(parser)


def run_small_cache(args: argparse.Namespace) -> int:
    """3 epochs through a cache smaller than the dataset, over a throttled FUSE volume.

    Writes FILES files into a temp folder and mounts it read-only with rclone
    ``--bwlimit`` (the throttle of benchmarks.epochs throttled: one token bucket for
    every read of the mount). Then, ROUNDS times, alternating the loaders in each
    round, runs 3 epochs (``--order``: shuffled, a new permutation each epoch, or in order) of:

    * ``ucstage scan``: ``VolumeDataset`` + ``ucstage.DataLoader`` through a
      fresh cache capped at 25%, 50% and 100% of the dataset, plus one file (the
      room the 95% low water of eviction needs at 100%) (the eviction this
      release uses for dataset reads: most recently consumed first);
    * ``ucstage LRU``: the same, with consumed files marked as ordinary hand-outs
      (LRU order, no time lease): what eviction did before, minus the CacheFull;
    * ``no cache``: ``ucstage.DataLoader`` over a map-style dataset of the
      mounted paths (every epoch reads the volume);
    * ``plain torch``: ``torch.utils.data.DataLoader`` over the same paths.

    Every loader reads every file's bytes (a decoding wrapper around the
    VolumeDataset). Prints files/s and hit rate per epoch (median over the
    rounds) and the ratios per round pair; ``--json`` prints the contract document.

        python -m benchmarks.epochs small_cache                  # ~3 min
        python -m benchmarks.epochs small_cache --files 200 --rounds 1
    """
    if not shutil.which("rclone"):
        print("rclone is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-small-cache-") as work:
        results = small_cache_rounds(args, work)
    rounds = results["rounds"]
    rows = []
    for name in rounds[0]:
        for e in range(EPOCHS):
            rows.append({"name": f"{name} epoch {e + 1}", "loader": name, "epoch": e + 1,
                         **{key: statistics.median(r[name][e].get(key, 0.0) for r in rounds)
                            for key in ("files_per_s", "hit_rate", "cache_wait_s")}})
    text = (f"{args.files} files x {args.size_kib} KiB, rclone FUSE mount --bwlimit "
            f"{args.bwlimit}, num_workers={args.workers}, {args.order}, {args.rounds} rounds\n"
            + small_cache_table(results))
    Report(SUITE, params_of(args), rows, {"rounds": rounds}).emit(
        args.json, text)
    return 0


# --- cap_hits -----------------------------------------------------------------

SETUPS = (("0 workers, in order", 0, False), ("0 workers, shuffled", 0, True),
          ("2 workers, shuffled", 2, True))


def cap_epochs(mnt: str, work: str, cap: int, workers: int, shuffle: bool,
           read_ahead: int | str) -> tuple[list[float], int]:
    """Hit rate per epoch and paths that vanished before the loop opened them."""
    from ucstage import DataLoader, VolumeDataset
    from ucstage.cache import LocalCache

    cache_dir = tempfile.mkdtemp(dir=work, prefix="cache-")
    try:
        cache = LocalCache(cache_dir, max_bytes=cap)
        ds = VolumeDataset(mnt, cache=cache, shuffle=shuffle, seed=1, read_ahead=read_ahead)
        loader = DataLoader(ds, batch_size=1, num_workers=workers, log_mlflow=False)
        vanished = 0
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            for batch in loader:
                for path in batch:
                    try:
                        with open(path, "rb") as fh:
                            fh.read()
                    except FileNotFoundError:
                        vanished += 1
        rates = [s.cache_hit_rate or 0.0 for s in loader.epoch_stats]
        del loader
        return rates, vanished
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def cap_hits_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=100_000, help="bytes per file")
    parser.add_argument("--cap-share", type=float, default=0.25)
    parser.add_argument("--bwlimit", default="64M", help="rclone --bwlimit (bytes/s)")
    parser.add_argument("--rounds", type=int, default=3)


def run_cap_hits(args: argparse.Namespace) -> int:
    """The hit rate through a cache capped at a quarter of the data, default read-ahead.

    Writes FILES files of SIZE bytes into a temp folder, mounts it read-only with
    rclone (``--bwlimit``, one token bucket for every read), and for each setup
    (0 workers in order, 0 workers shuffled, 2 workers shuffled; ``batch_size``
    1) runs 3 epochs of ``VolumeDataset`` + ``ucstage.DataLoader`` through a
    fresh cache capped at a quarter of the data, with ``read_ahead="auto"`` (the
    default) and with ``read_ahead=2``, alternating the two each round. The loop
    opens every path of every batch (a path that is gone counts as vanished).
    Prints, per setup and read-ahead, the median over the rounds of the hit rate
    of epochs 2-3 and the vanished paths; the target is a hit rate of at least
    0.8 x (cap / dataset) at the default.

        python -m benchmarks.epochs cap_hits                  # ~2 min
        python -m benchmarks.epochs cap_hits --rounds 1
    """
    work = tempfile.mkdtemp(prefix="ucstage-cap-hits-")
    cap = int(args.files * args.size * args.cap_share)
    target = 0.8 * args.cap_share
    try:
        backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
        write_files(backing, args.files, args.size, spread=0)
        with throttled_mount(backing, mnt, bwlimit=args.bwlimit):
            print(f"{args.files} files x {args.size} B, cap {args.cap_share:g} of the data "
                  f"({cap} B), {EPOCHS} epochs, batch_size 1, {args.rounds} rounds; "
                  f"target: epochs 2-{EPOCHS} hit >= {target:.2f} at the default read-ahead")
            met = True
            for label, workers, shuffle in SETUPS:
                later: dict[str, list[float]] = {"auto": [], "2": []}
                gone: dict[str, list[int]] = {"auto": [], "2": []}
                for r in range(args.rounds):
                    for side in order(["auto", "2"], r):
                        rates, vanished = cap_epochs(mnt, work, cap, workers, shuffle,
                                                 "auto" if side == "auto" else 2)
                        later[side].append(min(rates[1:]))
                        gone[side].append(vanished)
                for side in ("auto", "2"):
                    print(f"  {label:22s} read_ahead={side:4s}  lowest later-epoch hit rate: "
                          f"median {statistics.median(later[side]):.3f} "
                          f"(runs {', '.join(f'{x:.3f}' for x in later[side])}); "
                          f"vanished paths {sum(gone[side])}")
                met = met and min(later["auto"]) >= target and not sum(gone["auto"])
            print(f"target {'met' if met else 'missed'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


# --- lazy ---------------------------------------------------------------------

LAZY_SIDES = ("warm", "lazy")


def lazy_one(src: str, cache: str, workers: int) -> None:
    """In the measured process: one epoch at the defaults, every file read whole."""
    from ucstage import DataLoader, VolumeDataset

    start = time.perf_counter()
    ds = VolumeDataset(src, cache_dir=cache)
    loader = DataLoader(ReadBytes(ds), batch_size=BATCH, num_workers=workers,
                        collate_fn=keep, log_mlflow=False)
    # The loader finds the VolumeDataset inside ReadBytes (.paths) and shards it.
    count = sum(len(batch) for batch in loader)
    print(f"files {count} seconds {time.perf_counter() - start:.3f}")


def lazy_run(side: str, src: str, work: str, workers: int) -> dict[str, float]:
    cache = tempfile.mkdtemp(prefix=f"cache-{side}-", dir=work)
    if side == "warm":
        cmd = [os.path.join(BIN, "ucstage"), "cache", "warm", src, "--json"]
    else:
        cmd = [sys.executable, "-m", f"benchmarks.{SUITE}", "lazy", "--one", src, "--cache", cache,
               "--workers", str(workers)]
    run = run_command(cmd, env=with_this_checkout({**os.environ, "UCSTAGE_CACHE_DIR": cache}))
    shutil.rmtree(cache, ignore_errors=True)
    found = {"seconds": run.timing.wall_s, "cpu_s": run.timing.cpu_s,
             "command_s": run.timing.wall_s}
    if side == "lazy":  # the epoch itself: from VolumeDataset() to its last batch
        found["seconds"] = float(run.last_line.split()[-1])
    return found


def lazy_source(via: str, folder: str, work: str) -> tuple[str, str | None]:
    if via == "s3":
        return f"{remote_env('UCSTAGE_REMOTE_URL')}/{folder}", None
    mnt = fresh_mount(work, via)
    return os.path.join(mnt, folder), mnt


def lazy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="small,large",
                        help="bucket folders to read (default small,large)")
    parser.add_argument("--via", default="s3,fuse", help="s3, fuse or both (default both)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    pairs_argument(parser)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    json_argument(parser)


def run_lazy(args: argparse.Namespace) -> int:
    """Lazy as fast as eager: epoch 1 through ``VolumeDataset`` + ``DataLoader`` at
    their defaults against ``ucstage cache warm`` of the same files.

    Runs inside scripts/remote-volume.sh (it reads ``UCSTAGE_REMOTE_*``). Each
    round runs, in alternating order, for every source in ``--via`` (``s3``: the
    bucket's ``s3://`` URL; ``fuse``: a *fresh* rclone mount of it per run, so no
    run reads pages an earlier one left in the mount's cache) and every set:

    * ``warm``: ``ucstage cache warm SRC`` into an empty cache folder (the whole
      command: interpreter start-up, listing, copying);
    * ``lazy``: a fresh Python process that makes ``VolumeDataset(SRC)`` over an
      empty cache folder and runs one epoch of ``ucstage.DataLoader`` over it
      with ``--workers`` workers, batches of 32 kept as lists (every other
      setting at its default), each item's file read whole. Timed in the process
      from ``VolumeDataset(SRC)`` to the epoch's last batch: the listing, the
      workers' start and the reads, not the interpreter's start and torch's
      import (``command_s`` in the rows is the whole command).

    The ratio is files/s of lazy over files/s of warm (warm's seconds over
    lazy's, per round; the target is >= 0.8x), with each side's client CPU per
    file (user + sys of the command and what it waited for; the forkserver's
    workers are not among them, so lazy's figure is a floor).

        scripts/remote-volume.sh --delay 20ms --small 3000x16K --large 1000x256K -- \\
            .venv/bin/python -m benchmarks.epochs lazy --sets small,large --via s3,fuse --pairs 3
    """
    if args.one:
        lazy_one(args.one, args.cache, args.workers)
        return 0
    work = tempfile.mkdtemp(prefix="bench-lazy-epoch-")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"server": remote_server()}
    table = ["| data | via | warm s | lazy s | lazy / warm files/s (rounds) | "
             "CPU ms/file warm / lazy |", "|---|---|---:|---:|---|---|"]
    try:
        for folder in args.sets.split(","):
            count = lazy_count(folder)
            for via in args.via.split(","):
                runs: dict[str, list[dict[str, float]]] = {s: [] for s in LAZY_SIDES}
                for r in range(args.pairs):
                    for side in order(LAZY_SIDES, r):
                        src, mnt = lazy_source(via, folder, work)
                        try:
                            runs[side].append(lazy_run(side, src, work, args.workers))
                        finally:
                            if mnt is not None:
                                unmount(mnt)
                        print(f"{folder} {via} round {r} {side}: {runs[side][-1]}", file=sys.stderr)
                ratios = [w["seconds"] / lz["seconds"] for w, lz in zip(runs["warm"], runs["lazy"], strict=True)]
                med = {s: statistics.median(x["seconds"] for x in runs[s]) for s in LAZY_SIDES}
                cpu = {s: statistics.median(x["cpu_s"] for x in runs[s]) * 1000 / count
                       for s in LAZY_SIDES}
                key = f"{folder}_{via}"
                summary[f"{key}_lazy_over_warm"] = statistics.median(ratios)
                for s in LAZY_SIDES:
                    rows.append({"name": f"{key} {s}", "seconds": med[s],
                                 "command_s": statistics.median(x["command_s"] for x in runs[s]),
                                 "cpu_ms_per_file": cpu[s],
                                 "runs": [x["seconds"] for x in runs[s]]})
                table.append(f"| {folder} ({count} files) | {via} | {med['warm']:.2f} | "
                             f"{med['lazy']:.2f} | {statistics.median(ratios):.2f}x ("
                             + ", ".join(f"{x:.2f}" for x in ratios)
                             + f") | {cpu['warm']:.2f} / {cpu['lazy']:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Report(SUITE, params_of(args, drop=("json", "one", "cache")), rows,
           summary).emit(args.json, "\n".join(table))
    return 0


def lazy_count(folder: str) -> int:
    root = os.path.join(remote_env("UCSTAGE_REMOTE_MNT"), folder)
    return sum(len(names) for _, _, names in os.walk(root))


# --- loaders ------------------------------------------------------------------

LOADERS = ("ucstage fuse", "ucstage s3", "platform", "litdata s3", "plain")
LOADER_VARIANTS = ("ucstage s3 local", "ucstage s3 forkserver")
"""Not run by default: the wrapper class defined inside a function (as in a
notebook), and the forkserver start asked for explicitly."""
FUSE_LOADERS = ("ucstage fuse", "platform", "plain")
CEILING = ("loop 256", "s5cmd")
VOLUMES = "/Volumes/ucstage_bench"


# --- one run, in its own process ------------------------------------------------------

def _read_path(path: str) -> int:
    """litData's transform: read the cached file whole, as the other loaders' items are."""
    with open(path, "rb") as fh:
        return len(fh.read())


def build(loader: str, src: str, workers: int, cache: str) -> tuple[Any, Any]:
    """The (dataset, loader) of ``loader`` over ``src``; the dataset has ``set_epoch`` or not."""
    if loader.startswith("ucstage"):
        from ucstage import DataLoader, VolumeDataset

        vds = VolumeDataset(src, cache_dir=cache)
        wrapper: Any = ReadBytes
        if loader.endswith(" local"):
            class LocalReadBytes(ReadBytes):  # as in a notebook cell: does not pickle
                pass

            wrapper = LocalReadBytes
        context = "forkserver" if loader.endswith(" forkserver") else None
        return vds, DataLoader(wrapper(vds), batch_size=BATCH, num_workers=workers,
                               collate_fn=keep, multiprocessing_context=context)
    if loader == "platform":
        from databricks.air.data import DataLoader as AirLoader
        from databricks.air.data import UCVolumeDataset

        ds = UCVolumeDataset(src)
        return ds, AirLoader(ReadBytes(ds), batch_size=BATCH, num_workers=workers,
                             collate_fn=keep)
    if loader == "litdata s3":
        from litdata import StreamingRawDataset
        from litdata.streaming import downloader

        # Its obstore client has no way to be told of a plain-http endpoint (a
        # real store is https): add allow_http to the client options it builds
        # the store with, nothing else (forked workers inherit it).
        downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
            **downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}  # type: ignore[attr-defined]
        raw = StreamingRawDataset(src, cache_dir=cache, cache_files=True, item_type="path",
                                  transform=_read_path)
        return raw, tud.DataLoader(raw, batch_size=BATCH, num_workers=workers,
                                   persistent_workers=True, prefetch_factor=4,
                                   collate_fn=keep)
    if loader == "plain":
        paths = sorted(e.path for e in os.scandir(src) if e.is_file())
        return None, tud.DataLoader(RawPaths(paths), batch_size=BATCH, num_workers=workers,
                                    collate_fn=keep)
    raise ValueError(f"unknown loader {loader!r}")


def _epoch(loader: Any) -> int:
    return sum(len(batch) for batch in loader)


def one_run(loader: str, src: str, workers: int, epochs: int, want: int) -> dict[str, Any]:
    """Epoch 1 (from the dataset's construction) and ``epochs`` more, in this process."""
    # torch is imported with this module: before the clock starts, as every script has it.
    cache = tempfile.mkdtemp(prefix="bench-loaders-cache-")
    try:
        start = time.perf_counter()
        ds, dl = build(loader, src, workers, cache)
        got = _epoch(dl)
        first = time.perf_counter() - start
        if got != want:
            raise SystemExit(f"loaders: {loader} delivered {got} items of {want}")
        later = []
        for e in range(1, epochs + 1):
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(e)
            t = time.perf_counter()
            got = _epoch(dl)
            later.append(time.perf_counter() - t)
            if got != want:
                raise SystemExit(f"loaders: {loader} delivered {got} items of {want} in epoch "
                                 f"{e + 1}")
        del dl
        return {"epoch1_s": first, "epoch2_s": later[0] if later else None,
                "later_s": statistics.fmean(later) if later else None, "later_epochs": later}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --- the parent: fresh mounts, alternating rounds ------------------------------------

def mount_prefix(prefix: str, where: str, log: str) -> str:
    """A fresh read-only rclone mount of the bucket's ``prefix`` (a flat folder) at ``where``."""
    os.makedirs(where, exist_ok=True)
    subprocess.run([remote_rclone(), "mount", f"{remote_env('UCSTAGE_REMOTE_RCLONE')}/{prefix}",
                    where, "--daemon", "--read-only", "--use-server-modtime",
                    "--dir-cache-time", "5m", "--log-file", log],
                   check=True, env=without_ca_bundle())
    wait_mounted(where, log)
    return where


def unmount_prefix(where: str) -> None:
    """Unmount ``where``; remove it and the folders above it that are left empty."""
    unmount(where)
    with contextlib.suppress(OSError):
        os.removedirs(where)  # stops at the first folder that is not empty


def litdata_copy(url: str, prefix: str, endpoint: str) -> str:
    """A server-side copy of ``url/prefix`` for litData (it writes its index into it)."""
    copy = f"{url}/litdata-{prefix}"
    subprocess.run([which("s5cmd"), "--endpoint-url", endpoint, "cp", f"{url}/{prefix}/*",
                    copy + "/"], check=True, capture_output=True, env=without_ca_bundle())
    return copy


def loader_in_process(loader: str, src: str, workers: int, epochs: int, want: int,
               work: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.{SUITE}", "loaders", "--one", loader, "--src", src,
           "--workers", str(workers), "--epochs", str(epochs), "--want", str(want)]
    env = with_this_checkout(bytecode_env(without_ca_bundle(), work))
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"loaders: {loader} over {src} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def one_round(label: str, prefix: str, workers: int, rnd: int, args: argparse.Namespace,
              ctx: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    names = list(order([*args.loaders, *args.ceiling], rnd))
    for name in names:
        if name in CEILING:
            found = bare_run(name, f"{ctx['url']}/{prefix}", ctx["endpoint"], ctx["work"],
                             ctx["files"][label])
            row: dict[str, Any] = {"epoch1_s": found["seconds"]}
        else:
            mnt = None
            if name in FUSE_LOADERS:
                run = f"w{workers}-r{rnd + 1}-{name.split()[0]}"
                mnt = mount_prefix(prefix, os.path.join(VOLUMES, label, run),
                                   os.path.join(ctx["work"], f"{label}-{run}.rclone.log"))
                src = mnt
            elif name == "litdata s3":
                src = ctx["litdata"][label]
            else:
                src = f"{ctx['url']}/{prefix}"
            epochs = args.plain_epochs if name == "plain" else args.epochs
            try:
                row = loader_in_process(name, src, workers, epochs, ctx["files"][label], ctx["work"])
            finally:
                if mnt:
                    unmount_prefix(mnt)
        row.update({"name": f"{label} w{workers} round {rnd + 1} {name}", "set": label,
                    "workers": workers, "round": rnd + 1, "loader": name})
        rows.append(row)
        later = row.get("later_s")
        print(f"{label} w{workers} round {rnd + 1}: {name}: epoch 1 {row['epoch1_s']:.2f} s"
              + (f", later {later:.3f} s/epoch" if later else ""), file=sys.stderr, flush=True)
    return rows


TARGETS = (  # (what, ours, theirs, figure, target)
    ("epoch 1 vs plain torch", "ucstage fuse", "plain", "epoch1_s", 1.5),
    ("epoch 1 vs the platform's loader", "ucstage fuse", "platform", "epoch1_s", 1.0),
    ("epoch 1 over s3:// vs litData", "ucstage s3", "litdata s3", "epoch1_s", 1.0),
    ("epoch 1 over s3://, notebook wrapper vs litData", "ucstage s3 local", "litdata s3",
     "epoch1_s", 1.0),
    ("epoch 1 over s3://, notebook wrapper vs module-level", "ucstage s3 local", "ucstage s3",
     "epoch1_s", 1 / 1.1),
    ("epoch 1 over s3://, fork vs forkserver", "ucstage s3", "ucstage s3 forkserver",
     "epoch1_s", 1.0),
    ("epoch 1 over s3:// vs the platform's loader", "ucstage s3", "platform", "epoch1_s", 1.0),
    ("later epochs vs the platform's loader", "ucstage fuse", "platform", "later_s", 0.9),
    ("later epochs over s3:// vs the platform's loader", "ucstage s3", "platform", "later_s",
     0.9),
)


def loaders_summary(rows: list[dict[str, Any]], label: str, workers: int) -> dict[str, Any]:
    mine = [r for r in rows if r["set"] == label and r["workers"] == workers]
    rounds = sorted({r["round"] for r in mine})

    def get(loader: str, key: str) -> list[float | None]:
        by = {r["round"]: r.get(key) for r in mine if r["loader"] == loader}
        return [by.get(k) for k in rounds]

    loaders = sorted({r["loader"] for r in mine}, key=[*LOADERS, *LOADER_VARIANTS, *CEILING].index)
    med: dict[str, dict[str, float | None]] = {}
    for name in loaders:
        med[name] = {}
        for key in ("epoch1_s", "later_s"):
            vals = [v for v in get(name, key) if v is not None]
            med[name][key] = statistics.median(vals) if vals else None
    ceiling = [min(x for x in xs if x is not None)
               for xs in zip(*(get(t, "epoch1_s") for t in CEILING if t in loaders),
                             strict=True)] if any(t in loaders for t in CEILING) else []
    out: dict[str, Any] = {"median": med, "targets": {}, "of_ceiling": {}}
    if ceiling:
        out["ceiling_s"] = statistics.median(ceiling)
        for name in loaders:
            if name in CEILING:
                continue
            out["of_ceiling"][name] = statistics.median(
                c / v for c, v in zip(ceiling, get(name, "epoch1_s"), strict=True) if v)
    for what, ours, theirs, key, target in TARGETS:
        if ours not in loaders or theirs not in loaders:
            continue
        pairs = [t / o for o, t in zip(get(ours, key), get(theirs, key), strict=True)
                 if o and t]
        if pairs:
            ratio = statistics.median(pairs)
            out["targets"][what] = {"ratio": ratio, "pairs": pairs, "target": target,
                                    "met": ratio >= target}
    return out


def loaders_markdown(summaries: dict[str, dict[str, Any]], files: dict[str, int], pairs: int) -> str:
    lines = []
    for key, s in summaries.items():
        label, workers = key.rsplit(" w", 1)
        lines += ["", f"**{label}** ({files[label]:,} files), {workers} workers, "
                  f"{pairs} rounds alternating; medians", "",
                  "| loader | epoch 1 s | later epochs s/epoch | epoch 1 of the ceiling |",
                  "|---|---:|---:|---:|"]
        for name, m in s["median"].items():
            later = f"{m['later_s']:.3f}" if m["later_s"] is not None else "-"
            ceil = s["of_ceiling"].get(name)
            lines.append(f"| {name} | {m['epoch1_s']:.2f} | {later} | "
                         f"{f'{ceil:.2f}' if ceil is not None else '-'} |")
        lines += ["", "| ucstage target | ratio (median of rounds) | rounds | target | |",
                  "|---|---:|---|---:|---|"]
        for what, t in s["targets"].items():
            lines.append(f"| {what} | {t['ratio']:.2f}x | "
                         f"{', '.join(f'{x:.2f}' for x in t['pairs'])} | >= {t['target']:.3g} | "
                         f"{'met' if t['met'] else 'missed'} |")
    return "\n".join(lines)


def _loader_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",")]
    unknown = set(names) - {*LOADERS, *LOADER_VARIANTS}
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown loaders {sorted(unknown)}")
    return names


def loaders_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="small,large",
                        help="prefixes of the remote volume's bucket (default small,large)")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--epochs", type=int, default=10,
                        help="later epochs timed back to back after epoch 1 (default 10)")
    parser.add_argument("--plain-epochs", type=int, default=0,
                        help="later epochs for the plain loader (default 0: it reads the "
                             "mount every epoch, as in epoch 1)")
    parser.add_argument("--loaders", default=",".join(LOADERS), type=_loader_names,
                        help=f"comma-separated subset of {', '.join((*LOADERS, *LOADER_VARIANTS))}")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="leave out the bare loop and s5cmd")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--want", type=int, help=argparse.SUPPRESS)
    pairs_argument(parser)
    json_argument(parser)


def run_loaders(args: argparse.Namespace) -> int:
    """Side by side: ucstage's loader, the platform's loader, litData's raw dataset
    and a plain torch DataLoader, epoch 1 and later epochs, on the emulated remote volume.

    Runs inside scripts/remote-volume.sh (the rclone-served bucket behind its
    delay and rate shaping). For each data set (``--sets``: the bucket's
    ``small/`` and ``large/`` prefixes), each worker count (``--workers``, 4 and
    6) and each of ``--pairs`` alternating rounds (:func:`benchmarks.pairs.order`:
    every loader once per round, the order reversed every other round), every
    loader runs in a fresh Python process (one training script each: imports
    are not timed, the dataset's construction and listing are) from a cold
    start: a fresh rclone mount, a fresh cache folder. Each item's file is read
    whole in the worker; batches of 32 (``collate_fn`` keeps the list).

    * ``ucstage fuse``: ``ucstage.VolumeDataset`` over the FUSE mount +
      ``ucstage.DataLoader``, defaults (persistent workers, its start method);
    * ``ucstage s3``: the same over ``s3://`` (its workers fork; the main
      process lists through a short-lived child, so they read through obstore);
      on request (``--loaders``), ``ucstage s3 local`` with the wrapper class
      defined inside a function (as in a notebook: it does not pickle), and
      ``ucstage s3 forkserver`` with the workers started from a forkserver;
    * ``platform``: ``databricks.air.data.UCVolumeDataset`` + its ``DataLoader``
      (the ``databricks-sdk-air`` package), which takes only ``/Volumes`` paths
      and a flat folder: the prefix is mounted with rclone at
      ``/Volumes/ucstage_bench/<set>/<run>``; it forces fork and persistent
      workers and caches each file under its own temporary folder;
    * ``litdata s3``: litData's ``StreamingRawDataset`` over a copy of the prefix
      (it writes its index file into the source prefix: the copy, made once with
      ``s5cmd cp`` on the server, is written to by the first, untimed run), with
      ``cache_files=True`` and ``item_type="path"``, over torch's DataLoader
      (persistent workers, ``prefetch_factor=4``; litData's own loader refuses
      this dataset);
    * ``plain``: a map-style dataset of the mounted paths + torch's DataLoader
      with torch's defaults (reads the mount every epoch, so only epoch 1 is timed;
      ``--plain-epochs`` times later ones too).

    The FUSE loaders all get the same kind of mount: a fresh read-only rclone
    mount of the prefix (the pinned rclone, ``--use-server-modtime``, no VFS
    cache). Later epochs: ``--epochs`` (10) back to back after epoch 1, timed
    together (a warm epoch of 0.08 s is noise-sized alone); ``later_s`` is their
    mean. The store's ceiling is measured in the same rounds: a bare obstore
    loop with 256 GETs in flight and ``s5cmd cp`` (``benchmarks.staging ceiling``),
    each a whole command into an empty folder; each loader's epoch 1 is also
    given as a fraction of the round's fastest of the two.

    Ratios are within a round (the other's seconds over ucstage's: above 1,
    ucstage is faster), median over the rounds.

        pip install -e '.[bench]'   # databricks-sdk-air, litdata, zstd (docs/benchmarks.md)
        scripts/remote-volume.sh --delay 20ms --rate 1gbit --small 3000x16K --large 1000x256K -- \\
            .venv/bin/python -m benchmarks.epochs loaders --pairs 3 [--json]
    """
    if args.one:
        print(json.dumps(one_run(args.one, args.src, args.workers[0], args.epochs, args.want)))
        sys.stdout.flush()
        os._exit(0)  # skip finalizing obstore's and litData's runtimes
    args.ceiling = () if args.no_ceiling else CEILING
    url, endpoint = remote_env("UCSTAGE_REMOTE_URL"), remote_env("AWS_ENDPOINT_URL")
    sets = args.sets.split(",")
    work = tempfile.mkdtemp(prefix="bench-loaders-")
    rows: list[dict[str, Any]] = []
    try:
        ctx: dict[str, Any] = {"url": url, "endpoint": endpoint, "work": work,
                               "files": {s: count_objects(f"{url}/{s}", endpoint)[0]
                                         for s in sets}, "litdata": {}}
        for label in sets:
            if "litdata s3" in args.loaders:
                ctx["litdata"][label] = litdata_copy(url, label, endpoint)
        for label in sets:  # untimed: bytecode, the server's page cache, litData's index
            for name in args.loaders:
                if name in ("ucstage s3", "litdata s3"):  # the variants share these
                    src = ctx["litdata"][label] if name == "litdata s3" else f"{url}/{label}"
                    loader_in_process(name, src, 2, 0, ctx["files"][label], work)
        for label in sets:
            for workers in args.workers:
                for rnd in range(args.pairs):
                    rows += one_round(label, label, workers, rnd, args, ctx)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summaries = {f"{label} w{w}": loaders_summary(rows, label, w)
                 for label in sets for w in args.workers}
    where = (f"{remote_server()} server, {os.environ.get('UCSTAGE_REMOTE_DELAY', '?')} RTT, "
             f"{os.environ.get('UCSTAGE_REMOTE_RATE', '?')}")
    text = f"remote volume: {where}; load average {os.getloadavg()[0]:.1f}" + loaders_markdown(
        summaries, ctx["files"], args.pairs)
    Report(SUITE, {**params_of(args), "volume": where}, rows,
           summaries).emit(args.json, text)
    return 0


# --- rss ----------------------------------------------------------------------

RSS_CHILD = r"""
import json, os, sys
import torch.utils.data as tud

def rss(pid):
    # (RSS, PSS) in MiB: PSS splits shared pages (the memory-mapped manifest,
    # the forked parent's pages) between the processes that map them.
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        found = {l.split(":")[0]: int(l.split()[1]) / 1024 for l in fh if l[:4] in ("Rss:", "Pss:")}
    return [found.get("Rss", 0.0), found.get("Pss", 0.0)]

kind, root, manifest = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "plain":
    class Paths(tud.IterableDataset):
        def __init__(self, paths):
            self.paths = paths
        def __iter__(self):
            info = tud.get_worker_info()
            k, w = (info.num_workers, info.id) if info else (1, 0)
            yield from self.paths[w::k]
    paths = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns)
    loader = tud.DataLoader(Paths(paths), batch_size=None, num_workers=2)
else:
    from ucstage import DataLoader, VolumeDataset
    ds = VolumeDataset(manifest, cache_dir=os.path.join(os.path.dirname(manifest), "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=2, log_mlflow=False)
it = iter(loader)
next(it)
workers = [w.pid for w in it._workers]
print(json.dumps({"main": rss(os.getpid()), "workers": [rss(p) for p in workers]}))
"""


def rss_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--dir", default="/tmp/ucstage-bench-rss")
    json_argument(ap)


def run_rss(args: argparse.Namespace) -> int:
    """RSS of a VolumeDataset + DataLoader(num_workers=2) over a 200,000-file
    manifest, against a plain torch DataLoader over the same paths, after the
    first item (issue 15's loader target).

        python -m benchmarks.epochs rss [--files 200000] [--dir /tmp/ucstage-bench-rss] [--json]

    Each side runs in its own fresh process; memory is read from /proc/<pid>/smaps_rollup
    (RSS and PSS, from smaps_rollup) of the main process and of each worker once the first batch arrived.
    The files are real (one byte each), written once and reused.
    """
    root = os.path.join(args.dir, "vol")
    if not os.path.isdir(root):
        for i in range(args.files):
            folder = os.path.join(root, f"d{i % 200:03d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"f{i:07d}.bin"), "wb") as fh:
                fh.write(b"x")
    manifest = os.path.join(args.dir, "train.manifest.arrow")
    if not os.path.exists(manifest):
        from ucstage.manifest import save, snapshot

        save(snapshot(root), manifest)
    out: dict[str, Any] = {}
    for kind in ("plain", "ucstage"):
        try:
            done = run_command([sys.executable, "-c", RSS_CHILD, kind, root, manifest],
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
        except CommandFailed as exc:
            sys.exit(f"{kind} failed: {exc}")
        out[kind] = json.loads(done.last_line)
    plain, ours = out["plain"], out["ucstage"]
    lines = [f"{args.files:,} files, DataLoader(num_workers=2), after the first item (MiB):",
             "| process | plain RSS | ucstage RSS | RSS diff | plain PSS | ucstage PSS "
             "| PSS diff |", "|---|---:|---:|---:|---:|---:|---:|"]
    rows = [("main", plain["main"], ours["main"])] + [
        (f"worker {i}", p, u) for i, (p, u) in
        enumerate(zip(plain["workers"], ours["workers"], strict=True))]
    results = []
    for name, p, u in rows:
        lines.append(f"| {name} | {p[0]:.0f} | {u[0]:.0f} | {u[0] - p[0]:+.0f} | {p[1]:.0f} | "
                     f"{u[1]:.0f} | {u[1] - p[1]:+.0f} |")
        results.append({"name": name, "plain_rss_mib": p[0], "ucstage_rss_mib": u[0],
                        "plain_pss_mib": p[1], "ucstage_pss_mib": u[1]})
    Report(SUITE, params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


# --- hold_cost ----------------------------------------------------------------

def per_file_us(src: str, cache_dir: str, cap: int | None, files: int, repeat: int) -> float:
    from ucstage import VolumeDataset
    from ucstage.cache import LocalCache

    cache = LocalCache(cache_dir, max_bytes=cap)
    paths = VolumeDataset(src, cache=cache, read_ahead=0)
    count = sum(1 for _ in paths)  # cold: copy everything once
    assert count == files
    return best_seconds(lambda: sum(1 for _ in paths), repeat) / files * 1e6


def hold_cost_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    json_argument(parser)


def run_hold_cost(args: argparse.Namespace) -> int:
    """What a VolumeDataset warm hit costs per file, with and without a byte cap.

    With a cap, each file a dataset hands out is held while its reader needs it
    (open + shared flock + fstat) and marked consumed when the reader moves on
    (futimens + close); the mark changes the file's ctime, so the next epoch's
    lookup reads its stamp again (getxattr). Without a cap nothing is held. Reads
    FILES small cached files through ``VolumeDataset(read_ahead=0)`` in this
    process, best of REPEAT epochs, in microseconds per file. Compare two commits
    with benchmarks.ab_compare:

        python -m benchmarks.epochs hold_cost [--files 3000] [--repeat 5] [--json]
        python -m benchmarks.ab_compare --base c3a3ebf epochs hold_cost
    """
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-hold-") as work:
        src = os.path.join(work, "src")
        write_files(src, args.files, 512, spread=0, vary=False)
        found = {"no_cap_us_per_file": per_file_us(src, os.path.join(work, "a"), None,
                                                   args.files, args.repeat),
                 "cap_us_per_file": per_file_us(src, os.path.join(work, "b"), 1 << 30,
                                                args.files, args.repeat)}
    text = (f"{args.files:,} cached files, best of {args.repeat} epochs: "
            f"{found['no_cap_us_per_file']:.1f} µs per file without a cap, "
            f"{found['cap_us_per_file']:.1f} µs with one")
    Report(SUITE, params_of(args), [], found).emit(args.json, text)
    return 0


# --- mix ----------------------------------------------------------------------

MIX_TARGET_US = 2.0


def mix_best(fn: object, repeat: int) -> Timing:
    """The run of ``repeat`` with the least CPU time."""
    runs = [time_call(fn)[1] for _ in range(repeat)]  # type: ignore[arg-type]
    return min(runs, key=lambda t: t.cpu_s)


def mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=5000, help="files per source")
    parser.add_argument("--repeat", type=int, default=3, help="epochs per run (best of)")
    pairs_argument(parser, default=5)
    json_argument(parser)


def run_mix(args: argparse.Namespace) -> int:
    """What ucstage.Mix adds per item over reading its sources directly.

    Two sources of FILES small cached files each (local folders, warm cache, no
    cap), read in this process: side ``sources`` iterates each VolumeDataset in
    turn, shuffled (a new epoch each run), side ``mix`` iterates ``Mix([a, b])``
    over the same sources (each once per epoch, so the same items, also in a
    permutation), the shares, passes and interleaving computed per epoch.
    Each run is the best of REPEAT epochs, by this process's CPU time (every
    read here is a cache hit in this thread, so CPU is the cost, and it moves
    less than wall time with the load of a shared machine; wall is reported
    too); the sides alternate over PAIRS pairs. The figure is the median over
    pairs of (mix - sources) / items, in microseconds per item (target: <= 2):

        python -m benchmarks.epochs mix [--files 5000] [--repeat 3] [--pairs 5] [--json]
    """
    from ucstage import Mix, VolumeDataset
    from ucstage.cache import LocalCache

    with tempfile.TemporaryDirectory(prefix="ucstage-bench-mix-") as work:
        cache = LocalCache(os.path.join(work, "cache"))
        parts = []
        for name in ("a", "b"):
            src = os.path.join(work, name)
            write_files(src, args.files, 256, spread=4, vary=False)
            parts.append(VolumeDataset(src, cache=cache, shuffle=True))
        mix = Mix(parts)
        items = 2 * args.files
        assert sum(1 for _ in mix) == items  # cold: copy everything once

        def direct() -> list[int]:
            for p in parts:
                p.set_epoch(p.epoch + 1)
            return [sum(1 for _ in p) for p in parts]

        def mixed() -> int:
            mix.set_epoch(mix.epoch + 1)
            return sum(1 for _ in mix)

        runs = alternate({"sources": lambda: mix_best(direct, args.repeat),
                          "mix": lambda: mix_best(mixed, args.repeat)}, args.pairs)
    c = Comparison([t.cpu_s for t in runs["sources"]], [t.cpu_s for t in runs["mix"]])
    wall = Comparison([t.wall_s for t in runs["sources"]], [t.wall_s for t in runs["mix"]])
    extra_us = [(m - s) / items * 1e6 for s, m in zip(c.a, c.b, strict=True)]
    wall_extra = [(m - s) / items * 1e6 for s, m in zip(wall.a, wall.b, strict=True)]
    found = {"sources_us_per_item": c.a_median / items * 1e6,
             "mix_us_per_item": c.b_median / items * 1e6,
             "mix_extra_us_per_item": statistics.median(extra_us),
             "wall_mix_extra_us_per_item": statistics.median(wall_extra),
             "ratio": c.median_pair_ratio, "target_us": MIX_TARGET_US,
             "met": statistics.median(extra_us) <= MIX_TARGET_US}
    text = (f"{items:,} cached items ({args.files:,} per source), median of {args.pairs} "
            f"alternating pairs (best of {args.repeat} epochs each, CPU): sources "
            f"{found['sources_us_per_item']:.2f} µs per item, mix "
            f"{found['mix_us_per_item']:.2f} µs, the mix adds "
            f"{found['mix_extra_us_per_item']:.2f} µs per item (target <= {MIX_TARGET_US}: "
            f"{'met' if found['met'] else 'missed'}), ratio {found['ratio']:.2f}x; "
            f"wall: adds {found['wall_mix_extra_us_per_item']:.2f} µs")
    rows = [{"name": f"pair{i}", "sources_cpu_s": s, "mix_cpu_s": m, "extra_us_per_item": e,
             "sources_wall_s": ws, "mix_wall_s": wm}
            for i, (s, m, e, ws, wm) in enumerate(zip(c.a, c.b, extra_us, wall.a, wall.b,
                                                      strict=True))]
    Report(SUITE, params_of(args), rows, found).emit(args.json, text)
    return 0


# --- profile ------------------------------------------------------------------

def drain(iterable: Any) -> int:
    count = 0
    for _ in iterable:
        count += 1
    return count


def read_all(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as fh:
            total += len(fh.read())
    return total


def best_us(step: Callable[[], Any], files: int, repeat: int, cpu: bool = False) -> float:
    """Best of ``repeat`` timed calls after one untimed one, in µs per file
    (of wall time, or with ``cpu`` of the process's CPU time)."""
    if not cpu:
        return best_seconds(step, repeat, warmup=True) / files * 1e6
    step()
    return min(time_call(step)[1].cpu_s for _ in range(repeat)) / files * 1e6


def profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cap", action="store_true", help="also time under a byte cap")
    parser.add_argument("--cprofile", default=None, help="profile this step instead")
    parser.add_argument("--cpu", action="store_true",
                        help="time each step's CPU (user + sys of the process), not its wall "
                             "time: steadier on a shared machine (the steps run in one thread)")
    json_argument(parser)


def run_profile(args: argparse.Namespace) -> int:
    """Where a warm epoch's time goes, per file, in one process.

    Writes FILES files of SIZE_KIB KiB, warms a ucstage cache with them, then
    times each step below as the best of REPEAT epochs (after one untimed epoch),
    in microseconds per file, at ``num_workers=0``:

    * open and read: the source files, the cached copies (a bare loop);
    * ``VolumeDataset`` iteration alone (paths only), and with every path opened
      and read (``ReadBytes``, no loader);
    * torch's ``DataLoader`` over the paths (map-style, the plain side of
      benchmarks.epochs warm), over an IterableDataset of the same paths (torch's
      iterable-dataset cost), and over the ``VolumeDataset``;
    * ucstage's ``DataLoader`` over the ``VolumeDataset``, with and without the
      audit; and with ``--cap``, the same under a byte cap (holds).

    ``--cpu`` times each step's CPU (user + sys) instead of its wall time.

    ``--cprofile STEP`` runs that step under cProfile instead and prints the top
    functions by own time.

        python -m benchmarks.epochs profile [--cpu] [--json]
        python -m benchmarks.epochs profile --cprofile ucstage-loader
    """
    from ucstage import DataLoader, LocalCache, VolumeDataset
    from ucstage.volumes import list_files

    size = args.size_kib * 1024
    with tempfile.TemporaryDirectory(prefix="ucstage-profile-warm-") as work:
        data = os.path.join(work, "data")
        write_files(data, args.files, size, vary=False)
        cache_dir = os.path.join(work, "cache")
        listing = list_files(data)
        LocalCache(cache_dir).warm(listing.volume, listing.entries)
        sources = [os.path.join(data, e.path) for e in listing.entries]
        vds = VolumeDataset(data, cache_dir=cache_dir)
        cached = list(vds)
        capped = VolumeDataset(data, cache_dir=cache_dir, max_bytes=4 * args.files * size)
        steps: dict[str, Callable[[], Any]] = {
            "read-sources": lambda: read_all(sources),
            "read-cached": lambda: read_all(cached),
            "vds": lambda: drain(vds),
            "vds-read": lambda: drain(ReadBytes(vds)),
            "torch-paths": lambda: drain(tud.DataLoader(RawPaths(sources), batch_size=None,
                                                        num_workers=0)),
            "torch-iterpaths": lambda: drain(tud.DataLoader(ReadBytes(IterPaths(sources)),
                                                            batch_size=None, num_workers=0)),
            "torch-itercached": lambda: drain(tud.DataLoader(ReadBytes(IterPaths(cached)),
                                                             batch_size=None, num_workers=0)),
            "torch-vds": lambda: drain(tud.DataLoader(ReadBytes(vds), batch_size=None,
                                                      num_workers=0)),
            "ucstage-loader": lambda: drain(DataLoader(ReadBytes(vds), batch_size=None,
                                                       num_workers=0)),
            "ucstage-loader-noaudit": lambda: drain(DataLoader(ReadBytes(vds), batch_size=None,
                                                               num_workers=0, audit=False)),
        }
        if args.cap:
            steps["vds-capped"] = lambda: drain(capped)
            steps["ucstage-loader-capped"] = lambda: drain(
                DataLoader(ReadBytes(capped), batch_size=None, num_workers=0))
        if args.cprofile:
            step = steps[args.cprofile]
            step()
            profiler = cProfile.Profile()
            profiler.enable()
            step()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return 0
        results = []
        for name, step in steps.items():
            us = best_us(step, args.files, args.repeat, args.cpu)
            results.append({"name": name, "us_per_file": us})
            print(f"{name:24s} {us:7.2f}", file=sys.stderr, flush=True)
    lines = [f"{args.files} files x {args.size_kib} KiB, page-cached, num_workers=0, "
             f"best of {args.repeat}, µs {'CPU' if args.cpu else 'wall'} per file"]
    lines += [f"{r['name']:24s} {r['us_per_file']:7.2f}" for r in results]
    Report(SUITE, params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


VARIANTS = {"throttled": (throttled_arguments, run_throttled),
            "warm": (warm_arguments, run_warm),
            "small_cache": (small_cache_arguments, run_small_cache),
            "cap_hits": (cap_hits_arguments, run_cap_hits),
            "lazy": (lazy_arguments, run_lazy),
            "loaders": (loaders_arguments, run_loaders),
            "rss": (rss_arguments, run_rss),
            "hold_cost": (hold_cost_arguments, run_hold_cost),
            "mix": (mix_arguments, run_mix),
            "profile": (profile_arguments, run_profile)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
