#!/usr/bin/env python
"""Benchmark ``ucstage export`` against the seed recipe on the same Spark Connect server.

    python -m benchmarks.export [--rows 5000000] [--workdir /tmp/x] [--json]

Writes a Delta table with deltalake, starts ucstage's embedded Spark Connect
server (timing its start-up and first query), then on that one server:

1. warm-up: the seed recipe once, untimed (JIT, file cache);
2. the seed recipe by hand: ``spark.read.parquet(*live_files).write.mode("overwrite")
   .parquet(dest)`` with the live files from delta-rs;
3. ``export_table(..., compression="snappy", force=True)`` -- the seed's codec,
   so the ratio is ucstage's overhead: reading the Delta log, schema, staging,
   footer verification, the export record, swap;
   steps 2 and 3 alternate ``--repeat`` times (default 3): run 1 is the
   one-run ratio, the median is the steadier figure;
4. ``export_table(...)`` with the default zstd, for reference, and a rerun
   that finds the table unchanged.

Prints a Markdown table for docs/benchmarks.md ("## Export"). The machine is
shared and noisy, so read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from benchmarks.pairs import Comparison
from benchmarks.report import Report, benchmark_name, json_argument, params_of


def make_table(path: str, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import write_deltalake

    ids = pa.array(range(rows), pa.int64())
    table = pa.table({
        "id": ids,
        "text": pc.binary_join_element_wise("row ", pc.cast(ids, pa.string()), ""),
        "score": pc.divide(pc.cast(ids, pa.float64()), 7.0),
        "label": pc.cast(pc.bit_wise_and(ids, 7), pa.int32()),
    })
    half = rows // 2
    write_deltalake(path, table.slice(0, half))
    write_deltalake(path, table.slice(half), mode="append")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating seed/ucstage pairs after one warm-up (default 3)")
    json_argument(parser)
    args = parser.parse_args(argv)

    from ucstage.export import export_table
    from ucstage.export import spark as ucspark
    from ucstage.tables.delta import table_state

    work = args.workdir or tempfile.mkdtemp(prefix="ucstage-bench-export-")
    table = os.path.join(work, "table")
    shutil.rmtree(table, ignore_errors=True)
    t0 = time.monotonic()
    make_table(table, args.rows)
    print(f"delta table: {args.rows:,} rows in {time.monotonic() - t0:.1f} s at {table}",
          file=sys.stderr)

    os.environ.pop("SPARK_REMOTE", None)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    session = ucspark.get_session()
    ready = time.monotonic() - t0
    server = ucspark.embedded_server()
    assert server is not None and server.startup_seconds is not None
    t0 = time.monotonic()
    session.range(1).collect()
    first_query = time.monotonic() - t0

    files = table_state(table).files
    seed_dest = os.path.join(work, "seed")

    def seed() -> float:
        t = time.monotonic()
        session.read.parquet(*files).write.mode("overwrite").parquet(seed_dest)
        return time.monotonic() - t

    seed()  # warm-up
    ucs_dest = os.path.join(work, "ucstage")
    pairs: list[tuple[float, float]] = []
    res = None
    for _ in range(args.repeat):
        # Alternate the two, so drift in the machine's load hits both alike.
        seed_s = seed()
        res = export_table(table, ucs_dest, compression="snappy", force=True)
        pairs.append((seed_s, res.seconds))
    assert res is not None
    res_z = export_table(table, os.path.join(work, "ucstage-zstd"), force=True)
    skip = export_table(table, os.path.join(work, "ucstage-zstd"))
    assert skip.skipped_unchanged

    def size(folder: str) -> int:
        return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder)
                   for f in fs)

    c = Comparison([p[0] for p in pairs], [p[1] for p in pairs])
    seed_med, ucs_med = c.a_median, c.b_median
    lines = [f"rows: {res.row_count:,}; {len(files)} live files; load average before: "
             f"{load:.2f}; {os.cpu_count()} cores",
             "| step | seconds | output |\n|---|---:|---:|",
             f"| embedded server: port open | {server.startup_seconds:.1f} | |",
             f"| embedded server: session ready (incl. port) | {ready:.1f} | |",
             f"| first query | {first_query:.1f} | |"]
    for i, (a, b) in enumerate(pairs, 1):
        lines.append(f"| run {i}: seed recipe / ucstage export (snappy) | {a:.2f} / {b:.2f} | "
                     f"ratio {b / a:.2f}x |")
    lines += [f"| median: seed recipe (snappy) | {seed_med:.2f} | "
              f"{size(seed_dest) / 1e6:.0f} MB |",
              f"| median: ucstage export (snappy) | {ucs_med:.2f} | "
              f"{res.record.bytes / 1e6:.0f} MB |",
              f"| ucstage export (zstd, the default) | {res_z.seconds:.2f} | "
              f"{res_z.record.bytes / 1e6:.0f} MB |",
              f"| ucstage export rerun, unchanged (skipped) | {skip.seconds:.3f} | |",
              f"\nratio ucstage/seed: run 1 {pairs[0][1] / pairs[0][0]:.2f}x, median "
              f"{ucs_med / seed_med:.2f}x (target <= 1.15x)"]
    results = [{"name": f"run {i}", "seed_s": a, "ucstage_s": b, "ratio": b / a}
               for i, (a, b) in enumerate(pairs, 1)]
    summary = {"server_port_open_s": server.startup_seconds, "session_ready_s": ready,
               "first_query_s": first_query, "seed_median_s": seed_med,
               "ucstage_median_s": ucs_med, "ratio_of_medians": c.ratio,
               "median_pair_ratio": c.median_pair_ratio, "zstd_s": res_z.seconds,
               "rerun_skipped_s": skip.seconds, "seed_bytes": size(seed_dest),
               "ucstage_bytes": res.record.bytes, "zstd_bytes": res_z.record.bytes,
               "rows": res.row_count, "live_files": len(files), "load_average": load}
    ucspark.stop_embedded()
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    Report(benchmark_name(__file__), params_of(args), results, summary).emit(
        args.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
