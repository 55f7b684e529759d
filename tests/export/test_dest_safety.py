"""DEST is replaced as a whole: never without asking when it holds files ucstage did not write."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.parts import free_port
from tests.common.spark import Warehouse, beside_dest, dest_listing, exported_table
from ucstage.cli.app import cli
from ucstage.errors import InvalidArgument
from ucstage.export import export_table, read_record
from ucstage.export.dest import dest_lock, staging_path, sweep_leftovers
from ucstage.progress import NO_PROGRESS
from ucstage.tables.record import RECORD_NAME

pytestmark = pytest.mark.spark




def _no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any Spark call now fails: a refusal must come before Spark is asked anything."""
    monkeypatch.setenv("SPARK_REMOTE", f"sc://127.0.0.1:{free_port()}")


@pytest.fixture
def seed_export(spark_session: Any, tmp_path: Any) -> str:
    """A folder of Parquet files written by Spark without ucstage (the platform's recipe)."""
    seed = str(tmp_path / "seed")
    spark_session.range(5).write.parquet(seed)
    return seed


def test_parquet_files_ucstage_did_not_write_are_not_replaced(
        seed_export: str, warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch) -> None:
    before = dest_listing(seed_export)
    part = sorted(n for n in before if n.endswith(".parquet"))[0]
    with monkeypatch.context() as m:
        _no_spark(m)
        with pytest.raises(InvalidArgument) as info:
            export_table("main.ml.events", seed_export)
    assert info.value.message.startswith(f"DEST {seed_export} holds Parquet output ('")
    assert repr(part) in info.value.message and RECORD_NAME in info.value.message
    assert "`force`" in info.value.hint
    assert dest_listing(seed_export) == before and beside_dest(seed_export) == []
    # Asked to, it replaces them.
    assert export_table("main.ml.events", seed_export, force=True).row_count == 1600
    assert exported_table(seed_export).num_rows == 1600 and part not in os.listdir(seed_export)


def test_files_added_to_an_export_are_not_deleted(
        spark_session: Any, warehouse: Warehouse, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    dest = str(tmp_path / "events")
    first = export_table("main.ml.events", dest, files=2)
    shutil.copy(os.path.join(dest, first.files[0]["path"]), os.path.join(dest, "mine.parquet"))
    os.mkdir(os.path.join(dest, "label=9"))
    with open(os.path.join(dest, "label=9", "notes.txt"), "w") as f:
        f.write("mine")
    before = dest_listing(dest)
    # Unchanged: skipped, nothing touched, nothing to refuse.
    assert export_table("main.ml.events", dest, files=2).skipped_unchanged
    # Changed: the swap would delete the added files, so it is refused, before Spark.
    with monkeypatch.context() as m:
        _no_spark(m)
        with pytest.raises(InvalidArgument) as info:
            export_table("main.ml.events", dest, files=3)
    assert info.value.message == (
        f"DEST {dest} holds files that its export record does not list: 'label=9/notes.txt', "
        "'mine.parquet'; the new export would delete them")
    assert "`force`" in info.value.hint
    assert dest_listing(dest) == before and beside_dest(dest) == []
    forced = export_table("main.ml.events", dest, files=3, force=True)
    assert sorted(os.listdir(dest)) == sorted([*(f["path"] for f in forced.files), RECORD_NAME])


def test_many_files_are_named_with_a_count(seed_export: str, warehouse: Warehouse,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(7):
        with open(os.path.join(seed_export, f"extra-{i}.parquet"), "wb") as f:
            f.write(b"PAR1")
    _no_spark(monkeypatch)
    with pytest.raises(InvalidArgument, match=r"and \d+ more\) but no _ucstage_export.json"):
        export_table("main.ml.events", seed_export)


def test_cli_refuses_with_exit_2_and_hints_force(seed_export: str, warehouse: Warehouse,
                                                 tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    before = dest_listing(seed_export)
    _no_spark(monkeypatch)
    result = CliRunner().invoke(cli, ["export", "main.ml.events", seed_export],
                                catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"error: DEST {seed_export} holds Parquet output ('part-")
    assert "ucstage did not write it; refusing to replace it" in lines[0]
    assert lines[1] == ("hint: choose another DEST, or pass --force to replace it (its files "
                        "are deleted)")
    assert dest_listing(seed_export) == before and beside_dest(seed_export) == []


# -- leftovers of killed exports, cleaned under the lock -------------------------

def test_sweep_removes_staging_and_restores_a_missing_dest(tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    # A run killed between the two renames: DEST missing, the old export set aside.
    old = staging_path(dest, "old")
    os.makedirs(old)
    with open(os.path.join(old, "part-0.parquet"), "w") as f:
        f.write("old data")
    staging = staging_path(dest, "staging")
    os.makedirs(os.path.join(staging, "_temporary"))
    other = str(tmp_path / ".events2.ucstage-staging-0123456789ab")  # another DEST's
    os.makedirs(other)
    with dest_lock(dest, NO_PROGRESS):
        assert sweep_leftovers(dest) == old
    assert os.listdir(dest) == ["part-0.parquet"]
    assert sorted(os.listdir(tmp_path)) == [".events2.ucstage-staging-0123456789ab", "events"]
    # With DEST present, set-aside exports are stale and go.
    os.makedirs(staging_path(dest, "old"))
    with dest_lock(dest, NO_PROGRESS):
        assert sweep_leftovers(dest) is None
    assert sorted(os.listdir(tmp_path)) == [".events2.ucstage-staging-0123456789ab", "events"]


def test_a_killed_exports_staging_is_removed_by_the_next_export(
        spark_session: Any, warehouse: Warehouse, tmp_path: Any) -> None:
    dest = str(tmp_path / "events")
    export_table("main.ml.events", dest)
    staging = staging_path(dest, "staging")
    os.makedirs(os.path.join(staging, "_temporary", "0"))
    lock = os.path.join(str(tmp_path), ".events.ucstage.lock")
    open(lock, "w").close()  # a kill -9 leaves the lock file too
    assert read_record(dest) is not None
    export_table("main.ml.events", dest, force=True)
    assert beside_dest(dest) == []
