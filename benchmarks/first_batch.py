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

    python -m benchmarks.first_batch --fill 400x64K --pairs 3 [--setup 2] [--json]
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
from collections.abc import Iterator
from typing import Any

import torch.utils.data as tud

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.volumes import bytecode_env, s3_server, server_argument

SIDES = ("fork", "forkserver")
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


def _keep(batch: list[str]) -> list[str]:
    return batch


def _earliest(folder: str, name: str) -> float:
    found = []
    for entry in os.listdir(folder):
        if entry.startswith(name + "-"):
            with open(os.path.join(folder, entry)) as fh:
                found.append(float(fh.read()))
    return min(found) if found else float("nan")


def one(url: str, side: str, work: str, workers: int, setup: float) -> dict[str, float]:
    """In the measured process: one first epoch's first batch, in steps."""
    from ucstage import DataLoader, VolumeDataset

    stamps = os.path.join(work, "stamps")
    os.makedirs(stamps)
    ds = VolumeDataset(url, cache_dir=os.path.join(work, "cache"))
    loader = DataLoader(Stamped(ds, stamps), batch_size=32, num_workers=workers,
                        collate_fn=_keep, log_mlflow=False, worker_init_fn=InitStamp(stamps),
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


def probe() -> dict[str, float]:
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


def _measure(args: list[str], env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "benchmarks.first_batch", *args], env=env,
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--one", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.url, args.one, args.work, args.workers, args.setup)))
        return 0
    if args.probe:
        print(json.dumps(probe()))
        return 0
    work = tempfile.mkdtemp(prefix="bench-first-batch-")
    remote = os.environ.get("UCSTAGE_REMOTE_URL")
    server = None if remote else s3_server(args.server, work)
    try:
        url = f"{remote}/{args.set}" if remote else server.fill(args.fill)  # type: ignore[union-attr]
        code = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), code) if p)
        base = dict(os.environ) if server is None else {**os.environ, **server.env}
        env = bytecode_env({**base, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}, work)
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in (*SIDES, "server")}

        def run(side: str) -> None:
            folder = tempfile.mkdtemp(dir=work)
            if side == "server":
                runs[side].append(_measure(["--probe"], env))
            else:
                runs[side].append(_measure(["--one", side, "--url", url, "--work", folder,
                                            "--workers", str(args.workers),
                                            "--setup", str(args.setup)], env))
            shutil.rmtree(folder, ignore_errors=True)
            print(side, json.dumps(runs[side][-1]), file=sys.stderr)

        run("fork")  # bytecode and page caches warm; not counted
        runs["fork"].clear()
        for pair in range(args.pairs):
            for side in order([*SIDES, "server"], pair):
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
            for side in SIDES for step in ("list", *STEPS, "epoch")]
    rows += [{"name": f"server {k}", "seconds": v} for k, v in med["server"].items()]
    lines = ["| step | fork s | forkserver s |", "|---|---:|---:|"]
    lines += [f"| {step} | {med['fork'][step]:.3f} | {med['forkserver'][step]:.3f} |"
              for step in ("list", *STEPS, "epoch")]
    lines += [f"| (probe) {k} | | {v:.3f} |" for k, v in med["server"].items()]
    lines.append(f"\nforkserver / fork, first batch: {statistics.median(ratio):.2f}x "
                 f"(pairs {', '.join(f'{x:.2f}' for x in ratio)})")
    Report(benchmark_name(__file__), params_of(args, drop=("json", "one", "probe", "url", "work")),
           rows, summary).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
