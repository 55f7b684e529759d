#!/usr/bin/env python3
"""Run one benchmark script against two checkouts of ucstage, alternating, and
compare the medians: did a change move the figures?

    .venv/bin/python scripts/ab_compare.py --before ../baseline --pairs 3 \\
        -- scripts/bench_shard_plan.py

The script (a path in this checkout) must take ``--json FILE`` and write its
numbers there. Each pair runs it once with ``PYTHONPATH=BEFORE`` and once with
this checkout, in alternating order, so load on a shared machine falls on both
alike. Prints every numeric field's median before, after and the ratio, and
marks ratios outside the tolerance (default ±10%). Times are better lower;
rates (fields ending in ``_per_s``) better higher.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def leaves(doc: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON document, keyed by their dotted path."""
    if isinstance(doc, dict):
        out: dict[str, float] = {}
        for key, value in doc.items():
            out.update(leaves(value, f"{prefix}{key}."))
        return out
    if isinstance(doc, (int, float)) and not isinstance(doc, bool):
        return {prefix.rstrip("."): float(doc)}
    return {}


def run_once(tree: str, script: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
        # cwd elsewhere: with this checkout as cwd, sys.path[0] would shadow PYTHONPATH.
        proc = subprocess.run([sys.executable, os.path.abspath(script[0]), *script[1:],
                               "--json", out], env=env, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:
            sys.exit(f"{script[0]} failed on {tree}: {proc.stderr.strip()[-800:]}")
        with open(out, encoding="utf-8") as fh:
            return leaves(json.load(fh))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="the other checkout (the baseline)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("script", nargs=argparse.REMAINDER, help="-- SCRIPT [ARGS...]")
    args = ap.parse_args()
    script = [a for a in args.script if a != "--"] if args.script else []
    if not script:
        ap.error("give the benchmark script after --")
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for i in range(args.pairs):
        order = [("before", args.before), ("after", HERE)]
        for label, tree in order if i % 2 == 0 else order[::-1]:
            print(f"pair {i + 1}/{args.pairs}: {label}", file=sys.stderr)
            runs[label].append(run_once(tree, script))
    keys = [k for k in runs["after"][0] if all(k in r for r in runs["before"] + runs["after"])]
    table = []
    for key in keys:
        before = statistics.median(r[key] for r in runs["before"])
        after = statistics.median(r[key] for r in runs["after"])
        ratio = after / before if before else float("nan")
        table.append({"metric": key, "before": before, "after": after, "ratio": ratio,
                      "within": abs(ratio - 1) <= args.tolerance})
    print(f"`{' '.join(script)}`, median of {args.pairs} alternating pairs "
          f"(tolerance ±{args.tolerance:.0%}):\n")
    print("| metric | before | after | after/before |\n|---|---:|---:|---:|")
    for row in table:
        mark = "" if row["within"] else " **outside**"
        print(f"| {row['metric']} | {row['before']:.3g} | {row['after']:.3g} | "
              f"{row['ratio']:.2f}{mark} |")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as fh:
            json.dump({"script": script, "pairs": args.pairs, "runs": runs, "table": table},
                      fh, indent=2)


if __name__ == "__main__":
    main()
