"""Benchmark: what a VolumeDataset warm hit costs per file, with and without a byte cap.

With a cap, each file a dataset hands out is held while its reader needs it
(open + shared flock + fstat) and marked consumed when the reader moves on
(futimens + close); the mark changes the file's ctime, so the next epoch's
lookup reads its stamp again (getxattr). Without a cap nothing is held. Reads
FILES small cached files through ``VolumeDataset(read_ahead=0)`` in this
process, best of REPEAT epochs, in microseconds per file. Compare two commits
with benchmarks.ab_compare:

    python -m benchmarks.hold_cost [--files 3000] [--repeat 5] [--json]
    python -m benchmarks.ab_compare --base c3a3ebf hold_cost
"""

from __future__ import annotations

import argparse
import os
import tempfile

from benchmarks.files import write_files
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import best_seconds
from ucstage import VolumeDataset
from ucstage.cache import LocalCache


def per_file_us(src: str, cache_dir: str, cap: int | None, files: int, repeat: int) -> float:
    cache = LocalCache(cache_dir, max_bytes=cap)
    paths = VolumeDataset(src, cache=cache, read_ahead=0)
    count = sum(1 for _ in paths)  # cold: copy everything once
    assert count == files
    return best_seconds(lambda: sum(1 for _ in paths), repeat) / files * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    json_argument(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-hold-") as work:
        src = os.path.join(work, "src")
        write_files(src, args.files, 512, spread=0, vary=False)
        found = {"no_cap_us_per_file": per_file_us(src, os.path.join(work, "a"), None,
                                                   args.files, args.repeat),
                 "cap_us_per_file": per_file_us(src, os.path.join(work, "b"), 1 << 30,
                                                args.files, args.repeat)}
    text = (f"{args.files:,} cached files, best of {args.repeat} epochs: "
            f"{found['no_cap_us_per_file']:.1f} µs per file without a cap, "
            f"{found['cap_us_per_file']:.1f} µs with one")
    Report(benchmark_name(__file__), params_of(args), [], found).emit(args.json, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
