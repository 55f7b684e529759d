#!/usr/bin/env python
"""Profile: where a warm epoch's time goes, per file, in one process.

Writes FILES files of SIZE_KIB KiB, warms a ucstage cache with them, then
times each step below as the best of REPEAT epochs (after one untimed epoch),
in microseconds per file, at ``num_workers=0``:

* open and read: the source files, the cached copies (a bare loop);
* ``VolumeDataset`` iteration alone (paths only), and with every path opened
  and read (``ReadBytes``, no loader);
* torch's ``DataLoader`` over the paths (map-style, the plain side of
  benchmarks.warm_epoch), over an IterableDataset of the same paths (torch's
  iterable-dataset cost), and over the ``VolumeDataset``;
* ucstage's ``DataLoader`` over the ``VolumeDataset``, with and without the
  audit; and with ``--cap``, the same under a byte cap (holds).

``--cpu`` times each step's CPU (user + sys) instead of its wall time.

``--cprofile STEP`` runs that step under cProfile instead and prints the top
functions by own time.

    python -m benchmarks.profile_warm_epoch [--cpu] [--json]
    python -m benchmarks.profile_warm_epoch --cprofile ucstage-loader
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch.utils.data as tud

from benchmarks.datasets import IterPaths, RawPaths, ReadBytes
from benchmarks.files import write_files
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import best_seconds, time_call
from ucstage import DataLoader, LocalCache, VolumeDataset
from ucstage.volumes import list_files


def drain(iterable: Any) -> int:
    count = 0
    for _ in iterable:
        count += 1
    return count


def read_all(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as fh:
            total += len(fh.read())
    return total


def best_us(step: Callable[[], Any], files: int, repeat: int, cpu: bool = False) -> float:
    """Best of ``repeat`` timed calls after one untimed one, in µs per file
    (of wall time, or with ``cpu`` of the process's CPU time)."""
    if not cpu:
        return best_seconds(step, repeat, warmup=True) / files * 1e6
    step()
    return min(time_call(step)[1].cpu_s for _ in range(repeat)) / files * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--cap", action="store_true", help="also time under a byte cap")
    parser.add_argument("--cprofile", default=None, help="profile this step instead")
    parser.add_argument("--cpu", action="store_true",
                        help="time each step's CPU (user + sys of the process), not its wall "
                             "time: steadier on a shared machine (the steps run in one thread)")
    json_argument(parser)
    args = parser.parse_args(argv)
    size = args.size_kib * 1024
    with tempfile.TemporaryDirectory(prefix="ucstage-profile-warm-") as work:
        data = os.path.join(work, "data")
        write_files(data, args.files, size, vary=False)
        cache_dir = os.path.join(work, "cache")
        listing = list_files(data)
        LocalCache(cache_dir).warm(listing.volume, listing.entries)
        sources = [os.path.join(data, e.path) for e in listing.entries]
        vds = VolumeDataset(data, cache_dir=cache_dir)
        cached = list(vds)
        capped = VolumeDataset(data, cache_dir=cache_dir, max_bytes=4 * args.files * size)
        steps: dict[str, Callable[[], Any]] = {
            "read-sources": lambda: read_all(sources),
            "read-cached": lambda: read_all(cached),
            "vds": lambda: drain(vds),
            "vds-read": lambda: drain(ReadBytes(vds)),
            "torch-paths": lambda: drain(tud.DataLoader(RawPaths(sources), batch_size=None,
                                                        num_workers=0)),
            "torch-iterpaths": lambda: drain(tud.DataLoader(ReadBytes(IterPaths(sources)),
                                                            batch_size=None, num_workers=0)),
            "torch-itercached": lambda: drain(tud.DataLoader(ReadBytes(IterPaths(cached)),
                                                             batch_size=None, num_workers=0)),
            "torch-vds": lambda: drain(tud.DataLoader(ReadBytes(vds), batch_size=None,
                                                      num_workers=0)),
            "ucstage-loader": lambda: drain(DataLoader(ReadBytes(vds), batch_size=None,
                                                       num_workers=0)),
            "ucstage-loader-noaudit": lambda: drain(DataLoader(ReadBytes(vds), batch_size=None,
                                                               num_workers=0, audit=False)),
        }
        if args.cap:
            steps["vds-capped"] = lambda: drain(capped)
            steps["ucstage-loader-capped"] = lambda: drain(
                DataLoader(ReadBytes(capped), batch_size=None, num_workers=0))
        if args.cprofile:
            step = steps[args.cprofile]
            step()
            profiler = cProfile.Profile()
            profiler.enable()
            step()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
            return 0
        results = []
        for name, step in steps.items():
            us = best_us(step, args.files, args.repeat, args.cpu)
            results.append({"name": name, "us_per_file": us})
            print(f"{name:24s} {us:7.2f}", file=sys.stderr, flush=True)
    lines = [f"{args.files} files x {args.size_kib} KiB, page-cached, num_workers=0, "
             f"best of {args.repeat}, µs {'CPU' if args.cpu else 'wall'} per file"]
    lines += [f"{r['name']:24s} {r['us_per_file']:7.2f}" for r in results]
    Report(benchmark_name(__file__), params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
