"""The fixed cost of ``ucstage cache warm s3://``: time to the first GET, and the whole command.

    python -m benchmarks.fixedcost [--fill 3000x16K --fill 300x16K] [--delay-ms 20]
        [--runs 3] [--json]
    python -m benchmarks.ab_compare --base c5a239d --pairs 3 fixedcost

Starts ``rclone serve s3`` on 127.0.0.1 with each ``--fill`` set (COUNT
objects of SIZE) and scripts/delay_proxy.py in front of it (``--delay-ms``
round trip, half each way), then times ``--runs`` whole ``ucstage cache warm
s3://...`` commands per set, the sets alternating, each into a fresh cache
(interpreter start-up, imports, resolving, listing and copying; Python's
bytecode cache on, as an installed package has it; one untimed warm-up per set
first). Per run: the command's wall time and CPU (``os.wait4``); its copy
phase (the warm's own ``seconds``) and the rest, the fixed cost
(``fixed_s``); and the time from starting the command to its first object GET
reaching the proxy (``first_get_s``: the proxy notes it, scripts/delay_proxy.py's
MARK). Each command is checked to have fetched every object. With
``--cached``, each warm finds every object cached already (no GET): the
command is then its fixed cost alone (start-up, resolving, listing, lookups).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from benchmarks.report import Report, json_argument, params_of
from benchmarks.timing import CommandFailed, run_command
from benchmarks.volumes import (
    RcloneS3,
    bytecode_env,
    delayed,
    s3_env,
    size_spec,
    write_objects,
)

SUITE = "fixedcost"


def _first_get(mark: str, since: float) -> float | None:
    """Seconds from ``since`` to the first object GET the proxy noted (None: none)."""
    try:
        with open(mark, encoding="utf-8") as fh:
            return float(fh.read()) - since
    except (OSError, ValueError):
        return None


def warm_once(url: str, count: int, env: dict[str, str], work: str, mark: str,
              cached: str = "") -> dict[str, Any]:
    """One whole ``ucstage cache warm URL --json`` into a fresh cache (or into
    ``cached``, a cache that holds every object already: then the command is
    its fixed cost alone, with no GET): its figures."""
    cache = cached or tempfile.mkdtemp(prefix="cache-", dir=work)
    for stale in (mark, mark + ".armed"):
        if os.path.exists(stale):
            os.unlink(stale)
    open(mark + ".armed", "w").close()  # the proxy removes it at the first GET
    try:
        start = time.monotonic()
        try:
            run = run_command([sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"],
                              env={**env, "UCSTAGE_CACHE_DIR": cache})
        except CommandFailed as exc:
            raise SystemExit(f"fixedcost: cache warm {url} failed: {exc}") from None
        first = _first_get(mark, start)
        doc = json.loads(run.stdout)
        want = (0, count) if cached else (count, 0)
        if (doc.get("fetched"), doc.get("already_cached")) != want:
            raise SystemExit(f"fixedcost: cache warm {url} fetched {doc.get('fetched')}, found "
                             f"{doc.get('already_cached')} cached, of {count}")
        wall = run.timing.wall_s
        return {"wall_s": wall, "cpu_s": run.timing.cpu_s, "copy_s": doc["seconds"],
                "fixed_s": wall - doc["seconds"], "first_get_s": first,
                "peak_rss_mib": run.timing.peak_rss_mib}
    finally:
        if not cached:
            shutil.rmtree(cache, ignore_errors=True)


def fill(server: RcloneS3, specs: list[str]) -> list[tuple[str, str, int]]:
    """Every set written first, then each listed once (rclone hashes the
    objects for their ETags): written after a listing, a set would stay
    hidden behind rclone's cached listing of the bucket (s5cmd found nothing
    under the second prefix). (spec, URL, count) per set."""
    sets = []
    for i, spec in enumerate(specs):
        count, size = size_spec(spec)
        write_objects(os.path.join(server.root, "bench", f"d{i}"), count, size)
        sets.append((spec, f"d{i}", count))
    return [(spec, server.listed("bench", prefix), count) for spec, prefix, count in sets]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fill", action="append", metavar="COUNTxSIZE", default=[],
                        help="a set of COUNT objects of SIZE (repeatable; default 3000x16K "
                             "and 300x16K)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="round trip the delay proxy adds (default 20)")
    parser.add_argument("--runs", type=int, default=3, help="timed warms per set (default 3)")
    parser.add_argument("--cached", action="store_true",
                        help="time warms of a cache that holds every object already (the "
                             "warm-up fills it): start-up, resolving, listing and the lookups, "
                             "no GET")
    json_argument(parser)


def markdown(summary: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"rclone serve s3 behind the delay proxy at {args.delay_ms:g} ms, median of "
             f"{args.runs} runs per set", "",
             "| set | wall s | CPU s | copy phase s | fixed s | first GET s |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, s in summary.items():
        if not isinstance(s, dict):
            continue
        first = "-" if s["first_get_s"] is None else f"{s['first_get_s']:.3f}"
        lines.append(f"| {label} | {s['wall_s']:.3f} | {s['cpu_s']:.3f} | {s['copy_s']:.3f} | "
                     f"{s['fixed_s']:.3f} | {first} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fixedcost",
                                     description=(__doc__ or "").split("\n\n")[0])
    arguments(parser)
    args = parser.parse_args(argv)
    fills = args.fill or ["3000x16K", "300x16K"]
    work = tempfile.mkdtemp(prefix="ucstage-bench-fixedcost-")
    server: RcloneS3 | None = None
    rows: list[dict[str, Any]] = []
    try:
        server = RcloneS3(work)
        sets = fill(server, fills)
        mark = os.path.join(work, "first-get")
        with delayed(server.port, args.delay_ms, mark) as port:
            env = bytecode_env(s3_env(f"http://127.0.0.1:{port}"), work)
            caches = {url: tempfile.mkdtemp(prefix="cached-", dir=work) if args.cached else ""
                      for _, url, _ in sets}
            for _spec, url, count in sets:  # untimed: bytecode, the server's page cache
                if args.cached:  # fills the cache the timed runs find full
                    run_command([sys.executable, "-m", "ucstage", "cache", "warm", url, "--json"],
                                env={**env, "UCSTAGE_CACHE_DIR": caches[url]})
                warm_once(url, count, env, work, mark, caches[url])
            for run in range(args.runs):
                for spec, url, count in sets if run % 2 == 0 else reversed(sets):
                    found = warm_once(url, count, env, work, mark, caches[url])
                    rows.append({"name": f"{spec} run {run + 1}", "set": spec, "run": run + 1,
                                 **found})
                    first = found["first_get_s"]
                    print(f"{spec} run {run + 1}: {found['wall_s']:.2f} s, fixed "
                          f"{found['fixed_s']:.3f} s, first GET "
                          f"{'-' if first is None else f'{first:.3f}'} s, CPU {found['cpu_s']:.2f} s",
                          file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary: dict[str, Any] = {}
    for spec, _, _ in sets:
        mine = [r for r in rows if r["set"] == spec]
        summary[spec] = {key: (statistics.median(v) if (v := [r[key] for r in mine
                                                                 if r[key] is not None]) else None)
                         for key in ("wall_s", "cpu_s", "copy_s", "fixed_s", "first_get_s")}
    summary["load_average_1m"] = os.getloadavg()[0]
    Report(SUITE, {**params_of(args), "fill": fills}, rows, summary).emit(
        args.json, markdown(summary, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
