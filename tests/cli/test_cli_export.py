"""``ucstage export`` through click, on the session's embedded Spark Connect server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.spark import Warehouse, exported_table
from ucstage.cli.app import cli

pytestmark = pytest.mark.spark


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["export", *args], catch_exceptions=False)


def test_help_has_examples_and_every_option() -> None:
    result = run("--help")
    assert result.exit_code == 0
    for text in ("Examples:", "--remote", "--columns", "--where", "--partition-by", "--files",
                 "--max-records-per-file", "--compression", "--force", "--json"):
        assert text in result.output


def test_cli_import_stays_light() -> None:
    code = ("import sys, ucstage.cli.app; "
            "print(sorted(m for m in ('pyspark', 'deltalake') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_export_json_then_rerun_skips(spark_session: Any, warehouse: Warehouse,
                                      tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    first = run("main.ml.events", dest, "--files", "3", "--json")
    assert first.exit_code == 0, first.output
    data = json.loads(first.output)
    assert data["skipped_unchanged"] is False
    assert data["row_count"] == 1600 and data["delta_version"] == 4
    assert len(data["files"]) == 3 and isinstance(data["seconds"], float)
    assert data["options"]["files"] == 3
    assert exported_table(dest).num_rows == 1600

    again = run("main.ml.events", dest, "--files", "3", "--json")
    assert json.loads(again.output)["skipped_unchanged"] is True
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
    assert json.loads(result.output)["suggested_files"] == 4
    human = run("main.ml.events", str(tmp_path / "e"), "--files", "3", "-w", "2", "-k", "2")
    assert "--files 4" in human.output
    fine = run("main.ml.events", str(tmp_path / "f"), "--files", "4", "-w", "2", "-k", "2")
    assert fine.exit_code == 0 and "--files 4" not in fine.output


def test_options_reach_the_library(spark_session: Any, warehouse: Warehouse,
                                   tmp_path: Any) -> None:
    dest = str(tmp_path / "p")
    result = run("main.ml.parted", dest, "--partition-by", "year", "--columns",
                 "id,year,region", "--where", "id < 100", "--compression", "snappy", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["options"] == {"columns": ["id", "year", "region"], "where": "id < 100",
                               "partition_by": ["year"], "files": None,
                               "max_records_per_file": None, "compression": "snappy"}
    assert all(f["path"].startswith("year=") for f in data["files"])
    assert data["row_count"] == 90  # ids 0..99 minus the deleted multiples of 10


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


def test_unsupported_table_is_named(spark_session: Any, warehouse: Warehouse,
                                    tmp_path: Any) -> None:
    result = run("main.ml.dv", str(tmp_path / "dv"))
    assert result.exit_code == 2
    assert "deletionVectors" in result.output
