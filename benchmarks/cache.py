"""Reproduce docs/benchmarks.md "Cache warm": ucstage cache warm vs cp -r,
rclone copy and s5cmd, in one run, and the warm-cache lookup rate.

    python -m benchmarks.cache [--small 2000] [--large 16] [--jobs 16] [--json]

* FUSE: a local folder served by ``rclone mount --read-only``. Every tool gets
  its own fresh mount, so no tool reads pages another one pulled into the
  kernel's FUSE page cache. The backing files themselves sit in the host page
  cache for everyone (dropping it would need root-wide cache drops on a shared
  machine), so the comparison is of per-file and per-byte FUSE cost, the part
  a copy tool controls.
* S3: a local S3 server on 127.0.0.1 (``--server``: ``rclone serve s3`` by
  default, or moto as before 2026-12-01); ucstage vs ``s5cmd cp`` vs
  ``rclone copy`` from the S3 side (an ``aws s3 sync``-style baseline).
* Lookups: validated hits per second against a manifest, one process.

Each tool runs ``--repeat`` times in alternating order; the best run counts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from benchmarks.files import tree_size, write_files
from benchmarks.pairs import schedule
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import BIN, mount_folder, s3_server, server_argument, unmount, which

KB, MB = 1024, 1024 * 1024


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    try:
        return run_command(cmd, env=env).timing.wall_s
    except CommandFailed as exc:
        sys.exit(str(exc))


def du(folder: str) -> int:
    """Bytes of data files (ucstage's control folder and temp files are hidden)."""
    return tree_size(folder)[1]


def _best(work: str, tools: dict[str, Callable[[str], float]], chosen: list[str], repeat: int,
          expected: int, prefix: str) -> dict[str, float]:
    """Each chosen tool ``repeat`` times, alternating; its best seconds."""
    results: dict[str, float] = {}
    for _, tool in schedule(chosen, repeat):
        dest = os.path.join(work, f"{prefix}-{tool.split()[0]}")
        seconds = tools[tool](dest)
        if du(dest) != expected:
            sys.exit(f"{tool} copied {du(dest)} bytes of {expected}")
        shutil.rmtree(dest)
        results[tool] = min(seconds, results.get(tool, seconds))
    return results


def fuse_round(work: str, name: str, backing: str, jobs: int, repeat: int,
               only_ucstage: bool) -> dict[str, float]:
    """One data set through a fresh mount per tool run."""
    runs = iter(range(1_000_000))

    def on_mount(fn: Callable[[str, str], float]) -> Callable[[str], float]:
        def run(dest: str) -> float:
            mnt = mount_folder(backing, os.path.join(work, f"mnt-{name}-{next(runs)}"))
            try:
                return fn(mnt, dest)
            finally:
                unmount(mnt)
        return run

    tools = {
        "ucstage": on_mount(lambda mnt, dest: timed(
            [f"{BIN}/ucstage", "cache", "warm", mnt, "--jobs", str(jobs), "--json"],
            env={**os.environ, "UCSTAGE_CACHE_DIR": dest})),
        "cp -r": on_mount(lambda mnt, dest: timed(["cp", "-r", mnt, dest])),
        "rclone copy": on_mount(lambda mnt, dest: timed(
            ["rclone", "copy", mnt, dest, "--transfers", "8"])),
    }
    chosen = ["ucstage"] if only_ucstage else list(tools)
    return _best(work, tools, chosen, repeat, du(backing), f"out-{name}")


def s3_round(work: str, backing: str, jobs: int, repeat: int,
             only_ucstage: bool, kind: str = "rclone") -> dict[str, float]:
    server = s3_server(kind, work)
    try:
        start = time.perf_counter()
        url = server.upload(backing, "bench-cache", "small")
        upload = time.perf_counter() - start
        # AWS_CA_BUNDLE (set on some hosts) breaks rclone's S3 client on plain HTTP.
        env = {k: v for k, v in server.env.items() if k != "AWS_CA_BUNDLE"}
        remote = (f":s3,provider=Other,endpoint='{server.endpoint}',access_key_id=testing,"
                  "secret_access_key=testing:bench-cache/small")
        tools: dict[str, Callable[[str], float]] = {
            "ucstage": lambda dest: timed(
                [f"{BIN}/ucstage", "cache", "warm", url, "--jobs", str(jobs), "--json"],
                env={**env, "UCSTAGE_CACHE_DIR": dest}),
            "s5cmd cp": lambda dest: timed(
                [which("s5cmd"), "--endpoint-url", server.endpoint, "cp", f"{url}/*",
                 dest + "/"], env=env),
            "rclone copy (S3)": lambda dest: timed(
                ["rclone", "copy", remote, dest, "--transfers", "8"], env=env),
        }
        chosen = ["ucstage"] if only_ucstage else list(tools)
        return {"upload_seconds": upload,
                **_best(work, tools, chosen, repeat, du(backing), "s3")}
    finally:
        server.stop()


def lookup_rate(backing: str, seconds: float = 2.0) -> dict[str, float]:
    """Validated warm hits per second against a manifest, in one process."""
    from ucstage.cache import LocalCache
    from ucstage.manifest import snapshot

    with tempfile.TemporaryDirectory() as root:
        m = snapshot(backing)
        vol, entries = m.volume(), list(m.entries)
        cache = LocalCache(os.path.join(root, "c"))
        cache.warm(vol, entries, jobs=8)
        for e in entries:  # the first pass reads each stamp once
            cache.lookup(vol, e)
        hits = rounds = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            hits += sum(cache.lookup(vol, e) is not None for e in entries)
            rounds += 1
        elapsed = time.perf_counter() - start
        if hits != rounds * len(entries):
            sys.exit("lookup missed a warm entry")
        return {"lookups_per_s": hits / elapsed, "entries": len(entries)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000, help="files of 256 KiB")
    parser.add_argument("--large", type=int, default=16, help="files of 64 MiB")
    parser.add_argument("--jobs", type=int, default=16, help="ucstage --jobs")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool (best counts)")
    parser.add_argument("--skip-s3", action="store_true")
    server_argument(parser)
    parser.add_argument("--only-ucstage", action="store_true",
                        help="time ucstage alone (for benchmarks.ab_compare: before vs after)")
    json_argument(parser)
    args = parser.parse_args(argv)
    for tool in ("rclone", "fusermount3", "cp"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt-get install rclone fuse3)")
    repeat = max(1, args.repeat)
    sets: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work:
        small, large = os.path.join(work, "small"), os.path.join(work, "large")
        write_files(small, args.small, 256 * KB, spread=0, name="part-{i:05d}.bin")
        write_files(large, args.large, 64 * MB, spread=0, name="part-{i:05d}.bin")
        sets["fuse_small"] = fuse_round(work, "small", small, args.jobs, repeat,
                                        args.only_ucstage)
        sets["fuse_large"] = fuse_round(work, "large", large, args.jobs, repeat,
                                        args.only_ucstage)
        if not args.skip_s3:
            sets["s3_small"] = s3_round(work, small, args.jobs, repeat, args.only_ucstage,
                                        args.server)
        lookup = lookup_rate(small)
    mb = {"fuse_small": args.small * 256 * KB / 1e6, "fuse_large": args.large * 64 * MB / 1e6,
          "s3_small": args.small * 256 * KB / 1e6}
    results = [{"name": f"{name} {tool}", "set": name, "tool": tool, "seconds": sec,
                "mb_per_s": mb[name] / sec, "ucstage_speedup": sec / found["ucstage"]}
               for name, found in sets.items() for tool, sec in found.items()
               if tool != "upload_seconds"]
    summary = {"lookups_per_s": lookup["lookups_per_s"], "lookup_entries": lookup["entries"],
               **({"s3_upload_seconds": sets["s3_small"]["upload_seconds"]}
                  if "s3_small" in sets else {})}
    Report(benchmark_name(__file__), params_of(args), results, summary).emit(
        args.json, render(args, results, summary))
    return 0


def render(args: argparse.Namespace, results: list[dict[str, Any]],
           summary: dict[str, Any]) -> str:
    titles = {"fuse_small": f"{args.small:,} x 256 KiB on an rclone FUSE mount (fresh mount "
                            "per run):",
              "fuse_large": f"{args.large} x 64 MiB on the same kind of mount:",
              "s3_small": f"The {args.small:,} small files in a {args.server} S3 bucket on "
                          "127.0.0.1:"}
    parts = [f"Best of {max(1, args.repeat)} runs per tool (alternating order); ucstage "
             f"--jobs {args.jobs}.", ""]
    for name, title in titles.items():
        rows = [r for r in results if r["set"] == name]
        if not rows:
            continue
        parts += [title, "", "| tool | seconds | MB/s | ucstage speed-up |",
                  "|---|---:|---:|---:|"]
        parts += [f"| {r['tool']} | {r['seconds']:.2f} | {r['mb_per_s']:.0f} | "
                  f"{r['ucstage_speedup']:.2f}x |" for r in rows]
        parts.append("")
    parts.append(f"Warm-cache lookups validated against a manifest: "
                 f"{summary['lookups_per_s']:,.0f} per second (one process, "
                 f"{summary['lookup_entries']:,} entries).")
    return "\n".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
