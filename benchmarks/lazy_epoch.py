"""Lazy as fast as eager: epoch 1 through ``VolumeDataset`` + ``DataLoader`` at
their defaults against ``ucstage cache warm`` of the same files.

Runs inside scripts/remote-volume.sh (it reads ``UCSTAGE_REMOTE_*``). Each
round runs, in alternating order, for every source in ``--via`` (``s3``: the
bucket's ``s3://`` URL; ``fuse``: a *fresh* rclone mount of it per run, so no
run reads pages an earlier one left in the mount's cache) and every set:

* ``warm``: ``ucstage cache warm SRC`` into an empty cache folder (the whole
  command: interpreter start-up, listing, copying);
* ``lazy``: a fresh Python process that makes ``VolumeDataset(SRC)`` over an
  empty cache folder and runs one epoch of ``ucstage.DataLoader`` over it
  with ``--workers`` workers, batches of 32 kept as lists (every other
  setting at its default), each item's file read whole. Timed in the process
  from ``VolumeDataset(SRC)`` to the epoch's last batch: the listing, the
  workers' start and the reads, not the interpreter's start and torch's
  import (``command_s`` in the rows is the whole command).

The ratio is files/s of lazy over files/s of warm (warm's seconds over
lazy's, per round; the target is >= 0.8x), with each side's client CPU per
file (user + sys of the command and what it waited for; the forkserver's
workers are not among them, so lazy's figure is a floor).

    scripts/remote-volume.sh --delay 20ms --small 3000x16K --large 1000x256K -- \\
        .venv/bin/python -m benchmarks.lazy_epoch --sets small,large --via s3,fuse --pairs 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from benchmarks.volumes import BIN, fresh_mount, remote_env, remote_server, unmount

SIDES = ("warm", "lazy")
BATCH = 32


def _keep(batch: list[int]) -> list[int]:
    """Batches stay lists: torch's default collate would send every batch as
    a shared-memory tensor, whose cost per batch is torch's, not the read's."""
    return batch


def epoch(src: str, cache: str, workers: int) -> None:
    """In the measured process: one epoch at the defaults, every file read whole."""
    from benchmarks.datasets import ReadBytes
    from ucstage import DataLoader, VolumeDataset

    start = time.perf_counter()
    ds = VolumeDataset(src, cache_dir=cache)
    loader = DataLoader(ReadBytes(ds), batch_size=BATCH, num_workers=workers,
                        collate_fn=_keep, log_mlflow=False)
    # The loader finds the VolumeDataset inside ReadBytes (.paths) and shards it.
    count = sum(len(batch) for batch in loader)
    print(f"files {count} seconds {time.perf_counter() - start:.3f}")


def _env(cache: str) -> dict[str, str]:
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), here) if p)
    return {**os.environ, "UCSTAGE_CACHE_DIR": cache, "PYTHONPATH": path}


def _run(side: str, src: str, work: str, workers: int) -> dict[str, float]:
    cache = tempfile.mkdtemp(prefix=f"cache-{side}-", dir=work)
    if side == "warm":
        cmd = [os.path.join(BIN, "ucstage"), "cache", "warm", src, "--json"]
    else:
        cmd = [sys.executable, "-m", "benchmarks.lazy_epoch", "--one", src, "--cache", cache,
               "--workers", str(workers)]
    run = run_command(cmd, env=_env(cache))
    shutil.rmtree(cache, ignore_errors=True)
    found = {"seconds": run.timing.wall_s, "cpu_s": run.timing.cpu_s,
             "command_s": run.timing.wall_s}
    if side == "lazy":  # the epoch itself: from VolumeDataset() to its last batch
        found["seconds"] = float(run.last_line.split()[-1])
    return found


def _source(via: str, folder: str, work: str) -> tuple[str, str | None]:
    if via == "s3":
        return f"{remote_env('UCSTAGE_REMOTE_URL')}/{folder}", None
    mnt = fresh_mount(work, via)
    return os.path.join(mnt, folder), mnt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="small,large",
                        help="bucket folders to read (default small,large)")
    parser.add_argument("--via", default="s3,fuse", help="s3, fuse or both (default both)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    pairs_argument(parser)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.one:
        epoch(args.one, args.cache, args.workers)
        return 0
    work = tempfile.mkdtemp(prefix="bench-lazy-epoch-")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"server": remote_server()}
    table = ["| data | via | warm s | lazy s | lazy / warm files/s (rounds) | "
             "CPU ms/file warm / lazy |", "|---|---|---:|---:|---|---|"]
    try:
        for folder in args.sets.split(","):
            count = _count(folder)
            for via in args.via.split(","):
                runs: dict[str, list[dict[str, float]]] = {s: [] for s in SIDES}
                for r in range(args.pairs):
                    for side in order(SIDES, r):
                        src, mnt = _source(via, folder, work)
                        try:
                            runs[side].append(_run(side, src, work, args.workers))
                        finally:
                            if mnt is not None:
                                unmount(mnt)
                        print(f"{folder} {via} round {r} {side}: {runs[side][-1]}", file=sys.stderr)
                ratios = [w["seconds"] / lz["seconds"] for w, lz in zip(runs["warm"], runs["lazy"], strict=True)]
                med = {s: statistics.median(x["seconds"] for x in runs[s]) for s in SIDES}
                cpu = {s: statistics.median(x["cpu_s"] for x in runs[s]) * 1000 / count
                       for s in SIDES}
                key = f"{folder}_{via}"
                summary[f"{key}_lazy_over_warm"] = statistics.median(ratios)
                for s in SIDES:
                    rows.append({"name": f"{key} {s}", "seconds": med[s],
                                 "command_s": statistics.median(x["command_s"] for x in runs[s]),
                                 "cpu_ms_per_file": cpu[s],
                                 "runs": [x["seconds"] for x in runs[s]]})
                table.append(f"| {folder} ({count} files) | {via} | {med['warm']:.2f} | "
                             f"{med['lazy']:.2f} | {statistics.median(ratios):.2f}x ("
                             + ", ".join(f"{x:.2f}" for x in ratios)
                             + f") | {cpu['warm']:.2f} / {cpu['lazy']:.2f} |")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Report(benchmark_name(__file__), params_of(args, drop=("json", "one", "cache")), rows,
           summary).emit(args.json, "\n".join(table))
    return 0


def _count(folder: str) -> int:
    root = os.path.join(remote_env("UCSTAGE_REMOTE_MNT"), folder)
    return sum(len(names) for _, _, names in os.walk(root))


if __name__ == "__main__":
    raise SystemExit(main())
