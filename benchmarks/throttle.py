"""A rate-limited store: ``cache warm`` through a proxy that allows RATE object
GETs per second and answers 503 SlowDown above it.

docs/benchmarks.md, "Throttling". A moto server on 127.0.0.1 is filled with
COUNT x SIZE objects (``--moto``, default ``400x256K``); the fault proxy of
tests/common/faults.py runs in this process in front of it with a token
bucket of ``--rate`` GETs per second (burst rate / 10), as S3 throttles a
prefix. Each run is a whole ``ucstage cache warm s3://... --json`` into a
fresh cache, and (``--s5cmd``) an ``s5cmd cp`` of the same
objects, and (``--baseline DIR``) the same warm with the ``ucstage`` package
of another tree (an older commit, extracted there), alternating per round
(``--pairs``, at least 3). Reported: each
tool's median seconds against the ideal N / RATE, the throttled GETs, and
whether every file is right (MD5 against the object's).

    python -m benchmarks.throttle --moto 400x256K --rate 100 --pairs 3 [--s5cmd]
        [--baseline DIR] [--json]
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

from benchmarks.faults import _md5s, _wrong
from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from benchmarks.volumes import Moto, bytecode_env, s3_env, which


def _warm(url: str, env: dict[str, str], work: str, md5s: dict[str, str], i: int,
          faults: Any, tool: str = "ucstage", tree: str = "") -> dict[str, Any]:
    faults.done["throttled"] = 0
    cache = os.path.join(work, f"cache-{tool}-{i}")
    run_env = {**env, "UCSTAGE_CACHE_DIR": cache}
    if tree:
        run_env["PYTHONPATH"] = tree
    # Exit 1 (files that failed) is a result here: it is counted, not fatal.
    done = run_command([sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"],
                       env=run_env, cwd=tree or None, check=False)
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        sys.exit(f"cache warm exited {done.returncode}: {done.stderr.strip()[-500:]}")
    row = {"name": f"{tool} {i + 1}", "tool": tool, "round": i + 1,
           "wall_s": round(done.timing.wall_s, 3), "copy_s": doc["seconds"],
           "throttled": faults.done["throttled"], "failed": len(doc["failed"]),
           "wrong_files": _wrong(doc["namespace"], md5s), "jobs": doc["jobs"]}
    shutil.rmtree(cache, ignore_errors=True)
    return row


def _s5cmd(url: str, env: dict[str, str], work: str, i: int, faults: Any,
           timeout: float) -> dict[str, Any]:
    faults.done["throttled"] = 0
    dest = os.path.join(work, f"s5-{i}")
    start = time.monotonic()
    try:
        proc = subprocess.run([which("s5cmd"), "--endpoint-url", env["AWS_ENDPOINT_URL"], "cp",
                               f"{url}/*", dest + "/"], env=env, capture_output=True,
                              timeout=timeout, check=False)
        finished = proc.returncode == 0
    except subprocess.TimeoutExpired:
        finished = False
    row = {"name": f"s5cmd {i + 1}", "tool": "s5cmd", "round": i + 1,
           "wall_s": round(time.monotonic() - start, 3), "finished": finished,
           "throttled": faults.done["throttled"]}
    shutil.rmtree(dest, ignore_errors=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="400x256K")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="object GETs per second the proxy allows")
    parser.add_argument("--s5cmd", action="store_true", help="also time s5cmd cp")
    parser.add_argument("--s5cmd-timeout", type=float, default=60.0)
    parser.add_argument("--baseline", metavar="DIR", default="",
                        help="a tree whose ucstage package to warm with too")
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    from tests.common.faults import faulty

    work = tempfile.mkdtemp(prefix="ucstage-bench-throttle-")
    server = Moto(work)
    rows: list[dict[str, Any]] = []
    try:
        url = server.fill(args.moto)
        md5s = _md5s(server, url)
        with faulty(server.endpoint) as (proxy, faults):
            env = bytecode_env(s3_env(proxy), work)
            tools = ["ucstage"] + (["baseline"] if args.baseline else []) + \
                (["s5cmd"] if args.s5cmd else [])
            for i in range(args.pairs):
                for tool in order(tools, i):
                    faults.limit(args.rate, prefix=url[len("s3://"):])
                    if tool == "s5cmd":
                        row = _s5cmd(url, env, work, i, faults, args.s5cmd_timeout)
                    else:
                        row = _warm(url, env, work, md5s, i, faults, tool,
                                    args.baseline if tool == "baseline" else "")
                    print(json.dumps(row), file=sys.stderr)
                    rows.append(row)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    ideal = len(md5s) / args.rate
    mine = [r for r in rows if r["tool"] == "ucstage"]
    summary: dict[str, Any] = {
        "files": len(md5s), "rate": args.rate, "ideal_s": round(ideal, 3),
        "ucstage_median_s": statistics.median(r["copy_s"] for r in mine),
        "ucstage_median_throttled": statistics.median(r["throttled"] for r in mine),
        "wrong_files": sum(r["wrong_files"] for r in mine),
        "failed": sum(r["failed"] for r in mine)}
    summary["ucstage_vs_ideal"] = round(summary["ucstage_median_s"] / ideal, 3)
    base = [r for r in rows if r["tool"] == "baseline"]
    if base:
        summary["baseline_median_s"] = statistics.median(r["copy_s"] for r in base)
        summary["baseline_median_throttled"] = statistics.median(r["throttled"] for r in base)
        summary["baseline_failed"] = sum(r["failed"] for r in base)
        summary["baseline_over_ucstage"] = round(statistics.median(
            b["copy_s"] / next(r["copy_s"] for r in mine if r["round"] == b["round"])
            for b in base), 3)
    s5 = [r for r in rows if r["tool"] == "s5cmd"]
    if s5:
        summary["s5cmd_finished"] = sum(r["finished"] for r in s5)
        summary["s5cmd_median_s"] = statistics.median(r["wall_s"] for r in s5)
    Report(benchmark_name(__file__), params_of(args), rows, summary).emit(
        args.json, json.dumps({"rows": rows, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
