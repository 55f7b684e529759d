"""Checkpoints ucstage did not write, or whose record was edited: a plain
torch checkpoint (torch's own ``FileSystemWriter``, no record) loads, is
the latest when newest, is listed as plain torch and verified against its
``.metadata``; a record or ``.metadata`` naming ``../x``, an absolute path,
a name with control characters, or a file that is a link is refused by the
load and by ``verify`` (one line, the name escaped, exit 2), and nothing
outside the checkpoint is opened."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner, Result
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException

from tests.checkpoint.conftest import equal
from ucstage.checkpoint import Reader, Writer, latest
from ucstage.checkpoint.folder import METADATA, RECORD, name_problem
from ucstage.cli.app import cli
from ucstage.errors import CheckpointCorrupt, CheckpointUnsafe
from ucstage.volumes.location import entry_name_problem


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 64, generator=g), "b": torch.randn(64, generator=g),
            "loader": json.dumps({"epoch": 1, "seed": seed}), "step": seed}


def empty() -> dict[str, Any]:
    return {"w": torch.zeros(64, 64), "b": torch.zeros(64), "loader": "", "step": -1}


def load(path: Path) -> dict[str, Any]:
    target = empty()
    dcp.load(target, storage_reader=Reader(str(path)))
    return target


def load_error(path: Path) -> BaseException:
    """The error loading ``path`` fails with: raised by ``Reader`` itself,
    or inside ``dcp.load`` (torch wraps each rank's in CheckpointException)."""
    try:
        load(path)
    except CheckpointException as exc:
        ((err, _),) = exc.failures.values()
        return err
    except Exception as exc:
        return exc
    raise AssertionError(f"{path} loaded")


# -- a plain torch checkpoint --------------------------------------------------

def test_a_plain_torch_checkpoint_loads_and_is_listed_and_verified_as_one(tmp_path: Path) -> None:
    parent = tmp_path / "ckpt"
    dcp.save(state(1), storage_writer=Writer(str(parent / "step-1")))
    plain = parent / "step-2"
    dcp.save(state(2), storage_writer=FileSystemWriter(str(plain), thread_count=2))
    assert sorted(os.listdir(plain)) == sorted([METADATA, "__0_0.distcp", "__0_1.distcp"])

    # The newest complete checkpoint, whoever wrote it; it loads equal.
    assert latest(str(parent)) == str(plain)
    assert equal(load(plain), state(2))

    result = run("checkpoint", "list", str(parent))
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:3]]
    assert [r[:3] for r in rows] == [["step-1", "complete", "1"],
                                     ["step-2", "complete", "(plain"]]
    result = run("checkpoint", "list", str(parent), "--json")
    assert [(c["name"], c["record"], c["saved_by"]) for c in
            json.loads(result.stdout)["checkpoints"]] == [("step-1", True, "ucstage"),
                                                          ("step-2", False, "torch")]

    # verify checks what .metadata tells, and says its bytes were not checked.
    result = run("checkpoint", "verify", str(plain))
    assert result.exit_code == 0, result.output
    assert "2 files checked, 2 ok" in result.stdout
    assert "a plain torch checkpoint" in result.stdout and "bytes were not checked" in result.stdout
    doc = json.loads(run("checkpoint", "verify", str(plain), "--json").stdout)
    assert doc["ok"] and doc["checksums"] is False
    assert doc["checkpoint"]["saved_by"] == "torch"
    sizes = {n: os.path.getsize(plain / n) for n in ("__0_0.distcp", "__0_1.distcp")}
    assert [(f["name"], f["size"], f["status"]) for f in doc["files"]] == \
        [(n, sizes[n], "ok") for n in sorted(sizes)]
    assert all(0 < f["expected_size"] <= f["size"] for f in doc["files"])

    # A file cut short: verify names it (exit 1), the load fails on it.
    with open(plain / "__0_1.distcp", "r+b") as fh:
        fh.truncate(sizes["__0_1.distcp"] // 2)
    result = run("checkpoint", "verify", str(plain))
    assert result.exit_code == 1
    assert "short __0_1.distcp (rank 0)" in result.stdout
    assert "1 of 2 files are missing or shorter than its .metadata says" in result.stderr
    assert isinstance(load_error(plain), CheckpointCorrupt)
    # A file gone: named by verify, refused by the load before any read.
    os.unlink(plain / "__0_1.distcp")
    doc = json.loads(run("checkpoint", "verify", str(plain), "--json").stdout)
    assert [f["status"] for f in doc["files"]] == ["ok", "missing"]
    err = load_error(plain)
    assert isinstance(err, CheckpointCorrupt)
    assert "is missing __0_1.distcp (a file its .metadata indexes)" in str(err)


def test_a_metadata_that_is_no_index_is_refused_not_run(tmp_path: Path) -> None:
    plain = tmp_path / "step-1"
    dcp.save(state(1), storage_writer=FileSystemWriter(str(plain)))
    ran = tmp_path / "ran"
    # A pickle that would run a command when loaded by pickle.load.
    (plain / METADATA).write_bytes(pickle.dumps(_Runs(str(ran))))
    result = run("checkpoint", "verify", str(plain))
    assert result.exit_code == 1
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert line.endswith(f"{plain}: its .metadata is not a torch.distributed.checkpoint index "
                         f"(it holds {os.system.__module__}.system, which torch never writes "
                         "there)")
    assert not ran.exists()
    # A load unpickles it the same way, never with torch's plain pickle.load.
    with pytest.raises(CheckpointCorrupt, match=r"its \.metadata is not a torch"):
        Reader(str(plain)).read_metadata()
    assert not ran.exists()


class _Runs:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


# -- hostile records ------------------------------------------------------------

OPENED: list[str] = []
_WATCHING: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _WATCHING and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENED.append(os.fsdecode(args[0]))


@pytest.fixture
def opened() -> Iterator[list[str]]:
    """The paths this process opens while the test runs (an audit hook: it
    sees every open, by any library)."""
    if not getattr(sys, "_ucstage_ckpt_audit", False):
        sys.addaudithook(_audit)  # hooks cannot be removed: one for the session
        sys._ucstage_ckpt_audit = True  # type: ignore[attr-defined]
    OPENED.clear()
    _WATCHING.append(True)
    try:
        yield OPENED
    finally:
        _WATCHING.clear()


def _rename_in_record(folder: Path, old: str, new: str) -> None:
    path = folder / RECORD
    doc = json.loads(path.read_text())
    for f in doc["files"]:
        if f["name"] == old:
            f["name"] = new
    doc["ranges"] = {new if n == old else n: r for n, r in doc["ranges"].items()}
    path.write_text(json.dumps(doc))


def _rename_in_metadata(folder: Path, old: str, new: str) -> None:
    path = folder / METADATA
    metadata = pickle.loads(path.read_bytes())
    for info in metadata.storage_data.values():
        if info.relative_path == old:
            info.relative_path = new
    path.write_bytes(pickle.dumps(metadata))


HOSTILE = [
    # (case, how the index is edited, the name it then gives, the reason shown)
    ("parent", "record", "../x", "a path leading outside the checkpoint"),
    ("absolute", "record", "ABS", "an absolute path, outside the checkpoint"),
    ("control", "record", "__0_0\x1b]0;owned\x07.distcp", "a name with control characters"),
    ("link", "record", "__0_0.distcp", "a link, not a file of the checkpoint"),
    ("plain-parent", "metadata", "../x", "a path leading outside the checkpoint"),
    ("plain-link", "metadata", "__0_0.distcp", "a link, not a file of the checkpoint"),
]


@pytest.mark.parametrize(("case", "index", "name", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_record_naming_what_is_not_its_file_is_refused_reading_nothing_outside(
        tmp_path: Path, opened: list[str], case: str, index: str, name: str, why: str) -> None:
    folder = tmp_path / "ckpt" / "step-1"
    if index == "record":
        dcp.save(state(1), storage_writer=Writer(str(folder)))
    else:
        dcp.save(state(1), storage_writer=FileSystemWriter(str(folder)))
    # Outside the checkpoint, a copy of its data file: a read that followed the
    # name would find the bytes and sizes it expects, and load.
    outside = tmp_path / "ckpt" / "x"
    shutil.copyfile(folder / "__0_0.distcp", outside)
    if case.endswith("link"):
        os.unlink(folder / "__0_0.distcp")
        os.symlink(outside, folder / "__0_0.distcp")
    else:
        name = str(outside) if name == "ABS" else name
        if index == "record":
            _rename_in_record(folder, "__0_0.distcp", name)
        else:
            _rename_in_metadata(folder, "__0_0.distcp", name)
    escaped = name.replace("\x1b", "\\x1b").replace("\x07", "\\x07")

    opened.clear()
    err = load_error(folder)
    assert isinstance(err, CheckpointUnsafe) and isinstance(err, CheckpointCorrupt)
    assert f"names {escaped}: {why}; refused, nothing was read" in str(err)
    assert "\n" not in str(err) and "\x1b" not in str(err)

    result = run("checkpoint", "verify", str(folder))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("error:")]
    assert f"names {escaped}: {why}" in line and "\x1b" not in result.stderr
    assert result.stderr.count("\n") <= 2  # the error, and its hint
    result = run("checkpoint", "verify", str(folder), "--json")
    assert result.exit_code == 2

    seen = {os.path.realpath(p) for p in opened}
    assert os.path.realpath(folder / (METADATA if index == "metadata" else RECORD)) in seen
    assert os.path.realpath(outside) not in seen, opened


def test_the_name_rule_is_one_for_tables_listings_and_checkpoints() -> None:
    for bad in ("", ".", "..", "a/b", "a\x00b"):
        assert entry_name_problem(bad) is not None
        assert name_problem(bad) is not None
    assert entry_name_problem("__0_0.distcp") is None and name_problem("__0_0.distcp") is None
    # A checkpoint's names are its data files only, in ASCII digits.
    for bad in ("notes.txt", "__\u0663_0.distcp", "__0_0.distcp\n"):
        assert entry_name_problem(bad) is None and name_problem(bad) is not None
