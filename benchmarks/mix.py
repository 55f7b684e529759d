"""Benchmark: what ucstage.Mix adds per item over reading its sources directly.

Two sources of FILES small cached files each (local folders, warm cache, no
cap), read in this process: side ``sources`` iterates each VolumeDataset in
turn, shuffled (a new epoch each run), side ``mix`` iterates ``Mix([a, b])``
over the same sources (each once per epoch, so the same items, also in a
permutation), the shares, passes and interleaving computed per epoch.
Each run is the best of REPEAT epochs, by this process's CPU time (every
read here is a cache hit in this thread, so CPU is the cost, and it moves
less than wall time with the load of a shared machine; wall is reported
too); the sides alternate over PAIRS pairs. The figure is the median over
pairs of (mix - sources) / items, in microseconds per item (target: <= 2):

    python -m benchmarks.mix [--files 5000] [--repeat 3] [--pairs 5] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from benchmarks.files import write_files
from benchmarks.pairs import Comparison, alternate, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import Timing, time_call
from ucstage import Mix, VolumeDataset
from ucstage.cache import LocalCache

TARGET_US = 2.0


def best(fn: object, repeat: int) -> Timing:
    """The run of ``repeat`` with the least CPU time."""
    runs = [time_call(fn)[1] for _ in range(repeat)]  # type: ignore[arg-type]
    return min(runs, key=lambda t: t.cpu_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=5000, help="files per source")
    parser.add_argument("--repeat", type=int, default=3, help="epochs per run (best of)")
    pairs_argument(parser, default=5)
    json_argument(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-mix-") as work:
        cache = LocalCache(os.path.join(work, "cache"))
        parts = []
        for name in ("a", "b"):
            src = os.path.join(work, name)
            write_files(src, args.files, 256, spread=4, vary=False)
            parts.append(VolumeDataset(src, cache=cache, shuffle=True))
        mix = Mix(parts)
        items = 2 * args.files
        assert sum(1 for _ in mix) == items  # cold: copy everything once

        def direct() -> list[int]:
            for p in parts:
                p.set_epoch(p.epoch + 1)
            return [sum(1 for _ in p) for p in parts]

        def mixed() -> int:
            mix.set_epoch(mix.epoch + 1)
            return sum(1 for _ in mix)

        runs = alternate({"sources": lambda: best(direct, args.repeat),
                          "mix": lambda: best(mixed, args.repeat)}, args.pairs)
    c = Comparison([t.cpu_s for t in runs["sources"]], [t.cpu_s for t in runs["mix"]])
    wall = Comparison([t.wall_s for t in runs["sources"]], [t.wall_s for t in runs["mix"]])
    extra_us = [(m - s) / items * 1e6 for s, m in zip(c.a, c.b, strict=True)]
    wall_extra = [(m - s) / items * 1e6 for s, m in zip(wall.a, wall.b, strict=True)]
    found = {"sources_us_per_item": c.a_median / items * 1e6,
             "mix_us_per_item": c.b_median / items * 1e6,
             "mix_extra_us_per_item": statistics.median(extra_us),
             "wall_mix_extra_us_per_item": statistics.median(wall_extra),
             "ratio": c.median_pair_ratio, "target_us": TARGET_US,
             "met": statistics.median(extra_us) <= TARGET_US}
    text = (f"{items:,} cached items ({args.files:,} per source), median of {args.pairs} "
            f"alternating pairs (best of {args.repeat} epochs each, CPU): sources "
            f"{found['sources_us_per_item']:.2f} µs per item, mix "
            f"{found['mix_us_per_item']:.2f} µs, the mix adds "
            f"{found['mix_extra_us_per_item']:.2f} µs per item (target <= {TARGET_US}: "
            f"{'met' if found['met'] else 'missed'}), ratio {found['ratio']:.2f}x; "
            f"wall: adds {found['wall_mix_extra_us_per_item']:.2f} µs")
    rows = [{"name": f"pair{i}", "sources_cpu_s": s, "mix_cpu_s": m, "extra_us_per_item": e,
             "sources_wall_s": ws, "mix_wall_s": wm}
            for i, (s, m, e, ws, wm) in enumerate(zip(c.a, c.b, extra_us, wall.a, wall.b,
                                                      strict=True))]
    Report(benchmark_name(__file__), params_of(args), rows, found).emit(args.json, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
