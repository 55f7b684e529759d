"""The row-group listing (ucstage.tables): table SOURCEs of every kind resolved,
footers read once, frozen into a row-group manifest; bad input one clear error.

Real parts: Parquet files written with pyarrow on a local folder, the rclone
FUSE mount and the moto S3 server (both engines), Delta tables written with
deltalake (append, delete, overwrite, a new column, partitions).
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common.tables import parquet_bytes, table
from ucstage.errors import (
    EmptySource,
    InvalidArgument,
    NotParquet,
    SchemaMismatch,
    TableNotFound,
    UnknownColumn,
)
from ucstage.manifest import load, save
from ucstage.tables import RowGroupManifest, row_groups
from ucstage.tables.record import RECORD_NAME


def brute(files: list[pa.Table], row_group_rows: int) -> list[int]:
    """Row counts per row group, as pyarrow itself reports them."""
    out = []
    for t in files:
        md = pq.ParquetFile(io.BytesIO(parquet_bytes(t, row_group_rows))).metadata
        out += [md.row_group(g).num_rows for g in range(md.num_row_groups)]
    return out


def test_a_parquet_folder_on_every_backend(backend: Any) -> None:
    parts = [table(0, 250), table(250, 100), table(350, 7)]
    backend.write_many({f"part-{i}.parquet": parquet_bytes(t, 64) for i, t in enumerate(parts)}
                       | {"_SUCCESS": b"", ".hidden": b"x"})
    m = row_groups(backend.url)
    assert m.kind == "parquet" and m.table_version is None
    assert [e.path for e in m.files] == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert m.rows_per_group.tolist() == brute(parts, 64)
    assert m.rows == 357 and m.row_groups == 4 + 2 + 1
    assert m.file.tolist() == [0, 0, 0, 0, 1, 1, 2]
    assert m.index.tolist() == [0, 1, 2, 3, 0, 1, 0]
    assert m.schema.names == ["id", "x", "v", "s"]
    # The byte ranges are where the column chunks are: reading just those bytes works.
    raw = parquet_bytes(parts[1], 64)
    (off, n), = m.ranges(5, ["x"])
    md = pq.ParquetFile(io.BytesIO(raw)).metadata.row_group(1).column(1)
    assert (off, n) == (md.data_page_offset if not md.has_dictionary_page
                        else min(md.dictionary_page_offset, md.data_page_offset),
                        md.total_compressed_size)
    assert m.group_bytes(["x"]).sum() < m.group_bytes().sum() == m.bytes


def test_the_manifest_round_trips_and_its_fingerprint_guards_it(tmp_path: Path) -> None:
    pq.write_table(table(0, 100), tmp_path / "a.parquet", row_group_size=30)
    m = row_groups(str(tmp_path))
    path = save(m, tmp_path.parent / "m.rowgroups.arrow")
    back = load(path, kind=RowGroupManifest)
    assert back.fingerprint == m.fingerprint == back.compute_fingerprint()
    assert back.rows_per_group.tolist() == m.rows_per_group.tolist()
    assert back.schema == m.schema and back.files == m.files
    assert back.metadata(0).num_row_groups == 4
    # Another row-group size is another manifest.
    pq.write_table(table(0, 100), tmp_path / "a.parquet", row_group_size=50)
    assert row_groups(str(tmp_path)).fingerprint != m.fingerprint


def test_columns_are_checked_by_name(tmp_path: Path) -> None:
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    m = row_groups(str(tmp_path))
    assert m.check_columns(["x", "id"]) == ["x", "id"]
    with pytest.raises(UnknownColumn, match="no column 'nope'"):
        m.check_columns(["x", "nope"])


def test_a_file_that_is_not_parquet_is_named(tmp_path: Path) -> None:
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(NotParquet, match=r"notes\.txt is not a Parquet file") as info:
        row_groups(str(tmp_path))
    assert info.value.exit_code == 2


def test_schemas_that_cannot_be_unified_are_one_error(tmp_path: Path) -> None:
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array(["a", "b"])}), tmp_path / "b.parquet")
    with pytest.raises(SchemaMismatch, match="column 'id' is int64 in one, string") as info:
        row_groups(str(tmp_path))
    assert info.value.exit_code == 2


def test_a_missing_column_in_some_files_unifies(tmp_path: Path) -> None:
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    pq.write_table(table(10, 5).drop_columns(["s"]), tmp_path / "b.parquet")
    assert row_groups(str(tmp_path)).schema.names == ["id", "x", "v", "s"]


def test_an_empty_folder_and_a_version_without_delta(tmp_path: Path) -> None:
    with pytest.raises(EmptySource):
        row_groups(str(tmp_path))
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    with pytest.raises(InvalidArgument, match="version applies to Delta tables"):
        row_groups(str(tmp_path), version=0)


# -- Delta ---------------------------------------------------------------------


def test_a_delta_table_by_path_and_version(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, table(0, 100))                       # v0
    write_deltalake(path, table(100, 50), mode="append")       # v1
    DeltaTable(path).delete("id < 10")                         # v2: rewrites a file
    m = row_groups(path)
    assert m.kind == "delta" and m.table_version == 2 and m.rows == 140
    assert all(not e.path.startswith("_delta_log") for e in m.files)
    assert row_groups(path, version=1).rows == 150
    assert row_groups(path, version=0).rows == 100
    write_deltalake(path, table(0, 3), mode="overwrite")       # v3
    assert row_groups(path).rows == 3 and row_groups(path).table_version == 3
    with pytest.raises(TableNotFound, match="version 9"):
        row_groups(path, version=9)


def test_a_delta_table_by_name_under_the_warehouse(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(tmp_path / "main" / "ml" / "ev"), table(0, 20))
    monkeypatch.delenv("UCSTAGE_WAREHOUSE", raising=False)
    with pytest.raises(TableNotFound, match="UCSTAGE_WAREHOUSE"):
        row_groups("main.ml.ev")
    monkeypatch.setenv("UCSTAGE_WAREHOUSE", str(tmp_path))
    m = row_groups("main.ml.ev")
    assert m.rows == 20 and m.kind == "delta"
    with pytest.raises(TableNotFound, match="no Delta log"):
        row_groups("main.ml.nope")


def test_the_delta_log_schema_is_authoritative(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, table(0, 10).drop_columns(["s"]))
    write_deltalake(path, table(10, 10), mode="append", schema_mode="merge")  # ADD COLUMN s
    m = row_groups(path)
    assert m.schema.names == ["id", "x", "v", "s"]
    assert sorted(len(leaves) for leaves in m.leaves) == [3, 4]  # the old file has no s


def test_partition_columns_come_from_the_log(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    t = table(0, 30).append_column("region", pa.array(["eu", "us", "ap"] * 10))
    write_deltalake(path, t, partition_by=["region"])
    m = row_groups(path)
    assert "region" in m.schema.names
    assert sorted(p["region"] for p in m.partition_values) == ["ap", "eu", "us"]
    assert all("region" not in {leaf.split(".")[0] for leaf in leaves} for leaves in m.leaves)


def test_the_deletion_vector_feature_without_vectors_reads_every_row(tmp_path: Path) -> None:
    """deltalake writes the feature, never a vector: every row is live (the
    vectors themselves: tests/data/test_delta_reader.py)."""
    from deltalake import write_deltalake

    path = str(tmp_path / "dv")
    write_deltalake(path, table(0, 10), configuration={"delta.enableDeletionVectors": "true"})
    m = row_groups(path)
    assert m.rows == 10 and m.deletion_vectors == []


# -- an export destination -----------------------------------------------------


def test_an_export_destination_reads_its_record(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    files = []
    for i, t in enumerate([table(0, 40), table(40, 20)]):
        pq.write_table(t, dest / f"part-{i}.parquet", row_group_size=16)
        files.append({"path": f"part-{i}.parquet",
                      "bytes": os.path.getsize(dest / f"part-{i}.parquet"), "rows": len(t)})
    # A stray Parquet file the record does not list is not part of the export.
    pq.write_table(table(0, 5), dest / "stray.parquet")
    record = {"format": "ucstage-export/1", "table": "main.ml.ev",
              "source": {"kind": "delta", "location": "/somewhere"}, "delta_version": 7,
              "row_count": 60, "schema": {}, "files": files, "bytes": 0, "options": {},
              "created_at": "2026-12-01T00:00:00Z", "ucstage_version": "0"}
    (dest / RECORD_NAME).write_text(json.dumps(record))
    m = row_groups(str(dest))
    assert m.kind == "export" and m.table_version == 7
    assert [e.path for e in m.files] == ["part-0.parquet", "part-1.parquet"]
    assert m.rows == 60 and m.row_groups == 3 + 2
