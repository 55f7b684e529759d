#!/usr/bin/env python
"""Benchmark: an epoch over a fully warm cache, VolumeDataset vs a plain torch DataLoader.

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

    python -m benchmarks.warm_epoch --pairs 5 [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch.utils.data as tud

from benchmarks.datasets import RawPaths, ReadBytes
from benchmarks.files import write_files
from benchmarks.pairs import Comparison, alternate, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from ucstage import DataLoader, LocalCache, VolumeDataset
from ucstage.volumes import list_files


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    pairs_argument(parser)
    parser.add_argument("--dir", default=None, help="where to write the files (default: /tmp)")
    json_argument(parser)
    args = parser.parse_args(argv)
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
    Report(benchmark_name(__file__), params_of(args), rows).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
