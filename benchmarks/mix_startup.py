"""Benchmark: a Mix epoch's start-up (its interleaving, items and passes) per item.

Before a Mix hands out its first item, each slot computes what its positions
read: the source, the item and the pass (``MixOrder.take``, which
``Mix.__iter__`` calls on the slot's positions). Here the whole epoch is
taken at once (every slot's share), for the cases of issue 28:

* ``one-file-half``: a 1-file source at half of a 200,000-item epoch (the
  file repeats 100,000 times, one pass each);
* ``two-files-half``: the same with a 2-file source (50,000 real permutations);
* ``million-small``: 1,000,000 items and a 100-file source, weights 0.7/0.3
  (the small source repeats 4,286 times).

Each case is the median of RUNS runs by this process's CPU time (pure
arithmetic: CPU is the cost, and moves less than wall time on a shared
machine), in microseconds per item of the epoch (target: <= 2):

    python -m benchmarks.mix_startup [--runs 3] [--scale 1.0] [--json]
"""

from __future__ import annotations

import argparse
import functools
import statistics

import numpy as np

from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import time_call
from ucstage.sharding.mixing import MixOrder, MixShares, mix_shares

TARGET_US = 2.0
CASES = {  # name: (sizes, weights, epoch_size)
    "one-file-half": ([1, 200_000], [0.5, 0.5], 200_000),
    "two-files-half": ([2, 200_000], [0.5, 0.5], 200_000),
    "million-small": ([1_000_000, 100], [0.7, 0.3], None),
}


def start(shares: MixShares, epoch: int, slots: int) -> int:
    """One epoch's start-up over every slot: what each position reads."""
    order = MixOrder(shares, seed=0, epoch=epoch, slots=slots)
    src, _, _ = order.take(np.arange(order.n, dtype=np.int64))
    return len(src)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the large sizes and epoch sizes (0.01 for a quick look)")
    parser.add_argument("--slots", type=int, default=8, help="the layout's slots")
    json_argument(parser)
    args = parser.parse_args(argv)
    rows: list[dict[str, object]] = []
    for name, (sizes, weights, epoch_size) in CASES.items():
        sizes = [max(1, int(n * args.scale)) if n > 1000 else n for n in sizes]
        if epoch_size is not None:
            epoch_size = max(1, int(epoch_size * args.scale))
        shares = mix_shares(sizes, weights, epoch_size=epoch_size)
        runs = []
        for epoch in range(args.runs):
            taken, timing = time_call(functools.partial(start, shares, epoch, args.slots))
            assert taken == shares.epoch_size
            runs.append(timing)
        cpu = statistics.median(t.cpu_s for t in runs)
        passes = max(shares.passes(i) for i in range(len(sizes)))
        rows.append({"name": name, "items": shares.epoch_size, "counts": list(shares.counts),
                     "max_passes": passes, "cpu_s": cpu,
                     "wall_s": statistics.median(t.wall_s for t in runs),
                     "us_per_item": cpu / shares.epoch_size * 1e6})
    worst = max(float(r["us_per_item"]) for r in rows)  # type: ignore[arg-type]
    found = {"worst_us_per_item": worst, "target_us": TARGET_US, "met": worst <= TARGET_US}
    lines = [f"| {r['name']} | {r['items']:,} | {r['max_passes']:,.0f} | {r['cpu_s']:.3f} | "
             f"{r['us_per_item']:.2f} |" for r in rows]
    text = "\n".join(["| case | items | passes of the small source | CPU s | µs per item |",
                      "|---|---|---|---|---|", *lines, "",
                      f"worst {worst:.2f} µs per item (target <= {TARGET_US}: "
                      f"{'met' if found['met'] else 'missed'}), median of {args.runs} runs"])
    Report(benchmark_name(__file__), params_of(args), rows, found).emit(args.json, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
