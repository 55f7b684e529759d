#!/usr/bin/env python
"""What deletion vectors cost TableDataset: freeze and a warm epoch, with and without.

    python -m benchmarks.delta_dv [--rows 2000000] [--files 4] [--groups-per-file 5]
        [--deleted 0.1] [--dir /tmp/ucstage-bench-delta-dv] [--pairs 3] [--json]

Two Delta tables over the same Parquet files (written once with deltalake,
``id`` int64, ``x`` float64, ``s`` string): ``plain``, and ``dv``, whose next
commit gives every file a deletion vector (a UUID-named vector file, the
protocol's layout) deleting ``--deleted`` of its rows at random. Each run is
a fresh process (``--child MODE PATH``), the two tables alternating within
each of ``--pairs`` rounds:

* ``freeze``: seconds of ``ucstage.tables.row_groups`` (the log, the
  footers, and for ``dv`` every vector read and counted per row group).
* ``epoch``: rows/s of the second of two epochs of ``TableDataset``
  (``num_workers=0``, Arrow batches) over a warm cache: the first fills it.
  For ``dv`` the rows are the live ones; the vectors are applied to every
  row group read, which still decodes every stored row, so its live rows/s
  is at most ``1 - --deleted`` of ``plain``'s (the summary's
  ``epoch_stored_rows_per_s_ratio`` counts stored rows instead).

Target (set with the feature): ``dv``'s live rows/s at least 0.8x ``plain``'s
rows/s, and its freeze at most 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
import uuid
import zlib
from typing import Any

from benchmarks.pairs import MIN_PAIRS, Comparison, schedule
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def _z85(data: bytes) -> str:
    out = []
    for i in range(0, len(data), 4):
        v = int.from_bytes(data[i:i + 4], "big")
        digits = []
        for _ in range(5):
            v, d = divmod(v, 85)
            digits.append(_Z85[d])
        out.append("".join(reversed(digits)))
    return "".join(out)


def _tables(args: argparse.Namespace) -> tuple[str, str]:
    """The ``plain`` and ``dv`` tables (written once per shape, then reused)."""
    import numpy as np
    import pyarrow as pa
    from deltalake import WriterProperties, write_deltalake
    from pyroaring import BitMap64

    key = f"{args.rows}-{args.files}-{args.groups_per_file}-{args.deleted}"
    root = os.path.join(args.dir, key)
    plain, dv = os.path.join(root, "plain"), os.path.join(root, "dv")
    if os.path.isdir(dv):
        return plain, dv
    shutil.rmtree(root, ignore_errors=True)
    per_file = args.rows // args.files
    props = WriterProperties(max_row_group_size=-(-per_file // args.groups_per_file))
    for i in range(args.files):
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        t = pa.table({"id": ids, "x": ids / 7.0, "s": pa.array([f"row {j}" for j in ids])})
        write_deltalake(plain, t, mode="append", writer_properties=props)
    shutil.copytree(plain, dv)
    log = os.path.join(dv, "_delta_log")
    adds = []
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            with open(os.path.join(log, name), encoding="utf-8") as f:
                adds += [a["add"] for a in map(json.loads, f) if "add" in a]
    rng = np.random.default_rng(7)
    framed, actions = b"\x01", []
    file_id = uuid.uuid4()
    for add in adds:
        rows = json.loads(add["stats"])["numRecords"]
        gone = rng.choice(rows, int(rows * args.deleted), replace=False)
        data = struct.pack("<I", 1681511377) + BitMap64(gone.tolist()).serialize()
        offset = len(framed)
        framed += struct.pack(">I", len(data)) + data + struct.pack(">I", zlib.crc32(data))
        vector = {"storageType": "u", "pathOrInlineDv": _z85(file_id.bytes), "offset": offset,
                  "sizeInBytes": len(data), "cardinality": len(gone)}
        actions += [{"remove": {"path": add["path"], "deletionTimestamp": 1,
                                "dataChange": True}},
                    {"add": {**add, "deletionVector": vector}}]
    with open(os.path.join(dv, f"deletion_vector_{file_id}.bin"), "wb") as f:
        f.write(framed)
    version = len([n for n in os.listdir(log) if n.endswith(".json")])
    protocol = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                             "readerFeatures": ["deletionVectors"],
                             "writerFeatures": ["deletionVectors"]}}
    with open(os.path.join(log, f"{version:020d}.json"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(a) + "\n" for a in [protocol, *actions]))
    return plain, dv


def _child(mode: str, path: str) -> None:
    """One measured run in this process; prints one JSON line."""
    from ucstage import TableDataset
    from ucstage.tables import row_groups

    if mode == "freeze":
        start = time.perf_counter()
        manifest = row_groups(path)
        print(json.dumps({"seconds": time.perf_counter() - start, "rows": manifest.rows}))
        return
    cache = tempfile.mkdtemp(prefix="ucstage-bench-dv-")
    try:
        ds = TableDataset(path, cache_dir=cache)
        ds.num_workers = 0
        for _ in ds:  # fill the cache
            pass
        start = time.perf_counter()
        rows = sum(b.num_rows for b in ds)
        seconds = time.perf_counter() - start
        print(json.dumps({"seconds": seconds, "rows": rows, "rows_per_s": rows / seconds}))
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--groups-per-file", type=int, default=5)
    parser.add_argument("--deleted", type=float, default=0.1)
    parser.add_argument("--dir", default="/tmp/ucstage-bench-delta-dv")
    parser.add_argument("--pairs", type=int, default=MIN_PAIRS)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    plain, dv = _tables(args)
    tables = {"plain": plain, "dv": dv}
    found: dict[str, dict[str, list[dict[str, Any]]]] = {"freeze": {"plain": [], "dv": []},
                                                         "epoch": {"plain": [], "dv": []}}
    for mode in ("freeze", "epoch"):
        for _, side in schedule(["plain", "dv"], args.pairs):
            cmd = [sys.executable, "-m", "benchmarks.delta_dv", "--child", mode, tables[side]]
            result = run_command(cmd)
            found[mode][side].append(json.loads(result.last_line))
    freeze = Comparison([r["seconds"] for r in found["freeze"]["plain"]],
                        [r["seconds"] for r in found["freeze"]["dv"]])
    epoch = Comparison([r["rows_per_s"] for r in found["epoch"]["plain"]],
                       [r["rows_per_s"] for r in found["epoch"]["dv"]])
    report = Report(benchmark_name(__file__), params_of(args, drop=("json", "child")))
    report.results = [
        {"name": "freeze", **freeze.to_dict(),
         "rows": {s: found["freeze"][s][0]["rows"] for s in tables}},
        {"name": "epoch", **epoch.to_dict(),
         "rows": {s: found["epoch"][s][0]["rows"] for s in tables}},
    ]
    live = found["epoch"]["dv"][0]["rows"] / found["epoch"]["plain"][0]["rows"]
    report.summary = {"freeze_ratio": freeze.median_pair_ratio,
                      "epoch_rows_per_s_ratio": epoch.median_pair_ratio,
                      # the dv side decodes every stored row and delivers the live ones
                      "epoch_stored_rows_per_s_ratio": epoch.median_pair_ratio / live,
                      "target_met": freeze.median_pair_ratio <= 2.0
                      and epoch.median_pair_ratio >= 0.8}
    markdown = "\n".join([
        "| figure | plain | dv | dv/plain (median of pairs) |", "|---|---|---|---|",
        f"| freeze, s | {freeze.a_median:.3f} | {freeze.b_median:.3f} | "
        f"{freeze.median_pair_ratio:.2f} |",
        f"| warm epoch, rows/s | {epoch.a_median:,.0f} | {epoch.b_median:,.0f} | "
        f"{epoch.median_pair_ratio:.2f} |",
    ])
    report.emit(args.json, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
