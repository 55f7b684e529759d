"""TableDataset on Delta tables whose files hold other types than the log
states: type widening (``typeWidening``, GA in Delta 4.0, and
``typeWidening-preview``: files written before a column was widened keep
the narrower type) and column-mapped tables of every type with files as
Spark writes them (INT96 timestamps, physical names, field ids, statistics).

deltalake writes neither feature (it refuses to read type widening, and it
forgets column mapping once a table holds timestamp_ntz), so each table is
written by deltalake, then edited by the Delta protocol: a metaData action
widening the columns (``delta.typeChanges`` field metadata), a protocol
action naming the features, and data files written by pyarrow as another
engine would write them. Rows are compared with delta-kernel where it reads
the table and with the values the protocol says (the older values widened).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common.deltadv import kernel_rows
from tests.data.test_delta_reader import multiset, over_layout
from ucstage import DataLoader, TableDataset
from ucstage.errors import SchemaMismatch

UTC = dt.timezone.utc


# -- writing a table as other engines do -------------------------------------------

def _log(root: Path, version: int) -> list[dict[str, Any]]:
    text = (root / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _commit(root: Path, version: int, actions: list[dict[str, Any]]) -> None:
    (root / "_delta_log" / f"{version:020d}.json").write_text(
        "".join(json.dumps(a) + "\n" for a in actions))


def _physical(field: pa.Field) -> pa.Field:
    """A logical field of the log's schema (delta-rs's Arrow form) as a Delta
    engine writes it in Parquet: under its physical name, with its column
    mapping id as the Parquet field id, nested struct fields too."""
    meta = field.metadata or {}
    t = field.type
    if pa.types.is_struct(t):
        t = pa.struct([_physical(c) for c in t])
    name = meta.get(b"delta.columnMapping.physicalName", field.name.encode()).decode()
    ids = {b"PARQUET:field_id": meta[b"delta.columnMapping.id"]} \
        if b"delta.columnMapping.id" in meta else None
    return pa.field(name, t, field.nullable, ids)


def _physical_value(value: Any, field: pa.Field) -> Any:
    if value is None or not pa.types.is_struct(field.type):
        return value
    return {_physical(c).name: _physical_value(value[c.name], c) for c in field.type}


def engine_file(root: Path, rows: pa.Table, *, int96: bool = False) -> dict[str, Any]:
    """``rows`` (logical names, the table's current types) written into
    ``root`` as another Delta engine writes a file: physical names, field
    ids, INT96 timestamps when ``int96`` (Spark's default); its add action,
    with statistics keyed by physical names as the protocol says."""
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(str(root)).schema().to_arrow())
    fields = [schema.field(c) for c in rows.column_names]
    physical = pa.schema([_physical(f) for f in fields])
    data = pa.Table.from_pylist(
        [{_physical(f).name: _physical_value(r[f.name], f) for f in fields}
         for r in rows.to_pylist()], schema=physical)
    name = f"part-00001-{uuid.uuid4()}-c000.snappy.parquet"
    pq.write_table(data, root / name, use_deprecated_int96_timestamps=int96)
    ids = rows.column("id")
    key = _physical(schema.field("id")).name
    stats = {"numRecords": rows.num_rows, "minValues": {key: pa.compute.min(ids).as_py()},
             "maxValues": {key: pa.compute.max(ids).as_py()}, "nullCount": {key: 0}}
    return {"add": {"path": name, "partitionValues": {}, "size": (root / name).stat().st_size,
                    "modificationTime": 0, "dataChange": True, "stats": json.dumps(stats)}}


def protocol(*features: str) -> dict[str, Any]:
    return {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                         "readerFeatures": sorted(features), "writerFeatures": sorted(features)}}


def ucstage_rows(root: Path, cache: Path) -> list[dict[str, Any]]:
    ds = TableDataset(str(root), cache_dir=str(cache))
    batches = list(DataLoader(ds, batch_size=None, num_workers=0))
    schema = ds.freeze().schema
    for b in batches:  # every batch in the log's types, whichever file it came from
        assert b.schema.equals(schema), (b.schema, schema)
    return [r for b in batches for r in b.to_pylist()]


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


# -- type widening ------------------------------------------------------------------

def narrow(ids: list[int]) -> pa.Table:
    """Rows in the types the table had before it was widened."""
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "b2i": pa.array([i - 100 for i in ids], pa.int8()),
        "s2l": pa.array([-i * 300 for i in ids], pa.int16()),
        "i2l": pa.array([2**31 - 1 - i if i % 3 else None for i in ids], pa.int32()),
        "f2d": pa.array([i + 0.1 for i in ids], pa.float32()),
        "d2ntz": pa.array([dt.date(2020, 1, 1 + i) for i in ids]),
        "dec": pa.array([Decimal(i) / 100 - 1 for i in ids], pa.decimal128(5, 2)),
        "i2dec": pa.array([i * 7 for i in ids], pa.int32()),
        "i2d": pa.array([-(2**31) + i for i in ids], pa.int32()),
        "st": pa.array([{"x": -(2**31) + i, "y": f"y{i}"} for i in ids],
                       pa.struct([("x", pa.int32()), ("y", pa.string())])),
        "ls": pa.array([[i, -i] for i in ids], pa.list_(pa.int32())),
        "mp": pa.array([[("k", 2**31 - 1 - i)] for i in ids], pa.map_(pa.string(), pa.int32())),
    })


WIDER = {"b2i": "integer", "s2l": "long", "i2l": "long", "f2d": "double",
         "d2ntz": "timestamp_ntz", "dec": "decimal(10,4)", "i2dec": "decimal(12,2)",
         "i2d": "double"}
"""Top-level columns' new types (Delta 4.0's widenings, the preview's among them)."""


def widened(field: dict[str, Any], version: int) -> None:
    """The log's schema field ``field`` widened in place, with the
    ``delta.typeChanges`` entry the protocol records on the nearest struct
    field (``fieldPath`` for an array's element or a map's value)."""
    def change(old: str, new: str, path: str | None = None) -> dict[str, Any]:
        return {"tableVersion": version, "fromType": old, "toType": new,
                **({"fieldPath": path} if path else {})}

    name, meta = field["name"], field["metadata"]
    if name in WIDER:
        meta["delta.typeChanges"] = [change(field["type"], WIDER[name])]
        field["type"] = WIDER[name]
    elif name == "st":
        x = field["type"]["fields"][0]
        x["metadata"]["delta.typeChanges"] = [change("integer", "long")]
        x["type"] = "long"
    elif name == "ls":
        meta["delta.typeChanges"] = [change("integer", "long", "element")]
        field["type"]["elementType"] = "long"
    elif name == "mp":
        meta["delta.typeChanges"] = [change("integer", "long", "value")]
        field["type"]["valueType"] = "long"


def widening_table(root: Path, feature: str, mapping: str, columns: list[str]) -> None:
    """Version 0 by deltalake in the narrow types (ids 0..5); version 1
    widens every column; version 2 adds a file in the wide types (ids 6..9)."""
    from deltalake import write_deltalake

    write_deltalake(str(root), narrow(list(range(6))).select(columns),
                    configuration={"delta.columnMapping.mode": mapping})
    meta = next(a["metaData"] for a in _log(root, 0) if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    for field in schema["fields"]:
        widened(field, 1)
    meta["schemaString"] = json.dumps(schema)
    meta["configuration"] = {**meta["configuration"], "delta.enableTypeWidening": "true"}
    mapped = ["columnMapping"] if mapping != "none" else []
    _commit(root, 1, [protocol(feature, "timestampNtz", *mapped), {"metaData": meta}])
    _commit(root, 2, [engine_file(root, expected_wide(list(range(6, 10)), root, columns))])


def expected_wide(ids: list[int], root: Path, columns: list[str]) -> pa.Table:
    """The narrow rows ``ids`` as the protocol says a reader returns them once
    widened (built in Python, value by value: pyarrow's cast is what ucstage
    uses, so it is not the reference), in the log's current types."""
    from deltalake import DeltaTable

    schema = pa.schema(DeltaTable(str(root)).schema().to_arrow())
    rows = narrow(ids).select(columns).to_pylist()
    for r in rows:
        if "d2ntz" in r:
            r["d2ntz"] = dt.datetime.combine(r["d2ntz"], dt.time())
        for c in ("f2d", "i2d"):
            if c in r:
                r[c] = float(r[c])  # a float32's value is a double exactly
        for c, places in (("dec", 4), ("i2dec", 2)):
            if c in r:
                r[c] = Decimal(r[c]).quantize(Decimal(1).scaleb(-places))
    return pa.Table.from_pylist(rows, schema=pa.schema([schema.field(c) for c in columns]))


@pytest.mark.parametrize("feature,mapping", [("typeWidening", "none"),
                                             ("typeWidening-preview", "none"),
                                             ("typeWidening", "name")])
def test_type_widening_reads_older_files_in_the_table_s_types(
        tmp_path: Path, feature: str, mapping: str) -> None:
    from deltalake import DeltaTable

    every = narrow([0]).column_names
    root = tmp_path / "t"
    widening_table(root, feature, mapping, every)
    old = pq.read_schema(next(root.glob("*/*.parquet")) if mapping != "none"
                         else sorted(root.glob("*.parquet"), key=os.path.getmtime)[0])
    assert pa.int8() in old.types and pa.date32() in old.types  # the older file: narrow
    with pytest.raises(Exception, match=feature):  # the reference engines at hand refuse
        DeltaTable(str(root)).to_pyarrow_table()
    want = expected_wide(list(range(10)), root, every)
    assert by_id(ucstage_rows(root, tmp_path / "c")) == by_id(want.to_pylist())
    # Over ranks, workers and a shuffle: the same rows.
    assert multiset(over_layout(str(root), tmp_path / "c", world=2, workers=1)) == \
        multiset(want.to_pylist())
    # delta-kernel reads the feature, though not a widened list element (0.3.3
    # fails to cast it): compared on a table without one.
    root2 = tmp_path / "k"
    some = [c for c in every if c != "ls"]
    widening_table(root2, feature, mapping, some)
    kernel = kernel_rows(str(root2))
    assert by_id(kernel) == by_id(expected_wide(list(range(10)), root2, some).to_pylist())
    assert multiset(ucstage_rows(root2, tmp_path / "c2")) == multiset(kernel)


def test_a_file_whose_values_do_not_fit_the_table_s_type_is_one_error(tmp_path: Path) -> None:
    # A log that claims a narrowing (long -> int) over values that do not fit:
    # one error naming the file and the column, no value quoted.
    from deltalake import write_deltalake

    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": pa.array([1, 2], pa.int64()),
                                         "v": pa.array([5, 2**40 + 12345], pa.int64())}))
    meta = next(a["metaData"] for a in _log(root, 0) if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    schema["fields"][1]["type"] = "integer"
    meta["schemaString"] = json.dumps(schema)
    _commit(root, 1, [{"metaData": meta}])
    with pytest.raises(SchemaMismatch, match=r"\.parquet: column 'v' is int64 there") as info:
        ucstage_rows(root, tmp_path / "c")
    assert str(2**40 + 12345) not in str(info.value)


# -- column mapping, every type ----------------------------------------------------

def every_type(ids: list[int]) -> pa.Table:
    def v(i: int, x: Any) -> Any:
        return None if i % 7 == 3 else x

    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "i8": pa.array([v(i, i - 10) for i in ids], pa.int8()),
        "i16": pa.array([v(i, i * 1000) for i in ids], pa.int16()),
        "i32": pa.array([v(i, i * 100000) for i in ids], pa.int32()),
        "i64": pa.array([v(i, i * 2**40) for i in ids], pa.int64()),
        "f32": pa.array([v(i, i / 4) for i in ids], pa.float32()),
        "f64": pa.array([v(i, i / 3) for i in ids], pa.float64()),
        "dec": pa.array([v(i, Decimal(i) / 100) for i in ids], pa.decimal128(10, 2)),
        "s": pa.array([v(i, f"s{i}") for i in ids]),
        "bin": pa.array([v(i, bytes([i, 0, 255])) for i in ids], pa.binary()),
        "b": pa.array([v(i, i % 2 == 0) for i in ids]),
        "d": pa.array([v(i, dt.date(2024, 1, 1 + i)) for i in ids]),
        "ts": pa.array([v(i, dt.datetime(2024, 1, 1, i, 0, 0, 5, tzinfo=UTC)) for i in ids],
                       pa.timestamp("us", tz="UTC")),
        "st": pa.array([v(i, {"a": i, "b": f"x{i}"}) for i in ids]),
        "ls": pa.array([v(i, [i, i + 1]) for i in ids], pa.list_(pa.int32())),
        "mp": pa.array([v(i, [(f"k{i}", i)]) for i in ids], pa.map_(pa.string(), pa.int64())),
    })


NTZ = [dt.datetime(2000, 1, 1, i % 24, 0, 0, 7) for i in range(20)]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_with_every_type_and_spark_s_files(tmp_path: Path, mode: str) -> None:
    """Version 0 by deltalake (every type but timestamp_ntz, statistics on
    every column); version 1 adds a timestamp_ntz column (which deltalake
    cannot write column-mapped) and a file as Spark writes it: INT96
    timestamps (read without a time zone) under physical names and ids."""
    from deltalake import write_deltalake

    root = tmp_path / mode
    write_deltalake(str(root), every_type(list(range(10))),
                    configuration={"delta.columnMapping.mode": mode})
    stats = json.loads(next(a["add"] for a in _log(root, 0) if "add" in a)["stats"])
    assert len(stats["minValues"]) >= 10  # statistics, keyed by physical names
    meta = next(a["metaData"] for a in _log(root, 0) if "metaData" in a)
    schema = json.loads(meta["schemaString"])
    top = int(meta["configuration"]["delta.columnMapping.maxColumnId"]) + 1
    schema["fields"].append({"name": "ntz", "type": "timestamp_ntz", "nullable": True,
                             "metadata": {"delta.columnMapping.id": top,
                                          "delta.columnMapping.physicalName": f"col-{uuid.uuid4()}"}})
    meta["schemaString"] = json.dumps(schema)
    meta["configuration"]["delta.columnMapping.maxColumnId"] = str(top)
    _commit(root, 1, [protocol("columnMapping", "timestampNtz"), {"metaData": meta}])
    later = every_type(list(range(10, 20))).append_column(
        "ntz", pa.array(NTZ[10:], pa.timestamp("us")))
    _commit(root, 2, [engine_file(root, later, int96=True)])
    spark = pq.read_metadata(root / _log(root, 2)[0]["add"]["path"])
    assert "INT96" in {spark.schema.column(i).physical_type for i in range(spark.num_columns)}

    kernel = kernel_rows(str(root))
    want = every_type(list(range(20))).append_column(
        "ntz", pa.array([None] * 10 + NTZ[10:], pa.timestamp("us"))).to_pylist()
    assert multiset(kernel) == multiset(want)
    assert multiset(ucstage_rows(root, tmp_path / "c")) == multiset(kernel)
    got = over_layout(str(root), tmp_path / "c", world=2, workers=1, columns=["ts", "id", "st"])
    assert multiset(got) == multiset([{"ts": r["ts"], "id": r["id"], "st": r["st"]}
                                      for r in kernel])
