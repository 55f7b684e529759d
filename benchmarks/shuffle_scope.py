#!/usr/bin/env python3
"""Node vs global shuffle scope: the network forecast and what each scope costs to plan.

1. The forecast on the issue's setup (4,000 files, -w 16 -k 4, 8 ranks per
   node, seed 1, 3 epochs): per epoch, the share of node 0's reads that it did
   not read before, and the share of the dataset node 0 has needed.
2. Planning 1,000,000 files over 128 x 8 slots (16 nodes of 8 ranks), and one
   slot, under each scope: alternating global and node, median of the pairs.

    python -m benchmarks.shuffle_scope [--files 1000000] [--pairs 3] [--json]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.pairs import Comparison, alternate, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import time_call
from ucstage.sharding import Layout, ReadOrder, Slot, forecast, shard_plan, slot_array


def issue_forecast(lines: list[str]) -> list[dict[str, Any]]:
    sizes = np.full(4000, 1000, dtype=np.int64)
    lines.append("Forecast, 4,000 files, -w 16 -k 4, 8 ranks per node, seed 1, 3 epochs:")
    lines.append("| scope | epoch | node 0 reads not read before | node 0 has needed "
                 "| job fetches |")
    lines.append("|---|---:|---:|---:|---:|")
    rows = []
    for scope in ("global", "node"):
        f = forecast(sizes, Layout(16, 4, 8), ReadOrder(len(sizes), shuffle=True, seed=1,
                                                        shuffle_scope=scope), epochs=3)
        needed = 0
        for row in (r for r in f.rows if r.node == 0):
            needed += row.new_files
            fetches = f.epoch_new(row.epoch)[0]
            lines.append(f"| {scope} | {row.epoch} | {row.new_files / row.files:.0%} | "
                         f"{needed / 4000:.0%} of the files | {fetches:,} |")
            rows.append({"name": f"forecast {scope} epoch {row.epoch}",
                         "node0_new_share": row.new_files / row.files,
                         "node0_needed_share": needed / 4000, "job_fetches": fetches})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    pairs_argument(ap)
    json_argument(ap)
    args = ap.parse_args(argv)
    lines: list[str] = []
    results = issue_forecast(lines)
    sizes = np.arange(args.files, dtype=np.int64) % 100_000
    runs: dict[str, Callable[[str], object]] = {
        "plan 128x8, shuffled": lambda scope: shard_plan(
            sizes, Layout(128, 8, 8),
            ReadOrder(len(sizes), shuffle=True, seed=1, epoch=2, shuffle_scope=scope)),
        "one slot (rank 77, worker 5)": lambda scope: slot_array(
            ReadOrder(args.files, shuffle=True, seed=1, epoch=2, shuffle_scope=scope),
            Layout(128, 8, 8), Slot(77, 5)).tolist(),
    }
    lines += [f"\n{args.files:,} files, 128 ranks x 8 workers, 16 nodes; median of "
              f"{args.pairs} alternating pairs, seconds:",
              "| step | global | node | node/global |", "|---|---:|---:|---:|"]

    def side(fn: Callable[[str], object], scope: str) -> Callable[[], float]:
        return lambda: time_call(lambda: fn(scope))[1].wall_s

    for label, fn in runs.items():
        times = alternate({scope: side(fn, scope) for scope in ("global", "node")}, args.pairs)
        c = Comparison(times["global"], times["node"])
        lines.append(f"| {label} | {c.a_median:.4g} | {c.b_median:.4g} | {c.ratio:.2f} |")
        results.append({"name": label, "global_s": c.a_median, "node_s": c.b_median,
                        "node_over_global": c.ratio, "pair_ratios": c.pair_ratios})
    Report(benchmark_name(__file__), params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
