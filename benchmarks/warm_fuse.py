#!/usr/bin/env python
"""Benchmark: `ucstage cache warm` through the FUSE mount of a remote volume vs a bare
N-thread Python copy at the same N, and `cp -r`.

Runs inside scripts/remote-volume.sh (it reads UCSTAGE_REMOTE_* and the
RCLONE_S3_* settings that script exports) and copies the SET folder (small/
by default) of the bucket. Each round runs, in alternating order and each on a
*fresh* rclone mount (so no run reads pages an earlier one left in the
mount's page cache), for every N in --jobs:

* ``ucstage cache warm MNT/SET --jobs N`` into an empty cache folder (the
  whole command: interpreter start-up, listing, copying);
* once per round, ``ucstage cache warm MNT/SET`` with its defaults
  (``--jobs auto``), which the issue's targets compare with the best bare N
  of the same round and with ``cp -r``;
* a bare N-thread Python copy (``open``/``read``/``write`` in a thread pool,
  the whole command too): no lock, stamp, ledger or temp file;

and, with --cp, ``cp -r MNT/SET`` once per round. Prints median seconds per
tool, the median of the per-round ratios bare / ucstage at each N, the
default warm against the round's best bare N, and against cp.

    scripts/remote-volume.sh --delay 20ms --small 1000x256K --large 0 -- \\
        .venv/bin/python -m benchmarks.warm_fuse --jobs 8 16 32 64 --rounds 3 --cp
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from benchmarks.files import tree_size
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import BIN, fresh_mount, remote_server, unmount

BARE_COPY = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
src, dst, jobs = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = []
for folder, _, names in os.walk(src):
    for name in names:
        files.append(os.path.relpath(os.path.join(folder, name), src))
def copy(rel):
    out = os.path.join(dst, rel)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(os.path.join(src, rel), "rb") as fi, open(out, "wb") as fo:
        while True:
            block = fi.read(8 << 20)
            if not block:
                break
            fo.write(block)
with ThreadPoolExecutor(jobs) as pool:
    list(pool.map(copy, files))
"""


def count(path: str) -> tuple[int, int]:
    return tree_size(path)


def run_tool(tool: str, jobs: int, work: str, set_name: str,
             want: tuple[int, int]) -> tuple[float, float]:
    """Seconds and client CPU seconds (user + sys of the command) of one run."""
    mnt = fresh_mount(work, tool.replace(" ", "-"))
    out = tempfile.mkdtemp(prefix="out-", dir=work)
    src = os.path.join(mnt, set_name)
    try:
        if tool == "ucstage":
            cmd = [os.path.join(BIN, "ucstage"), "cache", "warm", src]
            cmd += ["--jobs", str(jobs)] if jobs else []  # 0: the default, --jobs auto
            env = dict(os.environ, UCSTAGE_CACHE_DIR=out)
        elif tool == "bare":
            cmd, env = [sys.executable, "-c", BARE_COPY, src, out, str(jobs)], None
        else:
            cmd, env = ["cp", "-r", src, os.path.join(out, set_name)], None
        try:
            timing = run_command(cmd, env=env).timing
        except CommandFailed as exc:
            raise RuntimeError(f"{tool} failed: {exc}") from None
        got = count(out)
        if got != want:
            raise RuntimeError(f"{tool} copied {got}, expected {want}")
        return timing.wall_s, timing.cpu_s
    finally:
        unmount(mnt)
        shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="set_name", default="small")
    parser.add_argument("--jobs", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cp", action="store_true", help="also time cp -r once per round")
    json_argument(parser)
    args = parser.parse_args(argv)
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-warm-fuse-") as work:
        mnt = fresh_mount(work, "count")
        try:
            want = count(os.path.join(mnt, args.set_name))
        finally:
            unmount(mnt)
        runs: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            order: list[tuple[str, int]] = []
            for n in args.jobs:
                pair = [("ucstage", n), ("bare", n)]
                order.extend(pair if (rnd + n) % 2 == 0 else pair[::-1])
            order.insert(len(order) // 2 if rnd % 2 else 0, ("ucstage", 0))
            if args.cp:
                order.insert(len(order) // 2, ("cp -r", 0))
            for tool, n in order:
                seconds, cpu = run_tool(tool, n, work, args.set_name, want)
                runs.append({"round": rnd, "tool": tool, "jobs": n, "seconds": seconds,
                             "cpu_ms_per_file": 1000 * cpu / want[0]})
                label = n or ("auto" if tool == "ucstage" else "")
                print(f"round {rnd + 1}: {tool} {label}: {seconds:.2f} s", file=sys.stderr,
                      flush=True)

    def med(tool: str, n: int) -> float:
        return statistics.median(r["seconds"] for r in runs if r["tool"] == tool
                                 and r["jobs"] == n)

    def one(k: int, tool: str, n: int) -> float:
        return next(r["seconds"] for r in runs if r["round"] == k and r["tool"] == tool
                    and r["jobs"] == n)

    def ratio(n: int) -> list[float]:
        return [one(k, "bare", n) / one(k, "ucstage", n) for k in range(args.rounds)]

    lines.append(f"{want[0]:,} files, {want[1] / 2**20:,.0f} MiB through the rclone FUSE mount "
                 f"({remote_server()} S3 server); "
                 f"{args.rounds} rounds, tools alternating, a fresh mount per run")
    lines.append("| N | ucstage cache warm s (median) | bare N-thread copy s (median) | "
                 "bare / ucstage (median of rounds) | rounds |")
    lines.append("|---:|---:|---:|---:|---|")
    for n in args.jobs:
        ratios = ratio(n)
        lines.append(f"| {n} | {med('ucstage', n):.2f} | {med('bare', n):.2f} | "
                     f"{statistics.median(ratios):.2f}x | {', '.join(f'{x:.2f}x' for x in ratios)} |")
    best_u = min(args.jobs, key=lambda n: med("ucstage", n))
    best_b = min(args.jobs, key=lambda n: med("bare", n))
    lines.append(f"\nbest ucstage: --jobs {best_u} {med('ucstage', best_u):.2f} s; best bare: "
                 f"N={best_b} {med('bare', best_b):.2f} s; bare(best) / ucstage(best) = "
                 f"{med('bare', best_b) / med('ucstage', best_u):.2f}x")

    def cpu_ms(tool: str, n: int) -> float:
        return statistics.median(r["cpu_ms_per_file"] for r in runs if r["tool"] == tool
                                 and r["jobs"] == n)

    lines.append("client CPU per file (user + sys, median), ms: " + ", ".join(
        [f"ucstage auto {cpu_ms('ucstage', 0):.2f}"]
        + [f"ucstage {n} {cpu_ms('ucstage', n):.2f} / bare {n} {cpu_ms('bare', n):.2f}"
           for n in args.jobs] + ([f"cp -r {cpu_ms('cp -r', 0):.2f}"] if args.cp else [])))
    auto = [one(k, "ucstage", 0) for k in range(args.rounds)]
    best_bare = [min(one(k, "bare", n) for n in args.jobs) for k in range(args.rounds)]
    vs_bare = [b / a for a, b in zip(auto, best_bare, strict=True)]
    lines.append(f"default ucstage cache warm (--jobs auto): {statistics.median(auto):.2f} s "
                 f"(rounds {', '.join(f'{a:.2f}' for a in auto)}); the round's best bare copy / "
                 f"it: median {statistics.median(vs_bare):.2f}x "
                 f"(rounds {', '.join(f'{x:.2f}x' for x in vs_bare)})")
    if args.cp:
        cp = med("cp -r", 0)
        vs_cp = [one(k, "cp -r", 0) / a for k, a in enumerate(auto)]
        lines.append(f"cp -r: {cp:.2f} s; cp / ucstage(best) = {cp / med('ucstage', best_u):.1f}x; "
                     f"cp / default ucstage: median {statistics.median(vs_cp):.1f}x "
                     f"(rounds {', '.join(f'{x:.1f}x' for x in vs_cp)})")
    summary = {"best_ucstage_jobs": best_u, "best_ucstage_s": med("ucstage", best_u),
               "best_bare_jobs": best_b, "best_bare_s": med("bare", best_b),
               "default_ucstage_s": statistics.median(auto),
               "best_bare_over_default": statistics.median(vs_bare),
               "files": want[0], "bytes": want[1]}
    if args.cp:
        summary["cp_over_default"] = statistics.median(vs_cp)
    results = [{"name": f"round {r['round'] + 1} {r['tool']} {r['jobs']}", **r} for r in runs]
    Report(benchmark_name(__file__), {**params_of(args), "server": remote_server()}, results,
           summary).emit(
        args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
