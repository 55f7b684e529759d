"""What an export writes beside and into DEST, when other users share the
folder: the lock beside DEST is never opened through a link (issue 39, item
3), and the export record gets the user's umask (item 9).

No Spark is needed: the lock is taken before any Spark call (a dead
SPARK_REMOTE proves it), and the record is written by :func:`publish`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from tests.common.parts import free_port, unique
from tests.common.users import OtherUser
from ucstage.errors import ExportError
from ucstage.export.dest import dest_lock, publish
from ucstage.progress import NO_PROGRESS
from ucstage.tables.record import RECORD_NAME, ExportRecord, load_record


@pytest.fixture
def theirs(other_user: OtherUser) -> Iterator[Path]:
    """A folder the other user owns (not sticky), which root exports into."""
    folder = Path(f"/tmp/ucstage-dest-{unique()}")
    folder.mkdir(mode=0o755)
    other_user.chown(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_lock_link_planted_by_another_user_is_not_followed(
        other_user: OtherUser, theirs: Path, tmp_path: Path) -> None:
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    dest = theirs / "events"
    lock = theirs / ".events.ucstage.lock"
    other_user.run(["ln", "-s", str(root_only / "created"), str(lock)])
    message = f"the lock file {lock} is a symlink; refusing to follow it"

    with pytest.raises(ExportError) as caught, dest_lock(str(dest), NO_PROGRESS):
        pytest.fail("the lock was taken through the link")
    assert caught.value.message == message
    assert str(theirs) in caught.value.hint
    assert os.listdir(root_only) == []

    # The command too, before Spark is asked anything.
    from deltalake import write_deltalake

    table = tmp_path / "table"
    write_deltalake(str(table), pa.table({"x": [1, 2, 3]}))
    run = subprocess.run([sys.executable, "-m", "ucstage", "export", str(table), str(dest)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SPARK_REMOTE": f"sc://127.0.0.1:{free_port()}"})
    assert run.returncode == 1, run.stderr
    assert run.stderr.splitlines()[0] == f"error: {message}"
    assert "Traceback" not in run.stderr
    assert os.listdir(root_only) == [] and os.path.islink(lock)
    assert sorted(os.listdir(theirs)) == [lock.name]  # no staging folder, no DEST


def _record() -> ExportRecord:
    return ExportRecord(table="main.ml.events", source_kind="delta", source_location="/t",
                        delta_version=3, row_count=0, schema={"type": "struct", "fields": []},
                        files=[], bytes=0, options={}, created_at="2026-01-01T00:00:00Z",
                        ucstage_version="0")


@pytest.mark.parametrize(("mask", "mode"), [(0o077, 0o600), (0o022, 0o644)], ids=["077", "022"])
def test_the_export_record_follows_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    staging, dest = tmp_path / ".events.staging", tmp_path / "events"
    staging.mkdir()
    old = os.umask(mask)
    try:
        publish(str(staging), str(dest), _record())
    finally:
        os.umask(old)
    assert oct((dest / RECORD_NAME).stat().st_mode & 0o777) == oct(mode)
    assert load_record(str(dest)) == _record()
