"""The first batch of a later epoch over a warm cache: persistent workers
(ucstage's default) against workers restarted every epoch.

One process, a ucstage DataLoader with 6 workers, batches of 32 paths
(``collate_fn`` keeps the list), over a local folder whose files are all in
the cache already. Per side, one loader runs a first epoch to its end, then
``--epochs`` more; each of those is timed from ``iter(loader)`` to its first
batch, and run to its end before the next. The sides alternate per pair
(which goes first alternates too); medians over every timed epoch of a side,
and the median of the pairs' ratios (restarting / persistent).

    python -m benchmarks.epochs --files 3000x16K --pairs 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks.files import write_files
from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of

SIDES = ("persistent", "restarting")
WORKERS = 6
BATCH = 32


def _keep(batch: list[str]) -> list[str]:
    return batch


def _shape(text: str) -> tuple[int, int]:
    count, _, size = text.lower().partition("x")
    from ucstage.units import parse_size

    return int(count), parse_size(size)


def one_side(src: str, cache: str, persistent: bool, epochs: int) -> list[float]:
    """Seconds from ``iter(loader)`` to the first batch, for epochs 2..epochs+1."""
    from ucstage import DataLoader, VolumeDataset

    ds = VolumeDataset(src, cache_dir=cache, shuffle=True)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=_keep,
                        log_mlflow=False, persistent_workers=persistent)
    for _ in loader:  # epoch 1, completed
        pass
    firsts = []
    for epoch in range(1, epochs + 1):
        ds.set_epoch(epoch)
        start = time.perf_counter()
        it = iter(loader)
        next(it)
        firsts.append(time.perf_counter() - start)
        for _ in it:
            pass
    del loader
    return firsts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", metavar="COUNTxSIZE", default="3000x16K")
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs per side")
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    count, size = _shape(args.files)
    work = tempfile.mkdtemp(prefix="bench-epochs-")
    try:
        src, cache = os.path.join(work, "src"), os.path.join(work, "cache")
        write_files(src, count, size)
        one_side(src, cache, True, 1)  # the cache warm, page cache and imports too
        runs: dict[str, list[list[float]]] = {side: [] for side in SIDES}
        for pair in range(args.pairs):
            for side in order(list(SIDES), pair):
                runs[side].append(one_side(src, cache, side == "persistent", args.epochs))
            print(json.dumps({s: statistics.median(runs[s][-1]) for s in SIDES}),
                  file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = [statistics.median(r) / statistics.median(p)
              for p, r in zip(runs["persistent"], runs["restarting"], strict=True)]
    summary: dict[str, Any] = {
        side: {"first_batch_ms_median": 1000 * statistics.median(x for r in results for x in r),
               "first_batch_ms_max": 1000 * max(x for r in results for x in r)}
        for side, results in runs.items()}
    summary["median_pair_ratio"] = statistics.median(ratios)
    summary["pair_ratios"] = ratios
    rows = [{"name": f"{side} {i + 1}", "side": side, "first_batch_s": r}
            for side, results in runs.items() for i, r in enumerate(results)]
    Report(benchmark_name(__file__), params_of(args), rows, summary).emit(
        args.json, json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
