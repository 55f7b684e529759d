"""Compare ucstage with copy tools on the emulated remote volume, in one run.

Run through benchmarks/remote.sh, which starts scripts/remote-volume.sh
and runs this inside it (it reads UCSTAGE_REMOTE_* from the environment).
For each data set (small/ and large/ in the bucket) it times, back to back:

* ``ucstage cache warm`` into a fresh cache, from the FUSE mount and from s3://,
* ``ucstage bench`` direct / cold / warm across worker counts,
* ``cp -r`` from the FUSE mount,
* ``rclone copy --transfers 8`` and ``s5cmd cp`` from the S3 side,
* ``shutil.copytree`` from the FUSE mount (recording how it fails, if it does),

then prints a Markdown section (tables and ratios) and writes the chart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.files import tree_size
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command
from benchmarks.volumes import BIN, REPO, remote_rclone, remote_server
from benchmarks.volumes import remote_env as _env


def _size(path: str) -> tuple[int, int]:
    return tree_size(path, hidden=True)


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds of one command and, when it failed, the last line of its stderr."""
    done = run_command(cmd, env=env, check=False)
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]
    return done.timing.wall_s, error


def _copytree(src: str, dest: str) -> tuple[float, str]:
    start = time.perf_counter()
    try:
        shutil.copytree(src, dest)
        error = ""
    except shutil.Error as exc:  # copytree collects per-file errors, then raises
        first = exc.args[0][0] if exc.args and exc.args[0] else ("", "", str(exc))
        reason = str(first[2]).split(": '", 1)[0]  # drop the temp path
        error = f"shutil.Error on {len(exc.args[0])} files: {reason}"
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - start, error


def run_set(name: str, workers: str, max_seconds: float) -> dict[str, Any]:
    mnt, bucket = _env("UCSTAGE_REMOTE_MNT"), _env("UCSTAGE_REMOTE_URL")
    rclone_remote = _env("UCSTAGE_REMOTE_RCLONE")
    endpoint = _env("UCSTAGE_REMOTE_ENDPOINT")
    src = os.path.join(mnt, name)
    files, nbytes = _size(src)
    rows: list[dict[str, Any]] = []
    scratch = tempfile.mkdtemp(prefix="ucstage-bench-remote-")

    def record(tool: str, seconds: float, error: str = "", note: str = "") -> None:
        rows.append({"tool": tool, "seconds": round(seconds, 2),
                     "mb_per_s": None if error else round(nbytes / 1e6 / seconds, 1),
                     "error": error, "note": note})
        print(f"  {name}: {tool}: {seconds:.2f} s {error}", file=sys.stderr, flush=True)

    def fresh(label: str) -> str:
        path = os.path.join(scratch, label)
        shutil.rmtree(path, ignore_errors=True)
        return path

    try:
        env = dict(os.environ, UCSTAGE_CACHE_DIR=fresh("cache"))
        seconds, error = _timed([f"{BIN}/ucstage", "cache", "warm", src, "--jobs", "8"], env)
        record("ucstage cache warm --jobs 8 (FUSE)", seconds, error)
        shutil.rmtree(env["UCSTAGE_CACHE_DIR"], ignore_errors=True)

        env = dict(os.environ, UCSTAGE_CACHE_DIR=fresh("cache-s3"))
        seconds, error = _timed([f"{BIN}/ucstage", "cache", "warm", f"{bucket}/{name}",
                                 "--jobs", "8"], env)
        record("ucstage cache warm --jobs 8 (S3)", seconds, error)
        shutil.rmtree(env["UCSTAGE_CACHE_DIR"], ignore_errors=True)

        start = time.perf_counter()
        proc = subprocess.run(
            [f"{BIN}/ucstage", "bench", src, "--workers", workers, "--json",
             "--max-seconds", str(max_seconds), "--scratch-dir", scratch],
            capture_output=True, text=True, check=True)
        bench = json.loads(proc.stdout)
        print(f"  {name}: ucstage bench: {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)

        seconds, error = _timed(["cp", "-r", src, fresh("cp")])
        record("cp -r (FUSE)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "cp"), ignore_errors=True)

        seconds, error = _timed([remote_rclone(), "copy", f"{rclone_remote}/{name}", fresh("rclone"),
                                 "--transfers", "8"])
        record("rclone copy --transfers 8 (S3)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "rclone"), ignore_errors=True)

        # Always name the endpoint: s5cmd does not read AWS_ENDPOINT_URL.
        seconds, error = _timed([f"{BIN}/s5cmd", "--endpoint-url", endpoint, "cp",
                                 f"{bucket}/{name}/*",
                                 fresh("s5cmd") + "/"])
        record("s5cmd cp (S3)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "s5cmd"), ignore_errors=True)

        seconds, error = _copytree(src, fresh("copytree"))
        record("shutil.copytree (FUSE)", seconds, error)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"set": name, "files": files, "bytes": nbytes, "tools": rows, "bench": bench}


def chart(sets: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(sets), figsize=(6 * len(sets), 7.5), dpi=100,
                             squeeze=False)
    for col, data in enumerate(sets):
        label = f"{data['set']}: {data['files']:,} files, {data['bytes'] / 2**20:,.0f} MiB"
        ax = axes[0][col]
        for mode in data["bench"]["modes"]:
            runs = [r for r in data["bench"]["results"] if r["mode"] == mode]
            ax.plot([r["workers"] for r in runs], [r["mb_per_s"] for r in runs], marker="o",
                    label=f"bench {mode}")
        ax.set_xticks(data["bench"]["workers"])
        ax.set_xlabel("workers")
        ax.set_ylabel("MB/s")
        ax.set_yscale("log")
        ax.set_title(f"ucstage bench, {label}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        ax = axes[1][col]
        tools = list(data["tools"])
        values = [t["mb_per_s"] or 0 for t in tools]
        bars = ax.barh([t["tool"] for t in tools], values, color=[
            "tab:green" if t["tool"].startswith("ucstage") else "tab:grey" for t in tools])
        for bar, t in zip(bars, tools, strict=True):
            text = "failed" if t["error"] else f"{t['mb_per_s']:.0f} MB/s"
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {text}",
                    va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("MB/s (copy to local disk)")
        ax.set_xlim(0, max([*values, 1]) * 1.3)
        ax.set_title(f"copy tools, {label}", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def markdown(sets: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Emulated volume: {meta['server']} S3 in a network namespace, rclone FUSE mount over a veth "
             f"pair, {meta['delay']} round trip added by {meta['shaper']}, {meta['rate']} "
             f"each way. Worker counts {meta['workers']}.", ""]
    for data in sets:
        b = data["bench"]
        lines += [f"**{data['set']}**: {data['files']:,} files, "
                  f"{data['bytes'] / 2**20:,.0f} MiB", ""]
        lines += ["| mode | " + " | ".join(f"k={k}" for k in b["workers"]) + " |",
                  "|---|" + "---:|" * len(b["workers"])]
        for mode in b["modes"]:
            cells = []
            for k in b["workers"]:
                r = next((r for r in b["results"] if r["mode"] == mode and r["workers"] == k),
                         None)
                cells.append("–" if r is None else
                             f"{r['mb_per_s']:.0f} MB/s, p50 {r['p50_ms']:.1f} ms"
                             + ("" if r["complete"] else " *"))
            lines.append(f"| {mode} | " + " | ".join(cells) + " |")
        warm = b["speedup_warm_vs_direct"]
        lines += ["", f"Recommendation: {b['recommended_workers']} workers "
                  f"({b['recommended_mode']}); per mode {b['recommended_by_mode']}; "
                  f"warm/direct {warm}x, cold/direct {b['speedup_cold_vs_direct']}x.", ""]
        best_direct = max((r["mb_per_s"] for r in b["results"] if r["mode"] == "direct"),
                          default=None)
        lines += ["| copy to local disk | seconds | MB/s | vs cp -r |", "|---|---:|---:|---:|"]
        cp = next((t for t in data["tools"] if t["tool"].startswith("cp -r")), None)
        for t in data["tools"]:
            ratio = ("" if t["error"] or not cp or cp["error"]
                     else f"{cp['seconds'] / t['seconds']:.2f}x")
            mbs = "failed: " + t["error"] if t["error"] else f"{t['mb_per_s']:.0f}"
            lines.append(f"| {t['tool']} | {t['seconds']:.1f} | {mbs} | {ratio} |")
        if best_direct is not None:
            lines.append(f"| (ucstage bench direct, best, read only) | | {best_direct:.0f} | |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="small,large")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--max-seconds", type=float, default=240.0,
                        help="bound on each `ucstage bench` run")
    parser.add_argument("--chart", default=os.path.join(REPO, "docs", "bench-remote.png"))
    parser.add_argument("--delay", default=os.environ.get("UCSTAGE_REMOTE_DELAY", "?"))
    parser.add_argument("--rate", default=os.environ.get("UCSTAGE_REMOTE_RATE", "?"))
    json_argument(parser)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    sets = [run_set(name, args.workers, args.max_seconds) for name in args.sets.split(",")]
    meta = {"delay": args.delay, "rate": args.rate, "workers": args.workers,
            "shaper": os.environ.get("UCSTAGE_REMOTE_SHAPER", "?"), "server": remote_server(),
            "seconds": round(time.perf_counter() - started, 1)}
    chart(sets, args.chart, f"ucstage on an emulated remote volume ({args.delay} RTT, "
          f"{args.rate}, {meta['shaper']})")
    results = [{"name": f"{data['set']} {t['tool']}", "set": data["set"], **t}
               for data in sets for t in data["tools"]]
    print(f"(whole comparison: {meta['seconds']} s)", file=sys.stderr)
    Report(benchmark_name(__file__), params_of(args), results,
           {"meta": meta, "bench": {d["set"]: d["bench"] for d in sets}}).emit(
        args.json, markdown(sets, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
