"""ucstage's object-store engine against s5cmd: whole commands, alternating.

Two measurements (docs/benchmarks.md, "Object-store engine"):

``warm``: ``ucstage cache warm s3://...`` with default options into a fresh
cache, against ``s5cmd cp 's3://.../*' DIR``, in alternating pairs (which
tool goes first alternates too). Each run is a whole command, interpreter
start-up included; client CPU is the child's user + sys time (getrusage).
Prints per pair the times and the ratio s5cmd / ucstage, then the median
ratio, the spread and CPU per file.

``list``: listing N objects, ``ucstage shard-plan s3://... -w 1 -k 1`` (which
lists, plans and prints a summary) against ``s5cmd ls 's3://.../*'``
(output to /dev/null), alternating; the ratio is ucstage / s5cmd.

Where the store is:

* inside scripts/remote-volume.sh (an emulated remote volume at a given
  round trip): ``--url $UCSTAGE_REMOTE_URL/small`` and the endpoint from
  ``AWS_ENDPOINT_URL`` (the script sets both);
* ``--fill SPEC``: a server started here on 127.0.0.1 (``--server rclone``,
  the default: ``rclone serve s3``; ``--server moto``: moto, filled with
  ``s5cmd cp``), with SPEC objects (``COUNTxSIZE``, e.g. ``2000x256K``; for
  ``list``, ``100000x1``), stopped at the end. ``--moto SPEC`` is
  ``--server moto --fill SPEC`` (the form of the figures before 2026-12-01).

    python -m benchmarks.objstore warm --fill 2000x256K --pairs 3 [--json]
    python -m benchmarks.objstore warm --server moto --fill 2000x256K --pairs 3
    python -m benchmarks.objstore list --fill 100000x1 --pairs 3
    scripts/remote-volume.sh --delay 20ms --small 1000x256K --large none -- \\
        .venv/bin/python -m benchmarks.objstore warm --url s3://ucstage-remote/small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import Moto, RcloneS3, bytecode_env, s3_env, s3_server, which


def _timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, the command's CPU seconds, stdout) of one command."""
    try:
        done = run_command(cmd, env=env)
    except CommandFailed as exc:
        sys.exit(str(exc))
    return done.timing.wall_s, done.timing.cpu_s, done.stdout


def warm(url: str, endpoint: str, pairs: int, work: str, extra: list[str]) -> dict[str, Any]:
    env = s3_env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json", *extra]
    s5cmd = [which("s5cmd"), "--endpoint-url", endpoint, "cp", f"{url}/*"]
    ucenv = bytecode_env(env, work)
    # One untimed run fills the bytecode cache (and, for both tools alike, the
    # server's page cache).
    _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": os.path.join(work, "cache-warmup")})
    shutil.rmtree(os.path.join(work, "cache-warmup"), ignore_errors=True)
    rows = []
    for i in range(pairs):
        cache = os.path.join(work, f"cache{i}")
        dest = os.path.join(work, f"s5cmd{i}") + "/"
        runs: dict[str, tuple[float, float, str]] = {}
        tools = order(["ucstage", "s5cmd"], i)
        for tool in tools:
            if tool == "ucstage":
                runs[tool] = _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": cache})
            else:
                runs[tool] = _timed([*s5cmd, dest], env)
        doc = json.loads(runs["ucstage"][2])
        files = doc["files"]
        row = {"name": f"pair {i + 1}", "pair": i + 1, "first": tools[0], "files": files,
               "ucstage_s": round(runs["ucstage"][0], 3), "s5cmd_s": round(runs["s5cmd"][0], 3),
               "ucstage_copy_s": doc["seconds"],
               "ratio": round(runs["s5cmd"][0] / runs["ucstage"][0], 3),
               "ucstage_cpu_ms_per_file": round(runs["ucstage"][1] / files * 1e3, 3),
               "s5cmd_cpu_ms_per_file": round(runs["s5cmd"][1] / files * 1e3, 3),
               "engine": doc["engine"], "jobs": doc["jobs"]}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
    ratios = [r["ratio"] for r in rows]
    return {"what": "warm", "url": url, "pairs": rows,
            "median_ratio": round(statistics.median(ratios), 3),
            "min_ratio": min(ratios), "max_ratio": max(ratios),
            "median_ucstage_cpu_ms_per_file": statistics.median(
                r["ucstage_cpu_ms_per_file"] for r in rows),
            "median_s5cmd_cpu_ms_per_file": statistics.median(
                r["s5cmd_cpu_ms_per_file"] for r in rows)}


def listing(url: str, endpoint: str, pairs: int) -> dict[str, Any]:
    env = s3_env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "shard-plan", url, "-w", "1", "-k", "1"]
    s5cmd = [which("s5cmd"), "--endpoint-url", endpoint, "ls", f"{url}/*"]
    rows: list[dict[str, Any]] = []
    for i in range(pairs):
        tools = order(["ucstage", "s5cmd"], i)
        times = {}
        for tool in tools:
            times[tool] = _timed(ucstage if tool == "ucstage" else s5cmd, env)
        row = {"name": f"pair {i + 1}", "pair": i + 1, "first": tools[0],
               "ucstage_s": round(times["ucstage"][0], 3),
               "s5cmd_s": round(times["s5cmd"][0], 3),
               "ratio": round(times["ucstage"][0] / times["s5cmd"][0], 3),
               "ucstage_cpu_s": round(times["ucstage"][1], 3),
               "s5cmd_cpu_s": round(times["s5cmd"][1], 3)}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    ratios = [r["ratio"] for r in rows]
    return {"what": "list", "url": url, "pairs": rows,
            "median_ratio": round(statistics.median(ratios), 3),
            "min_ratio": min(ratios), "max_ratio": max(ratios)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["warm", "list"])
    parser.add_argument("--url", help="the source (inside remote-volume.sh)")
    parser.add_argument("--fill", metavar="COUNTxSIZE",
                        help="start --server here and fill it with COUNT objects of SIZE")
    parser.add_argument("--server", choices=("rclone", "moto"), default=None,
                        help="the server --fill starts: rclone serve s3 (default) or moto")
    parser.add_argument("--moto", metavar="COUNTxSIZE", help="--server moto --fill COUNTxSIZE")
    pairs_argument(parser)
    parser.add_argument("--ucstage-arg", action="append", default=[],
                        help="extra argument for ucstage cache warm (e.g. --jobs=32)")
    json_argument(parser)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="ucstage-bench-obj-")
    if args.moto:
        args.fill, args.server = args.moto, args.server or "moto"
    server: Moto | RcloneS3 | None = None
    try:
        if args.fill:
            args.server = args.server or "rclone"
            server = s3_server(args.server, work)
            url, endpoint = server.fill(args.fill), server.endpoint
        else:
            if not args.url or not os.environ.get("AWS_ENDPOINT_URL"):
                sys.exit("objstore: pass --fill (or --moto), or --url inside remote-volume.sh")
            args.server = os.environ.get("UCSTAGE_REMOTE_SERVER", "moto")
            url, endpoint = args.url, os.environ["AWS_ENDPOINT_URL"]
        if args.what == "warm":
            result = warm(url, endpoint, args.pairs, work, args.ucstage_arg)
        else:
            result = listing(url, endpoint, args.pairs)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = result.pop("pairs")
    Report(benchmark_name(__file__), params_of(args), rows, result).emit(
        args.json, json.dumps({"pairs": rows, **result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
