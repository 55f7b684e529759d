"""ucstage's object-store engine against s5cmd: whole commands, alternating.

Two measurements (docs/benchmarks.md, "Object-store engine"):

``warm``: ``ucstage cache warm s3://...`` with default options into a fresh
cache, against ``s5cmd cp 's3://.../*' DIR``, in alternating pairs (which
tool goes first alternates too). Each run is a whole command, interpreter
start-up included; client CPU is the child's user + sys time (getrusage).
Prints per pair the times and the ratio s5cmd / ucstage, then the median
ratio, the spread and CPU per file.

``list``: listing N objects, ``ucstage shard-plan s3://... -w 1 -k 1`` (which
lists, plans and prints a summary) against ``s5cmd ls 's3://.../*'``
(output to /dev/null), alternating; the ratio is ucstage / s5cmd.

Where the store is:

* inside scripts/remote-volume.sh (an emulated remote volume at a given
  round trip): ``--url $UCSTAGE_REMOTE_URL/small`` and the endpoint from
  ``AWS_ENDPOINT_URL`` (the script sets both);
* ``--moto SPEC``: a moto server started here on 127.0.0.1, filled with
  ``s5cmd cp`` (SPEC is ``COUNTxSIZE``, e.g. ``2000x256K``; for ``list``,
  ``100000x1``), stopped at the end.

    python scripts/bench_objstore.py warm --moto 2000x256K --pairs 3
    python scripts/bench_objstore.py list --moto 100000x1 --pairs 3
    scripts/remote-volume.sh --delay 20ms --small 1000x256K --large none -- \\
        .venv/bin/python scripts/bench_objstore.py warm --url s3://ucstage-remote/small
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)


def _which(name: str) -> str:
    found = shutil.which(name, path=BIN) or shutil.which(name)
    if not found:
        sys.exit(f"bench_objstore.py: {name} is not installed")
    return found


def _timed(cmd: list[str], env: dict[str, str], stdout: Any = subprocess.DEVNULL
           ) -> tuple[float, float, str]:
    """(wall seconds, child CPU seconds, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout or ""


def _size(spec: str) -> tuple[int, int]:
    count, size = spec.lower().split("x")
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    n = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return int(count), n


class Moto:
    """A moto server on 127.0.0.1 holding COUNT objects of SIZE under bench/."""

    def __init__(self, spec: str, work: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(work, "moto.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([_which("moto_server"), "-H", "127.0.0.1", "-p",
                                      str(self.port)], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("moto_server did not start")
                time.sleep(0.1)
        env = _env(self.endpoint)
        s5 = [_which("s5cmd"), "--endpoint-url", self.endpoint]
        subprocess.run([*s5, "mb", "s3://bench"], env=env, check=True, capture_output=True)
        count, size = _size(spec)
        gen = os.path.join(work, "gen")
        os.makedirs(gen)
        width = len(str(count - 1))
        print(f"writing {count:,} x {size:,} B into moto ...", file=sys.stderr)
        for i in range(count):
            with open(os.path.join(gen, f"f{i:0{width}d}.bin"), "wb") as fh:
                fh.write(os.urandom(size))
        subprocess.run([*s5, "--numworkers", "64", "cp", f"{gen}/*", "s3://bench/data/"],
                       env=env, check=True, capture_output=True)
        shutil.rmtree(gen)
        self.url = "s3://bench/data"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


def _env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


def _bytecode(env: dict[str, str], work: str) -> dict[str, str]:
    """``env`` with Python's bytecode cache on (in ``work``), as an installed
    package has it: where ``PYTHONDONTWRITEBYTECODE`` is set (as on this
    project's machines), every command would otherwise compile ucstage's
    modules from source, which no user's install does."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    return env


def warm(url: str, endpoint: str, pairs: int, work: str, extra: list[str]) -> dict[str, Any]:
    env = _env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json", *extra]
    s5cmd = [_which("s5cmd"), "--endpoint-url", endpoint, "cp", f"{url}/*"]
    ucenv = _bytecode(env, work)
    # One untimed run fills the bytecode cache (and, for both tools alike, the
    # server's page cache).
    _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": os.path.join(work, "cache-warmup")})
    shutil.rmtree(os.path.join(work, "cache-warmup"), ignore_errors=True)
    rows = []
    for i in range(pairs):
        cache = os.path.join(work, f"cache{i}")
        dest = os.path.join(work, f"s5cmd{i}") + "/"
        runs: dict[str, tuple[float, float, str]] = {}
        order = ["ucstage", "s5cmd"] if i % 2 == 0 else ["s5cmd", "ucstage"]
        for tool in order:
            if tool == "ucstage":
                runs[tool] = _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": cache},
                                    stdout=subprocess.PIPE)
            else:
                runs[tool] = _timed([*s5cmd, dest], env)
        doc = json.loads(runs["ucstage"][2])
        files = doc["files"]
        row = {"pair": i + 1, "first": order[0], "files": files,
               "ucstage_s": round(runs["ucstage"][0], 3), "s5cmd_s": round(runs["s5cmd"][0], 3),
               "ucstage_copy_s": doc["seconds"],
               "ratio": round(runs["s5cmd"][0] / runs["ucstage"][0], 3),
               "ucstage_cpu_ms_per_file": round(runs["ucstage"][1] / files * 1e3, 3),
               "s5cmd_cpu_ms_per_file": round(runs["s5cmd"][1] / files * 1e3, 3),
               "engine": doc["engine"], "jobs": doc["jobs"]}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(dest, ignore_errors=True)
    ratios = [r["ratio"] for r in rows]
    return {"what": "warm", "url": url, "pairs": rows,
            "median_ratio": round(statistics.median(ratios), 3),
            "min_ratio": min(ratios), "max_ratio": max(ratios),
            "median_ucstage_cpu_ms_per_file": statistics.median(
                r["ucstage_cpu_ms_per_file"] for r in rows),
            "median_s5cmd_cpu_ms_per_file": statistics.median(
                r["s5cmd_cpu_ms_per_file"] for r in rows)}


def listing(url: str, endpoint: str, pairs: int) -> dict[str, Any]:
    env = _env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "shard-plan", url, "-w", "1", "-k", "1"]
    s5cmd = [_which("s5cmd"), "--endpoint-url", endpoint, "ls", f"{url}/*"]
    rows = []
    for i in range(pairs):
        order = ["ucstage", "s5cmd"] if i % 2 == 0 else ["s5cmd", "ucstage"]
        times = {}
        for tool in order:
            times[tool] = _timed(ucstage if tool == "ucstage" else s5cmd, env)
        row = {"pair": i + 1, "first": order[0], "ucstage_s": round(times["ucstage"][0], 3),
               "s5cmd_s": round(times["s5cmd"][0], 3),
               "ratio": round(times["ucstage"][0] / times["s5cmd"][0], 3),
               "ucstage_cpu_s": round(times["ucstage"][1], 3),
               "s5cmd_cpu_s": round(times["s5cmd"][1], 3)}
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    ratios = [r["ratio"] for r in rows]
    return {"what": "list", "url": url, "pairs": rows,
            "median_ratio": round(statistics.median(ratios), 3),
            "min_ratio": min(ratios), "max_ratio": max(ratios)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["warm", "list"])
    parser.add_argument("--url", help="the source (inside remote-volume.sh)")
    parser.add_argument("--moto", metavar="COUNTxSIZE", help="start moto here and fill it")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--ucstage-arg", action="append", default=[],
                        help="extra argument for ucstage cache warm (e.g. --jobs=32)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="ucstage-bench-obj-")
    server = None
    try:
        if args.moto:
            server = Moto(args.moto, work)
            url, endpoint = server.url, server.endpoint
        else:
            if not args.url or not os.environ.get("AWS_ENDPOINT_URL"):
                sys.exit("bench_objstore.py: pass --moto, or --url inside remote-volume.sh")
            url, endpoint = args.url, os.environ["AWS_ENDPOINT_URL"]
        if args.what == "warm":
            result = warm(url, endpoint, args.pairs, work, args.ucstage_arg)
        else:
            result = listing(url, endpoint, args.pairs)
        print(json.dumps(result, indent=1))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
