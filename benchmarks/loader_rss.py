#!/usr/bin/env python3
"""Issue 15's loader target: RSS of a VolumeDataset + DataLoader(num_workers=2)
over a 200,000-file manifest, against a plain torch DataLoader over the same
paths, after the first item.

    python -m benchmarks.loader_rss [--files 200000] [--dir /tmp/ucstage-bench-rss] [--json]

Each side runs in its own fresh process; memory is read from /proc/<pid>/smaps_rollup
(RSS and PSS, from smaps_rollup) of the main process and of each worker once the first batch arrived.
The files are real (one byte each), written once and reused.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command

CHILD = r"""
import json, os, sys
import torch.utils.data as tud

def rss(pid):
    # (RSS, PSS) in MiB: PSS splits shared pages (the memory-mapped manifest,
    # the forked parent's pages) between the processes that map them.
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        found = {l.split(":")[0]: int(l.split()[1]) / 1024 for l in fh if l[:4] in ("Rss:", "Pss:")}
    return [found.get("Rss", 0.0), found.get("Pss", 0.0)]

kind, root, manifest = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "plain":
    class Paths(tud.IterableDataset):
        def __init__(self, paths):
            self.paths = paths
        def __iter__(self):
            info = tud.get_worker_info()
            k, w = (info.num_workers, info.id) if info else (1, 0)
            yield from self.paths[w::k]
    paths = sorted(os.path.join(d, n) for d, _, ns in os.walk(root) for n in ns)
    loader = tud.DataLoader(Paths(paths), batch_size=None, num_workers=2)
else:
    from ucstage import DataLoader, VolumeDataset
    ds = VolumeDataset(manifest, cache_dir=os.path.join(os.path.dirname(manifest), "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=2, log_mlflow=False)
it = iter(loader)
next(it)
workers = [w.pid for w in it._workers]
print(json.dumps({"main": rss(os.getpid()), "workers": [rss(p) for p in workers]}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200_000)
    ap.add_argument("--dir", default="/tmp/ucstage-bench-rss")
    json_argument(ap)
    args = ap.parse_args(argv)
    root = os.path.join(args.dir, "vol")
    if not os.path.isdir(root):
        for i in range(args.files):
            folder = os.path.join(root, f"d{i % 200:03d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"f{i:07d}.bin"), "wb") as fh:
                fh.write(b"x")
    manifest = os.path.join(args.dir, "train.manifest.arrow")
    if not os.path.exists(manifest):
        from ucstage.manifest import save, snapshot

        save(snapshot(root), manifest)
    out: dict[str, Any] = {}
    for kind in ("plain", "ucstage"):
        try:
            done = run_command([sys.executable, "-c", CHILD, kind, root, manifest],
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
        except CommandFailed as exc:
            sys.exit(f"{kind} failed: {exc}")
        out[kind] = json.loads(done.last_line)
    plain, ours = out["plain"], out["ucstage"]
    lines = [f"{args.files:,} files, DataLoader(num_workers=2), after the first item (MiB):",
             "| process | plain RSS | ucstage RSS | RSS diff | plain PSS | ucstage PSS "
             "| PSS diff |", "|---|---:|---:|---:|---:|---:|---:|"]
    rows = [("main", plain["main"], ours["main"])] + [
        (f"worker {i}", p, u) for i, (p, u) in
        enumerate(zip(plain["workers"], ours["workers"], strict=True))]
    results = []
    for name, p, u in rows:
        lines.append(f"| {name} | {p[0]:.0f} | {u[0]:.0f} | {u[0] - p[0]:+.0f} | {p[1]:.0f} | "
                     f"{u[1]:.0f} | {u[1] - p[1]:+.0f} |")
        results.append({"name": name, "plain_rss_mib": p[0], "ucstage_rss_mib": u[0],
                        "plain_pss_mib": p[1], "ucstage_pss_mib": u[1]})
    Report(benchmark_name(__file__), params_of(args), results).emit(args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
