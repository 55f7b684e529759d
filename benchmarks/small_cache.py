#!/usr/bin/env python
"""Benchmark: 3 epochs through a cache smaller than the dataset, over a throttled FUSE volume.

Writes FILES files into a temp folder and mounts it read-only with rclone
``--bwlimit`` (the throttle of benchmarks.loader: one token bucket for
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

    python -m benchmarks.small_cache                  # ~3 min
    python -m benchmarks.small_cache --files 200 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.utils.data as tud

from benchmarks.datasets import RawPaths, ReadBytes
from benchmarks.files import write_files
from benchmarks.pairs import order
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.volumes import throttled_mount
from ucstage import DataLoader, VolumeDataset
from ucstage.cache import LocalCache, policy

EPOCHS = 3
CAPS = (0.25, 0.5, 1.0)


def _lru_mark(file: int | str, mtime_ns: int) -> None:
    """Consumption recorded as an ordinary hand-out: eviction goes LRU."""
    os.utime(file, ns=(time.time_ns(), mtime_ns))


def cached(mnt: str, work: str, cap: int, workers: int, lru: bool,
           shuffle: bool) -> list[dict[str, float]]:
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


def run(args: argparse.Namespace, work: str) -> dict[str, Any]:
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


def table(results: dict[str, Any]) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--size-kib", type=int, default=64)
    parser.add_argument("--bwlimit", default="16M", help="rclone --bwlimit (bytes/s)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--order", choices=["shuffled", "in-order"], default="shuffled",
                        help="a new permutation each epoch, or listing order")
    json_argument(parser)
    args = parser.parse_args(argv)
    if not shutil.which("rclone"):
        print("rclone is not installed", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-small-cache-") as work:
        results = run(args, work)
    rounds = results["rounds"]
    rows = []
    for name in rounds[0]:
        for e in range(EPOCHS):
            rows.append({"name": f"{name} epoch {e + 1}", "loader": name, "epoch": e + 1,
                         **{key: statistics.median(r[name][e].get(key, 0.0) for r in rounds)
                            for key in ("files_per_s", "hit_rate", "cache_wait_s")}})
    text = (f"{args.files} files x {args.size_kib} KiB, rclone FUSE mount --bwlimit "
            f"{args.bwlimit}, num_workers={args.workers}, {args.order}, {args.rounds} rounds\n"
            + table(results))
    Report(benchmark_name(__file__), params_of(args), rows, {"rounds": rounds}).emit(
        args.json, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
