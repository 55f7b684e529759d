"""A table's files stay inside its folder (issue 39, items 4 and 7).

Delta logs written by deltalake, then edited (tests/common/deltaedit.py):
an add naming a file outside the table is refused by name before anything
reads it, one naming its own file absolutely keeps working. Deletion
vectors written by tests/common/deltadv.py: a ``u`` prefix with ``../`` and
a ``p`` path elsewhere are refused; no message shows a value read from a
file. A Parquet folder's links out of it are named, never dropped silently.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.common.deltadv import DvTable, recheckpoint
from tests.common.deltaedit import ESCAPES, INSIDE, ids, two_commit_table
from ucstage import TableDataset
from ucstage.cli import cli
from ucstage.errors import NotParquet, UnreadableDeltaLog, UnsafePath
from ucstage.tables import row_groups
from ucstage.tables.delta import table_state

SECRET = b"ABCD"
"""The first bytes of a file outside a table; as a big-endian number 1094861636."""


def _no_secret(message: str) -> None:
    assert "ABCD" not in message and str(int.from_bytes(SECRET, "big")) not in message


def _ids(source: str, cache: Path) -> list[int]:
    return sorted(i for b in TableDataset(source, columns=["id"], cache_dir=str(cache))
                  for i in b.column("id").to_pylist())


# -- item 4: data files ---------------------------------------------------------------

@pytest.mark.parametrize("how", ESCAPES)
def test_an_add_outside_the_table_is_refused_by_name(tmp_path: Path, how: str) -> None:
    t = two_commit_table(tmp_path)
    logged = t.escape(how)
    # table_state: what export hands Spark (the refusal precedes any read).
    with pytest.raises(UnsafePath) as info:
        table_state(t.root)
    message = info.value.message
    assert f"the Delta log names data file {logged}" in message, message
    assert f"outside the table's folder {t.root}" in message
    assert info.value.exit_code == 2 and "nothing was read" in info.value.hint
    # TableDataset and the row-group listing: the same rule, the same error.
    for read in (lambda: row_groups(t.root),
                 lambda: TableDataset(t.root, cache_dir=str(tmp_path / "c")).freeze()):
        with pytest.raises(UnsafePath, match="outside the table's folder") as again:
            read()
        assert again.value.message == message


@pytest.mark.parametrize("how", INSIDE)
def test_an_absolute_path_inside_the_table_keeps_working(tmp_path: Path, how: str) -> None:
    t = two_commit_table(tmp_path)
    t.inside(how)
    state = table_state(t.root)
    assert state.files == sorted(os.path.join(t.root, n) for n in t.names)  # named under root
    assert row_groups(t.root).rows == 20
    assert _ids(t.root, tmp_path / "c") == list(range(20))


def test_a_table_given_through_a_link_reads_its_absolute_paths(tmp_path: Path) -> None:
    """The folder given by a link's name, the log naming the real folder."""
    t = two_commit_table(tmp_path)
    t.inside("absolute")
    alias = str(tmp_path / "alias")
    os.symlink(t.root, alias)
    assert table_state(alias).files == sorted(os.path.join(alias, n) for n in t.names)
    assert _ids(alias, tmp_path / "c") == list(range(20))


def test_a_path_with_control_characters_is_named_escaped(tmp_path: Path) -> None:
    t = two_commit_table(tmp_path)
    t.repoint(1, "../evil\x1b[2J.parquet")
    with pytest.raises(UnsafePath) as info:
        table_state(t.root)
    assert "\x1b" not in info.value.message
    assert repr("../evil\x1b[2J.parquet") in info.value.message


def test_a_removed_file_outside_fails_nothing(tmp_path: Path) -> None:
    """Only live files are confined: an older add of a file no longer live
    (outside the table) is never read, so it refuses nothing."""
    from deltalake import DeltaTable, write_deltalake

    t = two_commit_table(tmp_path)
    t.escape("dotdot")
    write_deltalake(t.root, ids(50, 5), mode="overwrite")  # removes both files
    assert table_state(t.root).num_records == 5
    assert _ids(t.root, tmp_path / "c") == list(range(50, 55))
    assert DeltaTable(t.root).version() == 2


# -- item 4: deletion vectors ----------------------------------------------------------

def _dv_table(root: Path) -> DvTable:
    t = DvTable(str(root / "dv"))
    t.data("a.parquet", 0, 10, 5)
    t.data("b.parquet", 100, 10, 5)
    return t


def test_a_u_vector_with_a_dotdot_prefix_is_refused(tmp_path: Path) -> None:
    t = _dv_table(tmp_path)
    t.add("a.parquet", t.vector([1], "i"))
    vector = t.vector([2, 3], "u", prefix="../out")  # the fixture writes it there
    t.add("b.parquet", vector)
    t.commit()
    assert os.listdir(tmp_path / "out")  # the vector file is real, outside the table
    with pytest.raises(UnsafePath) as info:
        row_groups(t.root)
    assert "the Delta log names deletion vector ../out/deletion_vector_" in info.value.message
    assert f"outside the table's folder {t.root}" in info.value.message
    with pytest.raises(UnsafePath, match=r"deletion vector \.\./out/"):
        TableDataset(t.root, cache_dir=str(tmp_path / "c")).freeze()


@pytest.mark.parametrize("form", ["file-uri", "path"])
def test_a_p_vector_elsewhere_is_refused_before_it_is_read(tmp_path: Path, form: str) -> None:
    """The vector file elsewhere starts with the size header ``ABCD``: the
    message names the path, and shows none of the file."""
    t = _dv_table(tmp_path)
    vector = t.vector([2, 3], "p", where=str(tmp_path / "elsewhere"))
    path = vector["pathOrInlineDv"][len("file://"):]
    with open(path, "r+b") as f:
        f.seek(vector["offset"])
        f.write(SECRET)
    if form == "path":
        vector["pathOrInlineDv"] = path
    t.add("a.parquet", None)
    t.add("b.parquet", vector)
    t.commit()
    with pytest.raises(UnsafePath) as info:
        row_groups(t.root)
    assert f"deletion vector {vector['pathOrInlineDv']}" in info.value.message
    _no_secret(info.value.message)


def test_a_p_vector_inside_the_table_keeps_working(tmp_path: Path) -> None:
    t = _dv_table(tmp_path)
    t.add("a.parquet", t.vector([0, 9], "p", where=os.path.join(t.root, "vectors")))
    t.add("b.parquet", t.vector([5], "u", prefix="q"))
    t.commit()
    assert _ids(t.root, tmp_path / "c") == [*range(1, 9), *range(100, 105), *range(106, 110)]


def test_a_file_that_is_no_vector_is_named_without_its_bytes(tmp_path: Path) -> None:
    """A ``u`` vector inside the table whose file is not a vector file: its
    size header (``ABCD``) is not the descriptor's, and is not shown."""
    t = _dv_table(tmp_path)
    vector = t.vector([2, 3], "u", prefix="q")
    t.add("a.parquet", None)
    t.add("b.parquet", vector)
    t.commit()
    dvfile = next(str(p) for p in (Path(t.root) / "q").iterdir())
    with open(dvfile, "r+b") as f:
        f.seek(vector["offset"])
        f.write(SECRET)
    with pytest.raises(UnreadableDeltaLog) as info:
        row_groups(t.root)
    message = info.value.message
    assert f"{dvfile} is not a valid deletion-vector file" in message, message
    assert f"the descriptor's {vector['sizeInBytes']} bytes" in message
    _no_secret(message)


def test_a_vector_whose_bitmap_disagrees_shows_no_count_of_its_own(tmp_path: Path) -> None:
    t = _dv_table(tmp_path)
    vector = t.vector([2, 3], "u")
    vector["cardinality"] = 7  # the bitmap holds 2
    t.add("a.parquet", None)
    t.add("b.parquet", vector)
    t.commit()
    with pytest.raises(UnreadableDeltaLog, match="row count does not match the descriptor's 7"
                       ) as info:
        row_groups(t.root)
    assert " 2 " not in info.value.message


def test_a_checkpoint_sidecar_outside_the_table_is_refused(tmp_path: Path) -> None:
    """A v2 checkpoint (the commits cleaned up) whose sidecar of adds, with
    their deletion vectors, lies outside the table."""
    import shutil

    from deltalake import DeltaTable

    t = _dv_table(tmp_path)
    t.add("a.parquet", t.vector([1], "u"))
    t.add("b.parquet", None)
    t.commit()
    DeltaTable(t.root).create_checkpoint()
    log = Path(t.root) / "_delta_log"
    recheckpoint(log, 0, "v2")
    os.remove(log / f"{0:020d}.json")
    assert _ids(t.root, tmp_path / "c0") == [0, *range(2, 10), *range(100, 110)]
    side = next((log / "_sidecars").iterdir())
    (tmp_path / "outside").mkdir()
    moved = shutil.move(side, tmp_path / "outside" / side.name)
    top = next(p for p in log.iterdir() if p.name.endswith(".json"))
    top.write_text(top.read_text().replace(json.dumps(side.name),
                                           json.dumps(f"file://{moved}")))
    with pytest.raises(UnsafePath) as info:
        row_groups(t.root)
    assert f"checkpoint sidecar file://{moved}, which resolves to {moved}, outside the " \
           f"table's folder {t.root}" in info.value.message


def test_an_export_record_naming_a_link_out_names_it(tmp_path: Path) -> None:
    """An export destination (its record lists the files) whose file is now a
    link out of it: named, not "missing"."""
    from ucstage.tables.record import RECORD_NAME, ExportRecord

    dest = tmp_path / "export"
    dest.mkdir()
    pq.write_table(ids(0, 4), dest / "part-0.parquet")
    pq.write_table(ids(1000, 4), tmp_path / "x.parquet")
    (dest / "part-1.parquet").symlink_to(tmp_path / "x.parquet")
    files = [{"path": f"part-{i}.parquet", "bytes": 1, "rows": 4} for i in (0, 1)]
    record = ExportRecord("t", "delta", None, 0, 8, {}, files,  # type: ignore[arg-type]
                          2, {}, "2026-01-01T00:00:00Z", "0")
    (dest / RECORD_NAME).write_text(record.dumps())
    with pytest.raises(UnsafePath, match=r"data file part-1\.parquet is refused: symlink to "):
        row_groups(str(dest))


def test_a_footer_length_is_not_shown(tmp_path: Path) -> None:
    """A file ending in ``PAR1`` whose footer length field is ``ABCD``."""
    folder = tmp_path / "f"
    folder.mkdir()
    pq.write_table(ids(0, 4), folder / "a.parquet")
    (folder / "b.parquet").write_bytes(b"\0" * 16 + SECRET[::-1] + b"PAR1")  # little-endian
    with pytest.raises(NotParquet, match=r"b\.parquet is not a Parquet file") as info:
        row_groups(str(folder))
    _no_secret(info.value.message)


# -- item 7: a Parquet folder's links out of it ------------------------------------------

@pytest.fixture
def linked_folder(tmp_path: Path) -> str:
    """``a.parquet``, ``out.parquet`` (a link to a Parquet file outside) and
    ``gone.parquet`` (a broken link)."""
    folder = tmp_path / "f"
    folder.mkdir()
    pq.write_table(ids(0, 6), folder / "a.parquet", row_group_size=3)
    (tmp_path / "secret").mkdir()
    pq.write_table(ids(1000, 6), tmp_path / "secret" / "x.parquet")
    (folder / "out.parquet").symlink_to(tmp_path / "secret" / "x.parquet")
    (folder / "gone.parquet").symlink_to(tmp_path / "nothing.parquet")
    return str(folder)


def test_table_dataset_names_the_links_it_leaves_out(linked_folder: str, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    m = row_groups(linked_folder)
    assert [e.path for e in m.files] == ["a.parquet"]
    assert dict(m.refused).keys() == {"out.parquet", "gone.parquet"}
    assert "outside the volume" in dict(m.refused)["out.parquet"]
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        assert _ids(linked_folder, tmp_path / "c") == list(range(6))
    said = [r.getMessage() for r in caplog.records]
    assert any(s.startswith("skipped out.parquet: symlink to ") and "outside the volume" in s
               for s in said), said
    assert any(s.startswith("skipped gone.parquet: broken symlink") for s in said), said


def test_a_folder_of_links_out_alone_is_empty_naming_them(tmp_path: Path) -> None:
    from ucstage.errors import EmptySource

    folder = tmp_path / "f"
    folder.mkdir()
    pq.write_table(ids(1000, 6), tmp_path / "x.parquet")
    (folder / "out.parquet").symlink_to(tmp_path / "x.parquet")
    with pytest.raises(EmptySource,
                       match=r"no Parquet files \(1 entry refused, e\.g\. out\.parquet: symlink to"):
        TableDataset(str(folder), cache_dir=str(tmp_path / "c")).freeze()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_row_group_commands_name_the_links_as_cache_warm_of_files_does(
        linked_folder: str) -> None:
    as_files = _cli("cache", "warm", linked_folder, "--json")
    assert as_files.exit_code == 0, as_files.output
    by_group = _cli("cache", "warm", linked_folder, "--unit", "row-group", "--json")
    assert by_group.exit_code == 0, by_group.output
    refused = json.loads(by_group.stdout)["refused"]
    assert refused == json.loads(as_files.stdout)["refused"]
    assert {r["path"] for r in refused} == {"out.parquet", "gone.parquet"}
    assert "warning: skipped out.parquet: symlink to" in by_group.stderr
    plan = _cli("shard-plan", linked_folder, "--unit", "row-group", "-w", "1", "-k", "1")
    assert plan.exit_code == 0, plan.output
    assert "warning: skipped out.parquet: symlink to" in plan.stderr
    assert "warning: skipped gone.parquet: broken symlink" in plan.stderr


def test_a_delta_file_linking_out_is_an_error_in_every_command(tmp_path: Path) -> None:
    t = two_commit_table(tmp_path)
    t.escape("link-out")
    for args in (["cache", "warm", t.root, "--unit", "row-group"],
                 ["shard-plan", t.root, "--unit", "row-group", "-w", "1", "-k", "1"]):
        result = _cli(*args)
        assert result.exit_code == 2, result.output
        assert "data file link.parquet, which resolves to" in result.stderr
        assert "Traceback" not in result.output and result.stderr.count("error:") == 1
