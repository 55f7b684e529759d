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
        .venv/bin/python -m benchmarks.ceiling --sets small,large --pairs 3 [--json]
    .venv/bin/python -m benchmarks.ceiling --fill 3000x16K --server rclone
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from typing import Any

from benchmarks.files import tree_size
from benchmarks.pairs import pairs_argument, schedule
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import (
    BIN,
    Moto,
    RcloneS3,
    bytecode_env,
    remote_env,
    remote_server,
    s3_env,
    s3_server,
    which,
)

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


def command(tool: str, url: str, endpoint: str, dest: str) -> list[str]:
    """The whole command of ``tool`` copying ``url`` into the folder ``dest``."""
    if tool.startswith("loop "):
        return [sys.executable, "-c", BARE_LOOP, url, endpoint, dest, tool.split()[1]]
    if tool.startswith("s5cmd"):
        workers = tool.split()[1:]
        return [which("s5cmd"), "--endpoint-url", endpoint,
                *(["--numworkers", workers[0]] if workers else []), "cp", f"{url}/*", dest + "/"]
    return [os.path.join(BIN, "ucstage"), "cache", "warm", url]


def run_tool(tool: str, url: str, endpoint: str, work: str, want: int) -> dict[str, float]:
    """One run of ``tool``: its seconds and client CPU; checks it copied every object."""
    dest = tempfile.mkdtemp(prefix="out-", dir=work)
    env = s3_env(endpoint)
    if tool == "ucstage" or tool.startswith("loop "):
        env = bytecode_env(env, work)
    if tool == "ucstage":
        env["UCSTAGE_CACHE_DIR"] = dest
    try:
        try:
            timing = run_command(command(tool, url, endpoint, dest), env=env).timing
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
        run_tool(warmup, url, endpoint, work, files)  # untimed: bytecode, page cache
    rows: list[dict[str, Any]] = []
    for rnd, tool in schedule(tools, args.pairs):
        found = run_tool(tool, url, endpoint, work, files)
        rows.append({"name": f"{label} round {rnd + 1} {tool}", "set": label, "round": rnd + 1,
                     "tool": tool, **found})
        print(f"{label} round {rnd + 1}: {tool}: {found['seconds']:.2f} s, "
              f"{found['cpu_ms_per_file']:.3f} ms CPU/file", file=sys.stderr, flush=True)
    return rows, summarize(rows, tools, files, nbytes)


def summarize(rows: list[dict[str, Any]], tools: list[str], files: int,
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


def markdown(label: str, s: dict[str, Any], args: argparse.Namespace, where: str) -> str:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    args = parser.parse_args(argv)
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
            parts.append(markdown(label, summary[label], args, where))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary["where"] = where
    summary["load_average_1m"] = os.getloadavg()[0]
    Report(benchmark_name(__file__), params_of(args), rows, summary).emit(
        args.json, "\n\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
