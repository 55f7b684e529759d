"""``ucstage checkpoint list``, ``verify`` and ``prune`` on checkpoints saved
by ``ucstage.checkpoint.Writer`` in this process: human output, ``--json``,
exit codes, one-line errors, names shown escaped."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner, Result

from tests.cli.test_json_contract import assert_matches
from ucstage.checkpoint import Writer
from ucstage.checkpoint.folder import METADATA, read_record
from ucstage.cli.app import cli


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def save(path: Path, seed: int = 0, **kw: Any) -> None:
    g = torch.Generator().manual_seed(seed)
    dcp.save({"w": torch.randn(128, 128, generator=g), "b": torch.randn(64, generator=g),
              "step": seed},
             storage_writer=Writer(str(path), **kw))


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    """step-1 and step-2 complete (thread_count=2: two files each), step-3 incomplete."""
    folder = tmp_path / "ckpt"
    save(folder / "step-1", 1, thread_count=2)
    save(folder / "step-2", 2, thread_count=2)
    (folder / "step-3").mkdir()
    (folder / "step-3" / "__0_0.distcp").write_bytes(b"x" * 1000)
    (folder / "notes").mkdir()
    return folder


def test_list_shows_each_checkpoint_complete_or_not(parent: Path) -> None:
    result = run("checkpoint", "list", str(parent))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["checkpoint", "state", "ranks", "files", "size", "age"]
    assert [line.split()[:4] for line in lines[1:4]] == [
        ["step-1", "complete", "1", "2"], ["step-2", "complete", "1", "2"],
        ["step-3", "incomplete", "1", "1"]]
    assert lines[-1] == "2 complete checkpoints, 1 incomplete (never loaded)"

    result = run("checkpoint", "list", str(parent), "--json")
    doc = json.loads(result.stdout)
    assert doc["path"] == str(parent)
    got = {c["name"]: c for c in doc["checkpoints"]}
    assert [c["name"] for c in doc["checkpoints"]] == ["step-1", "step-2", "step-3"]
    record = read_record(str(parent / "step-1"))
    assert record is not None
    assert got["step-1"]["bytes"] == sum(f.size for f in record.files)
    assert got["step-1"]["saved_at"] == record.saved_at and got["step-1"]["record"]
    assert got["step-3"] == {**got["step-3"], "complete": False, "files": 1, "bytes": 1000,
                             "record": False}
    assert all(c["age_s"] >= 0 for c in doc["checkpoints"])
    # A checkpoint's own folder lists it alone.
    doc = json.loads(run("checkpoint", "list", str(parent / "step-2"), "--json").stdout)
    assert [c["name"] for c in doc["checkpoints"]] == ["step-2"]
    assert "no checkpoints in" in run("checkpoint", "list", str(parent / "notes")).stdout


def test_verify_reads_every_file_and_exits_1_on_a_changed_one(parent: Path) -> None:
    step = parent / "step-2"
    result = run("checkpoint", "verify", str(step), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and doc["problem"] == ""
    assert [(f["name"], f["status"]) for f in doc["files"]] == [
        ("__0_0.distcp", "ok"), ("__0_1.distcp", "ok")]
    # One byte changed, the size the same: only the checksum tells.
    data = bytearray((step / "__0_1.distcp").read_bytes())
    data[len(data) // 2] ^= 0x10
    (step / "__0_1.distcp").write_bytes(bytes(data))
    result = run("checkpoint", "verify", str(step))
    assert result.exit_code == 1
    assert "checksum __0_1.distcp (rank 0): its bytes differ" in result.stdout
    assert result.stderr.startswith(f"error: checkpoint {step} does not verify: 1 of 2 files")
    assert "Traceback" not in result.output
    # Cut short: the size tells, without reading it.
    (step / "__0_0.distcp").write_bytes(b"short")
    result = run("checkpoint", "verify", str(step), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert [(f["name"], f["status"], f["size"]) for f in doc["files"]] == [
        ("__0_0.distcp", "size", 5), ("__0_1.distcp", "checksum", len(data))]
    assert not doc["ok"]


def test_verify_of_an_incomplete_checkpoint_exits_1(parent: Path) -> None:
    result = run("checkpoint", "verify", str(parent / "step-3"))
    assert result.exit_code == 1
    assert "it is incomplete: no .metadata" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["verify", "{p}/notes"], "is not a checkpoint: it holds no .metadata and no .distcp files"),
    (["verify", "{p}/nowhere"], "does not exist"),
    (["list", "{p}/nowhere"], "does not exist"),
    (["list", "{p}/step-1/__0_0.distcp"], "is not a folder"),
    (["list", "memory://bucket/ckpt"], "cannot keep checkpoints at memory://"),
    (["prune", "{p}/step-1", "--keep", "1"], "is a checkpoint: prune takes the folder that "
                                              "holds checkpoints"),
    (["prune", "{p}", "--keep", "0"], "0 is not in the range x>=1"),
    (["prune", "{p}"], "Missing option '--keep'"),
])
def test_bad_input_is_one_error_line_and_exit_2(parent: Path, args: list[str],
                                                message: str) -> None:
    result = run("checkpoint", *[a.format(p=parent) for a in args])
    assert result.exit_code == 2, result.output
    first, *rest = result.stderr.splitlines()
    assert first.startswith("error: ") and message in first
    assert all(line.startswith("hint: ") for line in rest) and "Traceback" not in result.output


def test_an_error_with_json_is_also_a_json_document(parent: Path) -> None:
    result = run("checkpoint", "verify", str(parent / "notes"), "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["type"] == "CheckpointError" and error["exit_code"] == 2
    assert "is not a checkpoint" in error["message"]


def test_prune_removes_only_older_complete_checkpoints(parent: Path) -> None:
    before = sorted(os.listdir(parent))
    result = run("checkpoint", "prune", str(parent), "--keep", "1", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["dry_run"] and [c["name"] for c in doc["removed"]] == ["step-1"]
    assert [c["name"] for c in doc["kept"]] == ["step-2"]
    assert [c["name"] for c in doc["incomplete"]] == ["step-3"]
    assert sorted(os.listdir(parent)) == before  # nothing removed
    result = run("checkpoint", "prune", str(parent), "--keep", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("removed step-1 (")
    assert "removed 1 checkpoint" in result.stdout and "kept 1 complete and 1 incomplete" \
        in result.stdout
    assert sorted(os.listdir(parent)) == ["notes", "step-2", "step-3"]
    # keep=1 never removes the newest complete one, however old.
    os.utime(parent / "step-2" / METADATA, (time.time() - 10**6,) * 2)
    doc = json.loads(run("checkpoint", "prune", str(parent), "--keep", "1", "--json").stdout)
    assert doc["removed"] == [] and [c["name"] for c in doc["kept"]] == ["step-2"]


def test_a_removed_checkpoint_keeps_files_ucstage_did_not_write(parent: Path) -> None:
    (parent / "step-1" / "notes.txt").write_text("mine")
    doc = json.loads(run("checkpoint", "prune", str(parent), "--keep", "1", "--json").stdout)
    assert doc["left"] == {str(parent / "step-1"): ["notes.txt"]}
    assert os.listdir(parent / "step-1") == ["notes.txt"]


def test_names_with_control_characters_are_shown_escaped(tmp_path: Path) -> None:
    save(tmp_path / "step-\x1b[31mred")
    result = run("checkpoint", "list", str(tmp_path))
    assert "\x1b" not in result.stdout and "step-\\x1b[31mred" in result.stdout
    result = run("checkpoint", "verify", str(tmp_path / "nowhere\x1b[2J"))
    assert result.exit_code == 2 and "\x1b" not in result.stderr and "\\x1b[2J" in result.stderr


def test_the_json_documents_match_docs_json_md(parent: Path) -> None:
    result = run("checkpoint", "list", str(parent), "--json")
    assert_matches("json.md", "`ucstage checkpoint list`", json.loads(result.stdout))
    (parent / "step-2" / "__0_1.distcp").unlink()
    result = run("checkpoint", "verify", str(parent / "step-2"), "--json")
    assert result.exit_code == 1
    assert_matches("json.md", "`ucstage checkpoint verify`", json.loads(result.stdout))
    result = run("checkpoint", "prune", str(parent), "--keep", "1", "--json")
    doc = json.loads(result.stdout)
    assert doc["removed"] and doc["kept"] and doc["incomplete"]
    assert_matches("json.md", "`ucstage checkpoint prune`", doc)
