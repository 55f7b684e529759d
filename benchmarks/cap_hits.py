#!/usr/bin/env python
"""Benchmark: the hit rate through a cache capped at a quarter of the data, default read-ahead.

Writes FILES files of SIZE bytes into a temp folder, mounts it read-only with
rclone (``--bwlimit``, one token bucket for every read), and for each setup
(0 workers in order, 0 workers shuffled, 2 workers shuffled; ``batch_size``
1) runs 3 epochs of ``VolumeDataset`` + ``ucstage.DataLoader`` through a
fresh cache capped at a quarter of the data, with ``read_ahead="auto"`` (the
default) and with ``read_ahead=2``, alternating the two each round. The loop
opens every path of every batch (a path that is gone counts as vanished).
Prints, per setup and read-ahead, the median over the rounds of the hit rate
of epochs 2-3 and the vanished paths; the target is a hit rate of at least
0.8 x (cap / dataset) at the default.

    python -m benchmarks.cap_hits                  # ~2 min
    python -m benchmarks.cap_hits --rounds 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from benchmarks.files import write_files
from benchmarks.pairs import order
from benchmarks.volumes import throttled_mount
from ucstage import DataLoader, VolumeDataset
from ucstage.cache import LocalCache

EPOCHS = 3
SETUPS = (("0 workers, in order", 0, False), ("0 workers, shuffled", 0, True),
          ("2 workers, shuffled", 2, True))


def epochs(mnt: str, work: str, cap: int, workers: int, shuffle: bool,
           read_ahead: int | str) -> tuple[list[float], int]:
    """Hit rate per epoch and paths that vanished before the loop opened them."""
    cache_dir = tempfile.mkdtemp(dir=work, prefix="cache-")
    try:
        cache = LocalCache(cache_dir, max_bytes=cap)
        ds = VolumeDataset(mnt, cache=cache, shuffle=shuffle, seed=1, read_ahead=read_ahead)
        loader = DataLoader(ds, batch_size=1, num_workers=workers, log_mlflow=False)
        vanished = 0
        for epoch in range(EPOCHS):
            ds.set_epoch(epoch)
            for batch in loader:
                for path in batch:
                    try:
                        with open(path, "rb") as fh:
                            fh.read()
                    except FileNotFoundError:
                        vanished += 1
        rates = [s.cache_hit_rate or 0.0 for s in loader.epoch_stats]
        del loader
        return rates, vanished
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--size", type=int, default=100_000, help="bytes per file")
    parser.add_argument("--cap-share", type=float, default=0.25)
    parser.add_argument("--bwlimit", default="64M", help="rclone --bwlimit (bytes/s)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ucstage-cap-hits-")
    cap = int(args.files * args.size * args.cap_share)
    target = 0.8 * args.cap_share
    try:
        backing, mnt = os.path.join(work, "backing"), os.path.join(work, "mnt")
        write_files(backing, args.files, args.size, spread=0)
        with throttled_mount(backing, mnt, bwlimit=args.bwlimit):
            print(f"{args.files} files x {args.size} B, cap {args.cap_share:g} of the data "
                  f"({cap} B), {EPOCHS} epochs, batch_size 1, {args.rounds} rounds; "
                  f"target: epochs 2-{EPOCHS} hit >= {target:.2f} at the default read-ahead")
            met = True
            for label, workers, shuffle in SETUPS:
                later: dict[str, list[float]] = {"auto": [], "2": []}
                gone: dict[str, list[int]] = {"auto": [], "2": []}
                for r in range(args.rounds):
                    for side in order(["auto", "2"], r):
                        rates, vanished = epochs(mnt, work, cap, workers, shuffle,
                                                 "auto" if side == "auto" else 2)
                        later[side].append(min(rates[1:]))
                        gone[side].append(vanished)
                for side in ("auto", "2"):
                    print(f"  {label:22s} read_ahead={side:4s}  lowest later-epoch hit rate: "
                          f"median {statistics.median(later[side]):.3f} "
                          f"(runs {', '.join(f'{x:.3f}' for x in later[side])}); "
                          f"vanished paths {sum(gone[side])}")
                met = met and min(later["auto"]) >= target and not sum(gone["auto"])
            print(f"target {'met' if met else 'missed'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
