"""Row filters on a Delta table in s3 (issue 42): bytes fetched and the first batch, filtered or not.

    python -m benchmarks.tablefilter [--rows 5000000] [--files 10] [--group-rows 131072]
        [--pad 80] [--share 0.1] [--workers 2] [--batch-rows 8192] [--delay-ms 20]
        [--pairs 3] [--json]

Set-up, untimed: a Delta table of ROWS rows sorted by ``ts`` (int64, 0 ..
ROWS-1), with ``user`` (int32), ``label`` (int8) and ``pad`` (PAD random
bytes, which do not compress), written by deltalake in FILES commits of one
file each (row groups of GROUP_ROWS rows; the log's per-file statistics are
deltalake's), then copied whole to moto (s5cmd) under
``s3://bench/events``. Every client reaches moto through
scripts/delay_proxy.py (``--delay-ms`` round trip, half each way), which
counts the bytes moto sent back (``DELAY_PROXY_COUNT``): what a run fetched,
the log, listings and footers included. moto, not rclone serve s3: rclone
answers a ranged GET with the whole object (200, not 206), which obstore
refuses, and a row group is a ranged GET.

The filter is ``ts >= LO and ts < HI``, SHARE of the rows from the middle of
the table (LO = 0.45 ROWS for 10%): the readers deal row groups to their
workers in strides, so a window in the middle is met half-way through an
unfiltered epoch, the average of a window anywhere.

The sides, in alternating rounds (every side once per round, the order
reversed every other round), each a fresh Python process (imports untimed,
then from the dataset's construction) with a fresh cache folder:

* ``filtered``: ``TableDataset(url, filter=...)`` through
  ``ucstage.DataLoader`` (``--workers``, ``batch_rows``): seconds to the
  first batch and to the end of the epoch, rows delivered (checked to equal
  ``pyarrow.dataset``'s ``count_rows`` of the same filter over the table,
  and every row to match);
* ``unfiltered``: the same without ``filter=``, the filter applied in the
  loop as a training loop without row filters does: the first batch, the
  first batch holding a matching row (``first_match_s``: when training on the
  window can start), the end, and the matching rows (checked as above);
* ``ceiling``: a bare ``deltalake.DeltaTable(url).to_pyarrow_dataset()
  .to_table(filter=...)`` from the same store (pyarrow's own pushdown, no
  cache, one process).

Each result row carries the bytes the proxy counted during the run and the
1-minute load average when it ended (``load_1m``): the machine is shared.
The targets (issue 42): the filtered run fetches at most 0.2x the table's
bytes (its data files' sizes), and reaches its first batch at least 5x sooner
than the unfiltered run reaches its first matching batch; both medians of
the rounds' own ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.pairs import order, pairs_argument
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.volumes import (
    Moto,
    bytecode_env,
    delayed,
    s3_env,
    with_this_checkout,
)

NAME = benchmark_name(__file__)
SIDES = ("filtered", "unfiltered", "ceiling")
BYTES_TARGET = 0.2  # the filtered run's bytes over the table's, at most
FIRST_TARGET = 5.0  # the unfiltered first matching batch over the filtered first batch, at least


# --- the table ------------------------------------------------------------------------

def write_table(local: str, rows: int, files: int, group_rows: int, pad: int) -> int:
    """The sorted table in ``local`` (FILES deltalake commits); its data bytes."""
    import deltalake
    import numpy as np
    import pyarrow as pa

    props = deltalake.WriterProperties(max_row_group_size=group_rows, compression="SNAPPY")
    per_file = -(-rows // files)
    rng = np.random.default_rng(42)
    for i in range(files):
        start, stop = i * per_file, min(rows, (i + 1) * per_file)
        n = stop - start
        blob = pa.py_buffer(rng.integers(0, 256, n * pad, dtype=np.uint8).tobytes())
        padding = pa.FixedSizeBinaryArray.from_buffers(pa.binary(pad), n, [None, blob])
        part = pa.table({"ts": pa.array(np.arange(start, stop, dtype=np.int64)),
                         "user": pa.array(rng.integers(0, 1 << 20, n, dtype=np.int32)),
                         "label": pa.array(rng.integers(0, 10, n, dtype=np.int8)),
                         "pad": padding.cast(pa.binary())})
        deltalake.write_deltalake(local, part, mode="append" if i else "error",
                                  writer_properties=props)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(local)
               for f in names if f.endswith(".parquet") and "_delta_log" not in d)


def window(rows: int, share: float) -> tuple[int, int]:
    """[LO, HI) of ``ts``: ``share`` of the rows, centred on the table's middle."""
    width = max(1, round(rows * share))
    lo = max(0, rows // 2 - width // 2)
    return lo, min(rows, lo + width)


def filter_text(lo: int, hi: int) -> str:
    return f"ts >= {lo} and ts < {hi}"


def expression(lo: int, hi: int) -> Any:
    import pyarrow.compute as pc

    return (pc.field("ts") >= lo) & (pc.field("ts") < hi)


# --- one run, in its own process --------------------------------------------------------

def one_loader(side: str, url: str, lo: int, hi: int, workers: int, batch_rows: int,
               cache: str) -> dict[str, Any]:
    """``TableDataset`` over ``url`` (with the filter, or without it and the
    filter applied here) through ``ucstage.DataLoader``: seconds to the first
    batch, the first matching batch and the end; rows delivered and matching."""
    import pyarrow.compute as pc

    from ucstage import DataLoader, TableDataset

    start = time.perf_counter()
    given = filter_text(lo, hi) if side == "filtered" else None
    ds = TableDataset(url, filter=given, batch_rows=batch_rows, cache_dir=cache)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    first = first_match = None
    delivered = matching = 0
    for batch in loader:
        now = time.perf_counter() - start
        if first is None:
            first = now
        ts = batch.column("ts")
        hits = pc.sum(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi))).as_py() or 0
        if hits and first_match is None:
            first_match = now
        delivered += batch.num_rows
        matching += hits
    seconds = time.perf_counter() - start
    if first is None or first_match is None:
        raise SystemExit(f"{NAME}: {side} delivered no matching row")
    return {"seconds": seconds, "first_batch_s": first, "first_match_s": first_match,
            "rows": delivered, "matching": matching}


def one_ceiling(url: str, lo: int, hi: int) -> dict[str, Any]:
    """deltalake's pyarrow dataset over the same store, the same filter."""
    import deltalake

    options = {"aws_endpoint_url": os.environ["AWS_ENDPOINT_URL"], "aws_region": "us-east-1",
               "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
               "aws_allow_http": "true"}
    start = time.perf_counter()
    table = deltalake.DeltaTable(url, storage_options=options).to_pyarrow_dataset().to_table(
        filter=expression(lo, hi))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "rows": table.num_rows, "matching": table.num_rows}


def _child(args: argparse.Namespace) -> int:
    import deltalake  # noqa: F401  (imports untimed, as for every side)
    import torch  # noqa: F401

    import ucstage  # noqa: F401

    cache = tempfile.mkdtemp(prefix="bench-tablefilter-cache-", dir=args.work)
    try:
        if args.one == "ceiling":
            found = one_ceiling(args.src, args.lo, args.hi)
        else:
            found = one_loader(args.one, args.src, args.lo, args.hi, args.workers,
                               args.batch_rows, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    print(json.dumps(found))
    return 0


# --- the parent: the store, the set-up, alternating rounds ----------------------------------

def counted(path: str) -> int:
    """The proxy's count of response bytes so far."""
    with open(path, "rb") as fh:
        text = fh.read().strip()
    return int(text) if text else 0


def in_process(side: str, ctx: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.{NAME}", "--one", side, "--src", ctx["url"],
           "--work", ctx["work"], "--lo", str(ctx["lo"]), "--hi", str(ctx["hi"]),
           "--workers", str(args.workers), "--batch-rows", str(args.batch_rows)]
    before = counted(ctx["counter"])
    done = subprocess.run(cmd, env=ctx["child_env"], capture_output=True, text=True,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{NAME}: {side} failed:\n{done.stderr[-3000:]}")
    time.sleep(0.3)  # the last responses' bytes, still in the proxy's pipeline
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    found["fetched_bytes"] = counted(ctx["counter"]) - before
    found["fetched_share"] = found["fetched_bytes"] / ctx["table_bytes"]
    want_rows = ctx["want"] if side != "unfiltered" else ctx["rows"]
    if found["matching"] != ctx["want"] or found["rows"] != want_rows:
        raise SystemExit(f"{NAME}: {side} delivered {found['rows']:,} rows, "
                         f"{found['matching']:,} matching; pyarrow.dataset counts "
                         f"{ctx['want']:,} matching of {ctx['rows']:,}")
    return found


def run_rounds(args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for rnd in range(args.pairs):
        for side in order(args.sides, rnd):
            found = in_process(side, ctx, args)
            row = {"name": f"round {rnd + 1} {side}", "round": rnd + 1, "side": side, **found,
                   "load_1m": os.getloadavg()[0]}
            first = f", first batch {row['first_batch_s']:.2f} s" if "first_batch_s" in row else ""
            print(f"round {rnd + 1}: {side}: {row['seconds']:.2f} s{first}, "
                  f"{row['fetched_bytes'] / 2**20:,.1f} MiB (load {row['load_1m']:.1f})",
                  file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]], ctx: dict[str, Any]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["side"], []).append(r)
    summary: dict[str, Any] = {"table_bytes": ctx["table_bytes"], "table_rows": ctx["rows"],
                               "matching_rows": ctx["want"], "filter": filter_text(ctx["lo"],
                                                                                   ctx["hi"])}
    for side, mine in by.items():
        for figure in ("seconds", "first_batch_s", "first_match_s", "fetched_bytes"):
            if all(figure in r for r in mine):
                summary[f"{side} {figure} median"] = statistics.median(r[figure] for r in mine)
    if by.get("filtered"):
        shares = [r["fetched_share"] for r in by["filtered"]]
        ratio = statistics.median(shares)
        summary["filtered bytes of the table's"] = {
            "ratio": ratio, "rounds": shares, "target": BYTES_TARGET, "at_most": True,
            "met": ratio <= BYTES_TARGET}
    if by.get("filtered") and by.get("unfiltered"):
        pairs = list(zip(by["filtered"], by["unfiltered"], strict=True))
        for what, figure, target in (
                ("first batch: unfiltered's first matching over filtered's", "first_match_s",
                 FIRST_TARGET),
                ("first batch: unfiltered's first (any rows) over filtered's", "first_batch_s",
                 None),
                ("epoch: unfiltered's over filtered's", "seconds", None)):
            per_round = [u[figure] / f["first_batch_s" if figure != "seconds" else "seconds"]
                         for f, u in pairs]
            ratio = statistics.median(per_round)
            found: dict[str, Any] = {"ratio": ratio, "rounds": per_round}
            if target is not None:
                found.update(target=target, met=ratio >= target)
            summary[what] = found
    loads = [r["load_1m"] for r in rows]
    summary["load_1m_min"], summary["load_1m_max"] = min(loads), max(loads)
    return summary


def markdown(rows: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace,
             ctx: dict[str, Any]) -> str:
    def s(r: dict[str, Any], key: str) -> str:
        return f"{r[key]:.2f}" if key in r else "-"

    lines = [f"moto behind the delay proxy at {args.delay_ms:g} ms; {ctx['rows']:,} rows in "
             f"{args.files} files, row groups of {args.group_rows:,}, "
             f"{ctx['table_bytes'] / 2**20:,.1f} MiB; filter `{summary['filter']}` "
             f"({ctx['want']:,} rows); {args.workers} workers, batch_rows {args.batch_rows:,}; "
             f"{args.pairs} alternating rounds", "",
             "| round | side | first batch s | first matching batch s | epoch s | MiB fetched | "
             "x table | rows delivered | load 1m |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['round']} | {r['side']} | {s(r, 'first_batch_s')} | "
                     f"{s(r, 'first_match_s')} | {r['seconds']:.2f} | "
                     f"{r['fetched_bytes'] / 2**20:,.1f} | {r['fetched_share']:.3f} | "
                     f"{r['rows']:,} | {r['load_1m']:.1f} |")
    lines += ["", "| figure | median | rounds | target | met |", "|---|---:|---|---:|---|"]
    for what, found in summary.items():
        if not isinstance(found, dict):
            continue
        target = "-"
        if "target" in found:
            target = f"{'<=' if found.get('at_most') else '>='} {found['target']:g}x"
        met = ("met" if found["met"] else "missed") if "met" in found else "-"
        lines.append(f"| {what} | {found['ratio']:.3f}x | "
                     f"{', '.join(f'{v:.3f}' for v in found['rounds'])} | {target} | {met} |")
    return "\n".join(lines)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=5_000_000,
                        help="rows of the table (default 5,000,000)")
    parser.add_argument("--files", type=int, default=10,
                        help="data files, one deltalake commit each (default 10)")
    parser.add_argument("--group-rows", type=int, default=131072,
                        help="rows per row group (default 131072)")
    parser.add_argument("--pad", type=int, default=80,
                        help="random bytes of each row's pad column (default 80)")
    parser.add_argument("--share", type=float, default=0.1,
                        help="the filter's share of the rows, from the middle (default 0.1)")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    parser.add_argument("--batch-rows", type=int, default=8192,
                        help="TableDataset's batch_rows (default 8192)")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="the proxy's round trip (default 20)")
    parser.add_argument("--sides", type=lambda v: v.split(","), default=list(SIDES),
                        help=f"comma-separated, of {','.join(SIDES)} (default all)")
    pairs_argument(parser)
    json_argument(parser)
    # One run in a child process (the parent's own use).
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--src", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--lo", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hi", type=int, help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{NAME}",
                                     description=(__doc__ or "").split("\n\n")[0])
    arguments(parser)
    args = parser.parse_args(argv)
    if args.one:
        return _child(args)
    for side in args.sides:
        if side not in SIDES:
            parser.error(f"--sides: {side!r} is not one of {', '.join(SIDES)}")
    if not 0 < args.share <= 1:
        parser.error(f"--share must be in (0, 1], got {args.share}")
    work = tempfile.mkdtemp(prefix="ucstage-bench-tablefilter-")
    server: Moto | None = None
    rows: list[dict[str, Any]] = []
    try:
        import deltalake

        local = os.path.join(work, "events")
        t0 = time.monotonic()
        print(f"writing {args.rows:,} sorted rows ...", file=sys.stderr, flush=True)
        table_bytes = write_table(local, args.rows, args.files, args.group_rows, args.pad)
        lo, hi = window(args.rows, args.share)
        # The reference count: pyarrow.dataset's, over the table as deltalake lists it.
        want = deltalake.DeltaTable(local).to_pyarrow_dataset().count_rows(
            filter=expression(lo, hi))
        server = Moto(work)
        url = server.upload(local, "bench", "events")
        shutil.rmtree(local)
        print(f"{table_bytes / 2**20:,.1f} MiB written and copied to moto in "
              f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        counter = os.path.join(work, "proxy.count")
        with delayed(server.port, args.delay_ms,
                     env={**os.environ, "DELAY_PROXY_COUNT": counter}) as port:
            env = bytecode_env(s3_env(f"http://127.0.0.1:{port}"), work)
            ctx: dict[str, Any] = {"work": work, "url": url, "lo": lo, "hi": hi, "want": want,
                                   "rows": args.rows, "table_bytes": table_bytes,
                                   "counter": counter, "child_env": with_this_checkout(env)}
            rows = run_rounds(args, ctx)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rows, ctx)
    Report(NAME, params_of(args, drop=("json", "one", "src", "work", "lo", "hi")),
           rows, summary).emit(args.json, markdown(rows, summary, args, ctx))
    return 0


if __name__ == "__main__":
    sys.exit(main())
