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

    python -m benchmarks.faults --moto 1000x256K --pairs 3 --cpu [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import Moto, bytecode_env, s3_env, size_spec

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


def _run(case: str, url: str, env: dict[str, str], faults: Any, prefix: str,
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
        _run("none", url, env, faults, prefix, work, md5s, -1)  # fills the bytecode cache
        for i in range(rounds):
            for case in order(list(CASES), i):
                rows.append(_run(case, url, env, faults, prefix, work, md5s, i))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moto", metavar="COUNTxSIZE", default="1000x256K",
                        help="objects to put in the moto server started here")
    pairs_argument(parser)
    parser.add_argument("--cpu", action="store_true",
                        help="also measure the checksums' CPU per GiB here")
    json_argument(parser)
    args = parser.parse_args(argv)
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
    Report(benchmark_name(__file__), params_of(args), result["rows"], summary).emit(
        args.json, json.dumps({"rows": result["rows"], **summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
