#!/usr/bin/env python
"""Benchmark: ucstage's DataLoader vs a plain torch DataLoader over a throttled FUSE volume.

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

    python -m benchmarks.loader                 # bandwidth-bound, ~40 s
    python -m benchmarks.loader --mode latency --files 120 --no-mlflow
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import torch.utils.data as tud

from benchmarks.datasets import RawPaths, ReadBytes
from benchmarks.files import write_files
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.volumes import throttled_mount
from ucstage import DataLoader, VolumeDataset


def epoch(loader: Any, n_files: int) -> float:
    start = time.perf_counter()
    count = sum(1 for _ in loader)
    elapsed = time.perf_counter() - start
    if count != n_files:
        raise RuntimeError(f"read {count} files, expected {n_files}")
    return n_files / elapsed


def run(args: argparse.Namespace, work: str) -> dict[str, Any]:
    backing = os.path.join(work, "backing")
    write_files(backing, args.files, args.size_kib * 1024)
    results: dict[str, Any] = {"files": args.files, "size_kib": args.size_kib,
                               "mode": args.mode, "throttle": throttle(args), "runs": []}
    with throttled_mount(backing, os.path.join(work, "mnt"), args.mode, args.bwlimit,
                         args.delay_ms) as mnt:
        raw = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(mnt) for f in fs)
        for k in args.workers:
            plain = tud.DataLoader(RawPaths(raw), batch_size=None, num_workers=k,
                                   prefetch_factor=4 if k else None)
            row = {"loader": "plain torch", "num_workers": k,
                   "epoch1": epoch(plain, args.files), "epoch2": epoch(plain, args.files)}
            results["runs"].append(row)
            cache_dir = os.path.join(work, f"cache-k{k}")
            paths = VolumeDataset(mnt, cache_dir=cache_dir, read_ahead=args.read_ahead)
            ours = DataLoader(ReadBytes(paths), batch_size=None, num_workers=k)
            row = {"loader": "ucstage", "num_workers": k,
                   "epoch1": epoch(ours, args.files), "epoch2": epoch(ours, args.files)}
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


def throttle(args: argparse.Namespace) -> str:
    if args.mode == "bwlimit":
        return f"rclone FUSE mount, --bwlimit {args.bwlimit}"
    return (f"rclone FUSE mount of `rclone serve http` through a {args.delay_ms:g} ms "
            "each-way delay proxy")


def table(results: dict[str, Any]) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)
    if not shutil.which("rclone"):
        print("rclone is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-loader-") as work:
        results = run(args, work)
    lines = [f"{args.files} files x {args.size_kib} KiB; {throttle(args)}", table(results)]
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
    Report(benchmark_name(__file__), {**params_of(args), "throttle": throttle(args)}, rows,
           summary).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
