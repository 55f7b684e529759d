#!/usr/bin/env python3
"""Reproduce docs/benchmarks.md "Resume and the audit": what resuming and
auditing an epoch cost.

    python -m benchmarks.resume [--files 1000000] [--loader-files 4000] [--json]

* The re-split rule at scale: ``resume_slots`` for a shuffled epoch of
  ``--files`` files saved on 16 x 4 slots, resumed on 24 x 3 (a re-split) and
  on 16 x 4 (each slot continues); each process of the new job computes this
  once when its iteration starts. Median of 3.
* The state's size in JSON for that job.
* The audit's epoch-end work on one rank for ``--files`` files: the payload
  (bitmap and duplicates) and the count over 8 such payloads. Median of 3.
* The loader with and without the audit: a ucstage DataLoader (num_workers=0,
  batch 8) over ``--loader-files`` small local files, warm cache, alternating
  audit on and off, median of 3 pairs (seconds per epoch).

Prints a Markdown section.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

import numpy as np

from benchmarks.files import write_files
from benchmarks.pairs import Comparison, alternate
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import median_seconds as timed
from benchmarks.timing import time_call
from ucstage.resume import LoaderState
from ucstage.sharding import Layout, ReadOrder, Segment, resume_slots
from ucstage.sharding.resplit import EpochOrder


def resplit(n: int) -> dict[str, float]:
    order = EpochOrder(n, shuffle=True, seed=1, epoch=0)
    saved = Segment(Layout(16, 4), tuple(n // 200 + s for s in range(64)))
    return {
        "resplit_s": timed(lambda: resume_slots(order, [saved], Layout(24, 3))),
        "continue_s": timed(lambda: resume_slots(order, [saved], Layout(16, 4))),
        "state_bytes": len(json.dumps(LoaderState(
            "0" * 64, ReadOrder(n, shuffle=True, seed=1, epoch=0, shuffle_scope="global"),
            (saved,)).to_dict())),
    }


def audit_cost(n: int) -> dict[str, float]:
    counts = np.ones(n, dtype=np.uint16)
    counts[::1000] = 2

    def payload() -> tuple[bytes, dict[int, int]]:
        extra = np.flatnonzero(counts > 1)
        return (np.packbits(counts > 0).tobytes(),
                {int(i): int(counts[i]) - 1 for i in extra})

    made = payload()

    def count() -> None:
        total = np.zeros(n, dtype=np.int64)
        for _ in range(8):
            total += np.unpackbits(np.frombuffer(made[0], dtype=np.uint8), count=n)
            for i, extra in made[1].items():
                total[i] += extra

    return {"payload_s": timed(payload), "count8_s": timed(count),
            "payload_bytes": len(made[0])}


def loader_cost(files: int) -> dict[str, float]:
    from torch.utils.data import IterableDataset

    from ucstage.data import DataLoader, VolumeDataset

    class Read(IterableDataset):  # type: ignore[type-arg]
        def __init__(self, paths: VolumeDataset) -> None:
            self.paths = paths

        def __iter__(self) -> Iterator[int]:
            for p in self.paths:
                with open(p, "rb") as fh:
                    yield len(fh.read())

    with tempfile.TemporaryDirectory(prefix="ucstage-bench-resume-") as work:
        root = os.path.join(work, "src")
        write_files(root, files, 64, spread=0, vary=False, name="f{i:06d}.bin")
        paths = VolumeDataset(root, cache_dir=os.path.join(work, "cache"), read_ahead=0)
        loaders = {on: DataLoader(Read(paths), batch_size=8, num_workers=0, audit=on,
                                  log_mlflow=False) for on in (True, False)}
        sum(len(b) for b in loaders[False])  # warm the cache

        def epoch(on: bool) -> Callable[[], float]:
            return lambda: time_call(lambda: sum(len(b) for b in loaders[on]))[1].wall_s

        times = alternate({"on": epoch(True), "off": epoch(False)}, 3)
    c = Comparison(times["off"], times["on"])
    return {"audit_on_s": c.b_median, "audit_off_s": c.a_median,
            "on_over_off": c.median_pair_ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--loader-files", type=int, default=4000)
    json_argument(parser)
    args = parser.parse_args(argv)
    r, a, lo = resplit(args.files), audit_cost(args.files), loader_cost(args.loader_files)
    per_batch = (lo["audit_on_s"] - lo["audit_off_s"]) / (args.loader_files / 8) * 1e6
    lines = [
        f"| {args.files:,} files, saved on 16 x 4 | median of 3 |",
        "|---|---|",
        f"| re-split onto 24 x 3 (`resume_slots`) | {r['resplit_s']:.3f} s |",
        f"| continue on 16 x 4 | {r['continue_s']:.3f} s |",
        f"| state, JSON | {r['state_bytes']:,} bytes |",
        f"| audit payload per rank (bitmap) | {a['payload_bytes']:,} bytes, "
        f"{a['payload_s'] * 1000:.1f} ms to build |",
        f"| audit count over 8 ranks' payloads | {a['count8_s'] * 1000:.1f} ms |",
        "",
        f"| DataLoader epoch, {args.loader_files:,} files, batch 8, num_workers=0 "
        "| seconds (median of 3 alternating pairs) |",
        "|---|---|",
        f"| audit on | {lo['audit_on_s']:.3f} |",
        f"| audit off | {lo['audit_off_s']:.3f} |",
        f"| difference per batch | {per_batch:.0f} µs |",
    ]
    results = [{"name": "resplit", **r}, {"name": "audit", **a}, {"name": "loader", **lo}]
    Report(benchmark_name(__file__), params_of(args), results,
           {"audit_us_per_batch": per_batch}).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
