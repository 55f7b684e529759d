#!/usr/bin/env python
"""Benchmark: what a VolumeDataset warm hit costs per file, with and without a byte cap.

With a cap, each file a dataset hands out is held while its reader needs it
(open + shared flock + fstat) and marked consumed when the reader moves on
(futimens + close); the mark changes the file's ctime, so the next epoch's
lookup reads its stamp again (getxattr). Without a cap nothing is held. Reads
FILES small cached files through ``VolumeDataset(read_ahead=0)`` in this
process, best of REPEAT epochs, in microseconds per file. Compare two
checkouts with scripts/ab_compare.py:

    .venv/bin/python scripts/ab_compare.py --before ../baseline --pairs 3 -- scripts/bench_hold_cost.py
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from ucstage import VolumeDataset
from ucstage.cache import LocalCache


def per_file_us(src: str, cache_dir: str, cap: int | None, files: int, repeat: int) -> float:
    cache = LocalCache(cache_dir, max_bytes=cap)
    paths = VolumeDataset(src, cache=cache, read_ahead=0)
    for _ in paths:  # cold: copy everything once
        pass
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        count = sum(1 for _ in paths)
        best = min(best, time.perf_counter() - start)
    assert count == files
    return best / files * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", metavar="FILE", help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-hold-") as work:
        src = os.path.join(work, "src")
        os.makedirs(src)
        for i in range(args.files):
            with open(os.path.join(src, f"f{i:05d}.bin"), "wb") as fh:
                fh.write(b"x" * 512)
        found = {"no_cap_us_per_file": per_file_us(src, os.path.join(work, "a"), None,
                                                   args.files, args.repeat),
                 "cap_us_per_file": per_file_us(src, os.path.join(work, "b"), 1 << 30,
                                                args.files, args.repeat)}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(found, fh)
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
