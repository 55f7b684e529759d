#!/usr/bin/env python3
"""Node vs global shuffle scope: the network forecast and what each scope costs to plan.

1. The forecast on the issue's setup (4,000 files, -w 16 -k 4, 8 ranks per
   node, seed 1, 3 epochs): per epoch, the share of node 0's reads that it did
   not read before, and the share of the dataset node 0 has needed.
2. Planning 1,000,000 files over 128 x 8 slots (16 nodes of 8 ranks), and one
   slot, under each scope: alternating global and node, median of the pairs.

    .venv/bin/python scripts/bench_shuffle_scope.py [--files 1000000] [--pairs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ucstage.sharding import Layout, ReadOrder, forecast, plan, slot_files


def issue_forecast() -> None:
    sizes = np.full(4000, 1000, dtype=np.int64)
    print("Forecast, 4,000 files, -w 16 -k 4, 8 ranks per node, seed 1, 3 epochs:")
    print("| scope | epoch | node 0 reads not read before | node 0 has needed | job fetches |")
    print("|---|---:|---:|---:|---:|")
    for scope in ("global", "node"):
        f = forecast(sizes, Layout(16, 4, 8), ReadOrder(len(sizes), shuffle=True, seed=1,
                                                        shuffle_scope=scope), epochs=3)
        needed = 0
        for row in (r for r in f.rows if r.node == 0):
            needed += row.new_files
            print(f"| {scope} | {row.epoch} | {row.new_files / row.files:.0%} | "
                  f"{needed / 4000:.0%} of the files | {f.epoch_new(row.epoch)[0]:,} |")


def timed(fn, scope: str) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    fn(scope)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    issue_forecast()
    sizes = np.arange(args.files, dtype=np.int64) % 100_000
    runs = {
        "plan 128x8, shuffled": lambda scope: plan(
            sizes, world_size=128, num_workers=8, shuffle=True, seed=1, epoch=2,
            shuffle_scope=scope, nproc_per_node=8),
        "one slot (rank 77, worker 5)": lambda scope: slot_files(
            args.files, rank=77, world_size=128, num_workers=8, worker=5, shuffle=True, seed=1,
            epoch=2, shuffle_scope=scope, nproc_per_node=8),
    }
    print(f"\n{args.files:,} files, 128 ranks x 8 workers, 16 nodes; median of "
          f"{args.pairs} alternating pairs, seconds:")
    print("| step | global | node | node/global |")
    print("|---|---:|---:|---:|")
    for label, fn in runs.items():
        times: dict[str, list[float]] = {"global": [], "node": []}
        for _ in range(args.pairs):
            for scope in ("global", "node"):
                times[scope].append(timed(fn, scope))
        g, n = statistics.median(times["global"]), statistics.median(times["node"])
        print(f"| {label} | {g:.4g} | {n:.4g} | {n / g:.2f} |")


if __name__ == "__main__":
    main()
