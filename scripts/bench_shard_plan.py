#!/usr/bin/env python3
"""Shard planning at scale: 1,000,000 files over 1,024 slots.

Measures, in one process: building the listing entries, freezing a manifest
(fingerprint + save + load), planning (consistent and mismatched), summarising,
and the `--slot` path, with peak RSS. Prints a Markdown table.

    .venv/bin/python scripts/bench_shard_plan.py [--files 1000000] [--world-size 128] [--num-workers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time

from ucstage.manifest import Manifest, fingerprint, load, save
from ucstage.sharding import plan, slot_files
from ucstage.volumes import FileEntry


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, rows: list, fn):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = fn()
    rows.append((label, time.perf_counter() - start, rss_mib()))
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=128)
    ap.add_argument("--num-workers", type=int, default=8)
    ap.add_argument("--json", dest="json_out", default=None,
                    help="also write {step: seconds} and the peak RSS to this file")
    args = ap.parse_args()
    n, w, k = args.files, args.world_size, args.num_workers
    rows: list = []
    entries = timed("build 1M entries", rows, lambda: [
        FileEntry(f"part-{i // 1000:05d}/sample-{i:08d}.jpg", 100_000 + (i * 7919) % 50_000,
                  str(1_700_000_000.0 + i)) for i in range(n)])
    fp = timed("fingerprint", rows, lambda: fingerprint(entries))
    m = Manifest(source="/Volumes/main/ml/train", entries=entries, fingerprint=fp)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.json")
        timed("manifest save", rows, lambda: save(m, path))
        size = os.path.getsize(path)
        timed("manifest load + verify", rows, lambda: load(path))
    sizes = [e.size for e in entries]
    p = timed(f"plan {w}x{k} slots, listing order", rows,
              lambda: plan(sizes, world_size=w, num_workers=k, batch_size=32))
    timed("summary (spread, imbalance)", rows, lambda: (p.files_per_slot(), p.imbalance))
    assert p.consistent and len(p.slots) == w * k
    p2 = timed(f"plan {w}x{k}, shuffled", rows,
               lambda: plan(sizes, world_size=w, num_workers=k, shuffle=True, seed=1))
    assert p2.consistent
    mixed = [k if r % 2 else k - 2 for r in range(w)]
    p3 = timed("plan with mismatched num_workers", rows,
               lambda: plan(sizes, world_size=w, num_workers=mixed))
    timed("one slot (--slot / VolumeDataset)", rows,
          lambda: slot_files(n, rank=w - 1, world_size=w, num_workers=k, worker=k - 1))
    print(f"files={n:,} slots={w * k} manifest={size / 2**20:.1f} MiB "
          f"mismatch: {len(p3.duplicated):,} duplicated, {len(p3.skipped):,} skipped")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"seconds": {label: secs for label, secs, _ in rows},
                       "peak_rss_mib": max(rss for _, _, rss in rows)}, fh, indent=2)
    print("| step | seconds | peak RSS MiB |\n|---|---:|---:|")
    for label, secs, rss in rows:
        print(f"| {label} | {secs:.2f} | {rss:.0f} |")


if __name__ == "__main__":
    main()
