#!/usr/bin/env python3
"""Issue 29's compact-batch target: what a TableDataset batch weighs once it
crossed from a DataLoader worker, and the main process's RSS over an epoch
whose batches the loop keeps, for several row-group sizes.

    python -m benchmarks.table_batch_rss [--rows 100000] [--row-groups 5000,50000] \\
        [--batch-rows 1000] [--workers 2] [--order shuffled|file] \\
        [--dir /tmp/ucstage-bench-batch-rss] [--json]

One table per row-group size (the same rows: ``id``, a float, 8 floats, a
string; about 56 bytes a row), each read in a fresh process:
``format="arrow"``, ``batch_rows``, shuffled, ``DataLoader(num_workers=2)``
(``--order file`` and ``--workers 0`` for the in-process case, where a batch
is a slice of a row group), over a cache warmed by a run before.
The main process keeps every batch (a loop that collects its outputs) and
reads its RSS from /proc/self/status after the first batch and after the
last; each batch's pickled size is compared with its rows' bytes
(``RecordBatch.nbytes``). Targets: pickled <= 1.2x the rows' bytes; RSS
growth over the epoch independent of the row-group size (about the rows kept).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command

CHILD = r"""
import json, os, pickle, statistics, sys, time
from ucstage import DataLoader, TableDataset

def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) / 1024

folder, cache, batch_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
workers, shuffle = int(sys.argv[4]), sys.argv[5] == "shuffled"
ds = TableDataset(folder, batch_rows=batch_rows, format="arrow", shuffle=shuffle, cache_dir=cache)
if sys.argv[6] == "warm":  # a run of its own, so the measured one starts afresh
    for _ in DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False):
        pass
    print("{}")
    sys.exit(0)
loader = DataLoader(ds, batch_size=None, num_workers=workers, log_mlflow=False)
it = iter(loader)
kept = [next(it)]
start = rss()  # the workers started, the first window decoded
t0 = time.perf_counter()
kept += it
seconds = time.perf_counter() - t0
end = rss()
ratio = [len(pickle.dumps(b)) / b.nbytes for b in kept]
print(json.dumps({"rss_start_mib": start, "rss_end_mib": end, "epoch_s": seconds,
                  "kept_mib": sum(b.nbytes for b in kept) / 2**20, "batches": len(kept),
                  "pickled_ratio_median": statistics.median(ratio),
                  "pickled_ratio_max": max(ratio)}))
"""


def _write(folder: str, rows: int, group_rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.isdir(folder):
        return
    os.makedirs(folder + ".tmp", exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids.astype(np.float32),
                      "v": pa.FixedSizeListArray.from_arrays(
                          pa.array(np.repeat(ids, 8).astype(np.float32)), 8),
                      "s": pa.array([f"row{i}" for i in ids])})
    pq.write_table(table, os.path.join(folder + ".tmp", "part-0.parquet"),
                   row_group_size=group_rows)
    os.rename(folder + ".tmp", folder)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--row-groups", default="5000,50000",
                    help="rows per row group, one table each (comma-separated)")
    ap.add_argument("--batch-rows", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--order", choices=("shuffled", "file"), default="shuffled")
    ap.add_argument("--dir", default="/tmp/ucstage-bench-batch-rss")
    json_argument(ap)
    args = ap.parse_args(argv)
    results: list[dict[str, Any]] = []
    lines = [f"{args.rows:,} rows, batches of {args.batch_rows:,}, {args.order} order, "
             f"format=arrow, DataLoader(num_workers={args.workers}), every batch kept:",
             "| rows per row group | batches | rows kept (MiB) | main RSS growth (MiB) "
             "| pickled / rows' bytes (median, max) | epoch after the first batch (s) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for group_rows in (int(x) for x in args.row_groups.split(",")):
        folder = os.path.join(args.dir, f"t{args.rows}-{group_rows}")
        _write(folder, args.rows, group_rows)
        cache = os.path.join(args.dir, "cache")
        try:
            for mode in ("warm", "measure"):
                done = run_command([sys.executable, "-c", CHILD, folder, cache,
                                    str(args.batch_rows), str(args.workers), args.order, mode],
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        except CommandFailed as exc:
            sys.exit(f"row groups of {group_rows}: {exc}")
        got = json.loads(done.last_line)
        growth = got["rss_end_mib"] - got["rss_start_mib"]
        results.append({"name": f"row groups of {group_rows}", "row_group_rows": group_rows,
                        "rss_growth_mib": growth, **got})
        lines.append(f"| {group_rows:,} | {got['batches']:,} | {got['kept_mib']:.1f} | "
                     f"{growth:.1f} | {got['pickled_ratio_median']:.3f}, "
                     f"{got['pickled_ratio_max']:.3f} | {got['epoch_s']:.2f} |")
    growths = [r["rss_growth_mib"] for r in results]
    summary = {"rss_growth_spread_mib": max(growths) - min(growths),
               "pickled_ratio_max": max(r["pickled_ratio_max"] for r in results)}
    Report(benchmark_name(__file__), params_of(args), results, summary).emit(
        args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
