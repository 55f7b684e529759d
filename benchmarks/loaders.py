"""Side by side: ucstage's loader, the platform's loader, litData's raw dataset
and a plain torch DataLoader, epoch 1 and later epochs, on the emulated remote volume.

Runs inside scripts/remote-volume.sh (the rclone-served bucket behind its
delay and rate shaping). For each data set (``--sets``: the bucket's
``small/`` and ``large/`` prefixes), each worker count (``--workers``, 4 and
6) and each of ``--pairs`` alternating rounds (:func:`benchmarks.pairs.order`:
every loader once per round, the order reversed every other round), every
loader runs in a fresh Python process (one training script each: imports
are not timed, the dataset's construction and listing are) from a cold
start: a fresh rclone mount, a fresh cache folder. Each item's file is read
whole in the worker; batches of 32 (``collate_fn`` keeps the list).

* ``ucstage fuse``: ``ucstage.VolumeDataset`` over the FUSE mount +
  ``ucstage.DataLoader``, defaults (persistent workers, its start method);
* ``ucstage s3``: the same over ``s3://`` (its workers fork; the main
  process lists through a short-lived child, so they read through obstore);
  on request (``--loaders``), ``ucstage s3 local`` with the wrapper class
  defined inside a function (as in a notebook: it does not pickle), and
  ``ucstage s3 forkserver`` with the workers started from a forkserver;
* ``platform``: ``databricks.air.data.UCVolumeDataset`` + its ``DataLoader``
  (the ``databricks-sdk-air`` package), which takes only ``/Volumes`` paths
  and a flat folder: the prefix is mounted with rclone at
  ``/Volumes/ucstage_bench/<set>/<run>``; it forces fork and persistent
  workers and caches each file under its own temporary folder;
* ``litdata s3``: litData's ``StreamingRawDataset`` over a copy of the prefix
  (it writes its index file into the source prefix: the copy, made once with
  ``s5cmd cp`` on the server, is written to by the first, untimed run), with
  ``cache_files=True`` and ``item_type="path"``, over torch's DataLoader
  (persistent workers, ``prefetch_factor=4``; litData's own loader refuses
  this dataset);
* ``plain``: a map-style dataset of the mounted paths + torch's DataLoader
  with torch's defaults (reads the mount every epoch, so only epoch 1 is timed;
  ``--plain-epochs`` times later ones too).

The FUSE loaders all get the same kind of mount: a fresh read-only rclone
mount of the prefix (the pinned rclone, ``--use-server-modtime``, no VFS
cache). Later epochs: ``--epochs`` (10) back to back after epoch 1, timed
together (a warm epoch of 0.08 s is noise-sized alone); ``later_s`` is their
mean. The store's ceiling is measured in the same rounds: a bare obstore
loop with 256 GETs in flight and ``s5cmd cp`` (:mod:`benchmarks.ceiling`),
each a whole command into an empty folder; each loader's epoch 1 is also
given as a fraction of the round's fastest of the two.

Ratios are within a round (the other's seconds over ucstage's: above 1,
ucstage is faster), median over the rounds.

    pip install -e '.[bench]'   # databricks-sdk-air, litdata, zstd (docs/benchmarks.md)
    scripts/remote-volume.sh --delay 20ms --rate 1gbit --small 3000x16K --large 1000x256K -- \\
        .venv/bin/python -m benchmarks.loaders --pairs 3 [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.ceiling import count_objects, run_tool
from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.volumes import (
    bytecode_env,
    remote_env,
    remote_rclone,
    remote_server,
    unmount,
    wait_mounted,
    which,
    without_ca_bundle,
)

LOADERS = ("ucstage fuse", "ucstage s3", "platform", "litdata s3", "plain")
VARIANTS = ("ucstage s3 local", "ucstage s3 forkserver")
"""Not run by default: the wrapper class defined inside a function (as in a
notebook), and the forkserver start asked for explicitly."""
FUSE_LOADERS = ("ucstage fuse", "platform", "plain")
CEILING = ("loop 256", "s5cmd")
BATCH = 32
VOLUMES = "/Volumes/ucstage_bench"


# --- one run, in its own process ------------------------------------------------------

def _keep(batch: list[Any]) -> list[Any]:
    return batch


def _read_path(path: str) -> int:
    """litData's transform: read the cached file whole, as the other loaders' items are."""
    with open(path, "rb") as fh:
        return len(fh.read())


def build(loader: str, src: str, workers: int, cache: str) -> tuple[Any, Any]:
    """The (dataset, loader) of ``loader`` over ``src``; the dataset has ``set_epoch`` or not."""
    import torch.utils.data as tud

    from benchmarks.datasets import RawPaths, ReadBytes

    if loader.startswith("ucstage"):
        from ucstage import DataLoader, VolumeDataset

        vds = VolumeDataset(src, cache_dir=cache)
        wrapper: Any = ReadBytes
        if loader.endswith(" local"):
            class LocalReadBytes(ReadBytes):  # as in a notebook cell: does not pickle
                pass

            wrapper = LocalReadBytes
        context = "forkserver" if loader.endswith(" forkserver") else None
        return vds, DataLoader(wrapper(vds), batch_size=BATCH, num_workers=workers,
                               collate_fn=_keep, multiprocessing_context=context)
    if loader == "platform":
        from databricks.air.data import DataLoader as AirLoader
        from databricks.air.data import UCVolumeDataset

        ds = UCVolumeDataset(src)
        return ds, AirLoader(ReadBytes(ds), batch_size=BATCH, num_workers=workers,
                             collate_fn=_keep)
    if loader == "litdata s3":
        from litdata import StreamingRawDataset
        from litdata.streaming import downloader

        # Its obstore client has no way to be told of a plain-http endpoint (a
        # real store is https): add allow_http to the client options it builds
        # the store with, nothing else (forked workers inherit it).
        downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
            **downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}  # type: ignore[attr-defined]
        raw = StreamingRawDataset(src, cache_dir=cache, cache_files=True, item_type="path",
                                  transform=_read_path)
        return raw, tud.DataLoader(raw, batch_size=BATCH, num_workers=workers,
                                   persistent_workers=True, prefetch_factor=4,
                                   collate_fn=_keep)
    if loader == "plain":
        paths = sorted(e.path for e in os.scandir(src) if e.is_file())
        return None, tud.DataLoader(RawPaths(paths), batch_size=BATCH, num_workers=workers,
                                    collate_fn=_keep)
    raise ValueError(f"unknown loader {loader!r}")


def _epoch(loader: Any) -> int:
    return sum(len(batch) for batch in loader)


def one_run(loader: str, src: str, workers: int, epochs: int, want: int) -> dict[str, Any]:
    """Epoch 1 (from the dataset's construction) and ``epochs`` more, in this process."""
    import torch  # noqa: F401  (imported before the clock starts, as every script has it)

    cache = tempfile.mkdtemp(prefix="bench-loaders-cache-")
    try:
        start = time.perf_counter()
        ds, dl = build(loader, src, workers, cache)
        got = _epoch(dl)
        first = time.perf_counter() - start
        if got != want:
            raise SystemExit(f"loaders: {loader} delivered {got} items of {want}")
        later = []
        for e in range(1, epochs + 1):
            if hasattr(ds, "set_epoch"):
                ds.set_epoch(e)
            t = time.perf_counter()
            got = _epoch(dl)
            later.append(time.perf_counter() - t)
            if got != want:
                raise SystemExit(f"loaders: {loader} delivered {got} items of {want} in epoch "
                                 f"{e + 1}")
        del dl
        return {"epoch1_s": first, "epoch2_s": later[0] if later else None,
                "later_s": statistics.fmean(later) if later else None, "later_epochs": later}
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# --- the parent: fresh mounts, alternating rounds ------------------------------------

def mount_prefix(prefix: str, where: str, log: str) -> str:
    """A fresh read-only rclone mount of the bucket's ``prefix`` (a flat folder) at ``where``."""
    os.makedirs(where, exist_ok=True)
    subprocess.run([remote_rclone(), "mount", f"{remote_env('UCSTAGE_REMOTE_RCLONE')}/{prefix}",
                    where, "--daemon", "--read-only", "--use-server-modtime",
                    "--dir-cache-time", "5m", "--log-file", log],
                   check=True, env=without_ca_bundle())
    wait_mounted(where, log)
    return where


def unmount_prefix(where: str) -> None:
    """Unmount ``where``; remove it and the folders above it that are left empty."""
    unmount(where)
    with contextlib.suppress(OSError):
        os.removedirs(where)  # stops at the first folder that is not empty


def litdata_copy(url: str, prefix: str, endpoint: str) -> str:
    """A server-side copy of ``url/prefix`` for litData (it writes its index into it)."""
    copy = f"{url}/litdata-{prefix}"
    subprocess.run([which("s5cmd"), "--endpoint-url", endpoint, "cp", f"{url}/{prefix}/*",
                    copy + "/"], check=True, capture_output=True, env=without_ca_bundle())
    return copy


def run_loader(loader: str, src: str, workers: int, epochs: int, want: int,
               work: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.loaders", "--one", loader, "--src", src,
           "--workers", str(workers), "--epochs", str(epochs), "--want", str(want)]
    env = bytecode_env(without_ca_bundle(), work)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    env.get("PYTHONPATH")) if p)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"loaders: {loader} over {src} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def one_round(label: str, prefix: str, workers: int, rnd: int, args: argparse.Namespace,
              ctx: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    names = list(order([*args.loaders, *args.ceiling], rnd))
    for name in names:
        if name in CEILING:
            found = run_tool(name, f"{ctx['url']}/{prefix}", ctx["endpoint"], ctx["work"],
                             ctx["files"][label])
            row: dict[str, Any] = {"epoch1_s": found["seconds"]}
        else:
            mnt = None
            if name in FUSE_LOADERS:
                run = f"w{workers}-r{rnd + 1}-{name.split()[0]}"
                mnt = mount_prefix(prefix, os.path.join(VOLUMES, label, run),
                                   os.path.join(ctx["work"], f"{label}-{run}.rclone.log"))
                src = mnt
            elif name == "litdata s3":
                src = ctx["litdata"][label]
            else:
                src = f"{ctx['url']}/{prefix}"
            epochs = args.plain_epochs if name == "plain" else args.epochs
            try:
                row = run_loader(name, src, workers, epochs, ctx["files"][label], ctx["work"])
            finally:
                if mnt:
                    unmount_prefix(mnt)
        row.update({"name": f"{label} w{workers} round {rnd + 1} {name}", "set": label,
                    "workers": workers, "round": rnd + 1, "loader": name})
        rows.append(row)
        later = row.get("later_s")
        print(f"{label} w{workers} round {rnd + 1}: {name}: epoch 1 {row['epoch1_s']:.2f} s"
              + (f", later {later:.3f} s/epoch" if later else ""), file=sys.stderr, flush=True)
    return rows


TARGETS = (  # (what, ours, theirs, figure, target)
    ("epoch 1 vs plain torch", "ucstage fuse", "plain", "epoch1_s", 1.5),
    ("epoch 1 vs the platform's loader", "ucstage fuse", "platform", "epoch1_s", 1.0),
    ("epoch 1 over s3:// vs litData", "ucstage s3", "litdata s3", "epoch1_s", 1.0),
    ("epoch 1 over s3://, notebook wrapper vs litData", "ucstage s3 local", "litdata s3",
     "epoch1_s", 1.0),
    ("epoch 1 over s3://, notebook wrapper vs module-level", "ucstage s3 local", "ucstage s3",
     "epoch1_s", 1 / 1.1),
    ("epoch 1 over s3://, fork vs forkserver", "ucstage s3", "ucstage s3 forkserver",
     "epoch1_s", 1.0),
    ("epoch 1 over s3:// vs the platform's loader", "ucstage s3", "platform", "epoch1_s", 1.0),
    ("later epochs vs the platform's loader", "ucstage fuse", "platform", "later_s", 0.9),
    ("later epochs over s3:// vs the platform's loader", "ucstage s3", "platform", "later_s",
     0.9),
)


def summarize(rows: list[dict[str, Any]], label: str, workers: int) -> dict[str, Any]:
    mine = [r for r in rows if r["set"] == label and r["workers"] == workers]
    rounds = sorted({r["round"] for r in mine})

    def get(loader: str, key: str) -> list[float | None]:
        by = {r["round"]: r.get(key) for r in mine if r["loader"] == loader}
        return [by.get(k) for k in rounds]

    loaders = sorted({r["loader"] for r in mine}, key=[*LOADERS, *VARIANTS, *CEILING].index)
    med: dict[str, dict[str, float | None]] = {}
    for name in loaders:
        med[name] = {}
        for key in ("epoch1_s", "later_s"):
            vals = [v for v in get(name, key) if v is not None]
            med[name][key] = statistics.median(vals) if vals else None
    ceiling = [min(x for x in xs if x is not None)
               for xs in zip(*(get(t, "epoch1_s") for t in CEILING if t in loaders),
                             strict=True)] if any(t in loaders for t in CEILING) else []
    out: dict[str, Any] = {"median": med, "targets": {}, "of_ceiling": {}}
    if ceiling:
        out["ceiling_s"] = statistics.median(ceiling)
        for name in loaders:
            if name in CEILING:
                continue
            out["of_ceiling"][name] = statistics.median(
                c / v for c, v in zip(ceiling, get(name, "epoch1_s"), strict=True) if v)
    for what, ours, theirs, key, target in TARGETS:
        if ours not in loaders or theirs not in loaders:
            continue
        pairs = [t / o for o, t in zip(get(ours, key), get(theirs, key), strict=True)
                 if o and t]
        if pairs:
            ratio = statistics.median(pairs)
            out["targets"][what] = {"ratio": ratio, "pairs": pairs, "target": target,
                                    "met": ratio >= target}
    return out


def markdown(summaries: dict[str, dict[str, Any]], files: dict[str, int], pairs: int) -> str:
    lines = []
    for key, s in summaries.items():
        label, workers = key.rsplit(" w", 1)
        lines += ["", f"**{label}** ({files[label]:,} files), {workers} workers, "
                  f"{pairs} rounds alternating; medians", "",
                  "| loader | epoch 1 s | later epochs s/epoch | epoch 1 of the ceiling |",
                  "|---|---:|---:|---:|"]
        for name, m in s["median"].items():
            later = f"{m['later_s']:.3f}" if m["later_s"] is not None else "-"
            ceil = s["of_ceiling"].get(name)
            lines.append(f"| {name} | {m['epoch1_s']:.2f} | {later} | "
                         f"{f'{ceil:.2f}' if ceil is not None else '-'} |")
        lines += ["", "| ucstage target | ratio (median of rounds) | rounds | target | |",
                  "|---|---:|---|---:|---|"]
        for what, t in s["targets"].items():
            lines.append(f"| {what} | {t['ratio']:.2f}x | "
                         f"{', '.join(f'{x:.2f}' for x in t['pairs'])} | >= {t['target']:.3g} | "
                         f"{'met' if t['met'] else 'missed'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="small,large",
                        help="prefixes of the remote volume's bucket (default small,large)")
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 6])
    parser.add_argument("--epochs", type=int, default=10,
                        help="later epochs timed back to back after epoch 1 (default 10)")
    parser.add_argument("--plain-epochs", type=int, default=0,
                        help="later epochs for the plain loader (default 0: it reads the "
                             "mount every epoch, as in epoch 1)")
    parser.add_argument("--loaders", default=",".join(LOADERS),
                        help=f"comma-separated subset of {', '.join((*LOADERS, *VARIANTS))}")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="leave out the bare loop and s5cmd")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--want", type=int, help=argparse.SUPPRESS)
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.one, args.src, args.workers[0], args.epochs, args.want)))
        sys.stdout.flush()
        os._exit(0)  # skip finalizing obstore's and litData's runtimes
    args.loaders = [n.strip() for n in args.loaders.split(",")]
    args.ceiling = () if args.no_ceiling else CEILING
    unknown = set(args.loaders) - {*LOADERS, *VARIANTS}
    if unknown:
        parser.error(f"unknown loaders {sorted(unknown)}")
    url, endpoint = remote_env("UCSTAGE_REMOTE_URL"), remote_env("AWS_ENDPOINT_URL")
    sets = args.sets.split(",")
    work = tempfile.mkdtemp(prefix="bench-loaders-")
    rows: list[dict[str, Any]] = []
    try:
        ctx: dict[str, Any] = {"url": url, "endpoint": endpoint, "work": work,
                               "files": {s: count_objects(f"{url}/{s}", endpoint)[0]
                                         for s in sets}, "litdata": {}}
        for label in sets:
            if "litdata s3" in args.loaders:
                ctx["litdata"][label] = litdata_copy(url, label, endpoint)
        for label in sets:  # untimed: bytecode, the server's page cache, litData's index
            for name in args.loaders:
                if name in ("ucstage s3", "litdata s3"):  # the variants share these
                    src = ctx["litdata"][label] if name == "litdata s3" else f"{url}/{label}"
                    run_loader(name, src, 2, 0, ctx["files"][label], work)
        for label in sets:
            for workers in args.workers:
                for rnd in range(args.pairs):
                    rows += one_round(label, label, workers, rnd, args, ctx)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summaries = {f"{label} w{w}": summarize(rows, label, w)
                 for label in sets for w in args.workers}
    where = (f"{remote_server()} server, {os.environ.get('UCSTAGE_REMOTE_DELAY', '?')} RTT, "
             f"{os.environ.get('UCSTAGE_REMOTE_RATE', '?')}")
    text = f"remote volume: {where}; load average {os.getloadavg()[0]:.1f}" + markdown(
        summaries, ctx["files"], args.pairs)
    Report(benchmark_name(__file__), {**params_of(args), "volume": where}, rows,
           summaries).emit(args.json, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
