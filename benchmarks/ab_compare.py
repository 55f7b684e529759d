"""Compare two commits of ucstage on one benchmark: alternating runs, medians.

    python -m benchmarks.ab_compare --base c3a3ebf --head HEAD [--pairs 3] \\
        shard_plan --files 200000 --world-size 32 --num-workers 4
    python -m benchmarks.ab_compare --base c17cffa epochs warm --workers 0 2

Every run uses the benchmark code of *this* tree (``benchmarks/``) and the
``ucstage`` package of one commit: the commit's ``ucstage/`` is extracted with
``git archive`` into a temporary folder, and the run's ``PYTHONPATH`` names
this tree's benchmarks first and that folder second. The benchmarks reach
ucstage only through its public entry points (the library's public API, the
``ucstage`` command), so a commit older than the harness, or than any
benchmark, can still be the baseline. ``--base``/``--head`` take a revision or
the path of a checkout (``--head`` defaults to this working tree, uncommitted
changes included).

Each pair runs the benchmark once per side (``python -m benchmarks.NAME ARGS
--json``; a suite's variant is the first of its ARGS), the order alternating
between pairs, so load on a shared machine falls on both alike. Every numeric figure of the benchmark's JSON document
(``summary`` and ``results`` rows, docs/benchmarks.md) and the whole run's
wall time, CPU and peak RSS are compared: median per side, head/base ratio of
the medians, per-pair ratios; ratios outside ``--tolerance`` (default ±10%)
are marked. Times are better lower, rates (``*_per_s``) higher.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.pairs import MIN_PAIRS, Comparison, alternate, pairs_argument
from benchmarks.report import Report, json_argument, numbers, validate
from benchmarks.timing import CommandFailed, run_command

PACKAGE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(PACKAGE)
HARNESS = {"__init__", "__main__", "ab_compare", "datasets", "files", "pairs", "report",
           "timing", "volumes"}


def benchmark_modules() -> list[str]:
    """The benchmark modules of this tree (every module but the harness)."""
    return sorted(n[:-3] for n in os.listdir(PACKAGE)
                  if n.endswith(".py") and n[:-3] not in HARNESS)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", REPO, *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@dataclass(frozen=True)
class Side:
    """One side of the comparison: where its ``ucstage`` package is imported from."""

    label: str
    spec: str
    commit: str | None
    root: str  # the folder holding its ucstage/

    def pythonpath(self, code: str) -> str:
        return os.pathsep.join([code, self.root])


def resolve(label: str, spec: str, work: str) -> Side:
    """A revision (extracted with ``git archive``) or a checkout's folder as a :class:`Side`."""
    if os.path.isdir(spec):
        root = os.path.abspath(spec)
        if not os.path.isdir(os.path.join(root, "ucstage")):
            sys.exit(f"ab_compare: {spec} holds no ucstage/ package")
        try:
            commit: str | None = subprocess.run(
                ["git", "-C", root, "rev-parse", "HEAD"], check=True, capture_output=True,
                text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = None
        return Side(label, spec, commit, root)
    try:
        commit = _git("rev-parse", "--verify", f"{spec}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"ab_compare: {spec!r} is neither a folder nor a revision of {REPO}")
    root = os.path.join(work, f"{label}-{commit[:12]}")
    os.makedirs(root)
    # git archive rather than a worktree: nothing is registered in the repository,
    # and only the package is extracted, so the commit's own benchmarks/ (if any)
    # cannot shadow this tree's.
    archive = subprocess.Popen(["git", "-C", REPO, "archive", commit, "ucstage"],
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", root], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        sys.exit(f"ab_compare: git archive {commit} failed")
    return Side(label, spec, commit, root)


def run_side(side: Side, code: str, module: str, args: list[str], cwd: str) -> dict[str, Any]:
    """One run of the benchmark on ``side``: its JSON document plus the run's timing."""
    env = {**os.environ, "PYTHONPATH": side.pythonpath(code)}
    try:
        # cwd is an empty folder: with a checkout as cwd, ``python -m`` would put it
        # first on sys.path, ahead of PYTHONPATH.
        run = run_command([sys.executable, "-m", f"benchmarks.{module}", *args, "--json"],
                          env=env, cwd=cwd)
    except CommandFailed as exc:
        sys.exit(f"ab_compare: {module} failed on {side.label} ({side.spec}): {exc}")
    try:
        doc = json.loads(run.stdout)
        validate(doc)
    except ValueError as exc:
        sys.exit(f"ab_compare: {module} on {side.label} printed no contract JSON ({exc}): "
                 f"{run.stdout[:300]!r}")
    imported = (doc.get("env") or {}).get("ucstage_file") or ""
    if not os.path.realpath(imported).startswith(os.path.realpath(side.root) + os.sep):
        sys.exit(f"ab_compare: the {side.label} run imported ucstage from {imported!r}, "
                 f"not from {side.root}")
    doc["process"] = run.timing.to_dict()
    return doc


def figures(doc: dict[str, Any]) -> dict[str, float]:
    """What is compared: the document's numbers and the whole run's timing."""
    found = numbers(doc)
    found.update({f"process.{k}": float(v) for k, v in doc["process"].items()})
    return found


def compare(runs: dict[str, list[dict[str, Any]]], tolerance: float,
            only: list[str]) -> list[dict[str, Any]]:
    """One row per figure present in every run of both sides."""
    base = [figures(d) for d in runs["base"]]
    head = [figures(d) for d in runs["head"]]
    keys = [k for k in head[0] if all(k in r for r in base + head)
            and (not only or any(s in k for s in only))]
    rows = []
    for key in keys:
        c = Comparison([r[key] for r in base], [r[key] for r in head])
        rows.append({"name": key, "base": c.a_median, "head": c.b_median, "ratio": c.ratio,
                     "pair_ratios": c.pair_ratios, "median_pair_ratio": c.median_pair_ratio,
                     "within": c.within(tolerance)})
    return rows


def markdown(rows: list[dict[str, Any]], title: str) -> str:
    lines = [title, "", "| metric | base | head | head/base | pairs |", "|---|---:|---:|---:|---|"]
    for r in rows:
        mark = "" if r["within"] else " **outside**"
        pairs = ", ".join(f"{x:.2f}" for x in r["pair_ratios"])
        lines.append(f"| {r['name']} | {r['base']:.4g} | {r['head']:.4g} | "
                     f"{r['ratio']:.2f}{mark} | {pairs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="benchmarks: " + ", ".join(benchmark_modules()))
    ap.add_argument("--base", required=True, help="the baseline: a revision or a checkout")
    ap.add_argument("--head", default=REPO,
                    help="the change: a revision or a checkout (default: this working tree)")
    pairs_argument(ap)
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--metric", action="append", default=[],
                    help="compare only figures whose name contains this (repeatable)")
    json_argument(ap)
    ap.add_argument("benchmark", help="a module of benchmarks/, e.g. shard_plan or epochs "
                                      "(then its variant, e.g. warm, first in ARGS)")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    args = ap.parse_args(argv)
    module = args.benchmark.removeprefix("benchmarks.").removeprefix("bench_")
    if module not in benchmark_modules():
        ap.error(f"no benchmark {args.benchmark!r}; one of {', '.join(benchmark_modules())}")
    if args.pairs < MIN_PAIRS:
        ap.error(f"--pairs: a median needs at least {MIN_PAIRS} pairs")
    bench_args = [a for a in args.args if a != "--json"]
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    with tempfile.TemporaryDirectory(prefix="ucstage-ab-") as work:
        code = os.path.join(work, "code")
        os.makedirs(code)
        os.symlink(PACKAGE, os.path.join(code, "benchmarks"))
        cwd = os.path.join(work, "cwd")
        os.makedirs(cwd)
        sides = {"base": resolve("base", args.base, work), "head": resolve("head", args.head, work)}

        def progress(r: int, label: str, doc: dict[str, Any]) -> None:
            print(f"pair {r + 1}/{args.pairs}: {label} {doc['process']['wall_s']:.2f} s",
                  file=sys.stderr, flush=True)

        def runner(side: Side) -> Callable[[], dict[str, Any]]:
            return lambda: run_side(side, code, module, bench_args, cwd)

        runs = alternate({label: runner(side) for label, side in sides.items()}, args.pairs,
                         progress)
    rows = compare(runs, args.tolerance, args.metric)
    params = {"benchmark": module, "args": bench_args, "pairs": args.pairs,
              "tolerance": args.tolerance,
              **{f"{label}_{key}": value for label, side in sides.items()
                 for key, value in (("spec", side.spec), ("commit", side.commit))}}
    summary = {"figures": len(rows), "outside": sum(not r["within"] for r in rows)}
    title = (f"`{module} {' '.join(bench_args)}`: base {args.base} "
             f"({(sides['base'].commit or '?')[:10]}) vs head {args.head} "
             f"({(sides['head'].commit or '?')[:10]}), median of {args.pairs} alternating "
             f"pairs (tolerance ±{args.tolerance:.0%}):")
    report = Report("ab_compare", params, rows, summary, extra={"runs": runs})
    report.emit(args.json, markdown(rows, title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
