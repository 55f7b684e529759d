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

    python -m benchmarks.worker_start --moto 400x256K --pairs 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import children_cpu_s
from benchmarks.volumes import Moto, bytecode_env

EPOCHS = 3


def one(url: str, context: str, work: str) -> dict[str, Any]:
    """In the measuring process: list, then time EPOCHS epochs."""
    from ucstage import DataLoader, VolumeDataset

    listed = VolumeDataset(url, cache_dir=os.path.join(work, "listing"))
    manifest = listed.freeze()  # the main process lists through obstore
    firsts, epochs, engines = [], [], set()
    for epoch in range(EPOCHS):
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


def _run(url: str, context: str, env: dict[str, str], work: str) -> dict[str, Any]:
    folder = tempfile.mkdtemp(dir=work)
    keep = _children()  # the moto server
    # RUSAGE_CHILDREN rather than the child's own rusage (timing.run_command): the
    # forkserver and resource tracker it leaves are reaped here, not by it.
    before = children_cpu_s()
    out = subprocess.run([sys.executable, "-m", "benchmarks.worker_start", "--one", context,
                          "--url", url, "--work", folder], env=env, check=True,
                         capture_output=True, text=True).stdout
    _reap(keep)
    cpu = children_cpu_s() - before
    shutil.rmtree(folder)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = cpu
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="400x256K")
    pairs_argument(parser)
    parser.add_argument("--one", choices=["fork", "default"], help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.url, args.one, args.work)))
        return 0
    _subreaper()
    work = tempfile.mkdtemp(prefix="bench-worker-start-")
    server = Moto(work)
    try:
        url = server.fill(args.moto)
        # The measured process imports this package too: name this checkout's root.
        code = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), code) if p)
        env = bytecode_env({**server.env, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}, work)
        _run(url, "fork", env, work)  # bytecode cache and page cache warm
        runs: dict[str, list[dict[str, Any]]] = {"fork": [], "default": []}
        for pair in range(args.pairs):
            sides = order(["fork", "default"], pair)
            for context in sides:
                runs[context].append(_run(url, context, env, work))
            print(json.dumps({c: runs[c][-1] for c in sides}), file=sys.stderr)
        summary = {}
        for context, results in runs.items():
            summary[context] = {
                "start": results[0]["start"],
                "first_batch_s": [statistics.median(r["first"][e] for r in results)
                                  for e in range(EPOCHS)],
                "epoch_s": [statistics.median(r["epoch"][e] for r in results)
                            for e in range(EPOCHS)],
                "run_cpu_s": statistics.median(r["cpu"] for r in results),
            }
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [{"name": f"{context} {i + 1}", "context": context, **r}
            for context, results in runs.items() for i, r in enumerate(results)]
    Report(benchmark_name(__file__), params_of(args, drop=("json", "one", "url", "work")), rows,
           summary).emit(args.json, json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
