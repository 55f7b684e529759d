"""Faults: ``cache warm s3://`` through a fault proxy, with network faults or a rate limit.

The proxy is tests/common/faults.py's, in front of a moto server.

    python -m benchmarks.faults VARIANT [OPTIONS] [--json]

Variants:

* ``network``: stalls, resets and flipped bytes mid-body, each case's time
  against the fault-free run of its round; every cached file checked;
* ``throttle``: a proxy allowing RATE GETs per second (503 SlowDown above
  it), against the ideal N / RATE, s5cmd and another tree's ucstage.

``python -m benchmarks.faults VARIANT --help`` describes each in full. The
proxy (tests/common/faults.py, which imports pytest) is imported where a
variant starts it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import Moto, bytecode_env, s3_env, size_spec, which

SUITE = "faults"


# --- network ------------------------------------------------------------------

CASES = {"none": ("", 0), "stall": ("stall", 50), "reset": ("reset", 20),
         "flip": ("flip", 50)}
"""case -> (fault, every n-th file gets it on its first GET)."""


def _md5s(moto: Moto, url: str) -> dict[str, str]:
    """Relative path -> MD5 of every object under ``url`` (its plain ETag)."""
    import boto3

    bucket, _, prefix = url[len("s3://"):].partition("/")
    s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"][len(prefix) + 1:]] = obj["ETag"].strip('"')
    return found


def _wrong(namespace: str, md5s: dict[str, str]) -> int:
    """Cached files whose bytes differ from the object's (missing ones too)."""
    wrong = 0
    for rel, want in md5s.items():
        path = Path(namespace, rel)
        if not path.exists() or hashlib.md5(path.read_bytes()).hexdigest() != want:
            wrong += 1
    return wrong


def _fault_run(case: str, url: str, env: dict[str, str], faults: Any, prefix: str,
         work: str, md5s: dict[str, str], round_index: int) -> dict[str, Any]:
    from tests.common.faults import every

    kind, nth = CASES[case]
    faults.set(kind, every(md5s, nth) if nth else [], prefix=prefix)
    cache = os.path.join(work, f"cache-{case}-{round_index}")
    cmd = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"]
    try:
        done = run_command(cmd, env={**env, "UCSTAGE_CACHE_DIR": cache})
    except CommandFailed as exc:
        sys.exit(str(exc))
    doc = json.loads(done.stdout)
    row = {"name": f"{case} {round_index + 1}", "case": case, "round": round_index + 1,
           "wall_s": round(done.timing.wall_s, 3), "copy_s": doc["seconds"],
           "cpu_s": round(done.timing.cpu_s, 3), "faults": sum(faults.done.values()),
           "fetched": doc["fetched"], "failed": len(doc["failed"]),
           "wrong_files": _wrong(doc["namespace"], md5s), "checks": doc["checks"],
           "checksum_mismatches": doc["checksum_mismatches"], "hedged": doc["hedged"],
           "timeouts": doc["timeouts"], "jobs": doc["jobs"],
           "longest_stall_s": round(max(faults.stalls, default=0.0), 3)}
    print(json.dumps(row), file=sys.stderr)
    shutil.rmtree(cache, ignore_errors=True)
    return row


def warm_rounds(url: str, moto: Moto, rounds: int, work: str) -> dict[str, Any]:
    from tests.common.faults import faulty

    md5s = _md5s(moto, url)
    prefix = url[len("s3://"):]
    rows: list[dict[str, Any]] = []
    with faulty(moto.endpoint) as (proxy, faults):
        env = bytecode_env(s3_env(proxy), work)
        _fault_run("none", url, env, faults, prefix, work, md5s, -1)  # fills the bytecode cache
        for i in range(rounds):
            for case in order(list(CASES), i):
                rows.append(_fault_run(case, url, env, faults, prefix, work, md5s, i))
    summary: dict[str, Any] = {"files": len(md5s)}
    for case in CASES:
        mine = [r for r in rows if r["case"] == case]
        summary[f"{case}_median_s"] = statistics.median(r["copy_s"] for r in mine)
        summary[f"{case}_wrong_files"] = sum(r["wrong_files"] for r in mine)
        summary[f"{case}_failed"] = sum(r["failed"] for r in mine)
        if case != "none":
            ratios = [r["copy_s"] / next(b["copy_s"] for b in rows
                                         if b["case"] == "none" and b["round"] == r["round"])
                      for r in mine]
            summary[f"{case}_median_ratio"] = round(statistics.median(ratios), 3)
            summary[f"{case}_ratios"] = [round(x, 3) for x in ratios]
    return {"rows": rows, "summary": summary}


def checksum_cpu(mib: int = 512) -> dict[str, Any]:
    """CPU seconds per GiB of each checksum, over 1 MiB chunks (as a GET streams)."""
    import zlib

    block = os.urandom(1024 * 1024)
    algos: dict[str, Any] = {"md5": lambda: _feed(hashlib.md5(usedforsecurity=False), block, mib),
                             "zlib_crc32": lambda: _crc(zlib.crc32, block, mib)}
    try:
        import crc32c  # type: ignore[import-not-found]

        algos["crc32c"] = lambda: _crc(crc32c.crc32c, block, mib)
    except ImportError:
        pass
    found: dict[str, Any] = {}
    for name, fn in algos.items():
        best = min(_cpu(fn) for _ in range(3))
        found[f"{name}_cpu_s_per_gib"] = round(best * 1024 / mib, 3)
    return found


def _feed(digest: Any, block: bytes, mib: int) -> None:
    for _ in range(mib):
        digest.update(block)
    digest.hexdigest()


def _crc(fn: Any, block: bytes, mib: int) -> None:
    value = 0
    for _ in range(mib):
        value = fn(block, value)


def _cpu(fn: Any) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def network_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="1000x256K",
                        help="objects to put in the moto server started here")
    pairs_argument(parser)
    parser.add_argument("--cpu", action="store_true",
                        help="also measure the checksums' CPU per GiB here")
    json_argument(parser)


def run_network(args: argparse.Namespace) -> int:
    """Network faults: ``cache warm`` through a fault proxy in front of moto.

    docs/benchmarks.md, "Network faults". A moto server on 127.0.0.1 is filled
    with COUNT x SIZE objects (``--moto``, default ``1000x256K``); the fault proxy
    of tests/common/faults.py runs in this process in front of it. Each run is a
    whole ``ucstage cache warm s3://... --json`` into a fresh cache through the
    proxy, with one fault case:

    * ``none``: no fault (the baseline; the proxy is still in the path);
    * ``stall``: the first GET of every 50th file (2%) stops mid-body with the
      connection open;
    * ``reset``: that of every 20th (5%) is cut mid-body by a TCP reset;
    * ``flip``: that of every 50th (2%) has one byte inverted.

    The cases run in rounds (``--pairs``, at least 3), the order alternating per
    round; each case's time is divided by the ``none`` run of its round, and the
    medians of those ratios are reported. After every run each cached file's
    MD5 is compared with the object's: ``wrong_files`` must be 0.

    ``--cpu`` also measures the checksums' CPU cost per GiB in this process:
    MD5 (hashlib, what the engine computes) and, when the ``crc32c`` package is
    importable, CRC32C (not used by the engine: obstore returns no stored CRC).

        python -m benchmarks.faults network --moto 1000x256K --pairs 3 --cpu [--json]
    """
    work = tempfile.mkdtemp(prefix="ucstage-bench-faults-")
    server = Moto(work)
    try:
        url = server.fill(args.moto)
        result = warm_rounds(url, server, args.pairs, work)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = result["summary"]
    if args.cpu:
        summary.update(checksum_cpu())
        # What the MD5 of every warmed byte costs, against the whole fault-free
        # warm's CPU (the command's, interpreter start-up included).
        count, size = size_spec(args.moto)
        none_cpu = statistics.median(r["cpu_s"] for r in result["rows"] if r["case"] == "none")
        summary["md5_share_of_warm_cpu"] = round(
            summary["md5_cpu_s_per_gib"] * count * size / 2 ** 30 / none_cpu, 3)
    Report(SUITE, params_of(args), result["rows"], summary).emit(
        args.json, json.dumps({"rows": result["rows"], **summary}, indent=1))
    return 0


# --- throttle -----------------------------------------------------------------

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


def throttle_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="400x256K")
    parser.add_argument("--rate", type=float, default=100.0,
                        help="object GETs per second the proxy allows")
    parser.add_argument("--s5cmd", action="store_true", help="also time s5cmd cp")
    parser.add_argument("--s5cmd-timeout", type=float, default=60.0)
    parser.add_argument("--baseline", metavar="DIR", default="",
                        help="a tree whose ucstage package to warm with too")
    pairs_argument(parser)
    json_argument(parser)


def run_throttle(args: argparse.Namespace) -> int:
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

        python -m benchmarks.faults throttle --moto 400x256K --rate 100 --pairs 3 [--s5cmd]
            [--baseline DIR] [--json]
    """
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
    Report(SUITE, params_of(args), rows, summary).emit(
        args.json, json.dumps({"rows": rows, **summary}, indent=1))
    return 0


VARIANTS = {"network": (network_arguments, run_network),
            "throttle": (throttle_arguments, run_throttle)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
