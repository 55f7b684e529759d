"""ucstage export of Delta tables with deletion vectors and column mapping,
on the embedded Spark Connect server, which has no Delta jars: the exported
Parquet holds the rows deltalake's engine (``QueryBuilder``) and
delta-kernel read, and the export record counts them.

(``DeltaTable.to_pyarrow_table()`` is no reference here: deltalake 1.x
refuses deletion vectors there and reads column-mapped columns as null.)

Each Spark export costs seconds, so a few tables carry every case: one with
deletion vectors of each storage kind beside a file without one, in a
folder whose name Spark must percent-encode; a column-mapped table in
``name`` and one in ``id`` mode (partitioned, nested fields, a renamed
column, a dropped one re-added, a deletion vector). The ``id`` table has a
file whose columns carry other names than the log's: only its field ids match.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common.deltadv import DvTable, bitmap, kernel_rows, z85
from tests.common.deltaedit import typed_partition_table
from tests.common.spark import exported_table
from ucstage.errors import ExportError, UnreadableDeltaLog, UnsupportedTable
from ucstage.export import export_table, read_record

pytestmark = pytest.mark.spark


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def reference(root: str) -> list[dict[str, Any]]:
    """The table's rows as deltalake's engine reads them, checked against delta-kernel's."""
    from deltalake import DeltaTable, QueryBuilder

    engine = pa.table(QueryBuilder().register("t", DeltaTable(root))
                      .execute("select * from t").read_all()).to_pylist()
    assert by_id(engine) == by_id(kernel_rows(root))
    return by_id(engine)


def check_export(root: str, dest: str, want: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Export the table at ``root`` into ``dest``; its rows, checked against
    ``want`` (sorted by id) and the record."""
    result = export_table(root, dest)
    got = by_id(exported_table(dest).to_pylist())
    assert got == want
    record = read_record(dest)
    assert record is not None and record == result.record
    assert record.row_count == len(want) == sum(f["rows"] for f in record.files)
    assert [f["name"] for f in record.schema["fields"]] == list(want[0])
    return got


# -- deletion vectors -----------------------------------------------------------------

DV_FOLDER = "dv t+ü%zz#x"
"""Spark names files by percent-encoded URIs: a space, ``%``, ``#`` and
``+`` must come back as the same file (``+`` is no space there), ``ü``
unencoded. (delta-rs decodes a ``%`` followed by hex digits in a table's
path: that path is no table here.)"""


def dv_table(root: Path) -> DvTable:
    """Five files of 20 rows (8-row row groups): vectors inline, in a file
    under a prefix (the file's second vector), in a file without one (one
    vector deletes a whole row group), a file without a vector, and one
    whose vector a later commit replaces (the newest wins)."""
    t = DvTable(str(root))
    for k, name in enumerate("abcde"):
        t.data(f"{name}.parquet", 100 * k, 20, 8)
    t.add("a.parquet", t.vector([0, 7, 8, 19], "i"))
    t.add("b.parquet", t.vector([3, 4, 5], "u", prefix="q1", before=[1, 2]))
    t.add("c.parquet", t.vector([*range(8, 16), 17], "u"))
    t.add("d.parquet", None)
    t.add("e.parquet", None)
    t.commit()
    first = t.vector([2], "i")
    t.remove("e.parquet", None)
    t.add("e.parquet", first)
    t.commit()
    t.remove("e.parquet", first)
    t.add("e.parquet", t.vector([2, 9, 10], "i"))
    t.commit()
    return t


@pytest.fixture(scope="module")
def dv_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(dv_table(tmp_path_factory.mktemp("dv") / DV_FOLDER).root)


def test_deletion_vectors_drop_the_deleted_rows(spark_session: Any, dv_root: Path,
                                                tmp_path: Path) -> None:
    # delta-kernel takes a URL it does not percent-encode: the references
    # read the same files through a link with a plain name.
    plain = tmp_path / "plain"
    os.symlink(dv_root, plain)
    want = reference(str(plain))
    gone = {0: {0, 7, 8, 19}, 1: {3, 4, 5}, 2: {*range(8, 16), 17}, 4: {2, 9, 10}}
    assert [r["id"] for r in want] == [100 * k + i for k in range(5) for i in range(20)
                                       if i not in gone.get(k, set())]
    check_export(str(dv_root), str(tmp_path / "out"), want)
    assert len(want) == 100 - 4 - 3 - 9 - 3
    # A filter Spark pushes into the scan skips row groups (c's first, all
    # of a and b by their statistics): the row indexes still count from the
    # start of each file. And with broadcasts off, the deleted rows are
    # joined as millions of them would be, by a shuffle join.
    dest = str(tmp_path / "some")
    conf = spark_session.conf
    saved = conf.get("spark.sql.autoBroadcastJoinThreshold")
    conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        result = export_table(str(dv_root), dest, where="id >= 209")
    finally:
        conf.set("spark.sql.autoBroadcastJoinThreshold", saved)
    some = [r for r in want if r["id"] >= 209]
    assert by_id(exported_table(dest).to_pylist()) == some
    assert result.row_count == len(some)


def test_rows_brought_back_fail_the_row_count_check(spark_session: Any, dv_root: Path,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The written files must add up to the log's live rows: a reader that
    ignored the vectors would write deleted rows, and the export fails
    after the write, publishing nothing."""
    from ucstage.export import deltaread

    monkeypatch.setattr(deltaread, "_deleted", lambda state: None)
    dest = tmp_path / "out"
    with pytest.raises(ExportError, match="rows") as info:
        export_table(str(dv_root), str(dest))
    assert info.value.exit_code != 0
    assert not dest.exists() and os.listdir(tmp_path) == []


# -- column mapping -------------------------------------------------------------------

def _rows(start: int, n: int, *, old: str = "old", gone: bool = True) -> pa.Table:
    ids = list(range(start, start + n))
    columns: dict[str, Any] = {
        "id": pa.array(ids, pa.int64()),
        "p": pa.array([["x y", "z/ü", None][i % 3] for i in ids]),
        "st": pa.array([{"u": i, "v": f"v{i}" if i % 4 else None} for i in ids]),
        "ls": pa.array([[{"w": i}, {"w": -i}] if i % 3 else None for i in ids]),
        "mp": pa.array([[(f"k{i}", {"q": i})] if i % 2 else None for i in ids],
                       pa.map_(pa.string(), pa.struct([("q", pa.int64())]))),
        old: pa.array([i * 10 for i in ids], pa.int32()),
    }
    if gone:
        columns["gone"] = pa.array([f"g{i}" for i in ids])
    return pa.table(columns)


def _actions(root: Path, version: int) -> list[dict[str, Any]]:
    text = (root / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    (root / "_delta_log" / f"{version:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))


def _metadata(root: Path, version: int) -> dict[str, Any]:
    for v in range(version, -1, -1):
        found = [a["metaData"] for a in _actions(root, v) if "metaData" in a]
        if found:
            return found[0]
    raise AssertionError("no metaData")


def mapped_table(root: Path, mode: str) -> None:
    """By deltalake and then by the protocol, as Delta engines change a table:
    v0 rows 0..19 partitioned by ``p``; v1 renames ``old`` to ``renamed``
    and drops ``gone``; v2 appends 20..29; v3 adds ``gone`` again (a new
    physical column: the dropped values must not come back); v4 appends
    30..39; v5 deletes rows of one file by a deletion vector."""
    from deltalake import write_deltalake

    path = str(root)
    write_deltalake(path, _rows(0, 20), partition_by=["p"],
                    configuration={"delta.columnMapping.mode": mode})
    meta = _metadata(root, 0)
    schema = json.loads(meta["schemaString"])
    for field in schema["fields"]:
        if field["name"] == "old":
            field["name"] = "renamed"
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "gone"]
    _commit(root, 1, [{"metaData": {**meta, "schemaString": json.dumps(schema)}}])
    write_deltalake(path, _rows(20, 10, old="renamed", gone=False), mode="append")
    top = int(meta["configuration"]["delta.columnMapping.maxColumnId"]) + 1
    schema["fields"].append({"name": "gone", "type": "string", "nullable": True,
                             "metadata": {"delta.columnMapping.id": top,
                                          "delta.columnMapping.physicalName":
                                              f"col-{uuid.uuid4()}"}})
    configuration = {**meta["configuration"], "delta.columnMapping.maxColumnId": str(top)}
    _commit(root, 3, [{"metaData": {**meta, "schemaString": json.dumps(schema),
                                    "configuration": configuration}}])
    write_deltalake(path, _rows(30, 10, old="renamed"), mode="append")
    target = next(a["add"] for a in _actions(root, 0) if "add" in a)
    data = bitmap([0, 3, 4])
    vector = {"storageType": "i", "pathOrInlineDv": z85(data), "sizeInBytes": len(data),
              "cardinality": 3}
    _commit(root, 5, [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["columnMapping", "deletionVectors"],
                      "writerFeatures": ["columnMapping", "deletionVectors"]}},
        {"remove": {"path": target["path"], "deletionTimestamp": 1, "dataChange": True}},
        {"add": {**target, "deletionVector": vector}}])


def other_names(root: Path) -> None:
    """A commit replacing a file of an ``id``-mapped table by one holding the
    same rows under other column names: only its field ids match the log.
    (Neither deltalake's engine nor delta-kernel reads that file.)"""
    add = next(a["add"] for a in _actions(root, 2) if "add" in a)
    stored = pq.read_table(root / add["path"])
    renamed = pa.schema([pa.field(f"other{i}", f.type, f.nullable, f.metadata)
                         for i, f in enumerate(stored.schema)])
    assert all(b"PARQUET:field_id" in (f.metadata or {}) for f in renamed)
    name = f"other-{uuid.uuid4()}.parquet"
    pq.write_table(pa.Table.from_arrays(stored.columns, schema=renamed), root / name)
    _commit(root, 6, [
        {"remove": {"path": add["path"], "deletionTimestamp": 2, "dataChange": True}},
        {"add": {**add, "path": name, "size": (root / name).stat().st_size}}])


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapped_tables_export_under_logical_names(spark_session: Any, tmp_path: Path,
                                                         mode: str) -> None:
    root = tmp_path / "t"
    mapped_table(root, mode)
    # The files: under random prefixes (no COL=value folders), physical names.
    files = [p for p in root.rglob("*.parquet")]
    assert not any("p=" in str(p.relative_to(root)) for p in files)
    assert "renamed" not in pq.read_schema(files[0]).names
    want = reference(str(root))
    if mode == "id":
        other_names(root)  # the same rows
    got = check_export(str(root), str(tmp_path / "out"), want)
    assert len(got) == 40 - 3
    assert {r["p"] for r in got} == {"x y", "z/ü", None}
    assert all(r["renamed"] == r["id"] * 10 for r in got)
    # Dropped and re-added: the old physical column is never read.
    assert [r["id"] for r in got if r["gone"] is not None] == list(range(30, 40))
    assert all(r["gone"] == f"g{r['id']}" for r in got if r["gone"] is not None)


# -- typed partition values -----------------------------------------------------------

def test_partition_values_come_from_the_log_in_their_types(spark_session: Any,
                                                           tmp_path: Path) -> None:
    """Partitioned by columns of every type a partition takes, exported in a
    session whose time zone is not UTC: a timestamp_ntz value must not move."""

    from deltalake import write_deltalake

    t = typed_partition_table(24).drop_columns(["l"])
    root = str(tmp_path / "typed")
    write_deltalake(root, t, partition_by=["i", "d", "ts", "ntz", "b", "dec", "s"])
    want = reference(root)
    conf = spark_session.conf
    saved = conf.get("spark.sql.session.timeZone")
    conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        check_export(root, str(tmp_path / "out"), want)
    finally:
        conf.set("spark.sql.session.timeZone", saved)
    types = {f.name: f.type for f in exported_table(str(tmp_path / "out")).schema}
    assert types["ntz"] == pa.timestamp("us") and types["dec"] == pa.decimal128(6, 2)


# -- type widening -------------------------------------------------------------------

def test_type_widening_exports_older_files_in_the_table_s_types(spark_session: Any,
                                                                tmp_path: Path) -> None:
    """Every widening Delta 4.0 allows (nested fields too), in a column-mapped
    table: the older file's narrow values come out in the log's types, as
    the protocol says (the rows built value by value, not by a cast; the
    reference engines at hand refuse the feature)."""
    from tests.data.test_delta_types import expected_wide, narrow, widening_table

    every = narrow([0]).column_names
    root = tmp_path / "t"
    widening_table(root, "typeWidening", "name", every)
    want = by_id(expected_wide(list(range(10)), root, every).to_pylist())
    check_export(str(root), str(tmp_path / "out"), want)
    types = {f.name: f.type for f in exported_table(str(tmp_path / "out")).schema}
    assert types["b2i"] == pa.int32() and types["d2ntz"] == pa.timestamp("us")
    assert types["dec"] == pa.decimal128(10, 4) and types["ls"] == pa.list_(pa.int64())


# -- what export still refuses, before any server is asked ---------------------------

def test_an_unknown_reader_feature_is_refused_before_spark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens at SPARK_REMOTE: a refusal any later would be
    SparkUnavailable. (deltalake itself refuses to open the table; a feature
    it knew and ucstage did not would be UnsupportedTable, by name.)"""
    from deltalake import write_deltalake

    from tests.common.parts import free_port

    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": [1, 2]}))
    _commit(root, 1, [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                    "readerFeatures": ["someFutureFeature"],
                                    "writerFeatures": ["someFutureFeature"]}}])
    with pytest.raises((UnreadableDeltaLog, UnsupportedTable), match="someFutureFeature") as info:
        export_table(str(root), str(tmp_path / "out"))
    assert info.value.exit_code == 2
    assert not (tmp_path / "out").exists()
