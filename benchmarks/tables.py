"""Tables: ``TableDataset`` against datasets and pyarrow, deletion vectors, batches, export.

Over Parquet and Delta tables, against Hugging Face datasets and pyarrow.

    python -m benchmarks.tables VARIANT [OPTIONS] [--json]

Variants:

* ``datasets``: first batch, epoch rows/s, two ranks streaming, and worker
  memory, against ``datasets`` and pyarrow on two Parquet tables;
* ``delta_dv``: freeze and a warm epoch of a Delta table with deletion
  vectors against the same table without;
* ``batch_rss``: a batch's pickled size once it crossed from a DataLoader
  worker, and the main process's RSS over an epoch, per row-group size.
* ``export``: ``ucstage export`` against the seed recipe on Spark Connect.

``python -m benchmarks.tables VARIANT --help`` describes each in full. Every
measured run is a fresh process (this module with ``--child``, or a script);
the module imports only the standard library and the harness at its top, so
those processes import what the one-module benchmarks did.
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
import uuid
from typing import Any

from benchmarks.pairs import MIN_PAIRS, Comparison, schedule
from benchmarks.report import Report, json_argument, params_of, suite
from benchmarks.timing import CommandFailed, run_command

SUITE = "tables"


# --- datasets -----------------------------------------------------------------

FIRST_ROWS = 32
VECTOR_DIM = 512
PARTS = ("first", "epoch", "stream", "memory")


# -- the tables -----------------------------------------------------------------

def _write_files(folder: str, make: Any, rows: int, files: int, groups: int) -> None:
    import pyarrow.parquet as pq

    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    per_file = -(-rows // files)
    group_rows = -(-per_file // groups)
    for i in range(files):
        start, stop = i * per_file, min(rows, (i + 1) * per_file)
        pq.write_table(make(start, stop), os.path.join(tmp, f"part-{i:05d}.zstd.parquet"),
                       compression="zstd", row_group_size=group_rows)
    os.rename(tmp, folder)


def _small(start: int, stop: int) -> Any:
    """The demo's rows (scripts/demo.sh): id, "event <id>", id % 3."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    numbers = np.arange(start, stop, dtype=np.int64)
    ids = pa.array(numbers)
    return pa.table({"id": ids,
                     "text": pc.binary_join_element_wise("event ", pc.cast(ids, pa.string()), ""),
                     "label": pa.array(numbers % 3)})


def _vector(start: int, stop: int) -> Any:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(start)
    flat = rng.standard_normal((stop - start) * VECTOR_DIM, dtype=np.float32)
    return pa.table({"id": pa.array(range(start, stop), pa.int64()),
                     "vec": pa.FixedSizeListArray.from_arrays(pa.array(flat), VECTOR_DIM)})


def make_tables(root: str, rows: int, vector_rows: int, files: int,
                groups: int) -> dict[str, str]:
    """The two tables' folders under ``root``, written once (kept between runs)."""
    out = {}
    for name, make, n in (("small", _small, rows), ("vector", _vector, vector_rows)):
        folder = os.path.join(root, f"{name}-{n}-{files}x{groups}")
        if not os.path.isdir(folder):
            t0 = time.monotonic()
            _write_files(folder, make, n, files, groups)
            print(f"{name}: {n:,} rows in {files} files, {_bytes(folder) / 2**20:,.1f} MiB, "
                  f"written in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        out[name] = folder
    return out


def numeric_columns(folder: str) -> list[str]:
    """The columns ``format="torch"`` takes (numbers, fixed-size lists): the
    small table's text is left out there."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(_parquet_files(folder)[0])
    return [f.name for f in schema if pa.types.is_integer(f.type)
            or pa.types.is_floating(f.type) or pa.types.is_fixed_size_list(f.type)]


def _bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(folder) for n in ns)


def _parquet_files(folder: str) -> list[str]:
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".parquet"))


# -- the children: one measured run each, a JSON line on stdout -----------------

def _rss_anon(pid: int) -> float:
    """RssAnon of ``pid`` in MiB (private memory: not the page cache, not mmaps)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _table_dataset(spec: dict[str, Any], **kwargs: Any) -> Any:
    from ucstage import TableDataset

    return TableDataset(spec["table"], cache_dir=spec["cache"], **kwargs)


def _batch_rows(batch: Any) -> int:
    if hasattr(batch, "num_rows"):
        return int(batch.num_rows)
    first = next(iter(batch.values()))
    return len(first)


def child_first(spec: dict[str, Any]) -> dict[str, Any]:
    tool, table = spec["tool"], spec["table"]
    if tool == "datasets":
        import datasets

        datasets.disable_progress_bars()
        t0 = time.perf_counter()
        loaded = datasets.load_dataset("parquet", data_files=_parquet_files(table),
                                       split="train", cache_dir=spec["cache"])
        batch = next(iter(loaded.iter(batch_size=FIRST_ROWS)))
        rows = len(next(iter(batch.values())))
    elif tool == "pyarrow":
        import pyarrow.parquet as pq

        t0 = time.perf_counter()
        batch = next(pq.ParquetFile(_parquet_files(table)[0]).iter_batches(
            batch_size=FIRST_ROWS))
        rows = batch.num_rows
    else:
        from ucstage import TableDataset  # noqa: F401 - imports (torch) are not the cost

        t0 = time.perf_counter()
        batch = next(iter(_table_dataset(spec, batch_rows=FIRST_ROWS)))
        rows = _batch_rows(batch)
    return {"seconds": time.perf_counter() - t0, "rows": rows}


def child_epoch(spec: dict[str, Any]) -> dict[str, Any]:
    """One epoch; with ``sample``, the workers' RssAnon peaks too."""
    tool, workers = spec["tool"], spec.get("workers", 0)
    if tool == "pyarrow":
        import pyarrow.dataset as pads

        t0 = time.perf_counter()
        rows = sum(b.num_rows for b in pads.dataset(spec["table"], format="parquet")
                   .to_batches())
        return {"seconds": time.perf_counter() - t0, "rows": rows}
    # Imports are not the cost: the pyarrow arm imports pyarrow.dataset before
    # its clock, and these are what TableDataset imports on its first use.
    import fsspec  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    from ucstage import DataLoader

    ds = _table_dataset(spec, format=spec.get("format", "arrow"), columns=spec.get("columns"))
    loader = DataLoader(ds, batch_size=None, num_workers=workers, log_mlflow=False)
    peaks: dict[int, float] = {}
    first: dict[int, float] = {}
    rows = batches = 0
    t0 = time.perf_counter()
    it = iter(loader)
    for batch in it:
        rows += _batch_rows(batch)
        batches += 1
        if spec.get("sample") and workers:
            for w in it._workers:  # type: ignore[attr-defined]
                now = _rss_anon(w.pid)
                first.setdefault(w.pid, now)
                peaks[w.pid] = max(peaks.get(w.pid, 0.0), now)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "rows": rows, "batches": batches,
            "worker_rss_anon_mib": sorted(peaks.values()),
            "worker_growth_mib": max((peaks[p] - first[p] for p in peaks), default=0.0),
            "main_rss_anon_mib":
                _rss_anon(os.getpid())}


def child_stream(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of a two-rank job: epochs of TableDataset, or HF streaming."""
    rank, world = spec["rank"], spec["world"]
    if spec["tool"] == "datasets":
        import datasets
        from datasets.distributed import split_dataset_by_node

        datasets.disable_progress_bars()
        t0 = time.perf_counter()
        streamed = datasets.load_dataset("parquet", data_files=_parquet_files(spec["table"]),
                                         split="train", streaming=True)
        mine = split_dataset_by_node(streamed, rank=rank, world_size=world)
        rows = sum(len(b["id"]) for b in mine.with_format("arrow").iter(
            batch_size=spec["batch_rows"]))
        return {"epochs": [{"seconds": time.perf_counter() - t0, "rows": rows}]}
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{spec['rendezvous']}", rank=rank,
                            world_size=world)
    try:
        ds = _table_dataset(spec, nproc_per_node=1)
        epochs = []
        for epoch in range(spec["epochs"]):
            ds.set_epoch(epoch)
            dist.barrier()
            t0 = time.perf_counter()
            rows = sum(_batch_rows(b) for b in ds)
            epochs.append({"seconds": time.perf_counter() - t0, "rows": rows})
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"epochs": epochs, "cache_bytes": _bytes(spec["cache"])}


CHILDREN = {"first": child_first, "epoch": child_epoch, "stream": child_stream}


def _datasets_child(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    result = run_command([sys.executable, "-m", f"benchmarks.{SUITE}", "datasets", "--child",
                          mode, json.dumps(spec)], env={**os.environ, "HF_DATASETS_OFFLINE": "1",
                                                  "HF_HUB_OFFLINE": "1"})
    return dict(json.loads(result.last_line))


# -- the parts ------------------------------------------------------------------

def _fresh(work: str, name: str) -> str:
    path = os.path.join(work, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def _med(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def part_first(tables: dict[str, str], work: str, pairs: int) -> list[dict[str, Any]]:
    rows = []
    for name, folder in tables.items():
        seconds: dict[str, list[float]] = {"datasets": [], "table": [], "pyarrow": []}
        for _, tool in schedule(list(seconds), pairs):
            cache = _fresh(work, f"first-{tool}")
            seconds[tool].append(_datasets_child("first", {"tool": tool, "table": folder,
                                                  "cache": cache})["seconds"])
            shutil.rmtree(cache, ignore_errors=True)
            _log(f"first {name} {tool}: {seconds[tool][-1]:.2f} s")
        ratios = [d / t for d, t in zip(seconds["datasets"], seconds["table"], strict=True)]
        rows.append({"name": f"first_batch_{name}",
                     **{f"{k}_s": _med(v) for k, v in seconds.items()},
                     "datasets_over_table": _med(ratios), "runs": seconds})
    return rows


def part_epoch(tables: dict[str, str], work: str, pairs: int) -> list[dict[str, Any]]:
    rows = []
    for name, folder in tables.items():
        cache = _fresh(work, f"epoch-{name}")
        warm = _datasets_child("epoch", {"tool": "table", "table": folder, "cache": cache})
        _log(f"epoch {name}: cache warmed in {warm['seconds']:.1f} s ({warm['rows']:,} rows)")
        arms: dict[str, dict[str, Any]] = {
            "pyarrow": {"tool": "pyarrow"}, "table_0w": {"tool": "table"},
            "table_torch_2w": {"tool": "table", "format": "torch", "workers": 2,
                               "columns": numeric_columns(folder)}}
        rate: dict[str, list[float]] = {k: [] for k in arms}
        for _, arm in schedule(list(arms), pairs):
            got = _datasets_child("epoch", {**arms[arm], "table": folder, "cache": cache})
            rate[arm].append(got["rows"] / got["seconds"])
            _log(f"epoch {name} {arm}: {rate[arm][-1]:,.0f} rows/s")
        row: dict[str, Any] = {"name": f"epoch_{name}",
                               **{f"{k}_rows_s": _med(v) for k, v in rate.items()}}
        for arm in ("table_0w", "table_torch_2w"):
            row[f"{arm}_over_pyarrow"] = _med([t / p for t, p in zip(
                rate[arm], rate["pyarrow"], strict=True)])
        row["runs"] = rate
        rows.append(row)
    return rows


def _two_ranks(mode: str, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Both ranks at once, each a fresh process."""
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-m", f"benchmarks.{SUITE}", "datasets",
                               "--child", mode, json.dumps(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "HF_DATASETS_OFFLINE": "1"})
             for s in specs]
    done = [(p.returncode, *p.communicate()) for p in procs]
    done = [(p.returncode, out, err) for p, (_, out, err) in zip(procs, done, strict=True)]
    failed = [f"rank {k} exited {code}: {err.strip()[-600:]}"
              for k, (code, _, err) in enumerate(done) if code != 0]
    if failed:
        raise RuntimeError("\n".join(failed))
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in done]


def part_stream(tables: dict[str, str], work: str, pairs: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = []
    for name, folder in tables.items():
        table_bytes = _bytes(folder)
        group_rows = pq.ParquetFile(_parquet_files(folder)[0]).metadata.row_group(0).num_rows
        rate: dict[str, list[float]] = {"datasets": [], "table_cold": [], "table_warm": []}
        node_share: list[float] = []
        for r, tool in schedule(["datasets", "table"], pairs):
            base = {"tool": tool, "table": folder, "world": 2, "batch_rows": group_rows}
            if tool == "datasets":
                got = _two_ranks("stream", [{**base, "rank": k} for k in range(2)])
                total = sum(g["epochs"][0]["rows"] for g in got)
                rate["datasets"].append(total / max(g["epochs"][0]["seconds"] for g in got))
            else:
                rendezvous = _fresh(work, f"rdv-{r}")
                got = _two_ranks("stream", [
                    {**base, "rank": k, "epochs": 2,
                     "rendezvous": rendezvous, "cache": _fresh(work, f"node{k}")}
                    for k in range(2)])
                for e, key in ((0, "table_cold"), (1, "table_warm")):
                    total = sum(g["epochs"][e]["rows"] for g in got)
                    rate[key].append(total / max(g["epochs"][e]["seconds"] for g in got))
                node_share.append(max(g["cache_bytes"] for g in got) / table_bytes)
            _log(f"stream {name} {tool}: " + ", ".join(
                f"{k} {v[-1]:,.0f} rows/s" for k, v in rate.items() if v))
        row: dict[str, Any] = {"name": f"stream_{name}",
                               **{f"{k}_rows_s": _med(v) for k, v in rate.items()}}
        for key in ("table_cold", "table_warm"):
            row[f"{key}_over_datasets"] = _med([t / d for t, d in zip(
                rate[key], rate["datasets"], strict=True)])
        row["node_cache_over_table"] = max(node_share)
        row["table_bytes"] = table_bytes
        row["runs"] = rate
        rows.append(row)
    return rows


def part_memory(tables: dict[str, str], work: str, pairs: int) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    rows = []
    for name, folder in tables.items():
        cache = os.path.join(work, f"epoch-{name}")  # warm from the epoch part, else cold
        meta = pq.ParquetFile(_parquet_files(folder)[0]).metadata
        group_bytes = meta.row_group(0).total_byte_size
        peaks: list[float] = []
        growth: list[float] = []
        for _ in range(pairs):
            got = _datasets_child("epoch", {"tool": "table", "table": folder, "cache": cache,
                                   "format": "torch", "workers": 2, "sample": True,
                                   "columns": numeric_columns(folder)})
            peaks.append(max(got["worker_rss_anon_mib"], default=float("nan")))
            growth.append(got["worker_growth_mib"])
            _log(f"memory {name}: worker RssAnon peaks {got['worker_rss_anon_mib']} MiB")
        rows.append({"name": f"memory_{name}", "worker_rss_anon_mib": _med(peaks),
                     "worker_growth_mib": _med(growth),
                     "table_mib": _bytes(folder) / 2**20,
                     "row_group_mib": group_bytes / 2**20, "runs": peaks})
    return rows


PART_FUNCS = {"first": part_first, "epoch": part_epoch, "stream": part_stream,
              "memory": part_memory}


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def datasets_markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"{args.files} zstd files of {args.groups_per_file} row groups per table; "
             f"median of {args.pairs} alternating pairs; {os.cpu_count()} cores, load "
             f"{os.getloadavg()[0]:.1f} (shared machine)", ""]
    for row in results:
        figures = ", ".join(f"{k} {v:,.3g}" for k, v in row.items()
                            if isinstance(v, float) and k != "name")
        lines.append(f"- **{row['name']}**: {figures}")
    return "\n".join(lines)


def _parts(text: str) -> list[str]:
    parts = [p for p in text.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part(s) {', '.join(unknown)}")
    return parts


def datasets_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--vector-rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--groups-per-file", type=int, default=8)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(),
                                                      "ucstage-bench-tables"))
    parser.add_argument("--pairs", type=int, default=MIN_PAIRS)
    parser.add_argument("--only", default=",".join(PARTS), type=_parts,
                        help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--tables", default="small,vector")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    json_argument(parser)


def run_datasets(args: argparse.Namespace) -> int:
    """TableDataset against datasets and pyarrow on two Parquet tables (issue 22's targets).

        python -m benchmarks.tables datasets [--rows 5000000] [--vector-rows 1000000] [--files 6]
            [--groups-per-file 8] [--dir /tmp/ucstage-bench-tables] [--pairs 3]
            [--only first,epoch,stream,memory] [--json]

    Two tables, written once with pyarrow (zstd) and reused: ``small``, the
    demo's shape (``id`` int64, ``text`` "event N", ``label`` int64; 5,000,000
    rows) and ``vector`` (``id`` and a 512-float32 ``vec`` column; 1,000,000 rows),
    each in ``--files`` files of ``--groups-per-file`` row groups.

    Every measured run is a fresh process (``python -m benchmarks.tables datasets --child
    MODE SPEC``), tools alternating within each of ``--pairs`` rounds; the
    figures are medians and the ratios medians of the per-pair ratios:

    * ``first``: seconds from the call to the first batch of 32 rows.
      ``datasets.load_dataset("parquet", ...)`` (a fresh cache folder each run:
      it converts the whole table first), ``TableDataset(batch_rows=32)`` over a
      fresh cache, and ``pyarrow.parquet.ParquetFile.iter_batches`` for reference.
    * ``epoch``: rows/s of one epoch over a warm cache, against
      ``pyarrow.dataset`` scanning the same local files: at 0 workers (Arrow
      batches) and ``format="torch"`` at 2 workers (``ucstage.DataLoader``).
      Imports are outside the clock on both sides (``pyarrow.dataset``; what
      TableDataset imports on first use, ``pyarrow.parquet`` and ``fsspec``).
    * ``stream``: two ranks at once (a gloo group for TableDataset, each rank its
      own cache folder, as two nodes) against two ``load_dataset(...,
      streaming=True)`` + ``split_dataset_by_node`` processes; rows/s of the job
      (rows over the slower rank's seconds), TableDataset's first epoch from cold
      caches and its second from warm ones. Each node's cache is then measured
      against the table's bytes.
    * ``memory``: RssAnon of each DataLoader worker (2 workers, ``format="torch"``),
      its peak over an epoch, against the table's and a row group's bytes.

    The machine is shared: read the ratios, measured in one run.
    """
    if args.child:
        mode, spec = args.child
        print(json.dumps(CHILDREN[mode](json.loads(spec))), flush=True)
        # No interpreter teardown: a streaming dataset's reader threads abort
        # it ("terminate called without an active exception").
        os._exit(0)
    parts = args.only
    os.makedirs(args.dir, exist_ok=True)
    tables = make_tables(args.dir, args.rows, args.vector_rows, args.files,
                         args.groups_per_file)
    tables = {k: v for k, v in tables.items() if k in args.tables.split(",")}
    work = os.path.join(args.dir, "work")
    os.makedirs(work, exist_ok=True)
    results: list[dict[str, Any]] = []
    for part in parts:
        results.extend(PART_FUNCS[part](tables, work, args.pairs))
    summary = {k: v for row in results for k, v in row.items()
               if k.endswith(("_over_table", "_over_pyarrow", "_over_datasets"))
               or k == "worker_rss_anon_mib"}
    Report(SUITE, params_of(args, drop=("json", "child")), results,
           summary={f"{row['name']}.{k}": v for row in results for k, v in row.items()
                    if k in summary}).emit(args.json, datasets_markdown(results, args))
    return 0


# --- delta_dv -----------------------------------------------------------------

def dv_tables(args: argparse.Namespace) -> tuple[str, str]:
    """The ``plain`` and ``dv`` tables (written once per shape, then reused)."""
    import numpy as np
    import pyarrow as pa
    from deltalake import WriterProperties, write_deltalake

    from tests.common.deltadv import PROTOCOL, bitmap, frame, z85

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
    deleted = []
    for add in adds:
        rows = json.loads(add["stats"])["numRecords"]
        deleted.append(rng.choice(rows, int(rows * args.deleted), replace=False).tolist())
    blocks = [bitmap(gone) for gone in deleted]
    framed, offsets = frame(blocks)  # every vector in one UUID-named file
    file_id = uuid.uuid4()
    actions: list[dict[str, Any]] = []
    for add, gone, block, offset in zip(adds, deleted, blocks, offsets, strict=True):
        vector = {"storageType": "u", "pathOrInlineDv": z85(file_id.bytes), "offset": offset,
                  "sizeInBytes": len(block), "cardinality": len(gone)}
        actions += [{"remove": {"path": add["path"], "deletionTimestamp": 1,
                                "dataChange": True}},
                    {"add": {**add, "deletionVector": vector}}]
    with open(os.path.join(dv, f"deletion_vector_{file_id}.bin"), "wb") as f:
        f.write(framed)
    version = len([n for n in os.listdir(log) if n.endswith(".json")])
    with open(os.path.join(log, f"{version:020d}.json"), "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(a) + "\n" for a in [PROTOCOL, *actions]))
    return plain, dv


def dv_child(mode: str, path: str) -> None:
    """One measured run in this process; prints one JSON line. A freeze does
    not import TableDataset (nor, with it, torch): its clock starts after the
    imports either way, and the run is shorter."""
    if mode == "freeze":
        from ucstage.tables import row_groups

        start = time.perf_counter()
        manifest = row_groups(path)
        print(json.dumps({"seconds": time.perf_counter() - start, "rows": manifest.rows}))
        return
    from ucstage import TableDataset

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


def delta_dv_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--groups-per-file", type=int, default=5)
    parser.add_argument("--deleted", type=float, default=0.1)
    parser.add_argument("--dir", default="/tmp/ucstage-bench-delta-dv")
    parser.add_argument("--pairs", type=int, default=MIN_PAIRS)
    parser.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    json_argument(parser)


def run_delta_dv(args: argparse.Namespace) -> int:
    """What deletion vectors cost TableDataset: freeze and a warm epoch, with and without.

        python -m benchmarks.tables delta_dv [--rows 2000000] [--files 4] [--groups-per-file 5]
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
    if args.child:
        dv_child(*args.child)
        return 0
    plain, dv = dv_tables(args)
    tables = {"plain": plain, "dv": dv}
    found: dict[str, dict[str, list[dict[str, Any]]]] = {"freeze": {"plain": [], "dv": []},
                                                         "epoch": {"plain": [], "dv": []}}
    for mode in ("freeze", "epoch"):
        for _, side in schedule(["plain", "dv"], args.pairs):
            cmd = [sys.executable, "-m", f"benchmarks.{SUITE}", "delta_dv", "--child", mode,
                   tables[side]]
            result = run_command(cmd)
            found[mode][side].append(json.loads(result.last_line))
    freeze = Comparison([r["seconds"] for r in found["freeze"]["plain"]],
                        [r["seconds"] for r in found["freeze"]["dv"]])
    epoch = Comparison([r["rows_per_s"] for r in found["epoch"]["plain"]],
                       [r["rows_per_s"] for r in found["epoch"]["dv"]])
    report = Report(SUITE, params_of(args, drop=("json", "child")))
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


# --- batch_rss ----------------------------------------------------------------

BATCH_RSS_CHILD = r"""
import json, os, pickle, statistics, sys, time
from ucstage import DataLoader, TableDataset

def rss():
    with open("/proc/self/status") as fh:
        return next(int(l.split()[1]) for l in fh if l.startswith("VmRSS:")) / 1024

folder, cache, batch_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
workers, shuffle = int(sys.argv[4]), sys.argv[5] == "shuffled"
ds = TableDataset(folder, batch_rows=batch_rows, format="arrow", shuffle=shuffle, cache_dir=cache)
if sys.argv[6] == "warm":  # a run of its own, so the measured one starts afresh
    for _ in DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False):
        pass
    print("{}")
    sys.exit(0)
loader = DataLoader(ds, batch_size=None, num_workers=workers, log_mlflow=False)
it = iter(loader)
kept = [next(it)]
start = rss()  # the workers started, the first window decoded
t0 = time.perf_counter()
kept += it
seconds = time.perf_counter() - t0
end = rss()
ratio = [len(pickle.dumps(b)) / b.nbytes for b in kept]
print(json.dumps({"rss_start_mib": start, "rss_end_mib": end, "epoch_s": seconds,
                  "kept_mib": sum(b.nbytes for b in kept) / 2**20, "batches": len(kept),
                  "pickled_ratio_median": statistics.median(ratio),
                  "pickled_ratio_max": max(ratio)}))
"""


def batch_rss_table(folder: str, rows: int, group_rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    if os.path.isdir(folder):
        return
    os.makedirs(folder + ".tmp", exist_ok=True)
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"id": ids, "x": ids.astype(np.float32),
                      "v": pa.FixedSizeListArray.from_arrays(
                          pa.array(np.repeat(ids, 8).astype(np.float32)), 8),
                      "s": pa.array([f"row{i}" for i in ids])})
    pq.write_table(table, os.path.join(folder + ".tmp", "part-0.parquet"),
                   row_group_size=group_rows)
    os.rename(folder + ".tmp", folder)


def batch_rss_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--row-groups", default="5000,50000",
                    help="rows per row group, one table each (comma-separated)")
    ap.add_argument("--batch-rows", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    ap.add_argument("--order", choices=("shuffled", "file"), default="shuffled")
    ap.add_argument("--dir", default="/tmp/ucstage-bench-batch-rss")
    json_argument(ap)


def run_batch_rss(args: argparse.Namespace) -> int:
    """What a TableDataset batch weighs once it crossed from a DataLoader worker,
    and the main process's RSS over an epoch whose batches the loop keeps, for
    several row-group sizes (issue 29's compact-batch target).

        python -m benchmarks.tables batch_rss [--rows 100000] [--row-groups 5000,50000] \\
            [--batch-rows 1000] [--workers 2] [--order shuffled|file] \\
            [--dir /tmp/ucstage-bench-batch-rss] [--json]

    One table per row-group size (the same rows: ``id``, a float, 8 floats, a
    string; about 56 bytes a row), each read in a fresh process:
    ``format="arrow"``, ``batch_rows``, shuffled, ``DataLoader(num_workers=2)``
    (``--order file`` and ``--workers 0`` for the in-process case, where a batch
    is a slice of a row group), over a cache warmed by a run before.
    The main process keeps every batch (a loop that collects its outputs) and
    reads its RSS from /proc/self/status after the first batch and after the
    last; each batch's pickled size is compared with its rows' bytes
    (``RecordBatch.nbytes``). Targets: pickled <= 1.2x the rows' bytes; RSS
    growth over the epoch independent of the row-group size (about the rows kept).
    """
    results: list[dict[str, Any]] = []
    lines = [f"{args.rows:,} rows, batches of {args.batch_rows:,}, {args.order} order, "
             f"format=arrow, DataLoader(num_workers={args.workers}), every batch kept:",
             "| rows per row group | batches | rows kept (MiB) | main RSS growth (MiB) "
             "| pickled / rows' bytes (median, max) | epoch after the first batch (s) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for group_rows in (int(x) for x in args.row_groups.split(",")):
        folder = os.path.join(args.dir, f"t{args.rows}-{group_rows}")
        batch_rss_table(folder, args.rows, group_rows)
        cache = os.path.join(args.dir, "cache")
        try:
            for mode in ("warm", "measure"):
                done = run_command([sys.executable, "-c", BATCH_RSS_CHILD, folder, cache,
                                    str(args.batch_rows), str(args.workers), args.order, mode],
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        except CommandFailed as exc:
            sys.exit(f"row groups of {group_rows}: {exc}")
        got = json.loads(done.last_line)
        growth = got["rss_end_mib"] - got["rss_start_mib"]
        results.append({"name": f"row groups of {group_rows}", "row_group_rows": group_rows,
                        "rss_growth_mib": growth, **got})
        lines.append(f"| {group_rows:,} | {got['batches']:,} | {got['kept_mib']:.1f} | "
                     f"{growth:.1f} | {got['pickled_ratio_median']:.3f}, "
                     f"{got['pickled_ratio_max']:.3f} | {got['epoch_s']:.2f} |")
    growths = [r["rss_growth_mib"] for r in results]
    summary = {"rss_growth_spread_mib": max(growths) - min(growths),
               "pickled_ratio_max": max(r["pickled_ratio_max"] for r in results)}
    Report(SUITE, params_of(args), results, summary).emit(
        args.json, "\n".join(lines))
    return 0


# --- export -------------------------------------------------------------------

def export_source(path: str, rows: int) -> None:
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


def export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating seed/ucstage pairs after one warm-up (default 3)")
    json_argument(parser)


def run_export(args: argparse.Namespace) -> int:
    """Benchmark ``ucstage export`` against the seed recipe on the same Spark Connect server.

        python -m benchmarks.tables export [--rows 5000000] [--workdir /tmp/x] [--json]

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

    from ucstage.export import export_table
    from ucstage.export import spark as ucspark
    from ucstage.tables.delta import table_state

    work = args.workdir or tempfile.mkdtemp(prefix="ucstage-bench-export-")
    table = os.path.join(work, "table")
    shutil.rmtree(table, ignore_errors=True)
    t0 = time.monotonic()
    export_source(table, args.rows)
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
    Report(SUITE, params_of(args), results, summary).emit(
        args.json, "\n".join(lines))
    return 0


VARIANTS = {"datasets": (datasets_arguments, run_datasets),
            "delta_dv": (delta_dv_arguments, run_delta_dv),
            "batch_rss": (batch_rss_arguments, run_batch_rss),
            "export": (export_arguments, run_export)}


def main(argv: list[str] | None = None) -> int:
    return suite(SUITE, __doc__ or "", VARIANTS, argv)


if __name__ == "__main__":
    raise SystemExit(main())
