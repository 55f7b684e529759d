"""The first batch: a DataLoader's time to its first batch, and an epoch's start-up.

From ``iter(loader)`` (or from its dataset's construction) to the first
batch, and what an epoch's start costs before it.

    python -m benchmarks.first_batch VARIANT [OPTIONS] [--json]

Variants:

* ``later``: the first batch of a later epoch over a warm cache, persistent
  workers (ucstage's default) against workers restarted every epoch;
* ``epoch1``: epoch 1's first batch over an object store, step by step,
  workers forked against started from the forkserver;
* ``worker_start``: forked against forkserver workers over an object store,
  three epochs each, with the CPU of every process the run started;
* ``mix``: a Mix epoch's start-up (its interleaving, items and passes) per item.

``python -m benchmarks.first_batch VARIANT --help`` describes each in full.
ucstage is imported inside the functions that use it: a commit that lacks one
variant's names (benchmarks.ab_compare's baseline) still runs the others, and
a measured child process (``epoch1``, ``worker_start``) imports it where the
one-module benchmark did.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.utils.data as tud

from benchmarks.datasets import keep
from benchmarks.files import write_files
from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.timing import children_cpu_s, time_call
from benchmarks.volumes import Moto, bytecode_env, s3_server, server_argument, with_this_checkout

if TYPE_CHECKING:
    from ucstage.sharding.mixing import MixShares

SUITE = "first_batch"
BATCH = 32
"""Batch size of ``later``."""


# --- later --------------------------------------------------------------------

LATER_SIDES = ("persistent", "restarting")
LATER_WORKERS = 6


def _shape(text: str) -> tuple[int, int]:
    count, _, size = text.lower().partition("x")
    from ucstage.units import parse_size

    return int(count), parse_size(size)


def later_side(src: str, cache: str, persistent: bool, epochs: int) -> list[float]:
    """Seconds from ``iter(loader)`` to the first batch, for epochs 2..epochs+1."""
    from ucstage import DataLoader, VolumeDataset

    ds = VolumeDataset(src, cache_dir=cache, shuffle=True)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=LATER_WORKERS, collate_fn=keep,
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


def later_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", metavar="COUNTxSIZE", default="3000x16K")
    parser.add_argument("--epochs", type=int, default=10, help="timed epochs per side")
    pairs_argument(parser)
    json_argument(parser)


def run_later(args: argparse.Namespace) -> int:
    """The first batch of a later epoch over a warm cache: persistent workers
    (ucstage's default) against workers restarted every epoch.

    One process, a ucstage DataLoader with 6 workers, batches of 32 paths
    (``collate_fn`` keeps the list), over a local folder whose files are all in
    the cache already. Per side, one loader runs a first epoch to its end, then
    ``--epochs`` more; each of those is timed from ``iter(loader)`` to its first
    batch, and run to its end before the next. The sides alternate per pair
    (which goes first alternates too); medians over every timed epoch of a side,
    and the median of the pairs' ratios (restarting / persistent).

        python -m benchmarks.first_batch later --files 3000x16K --pairs 3 [--json]
    """
    count, size = _shape(args.files)
    work = tempfile.mkdtemp(prefix="bench-epochs-")
    try:
        src, cache = os.path.join(work, "src"), os.path.join(work, "cache")
        write_files(src, count, size)
        later_side(src, cache, True, 1)  # the cache warm, page cache and imports too
        runs: dict[str, list[list[float]]] = {side: [] for side in LATER_SIDES}
        for pair in range(args.pairs):
            for side in order(list(LATER_SIDES), pair):
                runs[side].append(later_side(src, cache, side == "persistent", args.epochs))
            print(json.dumps({s: statistics.median(runs[s][-1]) for s in LATER_SIDES}),
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
    Report(SUITE, params_of(args), rows, summary).emit(
        args.json, json.dumps(summary, indent=1))
    return 0


# --- epoch1 -------------------------------------------------------------------

EPOCH1_SIDES = ("fork", "forkserver")
STEPS = ("iter returned", "worker up", "slot open", "first file", "first batch")


def _stamp(folder: str, name: str) -> None:
    path = os.path.join(folder, f"{name}-{os.getpid()}")
    with open(path, "w") as fh:
        fh.write(repr(time.monotonic()))


class Stamped(tud.IterableDataset):  # type: ignore[type-arg]
    """The VolumeDataset's paths, stamping when its iterator opens and its first path."""

    def __init__(self, paths: Any, folder: str) -> None:
        self.paths, self.folder = paths, folder

    def __iter__(self) -> Iterator[str]:
        it = iter(self.paths)
        _stamp(self.folder, "slot")
        first = True
        for path in it:
            if first:
                _stamp(self.folder, "file")
                first = False
            yield path


class InitStamp:
    """``worker_init_fn``: stamp when the worker is up."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, worker_id: int) -> None:
        _stamp(self.folder, "init")


def _earliest(folder: str, name: str) -> float:
    found = []
    for entry in os.listdir(folder):
        if entry.startswith(name + "-"):
            with open(os.path.join(folder, entry)) as fh:
                found.append(float(fh.read()))
    return min(found) if found else float("nan")


def epoch1_one(url: str, side: str, work: str, workers: int, setup: float) -> dict[str, float]:
    """In the measured process: one first epoch's first batch, in steps."""
    from ucstage import DataLoader, VolumeDataset

    stamps = os.path.join(work, "stamps")
    os.makedirs(stamps)
    ds = VolumeDataset(url, cache_dir=os.path.join(work, "cache"))
    loader = DataLoader(Stamped(ds, stamps), batch_size=32, num_workers=workers,
                        collate_fn=keep, log_mlflow=False, worker_init_fn=InitStamp(stamps),
                        multiprocessing_context="fork" if side == "fork" else None)
    time.sleep(setup)
    t0 = time.monotonic()
    ds.freeze()
    t1 = time.monotonic()
    it = iter(loader)
    t2 = time.monotonic()
    next(it)
    t3 = time.monotonic()
    for _ in it:
        pass
    marks = [t2, _earliest(stamps, "init"), _earliest(stamps, "slot"),
             _earliest(stamps, "file"), t3]
    found = {"list": t1 - t0}
    found.update({name: marks[i] - t1 for i, name in enumerate(STEPS)})
    found["epoch"] = time.monotonic() - t1
    return found


def _noop() -> None:
    pass


def epoch1_probe() -> dict[str, float]:
    """In a fresh process: the forkserver's start with ucstage's preloads."""
    import multiprocessing.forkserver

    from ucstage.data import workerstart

    context: Any = workerstart.forkserver()
    start = time.monotonic()
    first = context.Process(target=_noop)
    first.start()
    first.join()
    up = time.monotonic()
    second = context.Process(target=_noop)
    second.start()
    second.join()
    return {"server start + preloads": up - start, "one more fork": time.monotonic() - up,
            "pid": float(multiprocessing.forkserver._forkserver._forkserver_pid)}  # type: ignore[attr-defined]


def epoch1_measure(args: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{SUITE}", "epoch1", *args], env=env,
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def epoch1_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fill", metavar="COUNTxSIZE", default="400x64K",
                        help="objects of the local server's bucket (default 400x64K); "
                             "inside remote-volume.sh: --set instead")
    parser.add_argument("--set", default="small",
                        help="the remote volume's folder, inside remote-volume.sh (default small)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    parser.add_argument("--setup", type=float, default=0.0,
                        help="seconds between making the loader and iter() (default 0)")
    server_argument(parser)
    pairs_argument(parser)
    parser.add_argument("--one", choices=EPOCH1_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    json_argument(parser)


def run_epoch1(args: argparse.Namespace) -> int:
    """The first batch of epoch 1 over an object store: where its time goes, with
    workers forked against workers started from the forkserver.

    Each run is a fresh Python process over a local S3 server (``rclone serve
    s3`` by default; inside scripts/remote-volume.sh the remote volume's bucket
    instead, with its delay). It makes a ``VolumeDataset`` of the bucket and a
    ucstage ``DataLoader`` over it (``--workers``, batches of 32 paths), waits
    ``--setup`` seconds (the model's set-up a training script does between
    making its loader and its first ``iter``), lists (``freeze``), and times
    ``iter(loader)`` to the first batch. ``fork`` passes
    ``multiprocessing_context="fork"``; ``forkserver`` leaves it unset (ucstage
    starts the workers from a forkserver, the server itself when the loader is
    made). ``list`` is the listing (obstore, in the main process); the rest are
    seconds since ``iter(loader)`` was called, when:

    * ``iter returned``: torch started the workers;
    * ``worker up``: the first worker's ``worker_init_fn`` runs (for the
      forkserver: the server's start and preloads, if not done yet, the fork,
      unpickling the dataset);
    * ``slot open``: the first worker's dataset iterator made (the manifest
      opened, the slot's order);
    * ``first file``: its first path out of the dataset (the client built, the
      first GETs);
    * ``first batch``: the batch reached the main process (the figure compared).

    ``server`` (a separate probe in a fresh process) is the forkserver's own start
    with ucstage's preloads: ``ensure_running`` to a first empty process forked
    from it, and a second one (the fork alone). Sides alternate, medians over
    ``--pairs``.

        python -m benchmarks.first_batch epoch1 --fill 400x64K --pairs 3 [--setup 2] [--json]
    """
    if args.one:
        print(json.dumps(epoch1_one(args.url, args.one, args.work, args.workers, args.setup)))
        return 0
    if args.probe:
        print(json.dumps(epoch1_probe()))
        return 0
    work = tempfile.mkdtemp(prefix="bench-first-batch-")
    remote = os.environ.get("UCSTAGE_REMOTE_URL")
    server = None if remote else s3_server(args.server, work)
    try:
        url = f"{remote}/{args.set}" if remote else server.fill(args.fill)  # type: ignore[union-attr]
        base = dict(os.environ) if server is None else {**os.environ, **server.env}
        env = bytecode_env(with_this_checkout({**base, "OMP_NUM_THREADS": "1"}), work)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in (*EPOCH1_SIDES, "server")}

        def run(side: str) -> None:
            folder = tempfile.mkdtemp(dir=work)
            if side == "server":
                runs[side].append(epoch1_measure(["--probe"], env))
            else:
                runs[side].append(epoch1_measure(["--one", side, "--url", url, "--work", folder,
                                            "--workers", str(args.workers),
                                            "--setup", str(args.setup)], env))
            shutil.rmtree(folder, ignore_errors=True)
            print(side, json.dumps(runs[side][-1]), file=sys.stderr)

        run("fork")  # bytecode and page caches warm; not counted
        runs["fork"].clear()
        for pair in range(args.pairs):
            for side in order([*EPOCH1_SIDES, "server"], pair):
                run(side)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "pid"}
           for side, rs in runs.items()}
    ratio = [f["first batch"] / k["first batch"]
             for f, k in zip(runs["forkserver"], runs["fork"], strict=True)]
    summary = {"forkserver_over_fork": statistics.median(ratio),
               "fork_first_batch_s": med["fork"]["first batch"],
               "forkserver_first_batch_s": med["forkserver"]["first batch"],
               **{f"server_{k.replace(' ', '_').replace('+', 'and')}_s": v
                  for k, v in med["server"].items()}}
    rows = [{"name": f"{side} {step}", "seconds": med[side][step]}
            for side in EPOCH1_SIDES for step in ("list", *STEPS, "epoch")]
    rows += [{"name": f"server {k}", "seconds": v} for k, v in med["server"].items()]
    lines = ["| step | fork s | forkserver s |", "|---|---:|---:|"]
    lines += [f"| {step} | {med['fork'][step]:.3f} | {med['forkserver'][step]:.3f} |"
              for step in ("list", *STEPS, "epoch")]
    lines += [f"| (probe) {k} | | {v:.3f} |" for k, v in med["server"].items()]
    lines.append(f"\nforkserver / fork, first batch: {statistics.median(ratio):.2f}x "
                 f"(pairs {', '.join(f'{x:.2f}' for x in ratio)})")
    Report(SUITE, params_of(args, drop=("json", "one", "probe", "url", "work")),
           rows, summary).emit(args.json, "\n".join(lines))
    return 0


# --- worker_start -------------------------------------------------------------

WORKER_START_EPOCHS = 3


def worker_start_one(url: str, context: str, work: str) -> dict[str, Any]:
    """In the measuring process: list, then time WORKER_START_EPOCHS epochs."""
    from ucstage import DataLoader, VolumeDataset

    listed = VolumeDataset(url, cache_dir=os.path.join(work, "listing"))
    manifest = listed.freeze()  # the main process lists through obstore
    firsts, epochs, engines = [], [], set()
    for epoch in range(WORKER_START_EPOCHS):
        ds = VolumeDataset(manifest, cache_dir=os.path.join(work, f"cache{epoch}"))
        loader = DataLoader(ds, batch_size=None, num_workers=2, log_mlflow=False,
                            multiprocessing_context=None if context == "default" else context)
        start = time.perf_counter()
        it = iter(loader)
        next(it)
        first = time.perf_counter()
        for _ in it:
            pass
        firsts.append(first - start)
        epochs.append(time.perf_counter() - start)
        ctx = loader.multiprocessing_context
        engines.add(ctx.get_start_method() if ctx is not None else "fork")
    return {"first": firsts, "epoch": epochs, "start": sorted(engines)}


def _children() -> set[int]:
    found: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as fh:
            found.update(int(pid) for pid in fh.read().split())
    return found


def _subreaper() -> None:
    """Adopt orphaned descendants: the forkserver (which reaps its workers)
    and the resource tracker outlive the measured process, and their CPU is
    counted only once they are reaped here."""
    import ctypes

    pr_set_child_subreaper = 36
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0) != 0:
        sys.exit("worker_start: prctl(PR_SET_CHILD_SUBREAPER) failed")


def _reap(keep: set[int]) -> None:
    deadline = time.monotonic() + 60
    while orphans := _children() - keep:
        for pid in orphans:
            os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            sys.exit(f"worker_start: processes {sorted(orphans)} did not exit")
        time.sleep(0.02)


def worker_start_run(url: str, context: str, env: dict[str, str], work: str) -> dict[str, Any]:
    folder = tempfile.mkdtemp(dir=work)
    keep = _children()  # the moto server
    # RUSAGE_CHILDREN rather than the child's own rusage (timing.run_command): the
    # forkserver and resource tracker it leaves are reaped here, not by it.
    before = children_cpu_s()
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{SUITE}", "worker_start", "--one", context,
                          "--url", url, "--work", folder], env=env, check=True,
                         capture_output=True, text=True).stdout
    _reap(keep)
    cpu = children_cpu_s() - before
    shutil.rmtree(folder)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = cpu
    return result


def worker_start_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="400x256K")
    pairs_argument(parser)
    parser.add_argument("--one", choices=["fork", "default"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    json_argument(parser)


def run_worker_start(args: argparse.Namespace) -> int:
    """DataLoader workers over an object-store volume: forked (read through fsspec)
    against started from the forkserver (each with its own obstore client).

    Each run is a fresh Python process that lists the volume (obstore, in the
    main process, as a VolumeDataset does) and runs three epochs of a ucstage
    DataLoader (``num_workers=2``, ``batch_size=None``), each epoch into a fresh
    cache folder so every file is fetched: with ``multiprocessing_context="fork"``
    or the default (forkserver, chosen by ucstage). Per epoch it records the first
    batch's latency (``iter`` to the first item: worker start-up plus the first
    fetch) and the epoch's time; the run's CPU is everything it started (user +
    sys of the process, the forkserver, the resource tracker and the workers:
    this script adopts them as a child subreaper, so their time is counted). Runs alternate, which
    goes first alternates too; medians over the pairs.

        python -m benchmarks.first_batch worker_start --moto 400x256K --pairs 3 [--json]
    """
    if args.one:
        print(json.dumps(worker_start_one(args.url, args.one, args.work)))
        return 0
    _subreaper()
    work = tempfile.mkdtemp(prefix="bench-worker-start-")
    server = Moto(work)
    try:
        url = server.fill(args.moto)
        env = bytecode_env(with_this_checkout({**server.env, "OMP_NUM_THREADS": "1"}), work)
        worker_start_run(url, "fork", env, work)  # bytecode cache and page cache warm
        runs: dict[str, list[dict[str, Any]]] = {"fork": [], "default": []}
        for pair in range(args.pairs):
            sides = order(["fork", "default"], pair)
            for context in sides:
                runs[context].append(worker_start_run(url, context, env, work))
            print(json.dumps({c: runs[c][-1] for c in sides}), file=sys.stderr)
        summary = {}
        for context, results in runs.items():
            summary[context] = {
                "start": results[0]["start"],
                "first_batch_s": [statistics.median(r["first"][e] for r in results)
                                  for e in range(WORKER_START_EPOCHS)],
                "epoch_s": [statistics.median(r["epoch"][e] for r in results)
                            for e in range(WORKER_START_EPOCHS)],
                "run_cpu_s": statistics.median(r["cpu"] for r in results),
            }
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"name": f"{context} {i + 1}", "context": context, **r}
            for context, results in runs.items() for i, r in enumerate(results)]
    Report(SUITE, params_of(args, drop=("json", "one", "url", "work")), rows,
           summary).emit(args.json, json.dumps(summary, indent=1))
    return 0


# --- mix ----------------------------------------------------------------------

MIX_TARGET_US = 2.0
MIX_CASES = {  # name: (sizes, weights, epoch_size)
    "one-file-half": ([1, 200_000], [0.5, 0.5], 200_000),
    "two-files-half": ([2, 200_000], [0.5, 0.5], 200_000),
    "million-small": ([1_000_000, 100], [0.7, 0.3], None),
}


def mix_start(shares: MixShares, epoch: int, slots: int) -> int:
    """One epoch's start-up over every slot: what each position reads."""
    import numpy as np  # (imported by run_mix already: a lookup, not an import)

    from ucstage.sharding.mixing import MixOrder

    order = MixOrder(shares, seed=0, epoch=epoch, slots=slots)
    src, _, _ = order.take(np.arange(order.n, dtype=np.int64))
    return len(src)


def mix_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="runs per case (median)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the large sizes and epoch sizes (0.01 for a quick look)")
    parser.add_argument("--slots", type=int, default=8, help="the layout's slots")
    json_argument(parser)


def run_mix(args: argparse.Namespace) -> int:
    """A Mix epoch's start-up (its interleaving, items and passes) per item.

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

        python -m benchmarks.first_batch mix [--runs 3] [--scale 1.0] [--json]
    """
    import numpy  # noqa: F401  (imported before any run is timed)

    from ucstage.sharding.mixing import mix_shares

    rows: list[dict[str, object]] = []
    for name, (sizes, weights, epoch_size) in MIX_CASES.items():
        sizes = [max(1, int(n * args.scale)) if n > 1000 else n for n in sizes]
        if epoch_size is not None:
            epoch_size = max(1, int(epoch_size * args.scale))
        shares = mix_shares(sizes, weights, epoch_size=epoch_size)
        runs = []
        for epoch in range(args.runs):
            taken, timing = time_call(functools.partial(mix_start, shares, epoch, args.slots))
            assert taken == shares.epoch_size
            runs.append(timing)
        cpu = statistics.median(t.cpu_s for t in runs)
        passes = max(shares.passes(i) for i in range(len(sizes)))
        rows.append({"name": name, "items": shares.epoch_size, "counts": list(shares.counts),
                     "max_passes": passes, "cpu_s": cpu,
                     "wall_s": statistics.median(t.wall_s for t in runs),
                     "us_per_item": cpu / shares.epoch_size * 1e6})
    worst = max(float(r["us_per_item"]) for r in rows)  # type: ignore[arg-type]
    found = {"worst_us_per_item": worst, "target_us": MIX_TARGET_US, "met": worst <= MIX_TARGET_US}
    lines = [f"| {r['name']} | {r['items']:,} | {r['max_passes']:,.0f} | {r['cpu_s']:.3f} | "
             f"{r['us_per_item']:.2f} |" for r in rows]
    text = "\n".join(["| case | items | passes of the small source | CPU s | µs per item |",
                      "|---|---|---|---|---|", *lines, "",
                      f"worst {worst:.2f} µs per item (target <= {MIX_TARGET_US}: "
                      f"{'met' if found['met'] else 'missed'}), median of {args.runs} runs"])
    Report(SUITE, params_of(args), rows, found).emit(args.json, text)
    return 0


VARIANTS = {"later": (later_arguments, run_later), "epoch1": (epoch1_arguments, run_epoch1),
            "worker_start": (worker_start_arguments, run_worker_start),
            "mix": (mix_arguments, run_mix)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
