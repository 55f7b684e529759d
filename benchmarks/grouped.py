#!/usr/bin/env python
"""Benchmark: grouped samples (issue 23) against the same files ungrouped.

``warm``: SAMPLES samples of a ``.jpg`` and a ``.json`` (SIZE_KIB each) in a
local folder, warmed into a ucstage cache; alternating PAIRS times, the
second epoch (in this process, ``num_workers=0``) of a fresh
``VolumeDataset`` that reads every file's bytes: ungrouped (one item per
file) and ``group="key"`` (one item per sample, both members read).
Target: grouped <= 1.1x ungrouped.

``plan``: a columnar manifest of FILES files (half ``.jpg``, half ``.json``,
two per sample), then alternating PAIRS times ``ucstage shard-plan MANIFEST
-w 128 -k 8`` (the human plan) with and without ``--group key``, each a fresh process
(wall time from its rusage). Target: grouped <= 1.5x ungrouped.

    python -m benchmarks.grouped warm --pairs 5 [--json]
    python -m benchmarks.grouped plan --files 1000000 --pairs 3 [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Any

import ucstage
from benchmarks.pairs import Comparison, alternate, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from ucstage import LocalCache, VolumeDataset
from ucstage.manifest import Manifest, fingerprint, save
from ucstage.volumes import FileEntry, list_files


def _read(paths: Any) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as fh:
            total += len(fh.read())
    return total


def second_epoch(make: Any, expect: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the second epoch over a fresh dataset (the first
    warms the stamp memo); CPU is this process's, all threads."""
    ds = make()
    seconds = cpu = 0.0
    for _ in range(2):
        start, start_cpu = time.perf_counter(), time.process_time()
        total = 0
        for item in ds:
            total += _read(item.values()) if isinstance(item, dict) else _read((item,))
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if total != expect:
            raise RuntimeError(f"read {total} bytes, expected {expect}")
    return seconds, cpu


def warm(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    size = args.size_kib * 1024
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-grouped-", dir=args.dir) as work:
        data, cache_dir = os.path.join(work, "data"), os.path.join(work, "cache")
        payload = os.urandom(size)
        for i in range(args.samples):
            folder = os.path.join(data, f"part{i % 8}")
            os.makedirs(folder, exist_ok=True)
            for suffix in ("jpg", "json"):
                with open(os.path.join(folder, f"{i:07d}.{suffix}"), "wb") as fh:
                    fh.write(payload)
        listing = list_files(data)
        if LocalCache(cache_dir).warm(listing.volume, listing.entries).failed:
            raise RuntimeError("warm failed")
        expect = 2 * args.samples * size
        found = alternate(
            {"ungrouped": lambda: second_epoch(lambda: VolumeDataset(data, cache_dir=cache_dir),
                                               expect),
             "grouped": lambda: second_epoch(lambda: VolumeDataset(data, cache_dir=cache_dir,
                                                                   group="key"), expect)},
            args.pairs, lambda r, side, s: print(f"pair {r + 1}: {side} {s[0]:.3f} s wall, "
                                                 f"{s[1]:.3f} s CPU", file=sys.stderr))
    pairs = {what: Comparison([t[i] for t in found["ungrouped"]], [t[i] for t in found["grouped"]])
             for i, what in enumerate(("wall", "CPU"))}
    rows = [{"name": f"warm epoch ({what})", "ungrouped_s": c.a_median, "grouped_s": c.b_median,
             "ratio": c.median_pair_ratio, "pair_ratios": c.pair_ratios, "target": 1.1}
            for what, c in pairs.items()]
    return rows, "\n".join(
        f"{args.samples:,} samples x 2 files x {args.size_kib} KiB, warm cache, second epoch, "
        f"{args.pairs} alternating pairs, {what}: ungrouped {c.a_median:.3f} s, grouped "
        f"{c.b_median:.3f} s, grouped / ungrouped {c.median_pair_ratio:.2f}x "
        f"(pairs {', '.join(f'{x:.2f}x' for x in c.pair_ratios)})" for what, c in pairs.items())


def plan(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str]:
    n = args.files
    entries = [FileEntry(f"part-{i // 2000:05d}/sample-{i // 2:08d}.{'jpg' if i % 2 == 0 else 'json'}",
                         100_000 + (i * 7919) % 50_000, str(1_700_000_000.0 + i))
               for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-grouped-", dir=args.dir) as work:
        path = os.path.join(work, "m.manifest.arrow")
        save(Manifest("/Volumes/main/ml/train", entries, fingerprint(entries)), path)
        del entries
        base = [sys.executable, "-m", "ucstage", "shard-plan", path, "-w", "128", "-k", "8"]
        # The child runs the ucstage this process imported (ab_compare picks which).
        home = os.path.dirname(os.path.dirname(os.path.abspath(ucstage.__file__)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (home, os.environ.get("PYTHONPATH", "")) if p)}

        def side(extra: list[str]) -> Any:
            return run_command(base + extra, env=env).timing

        found = alternate({"ungrouped": lambda: side([]),
                           "grouped": lambda: side(["--group", "key"])}, args.pairs,
                          lambda r, s, t: print(f"pair {r + 1}: {s} {t.wall_s:.2f} s wall, "
                                                f"{t.cpu_s:.2f} s CPU", file=sys.stderr))
    wall = Comparison([t.wall_s for t in found["ungrouped"]], [t.wall_s for t in found["grouped"]])
    cpu = Comparison([t.cpu_s for t in found["ungrouped"]], [t.cpu_s for t in found["grouped"]])
    rows = [{"name": f"shard-plan {n:,} files -w 128 -k 8 ({what})", "ungrouped_s": c.a_median,
             "grouped_s": c.b_median, "ratio": c.median_pair_ratio,
             "pair_ratios": c.pair_ratios, "target": 1.5}
            for what, c in (("wall", wall), ("CPU", cpu))]
    return rows, "\n".join(
        f"shard-plan of a {n:,}-file Arrow manifest, 128 x 8 slots, {args.pairs} alternating "
        f"pairs, {what}: ungrouped {c.a_median:.2f} s, grouped {c.b_median:.2f} s, grouped / "
        f"ungrouped {c.median_pair_ratio:.2f}x (pairs {', '.join(f'{x:.2f}x' for x in c.pair_ratios)})"
        for what, c in (("wall", wall), ("CPU (user + sys)", cpu)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["warm", "plan"])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=16)
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--dir", default=None, help="where to write (default: /tmp)")
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    rows, text = warm(args) if args.mode == "warm" else plan(args)
    Report(benchmark_name(__file__), params_of(args), rows).emit(args.json, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
