#!/usr/bin/env python
"""Benchmark: an epoch over a fully warm cache, VolumeDataset vs a plain torch DataLoader.

Writes FILES files of SIZE_KIB KiB into a local folder (read once, so their
pages are cached), warms a ucstage cache with them, then for each
num_workers alternates, PAIRS times:

* plain: ``torch.utils.data.DataLoader`` (torch's defaults) over a map-style
  dataset of the local files' paths, each item opened and read whole;
* ucstage: ``ucstage.DataLoader`` (ucstage's defaults) over an IterableDataset
  that opens and reads whole every path a ``VolumeDataset`` of the folder
  yields (its cached copies);

each in a fresh loader, timing the *second* epoch in the process (the first
warms the interpreter, the workers' imports and the stamp memo). Prints files/s
per run, the median per side and the median of the per-pair ratios
ucstage / plain.

    .venv/bin/python scripts/bench_warm_epoch.py --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch.utils.data as tud
from read_datasets import RawPaths, ReadBytes

from ucstage import DataLoader, LocalCache, VolumeDataset, list_files


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


def make(folder: str, files: int, size: int) -> list[str]:
    payload = os.urandom(size)
    paths = []
    for i in range(files):
        sub = os.path.join(folder, f"part{i % 8}")
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, f"f{i:05d}.bin")
        with open(path, "wb") as fh:
            fh.write(payload[i % 997:] + payload[:i % 997])
        paths.append(path)
    return sorted(paths)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write the files (default: /tmp)")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    size = args.size_kib * 1024
    results: dict[str, Any] = {"files": args.files, "size_kib": args.size_kib, "runs": []}
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-warm-", dir=args.dir) as work:
        data = os.path.join(work, "data")
        paths = make(data, args.files, size)
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
            for pair in range(args.pairs):
                order = ["plain", "ucstage"] if pair % 2 == 0 else ["ucstage", "plain"]
                row: dict[str, Any] = {"num_workers": k, "pair": pair}
                for side in order:
                    if side == "plain":
                        loader: Any = tud.DataLoader(RawPaths(paths), batch_size=None,
                                                     num_workers=k)
                    else:
                        loader = DataLoader(ReadBytes(VolumeDataset(data, cache_dir=cache_dir)),
                                            batch_size=None, num_workers=k)
                    row[side] = second_epoch(loader, args.files, size)
                row["ratio"] = row["ucstage"] / row["plain"]
                results["runs"].append(row)
                print(f"num_workers={k} pair {pair + 1}: plain {row['plain']:,.0f} files/s, "
                      f"ucstage {row['ucstage']:,.0f} files/s, {row['ratio']:.2f}x",
                      file=sys.stderr)
    print(f"{args.files} files x {args.size_kib} KiB, page-cached, second epoch in the "
          f"process, {args.pairs} alternating pairs per num_workers")
    print("| num_workers | plain torch files/s (median) | ucstage files/s (median) | "
          "ucstage / plain (median of pairs) | pairs |")
    print("|---:|---:|---:|---:|---|")
    for k in args.workers:
        rows = [r for r in results["runs"] if r["num_workers"] == k]
        med = {s: statistics.median(r[s] for r in rows) for s in ("plain", "ucstage", "ratio")}
        ratios = ", ".join(f"{r['ratio']:.2f}x" for r in rows)
        print(f"| {k} | {med['plain']:,.0f} | {med['ucstage']:,.0f} | {med['ratio']:.2f}x "
              f"| {ratios} |")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
