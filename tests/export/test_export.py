"""ucstage.export against real parts: delta-rs tables and Spark Connect servers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.common.deltaedit import ESCAPES, INSIDE, two_commit_table
from tests.common.parts import free_port, in_lock_wait, require, tmpfs, wait_until
from tests.common.spark import (
    Warehouse,
    connect_script_server,
    events_table,
    exported_table,
    odd_table,
    read_delta,
    rows,
)
from ucstage.errors import (
    ExportError,
    InvalidArgument,
    SparkUnavailable,
    TableNotFound,
    UnsafePath,
)
from ucstage.export import export_table, read_record, read_table
from ucstage.export.options import suggest_files
from ucstage.progress import NO_PROGRESS, Callback
from ucstage.tables.names import TableName, is_table_path, local_table_path, parse_table_name
from ucstage.tables.record import RECORD_NAME, ExportRecord

pytestmark = pytest.mark.spark


def test_a_volumes_table_path_goes_through_the_mapping(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A /Volumes TABLE is exported from where /Volumes lives: the folder
    $UCSTAGE_VOLUMES_ROOT maps it to, else the literal path (the FUSE mount)."""
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path))
    want = str(tmp_path / "main" / "ml" / "t")
    assert local_table_path("/Volumes/main/ml/t") == want
    assert local_table_path("dbfs:/Volumes/main/ml/t") == want
    monkeypatch.delenv("UCSTAGE_VOLUMES_ROOT")
    assert local_table_path("/Volumes/main/ml/t") == "/Volumes/main/ml/t"


# -- no Spark needed ------------------------------------------------------------

@pytest.mark.parametrize(("name", "parts"), [
    ("main.ml.events", ("main", "ml", "events")),
    ("main.`odd-schema`.`weird table`", ("main", "odd-schema", "weird table")),
    ("`a``b`.c.d", ("a`b", "c", "d")),
    ("_x.y1.Z_2", ("_x", "y1", "Z_2")),
])
def test_valid_table_names(name: str, parts: tuple[str, str, str]) -> None:
    parsed = parse_table_name(name)
    assert parsed.parts == parts
    assert parse_table_name(parsed.quoted()) == parsed
    assert parse_table_name(str(parsed)) == parsed


@pytest.mark.parametrize("name", [
    "a.b", "a.b.c.d", "a..b", "a.b.", ".a.b", "1a.b.c", "a.b.c; DROP TABLE x",
    "a.b.`c", "a.b.``", "a.`x/y`.c", "a.`..`.c", "a.b.c--", "a b.c.d", "a.b.c)",
    "main.ml.events' OR '1'='1",
])
def test_bad_table_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument, match="invalid table name"):
        parse_table_name(name)


def test_paths_and_names_are_told_apart() -> None:
    assert is_table_path("./events") and is_table_path("/data/t") and is_table_path("file:///t")
    assert not is_table_path("main.`a/b`.c")
    assert not is_table_path("main.ml.events")
    assert TableName("a", "b`c", "d").quoted() == "`a`.`b``c`.`d`"


def test_bad_names_never_reach_spark(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")  # nothing listens
    with pytest.raises(InvalidArgument, match="invalid table name"):
        export_table("main.ml.x; DROP TABLE y", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_object_store_and_glob_dests_are_refused(tmp_path: Any, warehouse: Warehouse) -> None:
    with pytest.raises(InvalidArgument, match="local or mounted"):
        export_table("main.ml.events", "memory://bucket/events")
    with pytest.raises(InvalidArgument, match="glob"):
        export_table("main.ml.events", str(tmp_path / "out[1]"))


def test_option_conflicts_are_refused(tmp_path: Any, warehouse: Warehouse) -> None:
    dest = str(tmp_path / "out")
    with pytest.raises(InvalidArgument, match="exclude each other"):
        export_table("main.ml.events", dest, files=2, max_records_per_file=10)
    with pytest.raises(InvalidArgument, match="cannot be combined with partition_by"):
        export_table("main.ml.events", dest, files=2, partition_by="label")
    with pytest.raises(InvalidArgument, match="compression"):
        export_table("main.ml.events", dest, compression="lz4")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"files": 0}, r"^files must be at least 1, got 0$"),
    ({"max_records_per_file": 0}, r"^max_records_per_file must be at least 1, got 0$"),
    ({"files": 2, "max_records_per_file": 10},
     r"^files and max_records_per_file exclude each other$"),
    ({"compression": "lz4"}, r"^compression must be one of zstd, snappy, none, got 'lz4'$"),
    ({"row_group_rows": 0}, r"^row_group_rows must be at least 1, got 0$"),
    ({"columns": []}, r"^columns is empty$"),
    ({"where": " "}, r"^where is empty$"),
    ({"files": 2, "partition_by": ["label"]},
     r"^files counts the files of one folder and cannot be combined with partition_by$"),
])
def test_library_errors_name_the_parameter_not_the_flag(
        tmp_path: Any, warehouse: Warehouse, kwargs: dict[str, Any], message: str) -> None:
    # The library speaks Python; the CLI's error mapper says these as its flags
    # (tests/test_cli_export.py checks that side).
    with pytest.raises(InvalidArgument, match=message) as info:
        export_table("main.ml.events", str(tmp_path / "out"), **kwargs)
    assert "--" not in info.value.message and "--" not in info.value.hint
    assert not os.listdir(tmp_path)


def test_partition_by_outside_columns_is_refused_before_spark(
        tmp_path: Any, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")  # nothing listens
    with pytest.raises(InvalidArgument, match=r"partition_by column\(s\) label not in the output"):
        export_table("main.ml.events", str(tmp_path / "out"), columns=["id"], partition_by="label")
    with pytest.raises(InvalidArgument, match="cannot use every column"):
        export_table("main.ml.events", str(tmp_path / "out"), columns=["ID"], partition_by="id")
    # The library takes no comma lists: a string is one column name.
    with pytest.raises(InvalidArgument, match=r"partition_by column\(s\) id,label not in"):
        export_table("main.ml.events", str(tmp_path / "out"), columns="id",
                     partition_by="id,label")
    assert not os.listdir(tmp_path)


def test_dest_that_cannot_be_made_is_refused_before_anything(
        tmp_path: Any, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")  # nothing listens
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for dest in (afile / "sub", afile / "sub" / "deeper"):
        with pytest.raises(InvalidArgument, match=f"{afile} is not a folder"):
            export_table("main.ml.events", str(dest))
    with pytest.raises(InvalidArgument, match="exists and is not a folder"):
        export_table("main.ml.events", str(afile))
    assert afile.read_text() == "mine" and os.listdir(tmp_path) == ["afile"]


def test_dest_in_a_read_only_folder_is_refused(tmp_path: Any, warehouse: Warehouse) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    # Root ignores permission bits, but not a read-only filesystem.
    with (tmpfs(str(ro), "ro,size=1m") if os.geteuid() == 0 else _read_only_bits(ro)):
        with pytest.raises(InvalidArgument, match="no write permission"):
            export_table("main.ml.events", str(ro / "sub" / "events"))
        assert os.listdir(ro) == []


@contextlib.contextmanager
def _read_only_bits(folder: Any) -> Any:
    folder.chmod(0o555)
    try:
        yield folder
    finally:
        folder.chmod(0o755)


def test_lock_excludes_a_waiter_that_locked_a_removed_file(tmp_path: Any) -> None:
    # A holds the lock; B waits on A's file; A finishes and removes that file;
    # C comes next and creates a new one. B must notice and wait for C.
    from ucstage.export.dest import dest_lock

    dest = str(tmp_path / "events")
    spans: dict[str, list[float]] = {}
    b_told = Descriptions()
    threads: dict[str, int] = {}

    def hold(name: str, seconds: float, callback: Callback = NO_PROGRESS) -> None:
        threads[name] = threading.get_native_id()
        with dest_lock(dest, callback):
            spans[name] = [time.monotonic()]
            time.sleep(seconds)
            spans[name].append(time.monotonic())

    b = threading.Thread(target=hold, args=("B", 0.5, b_told))
    with dest_lock(dest, NO_PROGRESS):
        b.start()
        wait_until(lambda: "B" in threads and in_lock_wait(threads["B"]),
                   "B blocked in flock on A's file")
    c = threading.Thread(target=hold, args=("C", 0.5))
    c.start()
    b.join(10)
    c.join(10)
    first, second = sorted(spans.values())
    assert first[1] <= second[0], spans
    assert os.listdir(tmp_path) == []  # no lock file left
    # The waiter was told why it waits, and the line was cleared once it got the lock.
    assert b_told.texts[0] == f"waiting for another export into {dest}"
    assert b_told.texts[-1] == ""


class Descriptions(Callback):
    """Records every description a job sets, in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def set_description(self, text: str) -> None:
        self.texts.append(text)


def test_no_java_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from ucstage.export.spark import EmbeddedServer

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(SparkUnavailable, match="no Java") as info:
        EmbeddedServer().start()
    assert "openjdk-17-jre-headless" in info.value.hint


@pytest.mark.timeout(60)
def test_unreachable_remote_fails_in_seconds() -> None:
    require(_spark_importable(), "pyspark is not installed")
    from ucstage.export.spark import get_session

    with pytest.raises(SparkUnavailable, match="cannot reach"):
        get_session(f"sc://127.0.0.1:{free_port()}")


def _spark_importable() -> bool:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return False
    return True


def test_suggest_files_is_a_multiple_of_the_slots() -> None:
    assert suggest_files(10, 2, 3) == 12
    assert suggest_files(12, 2, 3) == 12
    assert suggest_files(None, 2, 0) == 2  # num_workers=0: the main process reads
    assert suggest_files(5, 2, [2, 4]) == 6
    with pytest.raises(InvalidArgument, match="num_workers must be an int"):
        suggest_files(5, 2, "2,4")  # type: ignore[arg-type]  # comma lists are the CLI's


def test_a_column_mapped_warehouse_table_exports_by_name(spark_session: Any,
                                                         warehouse: Warehouse,
                                                         tmp_path: Any) -> None:
    # deltalake writes its files under physical column names: Spark reads
    # them under the logical ones (tests/export/test_export_delta_features.py
    # has renamed and dropped columns, id mode and deletion vectors).
    dest = str(tmp_path / "cm")
    result = export_table("main.ml.cm", dest)
    assert rows(exported_table(dest)) == rows(events_table(0, 10))
    assert result.row_count == 10 and result.record.table == "main.ml.cm"


def test_missing_table_in_the_warehouse(tmp_path: Any, warehouse: Warehouse) -> None:
    with pytest.raises(TableNotFound, match="no Delta log"):
        export_table("main.ml.nope", str(tmp_path / "x"))


@pytest.mark.parametrize("how", ESCAPES)
def test_an_add_outside_the_table_is_refused_before_spark(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Issue 39 item 4: a log naming a file outside the table (deltalake's
    log, edited) is refused by name; nothing listens at SPARK_REMOTE, so a
    refusal any later would be SparkUnavailable."""
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")  # nothing listens
    t = two_commit_table(tmp_path)
    logged = t.escape(how)
    with pytest.raises(UnsafePath, match="outside the table's folder") as info:
        export_table(t.root, str(tmp_path / "out"))
    assert f"the Delta log names data file {logged}" in info.value.message
    assert info.value.exit_code == 2
    assert not (tmp_path / "out").exists()


# -- through the session's embedded Spark Connect server -----------------------

def _listing(dest: str) -> dict[str, tuple[int, int]]:
    out = {}
    for folder, _dirs, names in os.walk(dest):
        for name in names:
            full = os.path.join(folder, name)
            st = os.stat(full)
            out[os.path.relpath(full, dest)] = (st.st_ino, st.st_mtime_ns)
    return out


def _no_leftovers(dest: str) -> None:
    parent, base = os.path.split(dest)
    assert [n for n in os.listdir(parent) if n.startswith(f".{base}.ucstage")] == []


def test_export_equals_the_delta_table(spark_session: Any, warehouse: Warehouse,
                                          tmp_path: Any) -> None:
    dest = str(tmp_path / "vol" / "events")
    result = export_table("main.ml.events", dest)
    expected = read_delta(warehouse.path("main.ml.events"))
    assert not result.skipped_unchanged
    assert result.row_count == expected.num_rows == 1600  # 2000 after overwrite+append, -20%
    assert rows(exported_table(dest)) == rows(expected)
    record = read_record(dest)
    assert record == result.record
    assert record is not None and record.delta_version == 4
    assert record.table == "main.ml.events"
    assert [f["name"] for f in record.schema["fields"]] == ["id", "text", "score", "label"]
    assert sum(f["rows"] for f in record.files) == 1600
    listed = sorted(n for n in os.listdir(dest) if n.endswith(".parquet"))
    assert [f["path"] for f in record.files] == listed
    assert sorted(os.listdir(dest)) == sorted([*listed, RECORD_NAME])  # no _SUCCESS, .crc
    _no_leftovers(dest)


_RECORD_KEYS = ["format", "table", "source", "delta_version", "row_count", "schema", "files",
                "bytes", "options", "created_at", "ucstage_version"]


def test_record_is_read_back_as_an_export_record(spark_session: Any, warehouse: Warehouse,
                                                 tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    result = export_table("main.ml.events", dest, files=2, where="id >= 0")
    record = read_record(dest)
    assert isinstance(record, ExportRecord) and record == result.record
    assert (record.source_kind, record.source_location) == (
        "delta", warehouse.path("main.ml.events"))
    assert record.options["files"] == 2 and record.row_count == 1600
    assert record.bytes == sum(f["bytes"] for f in record.files)
    # The file is the documented JSON: keys in order, two-space indent, one newline.
    with open(os.path.join(dest, RECORD_NAME), encoding="utf-8") as f:
        text = f.read()
    assert text == record.dumps() and text.endswith("}\n") and not text.endswith("\n\n")
    assert text.startswith('{\n  "format": "ucstage-export/1",\n  "table": "main.ml.events",')
    on_disk = json.loads(text)
    assert list(on_disk) == _RECORD_KEYS
    assert on_disk == record.to_json() and ExportRecord.from_json(on_disk) == record
    assert list(on_disk["files"][0]) == ["path", "bytes", "rows"]
    # The JSON document is the record plus what the call did.
    doc = result.to_json(world_size=2, num_workers=[1, 2])
    assert list(doc) == [*_RECORD_KEYS, "skipped_unchanged", "seconds", "dest", "warnings",
                         "row_groups", "suggested_files", "row_group_slots"]
    assert doc["warnings"] == []
    assert doc["dest"] == dest and doc["suggested_files"] == 3
    assert "suggested_files" not in result.to_json()
    # Anything that is not this format's record reads as no record.
    with open(os.path.join(dest, RECORD_NAME), "w", encoding="utf-8") as f:
        json.dump({**on_disk, "format": "ucstage-export/0"}, f)
    assert read_record(dest) is None
    with open(os.path.join(dest, RECORD_NAME), "w", encoding="utf-8") as f:
        json.dump({**on_disk, "row_count": "1600"}, f)
    assert read_record(dest) is None
    assert read_record(str(tmp_path / "nothing-here")) is None


def test_progress_callback_hears_each_step(spark_session: Any, warehouse: Warehouse,
                                           tmp_path: Any) -> None:
    told = Descriptions()
    dest = str(tmp_path / "events")
    export_table("main.ml.events", dest, where="id >= 0", callback=told)
    assert told.texts == ["counting the source rows", "writing 1,600 rows",
                          "verifying the written files", ""]
    again = Descriptions()
    assert export_table("main.ml.events", dest, where="id >= 0", callback=again).skipped_unchanged
    assert again.texts == []  # nothing slow happened


def test_odd_names_and_types_round_trip(spark_session: Any, warehouse: Warehouse,
                                        tmp_path: Any) -> None:
    dest = str(tmp_path / "odd")
    result = export_table("main.`odd-schema`.`weird table`", dest)
    got = exported_table(dest)
    want = odd_table()
    assert got.schema.names == want.schema.names
    for name in want.schema.names:
        # Spark names a Parquet list's items "element", pyarrow "item".
        got_type = str(got.schema.field(name).type).replace("element:", "item:")
        assert got_type == str(want.schema.field(name).type), name
    assert rows(got) == rows(want)
    assert result.record.table == "main.`odd-schema`.`weird table`"


def test_partitioned_table_keeps_partition_columns(spark_session: Any, warehouse: Warehouse,
                                                    tmp_path: Any) -> None:
    expected = read_delta(warehouse.path("main.ml.parted"))
    flat = str(tmp_path / "flat")
    export_table("main.ml.parted", flat)
    got = exported_table(flat)
    assert got.schema.field("year").type == expected.schema.field("year").type  # int32, not str
    assert rows(got) == rows(expected)
    assert {r["region"] for r in got.to_pylist()} == {"eu west", "us/east", "ap%south", None}

    by_year = str(tmp_path / "by_year")
    result = export_table("main.ml.parted", by_year, partition_by=["year"])
    assert {f["path"].split("/")[0] for f in result.files} == {"year=2020", "year=2021",
                                                               "year=2022"}
    # The row groups are found in the COL=value/ folders too, file by file.
    assert [sum(g) for g in result.row_groups] == [f["rows"] for f in result.files]
    again = exported_table(by_year, partitioned=True)
    assert sorted(again.column("id").to_pylist()) == sorted(expected.column("id").to_pylist())


def test_loads_with_datasets_and_pyarrow(spark_session: Any, warehouse: Warehouse,
                                         tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    import pyarrow.dataset as ds

    dest = str(tmp_path / "events")
    export_table("main.ml.events", dest, files=3)
    loaded = datasets.load_dataset("parquet", data_files=dest + "/*.parquet", split="train",
                                   cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 1600
    assert sorted(loaded["id"]) == sorted(read_delta(
        warehouse.path("main.ml.events")).column("id").to_pylist())
    assert ds.dataset(dest, format="parquet").count_rows() == 1600


def test_options_shape_the_output(spark_session: Any, warehouse: Warehouse,
                                  tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    dest = str(tmp_path / "shaped")
    result = export_table("main.ml.events", dest, columns=["label", "id"], where="id >= 5500",
                          files=4, compression="snappy")
    expected = [r for r in rows(read_delta(warehouse.path("main.ml.events")))
                if r["id"] >= 5500]
    assert len(result.files) == 4
    got = exported_table(dest)
    assert got.schema.names == ["label", "id"]
    assert rows(got) == [{"label": r["label"], "id": r["id"]} for r in expected]
    for f in result.files:
        meta = pq.ParquetFile(os.path.join(dest, f["path"])).metadata
        assert meta.row_group(0).column(0).compression == "SNAPPY"
    assert result.record.options["where"] == "id >= 5500"

    capped = export_table("main.ml.events", str(tmp_path / "capped"), max_records_per_file=250,
                          compression="none")
    assert all(f["rows"] <= 250 for f in capped.files)
    assert sum(f["rows"] for f in capped.files) == 1600
    assert len(capped.files) >= 7


def test_rerun_does_no_work_and_force_reexports(spark_session: Any, warehouse: Warehouse,
                                                tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    dest = str(tmp_path / "events")
    first = export_table("main.ml.events", dest, files=2)
    before = _listing(dest)
    # Skipping needs no Spark at all: point it at a port where nothing listens.
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    again = export_table("main.ml.events", dest, files=2)
    assert again.skipped_unchanged
    assert again.record == first.record
    assert _listing(dest) == before
    monkeypatch.delenv("SPARK_REMOTE")

    other = export_table("main.ml.events", dest, files=3)  # options changed
    assert not other.skipped_unchanged and len(other.files) == 3
    forced = export_table("main.ml.events", dest, files=3, force=True)
    assert not forced.skipped_unchanged
    assert {f["path"] for f in forced.files}.isdisjoint(f["path"] for f in other.files)
    assert sorted(n for n in os.listdir(dest) if n.endswith(".parquet")) == \
        sorted(f["path"] for f in forced.files)
    _no_leftovers(dest)


def test_row_group_rows_caps_each_row_group(spark_session: Any, warehouse: Warehouse,
                                           tmp_path: Any) -> None:
    import pyarrow.parquet as pq

    dest = str(tmp_path / "grouped")
    result = export_table("main.ml.events", dest, files=2, row_group_rows=300)
    assert result.record.options["row_group_rows"] == 300
    footers = [pq.ParquetFile(os.path.join(dest, f["path"])).metadata for f in result.files]
    held = [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in footers]
    assert result.row_groups == held
    # An upper bound that the writer reaches: full groups, then each file's rest.
    for f, groups in zip(result.files, held, strict=True):
        assert sum(groups) == f["rows"] and max(groups) <= 300
        assert len(groups) == -(-f["rows"] // 300)
    assert result.to_json()["row_groups"] == {
        "count": sum(map(len, held)), "rows_min": min(map(min, held)), "rows_max": 300,
        "per_file": [len(g) for g in held]}
    slots = result.to_json(world_size=2, num_workers=2)["row_group_slots"]
    assert slots["slots"] == 4 and slots["filled"] == 4
    assert sum(map(len, held)) >= 6 and slots["rows"][1] <= 2 * 300

    # Without the option Spark writes one group per file here (its byte limit is 128 MiB).
    plain = export_table("main.ml.events", str(tmp_path / "plain"), files=2)
    assert plain.row_groups == [[f["rows"]] for f in plain.files]
    assert plain.record.options["row_group_rows"] is None
    # A record written before the option existed still matches an export without it.
    path = os.path.join(tmp_path, "plain", RECORD_NAME)
    with open(path, encoding="utf-8") as f:
        old = json.load(f)
    del old["options"]["row_group_rows"]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(old, f)
    again = export_table("main.ml.events", str(tmp_path / "plain"), files=2)
    assert again.skipped_unchanged and again.row_groups == plain.row_groups
    assert not export_table("main.ml.events", dest, files=2, row_group_rows=400
                            ).skipped_unchanged


@pytest.mark.parametrize("how", INSIDE)
def test_absolute_paths_inside_the_table_are_exported(spark_session: Any, tmp_path: Any,
                                                      how: str) -> None:
    t = two_commit_table(tmp_path)
    t.inside(how)
    dest = str(tmp_path / "out")
    assert export_table(t.root, dest).row_count == 20
    assert sorted(exported_table(dest).column("id").to_pylist()) == list(range(20))


def test_a_live_server_is_never_handed_a_file_outside(spark_session: Any,
                                                       tmp_path: Any) -> None:
    t = two_commit_table(tmp_path)
    t.escape("link-out")
    with pytest.raises(UnsafePath, match=r"data file link\.parquet, which resolves to"):
        export_table(t.root, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_new_table_version_is_exported(spark_session: Any, tmp_path: Any) -> None:
    from deltalake import write_deltalake

    table = str(tmp_path / "t")
    write_deltalake(table, events_table(0, 100))
    dest = str(tmp_path / "out")
    assert export_table(table, dest).row_count == 100
    assert export_table(table, dest).skipped_unchanged
    write_deltalake(table, events_table(100, 50), mode="append")
    result = export_table(table, dest)
    assert not result.skipped_unchanged
    assert result.row_count == 150 and result.record.delta_version == 1


def test_tampered_export_is_redone(spark_session: Any, warehouse: Warehouse,
                                   tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    first = export_table("main.ml.events", dest)
    os.unlink(os.path.join(dest, first.files[0]["path"]))
    result = export_table("main.ml.events", dest)
    assert not result.skipped_unchanged
    assert exported_table(dest).num_rows == 1600


def test_bad_where_keeps_the_previous_export(spark_session: Any, warehouse: Warehouse,
                                             tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    export_table("main.ml.events", dest)
    before = _listing(dest)
    for where in ("id >", "no_such_column = 1"):
        with pytest.raises(InvalidArgument, match=r"^where was refused by Spark"):
            export_table("main.ml.events", dest, where=where)
    with pytest.raises(InvalidArgument, match=r"^columns was refused by Spark"):
        export_table("main.ml.events", dest, columns=["id", "nope"])
    # With both given, the message still names the one Spark refused.
    with pytest.raises(InvalidArgument, match=r"^where was refused by Spark"):
        export_table("main.ml.events", dest, columns=["id"], where="nope > 1")
    with pytest.raises(InvalidArgument, match=r"^columns was refused by Spark"):
        export_table("main.ml.events", dest, columns=["id", "nope"], where="id > 1")
    assert _listing(dest) == before
    _no_leftovers(dest)
    # A refused export into a new DEST leaves no folders, lock or staging behind.
    with pytest.raises(InvalidArgument, match="was refused by Spark"):
        export_table("main.ml.events", str(tmp_path / "new" / "deep" / "events"), where="id >")
    assert not (tmp_path / "new").exists()


def test_too_many_files_fails_and_keeps_the_previous_export(
        spark_session: Any, tmp_path: Any) -> None:
    from deltalake import write_deltalake

    table = str(tmp_path / "tiny")
    write_deltalake(table, events_table(0, 3))
    dest = str(tmp_path / "out")
    export_table(table, dest)
    before = _listing(dest)
    with pytest.raises(ExportError, match="not the 8 asked for"):
        export_table(table, dest, files=8)
    assert _listing(dest) == before
    _no_leftovers(dest)


def test_table_path_with_glob_characters(spark_session: Any, tmp_path: Any) -> None:
    # Hadoop globs * ? { } [ ] in input paths; ucstage escapes them. (delta-rs
    # itself cannot create a table under a folder name with [ ].)
    from deltalake import write_deltalake

    table = str(tmp_path / "we*ird {1}?" / "t")
    write_deltalake(table, events_table(0, 30))
    dest = str(tmp_path / "out")
    assert export_table(table, dest).row_count == 30
    assert rows(exported_table(dest)) == rows(events_table(0, 30))


def test_catalog_name_without_warehouse(spark_session: Any, tmp_path: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UCSTAGE_WAREHOUSE", raising=False)
    with pytest.raises(TableNotFound, match="not found by the Spark server") as info:
        export_table("main.ml.events", str(tmp_path / "x"))
    assert "UCSTAGE_WAREHOUSE" in info.value.hint


def test_read_table(spark_session: Any, warehouse: Warehouse) -> None:
    table = read_table("main.ml.events")
    assert rows(table) == rows(read_delta(warehouse.path("main.ml.events")))
    assert read_table("main.ml.events", limit=5).num_rows == 5


def test_volume_dest_through_volumes_root(spark_session: Any, warehouse: Warehouse,
                                          tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path / "volumes"))
    result = export_table("main.ml.events", "/Volumes/main/ml/train/events")
    assert result.dest == str(tmp_path / "volumes" / "main" / "ml" / "train" / "events")
    assert exported_table(result.dest).num_rows == 1600


# -- failures while writing ----------------------------------------------------

@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_server_killed_mid_write_keeps_the_previous_export(spark_session: Any, big_table: str,
                                                           tmp_path: Any) -> None:
    from ucstage.export.spark import EmbeddedServer

    table = big_table
    dest = str(tmp_path / "vol" / "big")
    export_table(table, dest)  # the previous export, through the shared server
    before = _listing(dest)

    told = Descriptions()
    server = EmbeddedServer(log_dir=str(tmp_path / "victim")).start(callback=told)
    assert server.proc is not None
    assert told.texts[0].startswith("starting the embedded Spark Connect server on 127.0.0.1:")
    assert told.texts[1:] == [""]
    pid = server.proc.pid
    parent = os.path.dirname(dest)
    killed = threading.Event()

    def writing() -> bool:
        return any(os.path.isdir(os.path.join(parent, n, "_temporary"))
                   for n in os.listdir(parent) if ".ucstage-staging-" in n)

    def kill_when_writing() -> None:
        # The server is stopped (SIGSTOP) while the folder is looked at, so
        # what is seen is where it stands when killed, and it runs only
        # between looks: under load the write cannot slip past unseen.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            os.kill(pid, signal.SIGSTOP)
            try:
                if writing():
                    os.kill(pid, signal.SIGKILL)
                    killed.set()
                    return
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.005)

    killer = threading.Thread(target=kill_when_writing, daemon=True)
    killer.start()
    error: ExportError | None = None
    try:
        export_table(table, dest, remote=server.url, force=True, files=4)
    except ExportError as exc:
        error = exc
    finally:
        killer.join(5)
        server.stop()
    assert killed.is_set(), "the export finished before the server could be killed"
    assert error is not None and "server went away while writing" in str(error), error
    assert _listing(dest) == before
    assert exported_table(dest).num_rows == 3_000_000
    _no_leftovers(dest)


@pytest.fixture
def tiny_disk(tmp_path: Any) -> Any:
    """A 6 MiB tmpfs mounted for this test (needs root), unmounted afterwards."""
    if os.geteuid() != 0:
        require(False, "mounting a tmpfs needs root")
    with tmpfs(str(tmp_path / "tiny"), "size=6m") as mnt:
        yield mnt


def test_disk_full_keeps_the_previous_export(spark_session: Any, tmp_path: Any,
                                             tiny_disk: str) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    table = str(tmp_path / "blobs")
    rng = __import__("random").Random(7)

    def blobs(start: int, n: int) -> Any:
        return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                         "blob": [rng.randbytes(1000) for _ in range(n)]})

    write_deltalake(table, blobs(0, 2000))          # ~2 MB, incompressible
    dest = os.path.join(tiny_disk, "vol", "blobs")
    export_table(table, dest, compression="none")
    before = _listing(dest)
    write_deltalake(table, blobs(2000, 3000), mode="append")  # now ~5 MB: no room beside the old
    with pytest.raises(ExportError) as info:
        export_table(table, dest, compression="none")
    assert "no space left" in str(info.value)
    assert _listing(dest) == before
    record = read_record(dest)
    assert record is not None and record.row_count == 2000
    _no_leftovers(dest)


# -- a server the user runs: pyspark's sbin/start-connect-server.sh -------------

@pytest.mark.filterwarnings("ignore:.*RETRIES_EXCEEDED")
def test_remote_server_from_start_connect_script(spark_session: Any, warehouse: Warehouse,
                                                 tmp_path: Any) -> None:
    with connect_script_server(str(tmp_path / "remote")) as url:
        dest = str(tmp_path / "events")
        result = export_table("main.ml.events", dest, remote=url, files=2)
        assert rows(exported_table(dest)) == rows(read_delta(
            warehouse.path("main.ml.events")))
        assert len(result.files) == 2
        logs = os.listdir(tmp_path / "remote" / "logs")
        assert any("SparkConnectServer" in n for n in logs)
    with open(os.path.join(dest, RECORD_NAME)) as f:
        assert json.load(f)["row_count"] == 1600



def test_dest_that_is_not_an_export_is_not_replaced(spark_session: Any, warehouse: Warehouse,
                                                    tmp_path: Any) -> None:
    dest = tmp_path / "project"
    dest.mkdir()
    (dest / "notes.txt").write_text("mine")
    for force in (False, True):  # force replaces Parquet exports only
        with pytest.raises(InvalidArgument, match=r"is not a Parquet export: it holds 'notes\.txt'"):
            export_table("main.ml.events", str(dest), force=force)
    assert (dest / "notes.txt").read_text() == "mine"


def test_concurrent_exports_do_the_work_once(spark_session: Any, warehouse: Warehouse,
                                             tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    results: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(export_table("main.ml.events", dest))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == []
    assert sorted(r.skipped_unchanged for r in results) == [False, True]
    assert exported_table(dest).num_rows == 1600
    _no_leftovers(dest)


def test_catalog_table_through_spark_table(spark_session: Any, tmp_path: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Without $UCSTAGE_WAREHOUSE a name goes to the server's catalog. The
    # embedded server has no Delta, so a plain catalog table stands in: no
    # DESCRIBE HISTORY, hence no version, hence never skipped.
    monkeypatch.delenv("UCSTAGE_WAREHOUSE", raising=False)
    spark_session.sql("CREATE TABLE IF NOT EXISTS spark_catalog.default.ucstage_t "
                      "USING parquet AS SELECT id, id * 2 AS twice FROM range(25)")
    dest = str(tmp_path / "cat")
    first = export_table("spark_catalog.default.ucstage_t", dest, where="id < 20")
    assert (first.record.source_kind, first.record.source_location) == ("catalog", None)
    assert first.record.to_json()["source"] == {"kind": "catalog", "location": None}
    assert first.record.delta_version is None and first.row_count == 20
    assert rows(exported_table(dest)) == [{"id": i, "twice": 2 * i} for i in range(20)]
    assert not export_table("spark_catalog.default.ucstage_t", dest,
                            where="id < 20").skipped_unchanged


def test_where_selecting_no_rows_is_a_warning(spark_session: Any, warehouse: Warehouse,
                                              tmp_path: Any) -> None:
    dest = str(tmp_path / "none")
    result = export_table("main.ml.events", dest, where="id < 0")
    assert result.row_count == 0 and read_record(dest) is not None
    assert result.warnings == ["where selected 0 of the table's 1,600 rows ('id < 0'): the "
                               "export holds no rows"]
    assert result.to_json()["warnings"] == result.warnings
    assert export_table("main.ml.events", str(tmp_path / "all")).warnings == []
