"""TableDataset on Delta tables written the way other engines write them:
partitioned by typed columns, column-mapped (name and id) and with deletion
vectors (inline, UUID-relative and absolute, from commits and from a
checkpoint). Every table is read by an independent reader as the reference
(deltalake, delta-kernel) and compared as a multiset of rows over ranks x
workers, shuffled, and across a resume; damaged or vacuumed tables are one
typed error at freeze."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.common.deltadv import DvTable, kernel_rows, recheckpoint
from tests.common.deltaedit import typed_partition_table
from tests.common.resume import Ranked
from ucstage import DataLoader, TableDataset
from ucstage.errors import MissingDataFiles, UnreadableDeltaLog, UnsupportedTable
from ucstage.tables import row_groups
from ucstage.tables.partvalues import as_text


class RankedTable(Ranked, TableDataset):
    """Rank ``rank`` of ``world`` without a process group."""


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(sorted((k, repr(v)) for k, v in row.items()))


def multiset(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(map(_key, rows))


def over_layout(source: str, cache: Path, *, world: int, workers: int,
                **options: Any) -> list[dict[str, Any]]:
    """Every rank's rows (``world`` ranks x ``workers`` workers), shuffled."""
    rows: list[dict[str, Any]] = []
    for rank in range(world):
        ds = RankedTable(source, rank=rank, world=world, shuffle=True, seed=3,
                         shuffle_window=2, cache_dir=str(cache), **options)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        batches = [b for b in loader]
        assert len(batches) == len(loader)  # len() counts the live rows' batches
        for b in batches:
            rows += b.to_pylist()
        if world == 1:  # the exactly-once audit sees the whole epoch
            assert loader.audits[-1].coverage_ok and loader.audits[-1].gaps == 0
    return rows


def resumed(source: str, cache: Path, stop: int, *, then: int = 2,
            **options: Any) -> list[dict[str, Any]]:
    """Rows of a loader (2 workers) stopped after ``stop`` batches, then resumed
    from its state with ``then`` workers (another layout unless 2)."""
    def make(workers: int = 2) -> DataLoader:
        ds = TableDataset(source, shuffle=True, seed=8, shuffle_window=2, batch_rows=5,
                          cache_dir=str(cache), **options)
        return DataLoader(ds, batch_size=None, num_workers=workers)

    loader = make()
    it = iter(loader)
    head = [r for _ in range(stop) for r in next(it).to_pylist()]
    state = loader.state_dict()
    del it
    again = make(then)
    again.load_state_dict(state)
    rest = [r for b in again for r in b.to_pylist()]
    assert again.audits[-1].coverage_ok and again.audits[-1].gaps == 0
    return head + rest


# -- typed partition values ---------------------------------------------------------

def test_typed_partition_columns_read_in_their_declared_types(tmp_path: Path) -> None:
    from deltalake import DeltaTable, write_deltalake

    n = 24
    t = typed_partition_table(n)
    path = str(tmp_path / "typed")
    parts = ["i", "l", "d", "ts", "ntz", "b", "dec", "s"]
    write_deltalake(path, t.slice(0, 12), partition_by=parts)
    write_deltalake(path, t.slice(12), partition_by=parts, mode="append")
    reference = DeltaTable(path).to_pyarrow_table()
    m = row_groups(path)
    for c in parts:  # the batches' type is the log's, not text
        assert m.schema.field(c).type == reference.schema.field(c).type
    got = over_layout(path, tmp_path / "cache", world=2, workers=2)
    assert multiset(got) == multiset(reference.to_pylist())
    again = resumed(path, tmp_path / "cache", 2)
    assert multiset(again) == multiset(reference.to_pylist())


def test_a_partition_type_without_a_text_form_fails_at_freeze_naming_it() -> None:
    with pytest.raises(UnsupportedTable, match="partition column 'blob'") as info:
        as_text(pa.array([b"\xff\x00"]), pa.binary(), "blob", "main.ml.t")
    assert info.value.exit_code == 2


# -- column mapping -------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_reads_physical_columns_under_logical_names(tmp_path: Path,
                                                                   mode: str) -> None:
    from deltalake import DeltaTable, QueryBuilder, write_deltalake

    n = 30
    t = pa.table({
        "id": pa.array(range(n), pa.int64()),
        "p": pa.array(["x y", "z"] * (n // 2)),
        "st": pa.array([{"u": i, "v": f"v{i}" if i % 4 else None} for i in range(n)]),
        "ls": pa.array([[{"w": i}, {"w": -i}] if i % 3 else None for i in range(n)]),
        "mp": pa.array([[(f"k{i}", {"q": i})] if i % 2 else None for i in range(n)],
                       pa.map_(pa.string(), pa.struct([("q", pa.int64())]))),
    })
    path = str(tmp_path / mode)
    write_deltalake(path, t.slice(0, 17), partition_by=["p"],
                    configuration={"delta.columnMapping.mode": mode})
    write_deltalake(path, t.slice(17), mode="append")
    m = row_groups(path)
    assert m.schema.names == ["id", "p", "st", "ls", "mp"]
    assert all(leaf.split(".")[0] in m.schema.names for ls in m.leaves for leaf in ls)
    kernel = kernel_rows(path)
    engine = pa.table(QueryBuilder().register("t", DeltaTable(path))
                      .execute("select * from t").read_all()).to_pylist()
    assert multiset(kernel) == multiset(engine) == multiset(t.to_pylist())
    got = over_layout(path, tmp_path / "cache", world=2, workers=2)
    assert multiset(got) == multiset(kernel)
    # columns= takes logical names; only their chunks are read
    some = over_layout(path, tmp_path / "cache", world=1, workers=0, columns=["st", "id"])
    assert multiset(some) == multiset([{"st": r["st"], "id": r["id"]} for r in kernel])
    assert multiset(resumed(path, tmp_path / "cache", 2)) == multiset(kernel)


# -- deletion vectors -----------------------------------------------------------------

def dv_table(root: Path) -> DvTable:
    """Four files (8-row row groups) whose vectors cover every storage kind:
    inline, UUID-relative with a folder prefix (two vectors in one file),
    absolute (inside the table: one elsewhere is refused); and a file whose
    vector is replaced in a later commit (the newest ``add`` wins) and one
    that deletes a whole row group."""
    t = DvTable(str(root / "dv"))
    t.data("a.parquet", 0, 20, 8)
    t.data("b.parquet", 100, 20, 8)
    t.data("c.parquet", 200, 20, 8)
    t.data("d.parquet", 300, 20, 8)
    t.add("a.parquet", t.vector([0, 7, 8, 19], "i"))
    t.add("b.parquet", t.vector([3, 4, 5], "u", prefix="q1", before=[1, 2]))
    t.add("c.parquet", t.vector([*range(8, 16), 17], "p", where=os.path.join(t.root, "abs")))
    t.add("d.parquet", None)
    t.commit()
    first = t.vector([2], "i")
    t.add("d.parquet", first)
    t.remove("d.parquet", None)
    t.commit()
    t.remove("d.parquet", first)
    t.add("d.parquet", t.vector([2, 9, 10], "u"))
    t.commit()
    return t


def _live_ids(t: DvTable) -> list[int]:
    gone = {"a.parquet": {0, 7, 8, 19}, "b.parquet": {3, 4, 5},
            "c.parquet": set(range(8, 16)) | {17}, "d.parquet": {2, 9, 10}}
    return sorted(i for name, ids in t.ids.items()
                  for k, i in enumerate(ids) if k not in gone[name])


def test_deletion_vectors_leave_only_live_rows(tmp_path: Path) -> None:
    from deltalake import DeltaTable

    t = dv_table(tmp_path)
    kernel = kernel_rows(t.root)
    assert sorted(r["id"] for r in kernel) == _live_ids(t)  # the fixture is what Delta reads
    m = row_groups(t.root)
    # counts per row group from the vectors, no data read: deltalake's
    # selection vectors (a second reader) give the same counts
    keep = {os.path.basename(f): v for f, v in
            zip(*pa.table(DeltaTable(t.root).deletion_vectors()).to_pydict().values(),
                strict=True)}
    expected = []
    for entry in m.files:
        mask = keep[entry.path] + [True] * (20 - len(keep[entry.path]))
        expected += [sum(mask[g * 8:(g + 1) * 8]) for g in range(3)]
    assert m.rows_per_group.tolist() == expected
    assert 0 in expected  # c's second row group is all deleted
    assert m.rows == len(kernel)
    got = over_layout(t.root, tmp_path / "cache", world=2, workers=2, batch_rows=3)
    assert multiset(got) == multiset(kernel)
    assert multiset(resumed(t.root, tmp_path / "cache", 3)) == multiset(kernel)
    assert multiset(resumed(t.root, tmp_path / "cache", 4, then=0)) == multiset(kernel)


@pytest.mark.parametrize("kind", ["classic", "multi-part", "v2"])
def test_deletion_vectors_come_from_a_checkpoint_after_log_cleanup(tmp_path: Path,
                                                                   kind: str) -> None:
    from deltalake import DeltaTable

    t = dv_table(tmp_path)
    DeltaTable(t.root).create_checkpoint()
    log = Path(t.root) / "_delta_log"
    if kind != "classic":
        recheckpoint(log, 2, kind)
    for name in os.listdir(log):
        if name.endswith(".json") and ".checkpoint." not in name:
            os.remove(log / name)  # metadata cleanup: the checkpoint alone
    kernel = kernel_rows(t.root)
    assert sorted(r["id"] for r in kernel) == _live_ids(t)
    got = over_layout(t.root, tmp_path / "cache", world=1, workers=2)
    assert multiset(got) == multiset(kernel)


def test_a_damaged_or_vacuumed_deletion_vector_is_one_error_at_freeze(tmp_path: Path) -> None:
    t = dv_table(tmp_path)
    dvfile = next(os.path.join(d, f) for d, _, fs in os.walk(os.path.join(t.root, "q1"))
                  for f in fs)
    with open(dvfile, "rb") as f:
        data = bytearray(f.read())
    data[-6] ^= 0xFF  # a bitmap byte of the second vector: its checksum fails
    with open(dvfile, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(UnreadableDeltaLog, match="checksum") as info:
        TableDataset(t.root, cache_dir=str(tmp_path / "c")).freeze()
    assert info.value.exit_code == 2 and info.value.hint
    os.remove(dvfile)
    with pytest.raises(MissingDataFiles, match=r"deletion vector of b\.parquet is missing"):
        row_groups(t.root)


def test_a_vacuumed_data_file_and_a_damaged_log_are_named(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3]}))
    data = next(f for f in os.listdir(path) if f.endswith(".parquet"))
    os.remove(os.path.join(path, data))
    with pytest.raises(MissingDataFiles, match="missing") as missing:
        row_groups(path)
    assert "vacuumed" in missing.value.hint and missing.value.exit_code == 2
    with open(os.path.join(path, "_delta_log", f"{0:020d}.json"), "a") as f:
        f.write("{not json\n")
    with pytest.raises(UnreadableDeltaLog, match="cannot read the log") as bad:
        row_groups(path)
    assert bad.value.hint and bad.value.exit_code == 2


def test_time_travel_reads_each_version_s_vectors(tmp_path: Path) -> None:
    t = dv_table(tmp_path)
    first = row_groups(t.root, version=0)  # d had no vector yet
    ids = sorted(r["id"] for b in TableDataset(t.root, version=0, columns=["id"],
                                               cache_dir=str(tmp_path / "c"))
                 for r in b.to_pylist())
    assert ids == sorted([*_live_ids(t), 302, 309, 310])
    assert first.rows == len(ids) and first.table_version == 0
    assert row_groups(t.root, version=1).rows == len(ids) - 1  # d's first vector: row 2


def test_the_cli_plans_live_rows_and_names_a_damaged_vector(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from ucstage.cli import cli

    t = dv_table(tmp_path)

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["shard-plan", t.root, "--unit", "row-group",
                                        "-w", "1", "-k", "2", *args], catch_exceptions=False)

    plan = json.loads(run("--json").stdout)
    assert plan["rows"] == len(kernel_rows(t.root))
    log = os.path.join(t.root, "_delta_log", f"{0:020d}.json")
    with open(log) as f:
        text = f.read()
    with open(log, "w") as f:  # the vector's cardinality no longer matches its bitmap
        f.write(text.replace('"cardinality": 4', '"cardinality": 5', 1))
    bad = run()
    assert bad.exit_code == 2, bad.output
    assert "deletion vector of a.parquet" in bad.output and "Traceback" not in bad.output
    assert bad.output.count("error:") == 1


def test_id_mapping_refuses_a_file_without_field_ids(tmp_path: Path) -> None:
    """In ``id`` mode columns are matched by field id: a file that has none
    would read as all nulls, so it is refused at freeze, naming the file."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake

    path = tmp_path / "id"
    write_deltalake(str(path), pa.table({"id": [1, 2, 3]}),
                    configuration={"delta.columnMapping.mode": "id"})
    data = next(p for p in path.rglob("*.parquet"))
    stored = pq.read_table(data)
    plain = pa.schema([pa.field(f.name, f.type) for f in stored.schema])  # no field ids
    pq.write_table(stored.cast(plain), data)
    with pytest.raises(UnsupportedTable, match="no Parquet field ids") as info:
        TableDataset(str(path), cache_dir=str(tmp_path / "c")).freeze()
    assert data.name in str(info.value)


def test_deletion_vectors_on_a_column_mapped_partitioned_table(tmp_path: Path) -> None:
    """Both features at once, as new tables on the platform have them: a
    deltalake-written column-mapped table, then a commit (by the protocol)
    that turns deletion vectors on and deletes rows of one file."""
    import json

    from deltalake import write_deltalake

    from tests.common.deltadv import bitmap, z85

    path = tmp_path / "both"
    t = pa.table({"id": pa.array(range(40), pa.int64()), "p": ["a", "b"] * 20,
                  "st": pa.array([{"u": i} for i in range(40)])})
    write_deltalake(str(path), t, partition_by=["p"],
                    configuration={"delta.columnMapping.mode": "name"})
    log = path / "_delta_log"
    adds = [a["add"] for a in map(json.loads, (log / f"{0:020d}.json").read_text()
                                  .splitlines()) if "add" in a]
    target = adds[0]
    data = bitmap([0, 3, 4, 19])
    vector = {"storageType": "i", "pathOrInlineDv": z85(data), "sizeInBytes": len(data),
              "cardinality": 4}
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["columnMapping", "deletionVectors"],
                      "writerFeatures": ["columnMapping", "deletionVectors"]}},
        {"remove": {"path": target["path"], "deletionTimestamp": 1, "dataChange": True}},
        {"add": {**target, "deletionVector": vector}},
    ]
    (log / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))
    kernel = kernel_rows(str(path))
    assert len(kernel) == 36
    got = over_layout(str(path), tmp_path / "cache", world=2, workers=1, batch_rows=7)
    assert multiset(got) == multiset(kernel)


def test_a_vector_is_checked_against_its_descriptor() -> None:
    """Inline vectors with a wrong magic, a wrong size or a bad base85 text,
    and storage kinds outside the protocol, are each one typed error."""
    import struct

    from pyroaring import BitMap64

    from tests.common.deltadv import bitmap, z85
    from ucstage.tables.deletion import deleted, resolve
    from ucstage.tables.logpaths import TableFolder

    good = bitmap([1, 2])
    t = TableFolder("/t", "t")
    assert list(deleted(resolve(t, {"storageType": "i", "pathOrInlineDv": z85(good),
                                    "sizeInBytes": len(good), "cardinality": 2}),
                        "f.parquet")) == [1, 2]
    wrong_magic = struct.pack("<I", 7) + BitMap64([1]).serialize()
    cases = [
        ({"pathOrInlineDv": z85(wrong_magic), "sizeInBytes": len(wrong_magic),
          "cardinality": 1}, "magic"),
        ({"pathOrInlineDv": z85(good), "sizeInBytes": len(good) + 8, "cardinality": 2},
         "inline bytes"),
        ({"pathOrInlineDv": "~~~~~", "sizeInBytes": 4, "cardinality": 1}, "base85"),
    ]
    for fields, message in cases:
        with pytest.raises(UnreadableDeltaLog, match=message):
            deleted(resolve(t, {"storageType": "i", **fields}), "f.parquet")
    with pytest.raises(UnsupportedTable, match="storage type 'x'"):
        resolve(t, {"storageType": "x", "pathOrInlineDv": "", "sizeInBytes": 1,
                    "cardinality": 1})
    with pytest.raises(UnsupportedTable, match="not on a local"):
        resolve(t, {"storageType": "p", "pathOrInlineDv": "s3://b/dv.bin", "offset": 1,
                    "sizeInBytes": 1, "cardinality": 1})


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_equal_length_counts_live_rows(tmp_path: Path, mode: str) -> None:
    """``equal_length`` over a table with deletion vectors (one row group all
    deleted): every slot yields the same count of full batches of live rows,
    and the audit finds what the mode plans (drop's gaps, pad's none)."""
    t = dv_table(tmp_path)
    live = len(_live_ids(t))
    ds = TableDataset(t.root, batch_rows=4, equal_length=mode, shuffle=True, seed=2,
                      shuffle_window=2, columns=["id"], cache_dir=str(tmp_path / "c"))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    batches = [b.column("id").to_pylist() for b in loader]
    assert len(batches) == len(loader) and all(len(b) == 4 for b in batches)
    ids = [i for b in batches for i in b]
    if mode == "drop":
        assert len(set(ids)) == len(ids) and len(ids) <= live
    else:
        assert set(ids) == set(_live_ids(t))
    audit = loader.audits[-1]
    assert audit.coverage_ok and audit.gaps == audit.expected_gaps and audit.duplicates == 0


# -- a Delta table named by its /Volumes path ---------------------------------------

def test_a_delta_table_under_volumes_reads_its_live_files_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table named by its /Volumes path (the platform's FUSE mount, here the
    mapping to a folder) is read through its log: the files an overwrite
    removed stay in the folder, and a Parquet-folder read would bring their
    rows back."""
    from deltalake import write_deltalake

    root = tmp_path / "vol"
    folder = root / "main" / "ml" / "tables" / "events"
    write_deltalake(str(folder), pa.table({"id": pa.array(range(10), pa.int64())}))
    write_deltalake(str(folder), pa.table({"id": pa.array(range(100, 104), pa.int64())}),
                    mode="overwrite")
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(root))
    m = row_groups("/Volumes/main/ml/tables/events")
    assert (m.kind, m.table_version, m.rows) == ("delta", 1, 4)
    got = [r["id"] for b in TableDataset("/Volumes/main/ml/tables/events",
                                         cache_dir=str(tmp_path / "c"))
           for r in b.to_pylist()]
    assert sorted(got) == [100, 101, 102, 103]
    old = [r["id"] for b in TableDataset("/Volumes/main/ml/tables/events", version=0,
                                         cache_dir=str(tmp_path / "c"))
           for r in b.to_pylist()]
    assert sorted(old) == list(range(10))
