"""Shard planning at scale: 1,000,000 files over 1,024 slots.

Measures, in one process: building the listing entries, freezing a manifest
(fingerprint + save + load), planning (consistent and mismatched), summarising,
and the one-slot path (``--slot`` / VolumeDataset), with the peak RSS after
each step.

    python -m benchmarks.shard_plan [--files 1000000] [--world-size 128] [--num-workers 8] [--json]
"""

from __future__ import annotations

import argparse
import os
import tempfile

from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import Steps
from ucstage.manifest import Manifest, fingerprint, load, save
from ucstage.sharding import Layout, ReadOrder, Slot, shard_plan, slot_array
from ucstage.volumes import FileEntry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--world-size", type=int, default=128)
    ap.add_argument("--num-workers", type=int, default=8)
    json_argument(ap)
    args = ap.parse_args(argv)
    n, w, k = args.files, args.world_size, args.num_workers
    steps = Steps()
    entries = steps.time(f"build {n:,} entries", lambda: [
        FileEntry(f"part-{i // 1000:05d}/sample-{i:08d}.jpg", 100_000 + (i * 7919) % 50_000,
                  str(1_700_000_000.0 + i)) for i in range(n)])
    fp = steps.time("fingerprint", lambda: fingerprint(entries))
    m = Manifest(source="/Volumes/main/ml/train", entries=entries, fingerprint=fp)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.json")
        steps.time("manifest save", lambda: save(m, path))
        size = os.path.getsize(path)
        steps.time("manifest load + verify", lambda: load(path))
    sizes = [e.size for e in entries]
    order = ReadOrder(len(sizes))
    p = steps.time(f"plan {w}x{k} slots, listing order",
                   lambda: shard_plan(sizes, Layout(w, k), order, batch_size=32))
    steps.time("summary (spread, imbalance)", lambda: (p.files_per_slot(), p.imbalance))
    assert p.consistent and len(p.slots) == w * k
    p2 = steps.time(f"plan {w}x{k}, shuffled",
                    lambda: shard_plan(sizes, Layout(w, k),
                                       ReadOrder(len(sizes), shuffle=True, seed=1)))
    assert p2.consistent
    mixed = [k if r % 2 else k - 2 for r in range(w)]
    p3 = steps.time("plan with mismatched num_workers",
                    lambda: shard_plan(sizes, Layout(w, mixed), order))
    steps.time("one slot (--slot / VolumeDataset)",
               lambda: slot_array(ReadOrder(n), Layout(w, k), Slot(w - 1, k - 1)).tolist())
    summary = {"peak_rss_mib": max(r["peak_rss_mib"] for r in steps.rows),
               "manifest_mib": size / 2**20, "slots": w * k,
               "mismatch_duplicated": len(p3.duplicated), "mismatch_skipped": len(p3.skipped)}
    text = (f"files={n:,} slots={w * k} manifest={size / 2**20:.1f} MiB "
            f"mismatch: {len(p3.duplicated):,} duplicated, {len(p3.skipped):,} skipped\n"
            + steps.markdown())
    Report(benchmark_name(__file__), params_of(args), steps.rows, summary).emit(args.json, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
