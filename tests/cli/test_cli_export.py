"""``ucstage export`` through click, on the session's embedded Spark Connect server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.deltaedit import two_commit_table
from tests.common.parts import free_port
from tests.common.spark import Warehouse, exported_table
from ucstage.cli.app import cli

pytestmark = pytest.mark.spark


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)


def test_help_has_examples_and_every_option() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in ("Examples:", "--remote", "--columns", "--where", "--partition-by", "--files",
                 "--max-records-per-file", "--compression", "--row-group-rows", "--force",
                 "--json"):
        assert text in result.output


def test_cli_import_stays_light() -> None:
    code = ("import sys, ucstage.cli.app; "
            "print(sorted(m for m in ('pyspark', 'deltalake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_log_pointing_outside_the_table_exits_2_naming_it(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39 item 4, refused before Spark is asked: nothing listens at SPARK_REMOTE."""
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    t = two_commit_table(tmp_path)
    logged = t.escape("dotdot")
    human = run(t.root, str(tmp_path / "out"))
    assert human.exit_code == 2, human.output
    assert human.stderr.startswith("error: table ") and human.stderr.count("error:") == 1
    assert "Traceback" not in human.output
    doc = run(t.root, str(tmp_path / "out"), "--json")
    assert doc.exit_code == 2
    error = json.loads(doc.stdout)["error"]
    assert error["type"] == "UnsafePath" and error["exit_code"] == 2
    assert f"the Delta log names data file {logged}, which resolves to {t.secret}, outside " \
           f"the table's folder {t.root}" in error["message"]
    assert not (tmp_path / "out").exists()


def test_export_json_then_rerun_skips(spark_session: Any, warehouse: Warehouse,
                                      tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    first = run("main.ml.events", dest, "--files", "3", "--json")
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data["skipped_unchanged"] is False
    assert data["row_count"] == 1600 and data["delta_version"] == 4
    assert len(data["files"]) == 3 and isinstance(data["seconds"], float)
    assert data["options"]["files"] == 3
    assert exported_table(dest).num_rows == 1600

    again = run("main.ml.events", dest, "--files", "3", "--json")
    assert json.loads(again.stdout)["skipped_unchanged"] is True
    human = run("main.ml.events", dest, "--files", "3")
    assert human.exit_code == 0
    assert "unchanged" in human.output and "nothing to do" in human.output

    forced = run("main.ml.events", dest, "--files", "3", "--force")
    assert forced.exit_code == 0 and "exported main.ml.events" in forced.output
    _assert_summary_aligned(forced.output)
    _assert_summary_aligned(human.output)


def _assert_summary_aligned(output: str) -> None:
    starts = {}
    for line in output.splitlines():
        label = line.split(" ", 1)[0]
        if label in ("rows", "files", "columns", "options", "record"):
            starts[label] = len(line) - len(line[len(label):].lstrip(" "))
    assert set(starts) == {"rows", "files", "columns", "options", "record"}, output
    assert len(set(starts.values())) == 1, starts


def test_files_suggestion_uses_the_slot_rule(spark_session: Any, warehouse: Warehouse,
                                             tmp_path: Any) -> None:
    result = run("main.ml.events", str(tmp_path / "e"), "--files", "3", "-w", "2", "-k", "2",
                 "--json")
    assert json.loads(result.stdout)["suggested_files"] == 4
    human = run("main.ml.events", str(tmp_path / "e"), "--files", "3", "-w", "2", "-k", "2")
    assert "--files 4" in human.output
    # Issue 30 item 6: the files advice says it is about whole files, next to
    # the row groups' "fill N of N loader slots"; plurals agree.
    shown = " ".join(human.output.split())
    assert "! read as whole files (VolumeDataset), 3 files do not split evenly over 4 loader " \
           "slots (2 ranks x 2 workers)" in shown
    assert "TableDataset deals the row groups above" in shown
    fine = run("main.ml.events", str(tmp_path / "f"), "--files", "4", "-w", "2", "-k", "2")
    assert fine.exit_code == 0 and "--files 4" not in fine.output


def test_options_reach_the_library(spark_session: Any, warehouse: Warehouse,
                                   tmp_path: Any) -> None:
    dest = str(tmp_path / "p")
    result = run("main.ml.parted", dest, "--partition-by", "year", "--columns",
                 "id,year,region", "--where", "id < 100", "--compression", "snappy", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["options"] == {"columns": ["id", "year", "region"], "where": "id < 100",
                               "partition_by": ["year"], "files": None,
                               "max_records_per_file": None, "compression": "snappy",
                               "row_group_rows": None}
    assert all(f["path"].startswith("year=") for f in data["files"])
    assert data["row_count"] == 90  # ids 0..99 minus the deleted multiples of 10


def test_row_groups_and_the_slots_they_fill(spark_session: Any, warehouse: Warehouse,
                                           tmp_path: Any) -> None:
    dest = str(tmp_path / "g")
    result = run("main.ml.events", dest, "--files", "2", "--row-group-rows", "200",
                 "-w", "2", "-k", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["options"]["row_group_rows"] == 200
    groups = data["row_groups"]
    assert groups["count"] == sum(groups["per_file"]) >= 8 and groups["rows_max"] == 200
    assert data["row_group_slots"]["slots"] == 4 and data["row_group_slots"]["filled"] == 4
    human = run("main.ml.events", dest, "--files", "2", "--row-group-rows", "200",
                "-w", "2", "-k", "2")
    assert "unchanged" in human.output
    assert f"{groups['count']} in 2 files, " in human.output
    assert "fill 4 of 4 loader slots" in human.output
    assert "--row-group-rows" not in human.output.split("record")[1]  # no advice: all filled
    # More slots than row groups: the advice names a limit that fills them.
    wide = run("main.ml.events", dest, "--files", "2", "--row-group-rows", "200",
               "-w", "4", "-k", "8")
    assert f"fill {groups['count']} of 32 loader slots" in wide.output
    assert "empty: use --row-group-rows 50 so every slot reads a row group" in wide.output
    hints = [ln for ln in human.stdout.splitlines() if ln.startswith(("load: ", "  or: "))]
    assert hints == [f"load: datasets.load_dataset('parquet', data_files='{dest}/*.parquet')",
                     f"  or: ucstage.TableDataset('{dest}')"]


@pytest.mark.parametrize(("args", "message"), [
    (["main.ml"], "invalid table name"),
    (["main.ml.events; DROP"], "invalid table name"),
    (["main.ml.events", "--files", "2", "--max-records-per-file", "5"], "exclude each other"),
    (["main.ml.events", "-w", "2"], "go together"),
    (["main.ml.events", "-w", "2", "-k", "3,2,1"], "lists 3 values but --world-size is 2"),
    (["main.ml.events", "-w", "0", "-k", "1"], "--world-size must be at least 1"),
    (["main.ml.events", "-w", "2", "-k", "x"], "separated by commas"),
    (["main.ml.events", "--partition-by", "year", "--columns", "id"], "not in the output"),
])
def test_usage_errors_exit_2_with_one_line(warehouse: Warehouse, tmp_path: Any,
                                           args: list[str], message: str) -> None:
    table, *rest = args
    result = run(table, str(tmp_path / "x"), *rest)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.parametrize(("args", "error", "hint"), [
    (["--files", "0"], "--files must be at least 1, got 0", ""),
    (["--max-records-per-file", "0"], "--max-records-per-file must be at least 1, got 0", ""),
    (["--row-group-rows", "0"], "--row-group-rows must be at least 1, got 0", ""),
    (["--row-group-rows", "-5"], "--row-group-rows must be at least 1, got -5", ""),
    (["--files", "2", "--max-records-per-file", "5"],
     "--files and --max-records-per-file exclude each other",
     "--files writes exactly that many files, --max-records-per-file caps the rows in each: "
     "choose one"),
    (["--files", "2", "--partition-by", "year"],
     "--files counts the files of one folder and cannot be combined with --partition-by",
     "use --max-records-per-file with --partition-by"),
    (["--where", " "], "--where is empty", ""),
    (["--partition-by", "year", "--columns", "id"],
     "--partition-by column(s) year not in the output", "the output has the columns id"),
    (["--partition-by", "id", "--columns", "id"],
     "--partition-by cannot use every column: the files would be empty", ""),
])
def test_library_errors_are_shown_with_the_flags(warehouse: Warehouse, tmp_path: Any,
                                                 args: list[str], error: str, hint: str) -> None:
    # The library names its parameters (tests/test_export.py); the CLI's one
    # error mapper says them as the flags the user typed.
    result = run("main.ml.events", str(tmp_path / "x"), *args, "--json")
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)["error"]
    assert (doc["type"], doc["message"], doc["hint"]) == ("InvalidArgument", error, hint)


def test_bad_where_exits_2_and_keeps_the_export(spark_session: Any, warehouse: Warehouse,
                                                tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    assert run("main.ml.events", dest).exit_code == 0
    before = sorted(os.listdir(dest))
    result = run("main.ml.events", dest, "--where", "id >>> 3")
    assert result.exit_code == 2
    assert "error: --where was refused by Spark: " in result.output
    assert "JVM" not in result.output
    assert sorted(os.listdir(dest)) == before
    assert sorted(os.listdir(tmp_path)) == ["events"]  # no lock file or staging left


def test_bad_workers_exit_2_before_the_export(spark_session: Any, warehouse: Warehouse,
                                              tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    assert run("main.ml.events", dest, "--files", "6").exit_code == 0
    before = {n: os.stat(os.path.join(dest, n)).st_ino for n in os.listdir(dest)}
    result = run("main.ml.events", dest, "-w", "2", "-k", "3,2,1")
    assert result.exit_code == 2
    assert "--num-workers lists 3 values but --world-size is 2" in result.output
    assert {n: os.stat(os.path.join(dest, n)).st_ino for n in os.listdir(dest)} == before
    assert sorted(os.listdir(tmp_path)) == ["events"]


def test_dest_under_a_file_exits_2_with_one_line(warehouse: Warehouse, tmp_path: Any) -> None:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for dest in (afile / "sub", afile / "sub" / "deeper", afile):
        result = run("main.ml.events", str(dest))
        assert result.exit_code == 2, result.output
        assert "not a folder" in result.output and "unexpected" not in result.output
        assert "Traceback" not in result.output
        assert result.output.count("error:") == 1
    assert afile.read_text() == "mine"
    assert os.listdir(tmp_path) == ["afile"]


def test_unsupported_table_is_named(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # Deletion vectors, column mapping and type widening export
    # (tests/export/test_export_delta_features.py); a reader feature no
    # reader here knows is named, before any Spark server is asked.
    import pyarrow as pa
    from deltalake import write_deltalake

    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1, 2]}))
    feature = {"minReaderVersion": 3, "minWriterVersion": 7,
               "readerFeatures": ["someFutureFeature"], "writerFeatures": ["someFutureFeature"]}
    (table / "_delta_log" / f"{1:020d}.json").write_text(json.dumps({"protocol": feature}) + "\n")
    result = run(str(table), str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "someFutureFeature" in result.output and "Traceback" not in result.output


# -- the load hint keeps partition columns (item 17) ----------------------------

def _load_line(output: str) -> str:
    [line] = [ln for ln in output.splitlines() if ln.startswith("load: ")]
    return line[len("load: "):]


def _columns(expression: str, tmp_path: Any) -> set[str]:
    """Run the printed load command and return the columns it gives."""
    import pyarrow.dataset

    namespace: dict[str, Any] = {"pyarrow": __import__("pyarrow")}
    namespace["pyarrow"].dataset = pyarrow.dataset
    if expression.startswith("datasets."):
        datasets = pytest.importorskip("datasets")
        namespace["datasets"] = datasets
        loaded = eval(expression, namespace)
        return set(loaded["train"].column_names)
    return set(eval(expression, namespace).to_table().column_names)


@pytest.mark.parametrize("partition_by", ["year", "year,region"])
def test_load_hint_keeps_partition_columns(spark_session: Any, warehouse: Warehouse,
                                           tmp_path: Any, partition_by: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    dest = str(tmp_path / "p")
    result = run("main.ml.parted", dest, "--partition-by", partition_by)
    assert result.exit_code == 0, result.output
    hint = _load_line(result.stdout)
    assert "partitioning='hive'" in hint
    assert _columns(hint, tmp_path) == {"id", "region", "year", "value"}


def test_load_hint_without_partitions_loads_every_column(
        spark_session: Any, warehouse: Warehouse, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    result = run("main.ml.events", str(tmp_path / "e"))
    assert result.exit_code == 0, result.output
    assert _columns(_load_line(result.stdout), tmp_path) == {"id", "text", "score", "label"}


# -- zero rows selected (item 15) -----------------------------------------------

@pytest.mark.parametrize("partition_by", [None, "year"])
def test_where_selecting_no_rows_warns(spark_session: Any, warehouse: Warehouse,
                                       tmp_path: Any, partition_by: str | None) -> None:
    dest = str(tmp_path / "none")
    extra = ["--partition-by", partition_by] if partition_by else []
    result = run("main.ml.parted", dest, "--where", "id < 0", *extra, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    want = "--where selected 0 of the table's 810 rows ('id < 0'): the export holds no rows"
    assert data["warnings"] == [want]
    assert f"warning: {want}" in result.stderr
    assert data["row_count"] == 0 and not data["skipped_unchanged"]
    assert os.path.exists(os.path.join(dest, "_ucstage_export.json"))
    # The rerun skips, and says so again: the export is still empty.
    again = run("main.ml.parted", dest, "--where", "id < 0", *extra)
    assert again.exit_code == 0 and "unchanged" in again.stdout
    assert f"warning: {want}" in again.stderr
    fine = run("main.ml.parted", str(tmp_path / "some"), "--where", "id < 5", "--json")
    assert json.loads(fine.stdout)["warnings"] == [] and "warning" not in fine.stderr


def test_no_export_message_suggests_rm_rf() -> None:
    # Nothing ucstage says about an export may tell a person to delete a folder
    # by hand: DEST and the folders around it are the user's.
    from tests.common.parts import REPO

    folders = [os.path.join(REPO, "ucstage", "export"), os.path.join(REPO, "ucstage", "cli")]
    sources = [os.path.join(d, n) for d in folders for n in os.listdir(d) if n.endswith(".py")]
    sources = [p for p in sources if "export" in os.path.basename(p) or "/export/" in p]
    assert len(sources) > 5
    for path in sources:
        with open(path, encoding="utf-8") as f:
            assert "rm -r" not in f.read(), path


# -- progress off a terminal (item 11) ------------------------------------------

class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _log_console() -> Any:
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=False, width=200)


def test_status_prints_steps_and_a_line_every_interval_in_a_log() -> None:
    import time

    from ucstage.cli.export import _Status

    console, clock = _log_console(), _Clock()
    status = _Status(console, interval=0.01, clock=clock)
    status.set_description("starting the embedded Spark Connect server")
    clock.now += 6
    status.set_description("writing 1,600 rows")
    clock.now += 20
    deadline = time.monotonic() + 30
    while "since the export began" not in console.file.getvalue():
        assert time.monotonic() < deadline, console.file.getvalue()
        time.sleep(0.01)
    status.set_description("")
    status.close()
    lines = console.file.getvalue().splitlines()
    # The status thread runs on real time: it may also have printed a line
    # during the first step, before or after the fake clock moved, never out
    # of order.
    steps = [line for line in lines if "running for" not in line]
    assert steps == ["export: starting the embedded Spark Connect server",
                     "export: writing 1,600 rows"]
    writing = lines.index("export: writing 1,600 rows")
    assert set(lines[1:writing]) <= {
        f"export: starting the embedded Spark Connect server: running for 0:00:0{t}"
        for t in (0, 6)}  # the first step: one clock (issue 30 item 6)
    assert lines[writing + 1:]
    assert set(lines[writing + 1:]) == {
        "export: writing 1,600 rows: running for 0:00:20 (0:00:26 since the export began)"}


def test_status_on_a_terminal_draws_a_spinner_not_lines() -> None:
    import io

    from rich.console import Console

    from ucstage.cli.export import _Status

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    status = _Status(console, interval=0.01)
    status.set_description("writing 1,600 rows")
    assert status._status is not None
    status.close()
    assert status._status is None
    assert "export: writing" not in console.file.getvalue()


def test_status_shows_the_files_and_bytes_a_fetch_has_done() -> None:
    """Fetching a table on an object store into the cache: a step with a size."""
    import io

    from rich.console import Console

    from ucstage.cli.export import _Status

    console, clock = _log_console(), _Clock()
    status = _Status(console, interval=3600, clock=clock)
    status.set_description("fetching the table's 4 live files (4.0 KiB) into the cache")
    status.set_size(4096, items=4)
    status.relative_update(1024)
    status.item_done("a.parquet", "fetched")
    clock.now += 5
    assert status.line() == ("export: fetching the table's 4 live files (4.0 KiB) into the "
                             "cache: 1/4 files, 1.0 KiB/4.0 KiB (25%): running for 0:00:05")
    status.set_description("writing 80 rows")  # a new step has no size
    assert status.line() == ("export: writing 80 rows: running for 0:00:00 (0:00:05 since "
                             "the export began)")
    status.close()
    terminal = Console(file=io.StringIO(), force_terminal=True, width=200)
    spinner = _Status(terminal, interval=3600)
    spinner.set_description("fetching")
    spinner.set_size(2048, items=2)
    spinner.relative_update(2048)
    spinner.item_done("a.parquet", "cached")
    assert spinner._status is not None
    assert str(spinner._status.renderable.text) == "fetching: 1/2 files, 2.0 KiB/2.0 KiB (100%)"
    spinner.close()


def test_a_catalog_name_no_server_could_hold_is_refused_before_spark_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 30 item 6: `export main.ml.nope` without UCSTAGE_WAREHOUSE started
    Spark for 26 s before saying "not found". A fresh process: no embedded
    server is running, so its catalog would be a new, empty one."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("UCSTAGE_WAREHOUSE", "SPARK_REMOTE")}
    proc = subprocess.run([sys.executable, "-m", "ucstage", "export", "main.ml.nope",
                           str(tmp_path / "out")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "error: table main.ml.nope not found: UCSTAGE_WAREHOUSE is not set and no Spark " \
           "server is given" in proc.stderr
    assert "SPARK_REMOTE=sc://HOST:PORT" in proc.stderr
    assert "starting the embedded Spark" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()
