"""TableDataset in one process: every source kind (a Parquet folder on local,
FUSE, moto S3 through both engines, memory; Delta tables written with
deltalake), the cache holding only the chosen column chunks, formats, exact
resume, and one clear error for each kind of bad input."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common.tables import parquet_bytes
from tests.common.tables import table as common_table
from ucstage import DataLoader, LocalCache, TableDataset
from ucstage.errors import (
    InvalidArgument,
    NotParquet,
    ResumeMismatch,
    SchemaMismatch,
    UnknownColumn,
    UnsupportedTable,
)
from ucstage.volumes import RANGES_DIR


def table(start: int, n: int) -> pa.Table:
    return common_table(start, n, width=8, repeat=3)


def parquet(t: pa.Table, rows: int = 50) -> bytes:
    return parquet_bytes(t, rows)


def ids(loader: Any) -> list[int]:
    out: list[int] = []
    for b in loader:
        out += (b["id"].tolist() if isinstance(b, dict) else b.column("id").to_pylist())
    return out


def cached_bytes(cache: LocalCache, ds: TableDataset) -> int:
    top = os.path.join(cache.namespace_dir(ds.freeze().volume()), RANGES_DIR)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(top) for f in fs)


def test_every_backend_reads_every_row_and_caches_only_the_columns(backend: Any,
                                                                   tmp_path: Path) -> None:
    parts = [table(0, 180), table(180, 77), table(257, 3)]
    backend.write_many({f"d/part-{i}.parquet": parquet(t) for i, t in enumerate(parts)})
    cache = LocalCache(tmp_path / "cache")
    ds = TableDataset(f"{backend.url}/d", columns=["id", "x"], cache=cache)
    got = ids(DataLoader(ds, batch_size=None, num_workers=0))
    assert got == list(range(260))  # no shuffle: file order, row-group order
    m = ds.freeze()
    assert m.row_groups == 4 + 2 + 1
    # The cache holds exactly the id and x chunks of every row group, nothing else.
    assert cached_bytes(cache, ds) == int(m.group_bytes(["id", "x"]).sum()) < m.bytes // 2
    # A second epoch reads from the cache (hits), the same rows.
    assert ids(DataLoader(ds, batch_size=None, num_workers=0)) == got


def test_batches_formats_and_the_default_batch(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    pq.write_table(table(0, 230), tmp_path / "t" / "a.parquet", row_group_size=100)
    src = str(tmp_path / "t")
    default = list(TableDataset(src))
    assert [b.num_rows for b in default] == [100, 100, 30]  # one row group per batch
    assert isinstance(default[0], pa.RecordBatch) and default[0].schema.names == [
        "id", "x", "v", "s"]
    sized = list(TableDataset(src, batch_rows=64, columns=["id"]))
    assert [b.num_rows for b in sized] == [64, 64, 64, 38]
    torch_batches = list(TableDataset(src, batch_rows=64, columns=["id", "v"], format="torch"))
    import torch

    assert torch_batches[0]["v"].shape == (64, 8) and torch_batches[0]["v"].dtype == torch.float32
    assert torch.cat([b["id"] for b in torch_batches]).tolist() == list(range(230))
    np_batches = list(TableDataset(src, batch_rows=100, columns=["x"], format="numpy"))
    assert isinstance(np_batches[0]["x"], np.ndarray) and len(np_batches) == 3


def test_numbers_and_booleans_convert_from_their_buffers_without_pandas(tmp_path: Path) -> None:
    """Batches of 7 rows start at odd offsets of a row group's buffers (a
    boolean's at a bit inside a byte): every value as Arrow's to_numpy makes
    it, in a process that never imports pandas (seconds in every DataLoader
    worker when pyarrow's conversion does)."""
    import subprocess
    import sys

    (tmp_path / "t").mkdir()
    n = 40
    t = pa.table({"b": pa.array([i % 3 == 0 for i in range(n)]),
                  "i8": pa.array(np.arange(n, dtype=np.int8) - 20),
                  "u32": pa.array(np.arange(n, dtype=np.uint32) * 7),
                  "f16": pa.array(np.linspace(0, 1, n, dtype=np.float16)),
                  "v": pa.FixedSizeListArray.from_arrays(
                      pa.array(np.arange(n * 2, dtype=np.float32)), 2)})
    pq.write_table(t, tmp_path / "t" / "a.parquet", row_group_size=25)
    src = str(tmp_path / "t")
    for fmt in ("numpy", "torch"):
        got = list(TableDataset(src, batch_rows=7, format=fmt))
        for name in t.column_names:
            col = t.column(name).combine_chunks()
            want = col.flatten().to_numpy().reshape(n, 2) if name == "v" else \
                col.to_numpy(zero_copy_only=False)
            joined = np.concatenate([np.asarray(b[name]) for b in got])
            assert joined.dtype == want.dtype and np.array_equal(joined, want), (fmt, name)
    script = ("import sys; from ucstage import TableDataset; "
              f"batches = list(TableDataset({src!r}, batch_rows=7, format='torch')); "
              "assert len(batches) == 6; assert 'pandas' not in sys.modules, 'pandas imported'")
    subprocess.run([sys.executable, "-c", script], check=True, env={**os.environ})


def test_torch_refuses_strings_and_nulls_by_name(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    t = table(0, 10).append_column("maybe", pa.array([1.0, None] * 5))
    pq.write_table(t, tmp_path / "t" / "a.parquet")
    with pytest.raises(InvalidArgument, match=r"not s \(string\)"):
        TableDataset(str(tmp_path / "t"), format="torch").freeze()
    with pytest.raises(InvalidArgument, match="column 'maybe' has 5 null"):
        list(TableDataset(str(tmp_path / "t"), columns=["maybe"], format="torch"))
    filled = list(TableDataset(str(tmp_path / "t"), columns=["maybe"], format="torch",
                               fill_null=-1.0))
    assert filled[0]["maybe"].tolist() == [1.0, -1.0] * 5


def test_shuffle_mixes_rows_within_windows_and_each_epoch_differs(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    for i in range(4):
        pq.write_table(table(i * 200, 200), tmp_path / "t" / f"p{i}.parquet", row_group_size=50)
    ds = TableDataset(str(tmp_path / "t"), columns=["id"], shuffle=True, seed=1,
                      shuffle_window=4, batch_rows=40)
    first = ids(ds)
    assert sorted(first) == list(range(800)) and first != sorted(first)
    assert len({i // 50 for i in first[:40]}) > 2  # a batch mixes the window's row groups
    assert ids(ds) == first  # same epoch, same order
    ds.set_epoch(1)
    assert sorted(ids(ds)) == list(range(800)) and ids(ds) != first


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resume_on_the_same_layout_replays_the_rest_exactly(tmp_path: Path,
                                                              workers: int) -> None:
    (tmp_path / "t").mkdir()
    for i in range(3):
        pq.write_table(table(i * 170, 170), tmp_path / "t" / f"p{i}.parquet", row_group_size=40)

    def make() -> tuple[TableDataset, DataLoader]:
        ds = TableDataset(str(tmp_path / "t"), columns=["id"], shuffle=True, seed=5,
                          shuffle_window=3, batch_rows=23)
        return ds, DataLoader(ds, batch_size=None, num_workers=workers)

    _, whole = make()
    full = [b.column("id").to_pylist() for b in whole]
    _, loader = make()
    it = iter(loader)
    head = [next(it).column("id").to_pylist() for _ in range(7)]
    state = loader.state_dict()
    del it
    assert state["partial"] and state["unit"] == "row-group"
    _, again = make()
    again.load_state_dict(state)
    rest = [b.column("id").to_pylist() for b in again]
    if workers == 0:
        assert head + rest == full  # batch for batch: the interrupted windows replayed
    else:  # each slot replays its batches; the loader may interleave the workers anew
        assert sorted(map(tuple, head + rest)) == sorted(map(tuple, full))
    assert again.audits[-1].coverage_ok and again.audits[-1].gaps == 0
    if workers == 0:  # issue 28: more rows delivered than the row group holds
        group, _ = state["partial"][0]
        tampered = {**state, "partial": [[group, 41], *state["partial"][1:]]}
        _, refused = make()
        refused.load_state_dict(tampered)
        with pytest.raises(ResumeMismatch, match=f"41 rows of row group {group} were "
                                                 "delivered, but it has (40|10)"):
            next(iter(refused))


def test_equal_length_counts_batches(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    pq.write_table(table(0, 330), tmp_path / "t" / "a.parquet", row_group_size=100)
    with pytest.raises(InvalidArgument, match="needs batch_rows"):
        TableDataset(str(tmp_path / "t"), equal_length="drop")
    def batches(mode: str, workers: int) -> list[list[int]]:
        ds = TableDataset(str(tmp_path / "t"), batch_rows=60, columns=["id"],
                          equal_length=mode)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        got = [b.column("id").to_pylist() for b in loader]
        assert len(got) == len(loader)
        assert loader.audits[-1].coverage_ok  # drop's gaps are the ones it plans
        return got

    # One slot: 330 rows are 5 full batches of 60 (drop) or 6 with a wrap (pad).
    assert [len(b) for b in batches("drop", 0)] == [60] * 5
    pad = batches("pad", 0)
    assert [len(b) for b in pad] == [60] * 6 and pad[-1][-30:] == list(range(30))
    # Two workers: row groups 0, 2 (200 rows) and 1, 3 (130 rows).
    assert len(batches("drop", 2)) == 2 * 2   # min(200, 130) // 60 each
    pad2 = batches("pad", 2)
    assert len(pad2) == 2 * 4 and all(len(b) == 60 for b in pad2)  # ceil(200 / 60) each


# -- Delta ---------------------------------------------------------------------------


def test_a_delta_table_after_append_delete_overwrite_and_a_new_column(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, table(0, 100).drop_columns(["s"]))                      # v0
    write_deltalake(path, table(100, 50), mode="append", schema_mode="merge")    # v1: + s
    DeltaTable(path).delete("id >= 90 and id < 110")                             # v2
    got = list(TableDataset(path, columns=["id", "s"]))
    rows = pa.Table.from_batches(got).sort_by("id").to_pylist()
    assert [r["id"] for r in rows] == [i for i in range(150) if not 90 <= i < 110]
    # Rows written before ADD COLUMN read it as null; later ones have it.
    assert all(r["s"] is None for r in rows if r["id"] < 90)
    assert all(r["s"] == f"row{r['id']}" * 3 for r in rows if r["id"] >= 110)
    assert sorted(ids(TableDataset(path, version=0))) == list(range(100))
    write_deltalake(path, table(7, 3), mode="overwrite", schema_mode="overwrite")  # v3
    assert sorted(ids(TableDataset(path))) == [7, 8, 9]


def test_delta_partition_columns_come_from_the_log(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import write_deltalake

    t = table(0, 60).append_column("region", pa.array(["eu", "us", "ap"] * 20))
    write_deltalake(str(tmp_path / "main" / "ml" / "ev"), t, partition_by=["region"])
    monkeypatch.setenv("UCSTAGE_WAREHOUSE", str(tmp_path))
    got = pa.Table.from_batches(list(TableDataset("main.ml.ev", columns=["id", "region"])))
    rows = sorted(got.to_pylist(), key=lambda r: r["id"])
    assert [r["region"] for r in rows] == ["eu", "us", "ap"] * 20


# -- the cache -----------------------------------------------------------------------


def test_cache_verify_knows_row_group_entries(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    pq.write_table(table(0, 120), tmp_path / "t" / "a.parquet", row_group_size=50)
    cache = LocalCache(tmp_path / "cache")
    ds = TableDataset(str(tmp_path / "t"), columns=["id"], cache=cache)
    assert len(ids(ds)) == 120
    report = cache.verify(ds.freeze().volume())
    assert report.sources[0].ranges_ok == report.sources[0].ranges_checked == 3
    assert report.sources[0].clean
    # Files and row-group copies are counted apart (issue 30 item 8): the
    # one file is not cached whole, its 3 row groups are.
    one = report.sources[0]
    assert (one.checked, one.ok, one.missing) == (1, 0, 1)
    from ucstage.cli.cache_maint import _verify_line

    assert _verify_line(one).endswith("1 file checked, 0 ok, 1 not cached; 3 row-group copies "
                                      "checked, 3 ok; 0 stale, 0 corrupt")
    os.utime(tmp_path / "t" / "a.parquet", (1, 1))  # a new version of the file
    report = cache.verify(ds.freeze().volume())
    assert len(report.sources[0].stale) == 3
    assert all(p.startswith(RANGES_DIR + "/a.parquet/") for p, _ in report.sources[0].stale)


def test_verify_reports_the_row_groups_of_a_deleted_file_as_orphans(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    for name in ("a", "b"):
        pq.write_table(table(0, 120), tmp_path / "t" / f"{name}.parquet", row_group_size=50)
    cache = LocalCache(tmp_path / "cache")
    ds = TableDataset(str(tmp_path / "t"), columns=["id"], cache=cache)
    assert len(ids(ds)) == 240
    volume = ds.freeze().volume()
    (tmp_path / "t" / "b.parquet").unlink()
    report = cache.verify(volume, fix=True).sources[0]
    assert len(report.orphans) == 3 and report.orphans == report.orphans_removed
    assert all(p.startswith(RANGES_DIR + "/b.parquet/") for p in report.orphans)
    assert report.ranges_ok == 3 and cache.verify(volume).sources[0].orphans == []


def test_a_listed_file_cannot_take_a_range_entry_s_place(tmp_path: Path) -> None:
    from ucstage.errors import UnsafePath
    from ucstage.volumes import FileEntry, resolve

    (tmp_path / "v" / RANGES_DIR).mkdir(parents=True)
    (tmp_path / "v" / RANGES_DIR / "x").write_bytes(b"abc")
    cache = LocalCache(tmp_path / "cache")
    volume = resolve(str(tmp_path / "v"))
    with pytest.raises(UnsafePath, match="byte-range entries"):
        cache.fetch(volume, FileEntry(f"{RANGES_DIR}/x", 3, ""))


# -- bad input -----------------------------------------------------------------------


def test_bad_input_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "np").mkdir()
    (tmp_path / "np" / "a.csv").write_text("id\n1\n")
    with pytest.raises(NotParquet, match=r"a\.csv is not a Parquet file"):
        TableDataset(str(tmp_path / "np")).freeze()
    (tmp_path / "mix").mkdir()
    pq.write_table(table(0, 5), tmp_path / "mix" / "a.parquet")
    pq.write_table(pa.table({"id": ["x"]}), tmp_path / "mix" / "b.parquet")
    with pytest.raises(SchemaMismatch, match="cannot be unified"):
        TableDataset(str(tmp_path / "mix")).freeze()
    (tmp_path / "ok").mkdir()
    pq.write_table(table(0, 5), tmp_path / "ok" / "a.parquet")
    with pytest.raises(UnknownColumn, match="no column 'nope'"):
        TableDataset(str(tmp_path / "ok"), columns=["id", "nope"]).freeze()
    # Delta tables' own errors (vectors, vacuumed files, logs): test_delta_reader.py
    for error in (NotParquet, SchemaMismatch, UnknownColumn, UnsupportedTable):
        assert error("x").exit_code == 2


def test_warming_row_group_entries_copies_only_their_ranges(engine: str, moto: Any,
                                                            tmp_path: Path) -> None:
    """``LocalCache.warm`` of RangeEntries (what ``cache warm --unit row-group``
    warms), on each object-store engine: each entry holds exactly its chunks,
    and the dataset then reads them as hits."""
    from tests.common.parts import unique
    from ucstage.tables import row_groups
    from ucstage.tables.entries import group_entries

    url = f"s3://ucstage-test/{unique()}"
    fs = moto.filesystem()
    fs.pipe(f"{url[5:]}/a.parquet", parquet(table(0, 130)))
    m = row_groups(url)
    cache = LocalCache(tmp_path / "cache")
    entries = group_entries(m, ["id"])
    cache.warm(m.volume(), entries)
    for e in entries:
        local = cache.lookup(m.volume(), e)
        assert local is not None and os.path.getsize(local) == e.size
    ds = TableDataset(url, columns=["id"], cache=cache)
    assert ids(ds) == list(range(130))
    assert cached_bytes(cache, ds) == sum(e.size for e in entries)


def test_an_export_destination_is_read_by_its_record(tmp_path: Path) -> None:
    """The record's files only (a stray Parquet file beside them is not the
    export's), its Delta version in the manifest."""
    import json

    from ucstage.tables.record import RECORD_NAME

    dest = tmp_path / "dest"
    (dest / "label=1").mkdir(parents=True)
    pq.write_table(table(0, 90), dest / "label=1" / "part-0.parquet", row_group_size=40)
    pq.write_table(table(500, 5), dest / "stray.parquet")
    record = {"format": "ucstage-export/1", "table": "main.ml.ev",
              "source": {"kind": "delta", "location": "/x"}, "delta_version": 4,
              "row_count": 90, "schema": {},
              "files": [{"path": "label=1/part-0.parquet",
                         "bytes": os.path.getsize(dest / "label=1" / "part-0.parquet"),
                         "rows": 90}],
              "bytes": 0, "options": {}, "created_at": "2026-12-01T00:00:00Z",
              "ucstage_version": "0"}
    (dest / RECORD_NAME).write_text(json.dumps(record))
    ds = TableDataset(str(dest), columns=["id"], batch_rows=25)
    assert ids(ds) == list(range(90))
    assert ds.freeze().kind == "export" and ds.freeze().table_version == 4
    with pytest.raises(InvalidArgument, match="format must be one of"):
        TableDataset(str(dest), format="pandas")


def test_workers_read_an_object_store_table(monkeypatch: pytest.MonkeyPatch, moto: Any,
                                            tmp_path: Path) -> None:
    """Two DataLoader workers over moto S3 on the object-store engine (they start
    by forkserver once obstore ran in this process): every row once."""
    from tests.common.parts import unique

    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    url = f"s3://ucstage-test/{unique()}"
    fs = moto.filesystem()
    for i in range(3):
        fs.pipe(f"{url[5:]}/p{i}.parquet", parquet(table(i * 100, 100), rows=30))
    ds = TableDataset(url, columns=["id", "v"], format="torch", batch_rows=16, shuffle=True,
                      cache=LocalCache(tmp_path / "cache"))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    got = Counter(ids(loader))
    assert sorted(got) == list(range(300)) and set(got.values()) == {1}
    assert loader.audits[-1].coverage_ok


@pytest.mark.parametrize("same_layout", [True, False])
def test_a_row_group_finished_inside_an_interrupted_window_is_counted_once(
        tmp_path: Path, same_layout: bool) -> None:
    """A small row group finishes early in a shuffle window while the window's
    first one does not: the state holds it whole in ``partial`` (past the
    slot's leading count); after the resume it is neither read again nor
    missing from the audit."""
    (tmp_path / "t").mkdir()
    for i, n in enumerate([100, 5, 100]):
        pq.write_table(table(i * 1000, n), tmp_path / "t" / f"p{i}.parquet")

    def make(workers: int) -> DataLoader:
        ds = TableDataset(str(tmp_path / "t"), columns=["id"], shuffle=True, seed=19,
                          shuffle_window=3, batch_rows=30)
        return DataLoader(ds, batch_size=None, num_workers=workers)

    loader = make(0)
    it = iter(loader)
    head = [i for _ in range(5) for i in next(it).column("id").to_pylist()]
    state = loader.state_dict()
    del it
    small = [g for g, n in state["partial"] if n == 5]
    assert small and state["segments"][0]["delivered"] == [0]  # finished past the lead
    again = make(0 if same_layout else 2)
    again.load_state_dict(state)
    rest = ids(again)
    assert sorted(head + rest) == sorted(list(range(100)) + list(range(1000, 1005))
                                         + list(range(2000, 2100)))
    audit = again.audits[-1]
    assert (audit.files, audit.duplicates, audit.gaps, audit.coverage_ok) == (3, 0, 0, True)


def test_partition_folders_are_columns(tmp_path: Path) -> None:
    """``COL=value/`` folders (``export --partition-by``) read back as columns:
    whole numbers as int64, others as strings, Spark's null folder as null."""
    root = tmp_path / "t"
    for i, (label, region) in enumerate([(1, "eu"), (2, "us"), (2, "__HIVE_DEFAULT_PARTITION__")]):
        folder = root / f"label={label}" / f"region={region}"
        folder.mkdir(parents=True)
        pq.write_table(table(i * 10, 10).select(["id"]), folder / "part-0.parquet")
    ds = TableDataset(str(root), columns=["id", "label", "region"])
    assert ds.freeze().schema.field("label").type == pa.int64()
    rows = sorted(pa.Table.from_batches(list(ds)).to_pylist(), key=lambda r: r["id"])
    assert [(r["label"], r["region"]) for r in rows] == \
        [(1, "eu")] * 10 + [(2, "us")] * 10 + [(2, None)] * 10


def test_a_cache_smaller_than_the_table(tmp_path: Path) -> None:
    """Under a byte cap of about a third of the table, two epochs still read
    every row once each; the cache never holds more than the cap."""
    (tmp_path / "t").mkdir()
    for i in range(4):
        pq.write_table(table(i * 400, 400), tmp_path / "t" / f"p{i}.parquet", row_group_size=50)
    probe = TableDataset(str(tmp_path / "t"))
    m = probe.freeze()
    cap = int(m.bytes * 0.35)
    assert 5 * int(m.group_bytes().max()) < cap  # the readers' window fits
    cache = LocalCache(tmp_path / "cache", max_bytes=cap)
    ds = TableDataset(str(tmp_path / "t"), cache=cache, read_ahead=1, shuffle=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = Counter(ids(DataLoader(ds, batch_size=None, num_workers=0)))
        assert sorted(got) == list(range(1600)) and set(got.values()) == {1}
        assert cached_bytes(cache, ds) <= cap
