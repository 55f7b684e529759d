#!/usr/bin/env python
"""Issue 22's targets: TableDataset against datasets and pyarrow on two Parquet tables.

    python -m benchmarks.tables [--rows 5000000] [--vector-rows 1000000] [--files 6]
        [--groups-per-file 8] [--dir /tmp/ucstage-bench-tables] [--pairs 3]
        [--only first,epoch,stream,memory] [--json]

Two tables, written once with pyarrow (zstd) and reused: ``small``, the
demo's shape (``id`` int64, ``text`` "event N", ``label`` int64; 5,000,000
rows) and ``vector`` (``id`` and a 512-float32 ``vec`` column; 1,000,000 rows),
each in ``--files`` files of ``--groups-per-file`` row groups.

Every measured run is a fresh process (``python -m benchmarks.tables --child
MODE SPEC``), tools alternating within each of ``--pairs`` rounds; the
figures are medians and the ratios medians of the per-pair ratios:

* ``first``: seconds from the call to the first batch of 32 rows.
  ``datasets.load_dataset("parquet", ...)`` (a fresh cache folder each run:
  it converts the whole table first), ``TableDataset(batch_rows=32)`` over a
  fresh cache, and ``pyarrow.parquet.ParquetFile.iter_batches`` for reference.
* ``epoch``: rows/s of one epoch over a warm cache, against
  ``pyarrow.dataset`` scanning the same local files: at 0 workers (Arrow
  batches) and ``format="torch"`` at 2 workers (``ucstage.DataLoader``).
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

from benchmarks.pairs import MIN_PAIRS, schedule
from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command

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


def _child(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    result = run_command([sys.executable, "-m", "benchmarks.tables", "--child", mode,
                          json.dumps(spec)], env={**os.environ, "HF_DATASETS_OFFLINE": "1",
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
            seconds[tool].append(_child("first", {"tool": tool, "table": folder,
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
        warm = _child("epoch", {"tool": "table", "table": folder, "cache": cache})
        _log(f"epoch {name}: cache warmed in {warm['seconds']:.1f} s ({warm['rows']:,} rows)")
        arms: dict[str, dict[str, Any]] = {
            "pyarrow": {"tool": "pyarrow"}, "table_0w": {"tool": "table"},
            "table_torch_2w": {"tool": "table", "format": "torch", "workers": 2,
                               "columns": numeric_columns(folder)}}
        rate: dict[str, list[float]] = {k: [] for k in arms}
        for _, arm in schedule(list(arms), pairs):
            got = _child("epoch", {**arms[arm], "table": folder, "cache": cache})
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

    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.tables", "--child", mode,
                               json.dumps(s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
            got = _child("epoch", {"tool": "table", "table": folder, "cache": cache,
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


def markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"{args.files} zstd files of {args.groups_per_file} row groups per table; "
             f"median of {args.pairs} alternating pairs; {os.cpu_count()} cores, load "
             f"{os.getloadavg()[0]:.1f} (shared machine)", ""]
    for row in results:
        figures = ", ".join(f"{k} {v:,.3g}" for k, v in row.items()
                            if isinstance(v, float) and k != "name")
        lines.append(f"- **{row['name']}**: {figures}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--vector-rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--groups-per-file", type=int, default=8)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(),
                                                      "ucstage-bench-tables"))
    parser.add_argument("--pairs", type=int, default=MIN_PAIRS)
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts of {', '.join(PARTS)}")
    parser.add_argument("--tables", default="small,vector")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "SPEC"), help=argparse.SUPPRESS)
    json_argument(parser)
    args = parser.parse_args(argv)
    if args.child:
        mode, spec = args.child
        print(json.dumps(CHILDREN[mode](json.loads(spec))), flush=True)
        # No interpreter teardown: a streaming dataset's reader threads abort
        # it ("terminate called without an active exception").
        os._exit(0)
    parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}")
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
    Report(benchmark_name(__file__), params_of(args, drop=("json", "child")), results,
           summary={f"{row['name']}.{k}": v for row in results for k, v in row.items()
                    if k in summary}).emit(args.json, markdown(results, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
