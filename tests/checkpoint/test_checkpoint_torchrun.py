"""Checkpoints through the stage under torchrun (gloo): 2 ranks save model,
optimizer, a row-sharded DTensor and the loader's state with ``dcp.async_save``
into one checkpoint, on a local folder and on a writable rclone FUSE volume
(``/Volumes/...`` through ``$UCSTAGE_VOLUMES_ROOT``); 1 rank loads it,
resharded, gets equal tensors and finishes the epoch, each sample once. Then
a rank killed with SIGKILL mid-upload."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from tests.checkpoint.conftest import kill_a_rank_mid_upload, make_samples, torchrun
from ucstage.checkpoint import Reader, Writer
from ucstage.checkpoint.folder import METADATA, RECORD, read_record
from ucstage.checkpoint.retention import list_checkpoints
from ucstage.checkpoint.writer import STALE_SECONDS
from ucstage.cli.app import cli
from ucstage.errors import CheckpointCorrupt, CheckpointIncomplete

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

K = 3
"""Batches each rank trains before the save (4 samples a batch)."""


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.fixture(params=["folder", "fuse"])
def saved(request, tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """(checkpoint path as given, the folder it resolves to, its backing folder
    (the same for a local folder), samples source, names, out folder)."""
    source = str(tmp_path / "samples")
    names = make_samples(source)
    out = tmp_path / "out"
    out.mkdir()
    if request.param == "fuse":
        backing, mnt = request.getfixturevalue("writable_volume")
        key = os.path.basename(str(tmp_path))
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", mnt)
        dest = f"/Volumes/main/{key}/ckpt/step-{K}"
        local = os.path.join(backing, "main", key, "ckpt", f"step-{K}")
        folder = os.path.join(mnt, "main", key, "ckpt", f"step-{K}")
    else:
        dest = folder = local = str(tmp_path / "ckpt" / f"step-{K}")
    proc = torchrun(2, "save", source, dest, str(out), str(K))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return dest, folder, local, source, names, out


def test_two_ranks_save_and_one_rank_loads_resharded_with_an_exact_resume(saved) -> None:  # type: ignore[no-untyped-def]
    dest, _, local, source, names, out = saved
    # Published: both ranks' files, the record naming them, .metadata; nothing else.
    assert sorted(os.listdir(local)) == sorted([METADATA, RECORD, "__0_0.distcp", "__1_0.distcp"])
    record = read_record(local)
    assert record is not None and record.world_size == 2
    assert [(f.name, f.rank) for f in record.files] == [("__0_0.distcp", 0), ("__1_0.distcp", 1)]
    for f in record.files:
        assert os.path.getsize(os.path.join(local, f.name)) == f.size
    # No rank left its scratch behind.
    scratch = os.path.join(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "checkpoints")
    assert os.listdir(scratch) == []

    proc = torchrun(1, "load", source, dest, str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = torch.load(out / "expected.pt", weights_only=False)
    loaded = torch.load(out / "loaded.pt", weights_only=False)
    for key in ("model", "optim", "emb"):
        assert _equal(expected[key], loaded[key]), key
    assert loaded["step"] == K
    # The model the one rank trains on now holds the saved weights.
    assert _equal(expected["model"], loaded["net"])
    # 3 more steps ran after async_save returned: what was saved is the
    # state at the call, not the weights the upload raced with.
    before = []
    for rank in (0, 1):
        with open(out / f"rank{rank}.json", encoding="utf-8") as fh:
            before += json.load(fh)["items"]
    assert len(before) == 2 * K * 4
    with open(out / "load.json", encoding="utf-8") as fh:
        resumed = json.load(fh)
    assert Counter(before + resumed["items"]) == Counter(names)
    (audit,) = resumed["audits"]
    assert audit["coverage_ok"] and audit["duplicates"] == 0 and audit["gaps"] == 0
    assert audit["resumed_files"] == len(before) and audit["files"] == len(names)


def test_cli_lists_and_verifies_the_saved_checkpoint(saved) -> None:  # type: ignore[no-untyped-def]
    dest, folder, local, *_ = saved
    parent = os.path.dirname(dest)
    result = CliRunner().invoke(cli, ["checkpoint", "list", parent, "--json"])
    assert result.exit_code == 0, result.output
    (ckpt,) = json.loads(result.stdout)["checkpoints"]
    assert ckpt["name"] == f"step-{K}" and ckpt["complete"] and ckpt["ranks"] == 2
    assert ckpt["files"] == 2 and ckpt["path"] == folder
    assert ckpt["bytes"] == sum(os.path.getsize(os.path.join(local, f"__{r}_0.distcp"))
                                for r in (0, 1))
    result = CliRunner().invoke(cli, ["checkpoint", "verify", dest, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["ok"] and [f["status"] for f in doc["files"]] == ["ok", "ok"]


def test_a_checkpoint_missing_a_ranks_file_is_refused_naming_it(saved, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, _, local, *_ = saved
    damaged = str(tmp_path / "damaged")
    shutil.copytree(local, damaged)
    os.unlink(os.path.join(damaged, "__1_0.distcp"))
    with pytest.raises(CheckpointCorrupt, match=r"damaged is missing __1_0\.distcp \(rank 1's file"):
        Reader(damaged)
    result = CliRunner().invoke(cli, ["checkpoint", "verify", damaged])
    assert result.exit_code == 1
    assert "missing __1_0.distcp (rank 1)" in result.stdout
    assert "1 of 2 files are missing or differ from the record" in result.stderr


def test_a_rank_killed_mid_upload_leaves_the_previous_checkpoint_loadable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = str(tmp_path / "samples")
    names = make_samples(source)
    parent, out = tmp_path / "ckpt", tmp_path / "out"
    out.mkdir()
    kill_a_rank_mid_upload(source, str(parent), str(out), K)

    step1, step2 = str(parent / "step-1"), str(parent / "step-2")
    found = {c.name: c for c in list_checkpoints(str(parent))}
    assert sorted(found) == ["step-1", "step-2"]
    assert found["step-1"].complete and not found["step-2"].complete
    assert "__1_0.distcp" in found["step-2"].files  # half of it landed, then the kill
    with pytest.raises(CheckpointIncomplete, match=r"step-2 is incomplete: it has no \.metadata"):
        Reader(step2)
    result = CliRunner().invoke(cli, ["checkpoint", "list", str(parent), "--json"])
    assert [(c["name"], c["complete"]) for c in json.loads(result.stdout)["checkpoints"]] == \
        [("step-1", True), ("step-2", False)]
    result = CliRunner().invoke(cli, ["checkpoint", "verify", step2])
    assert result.exit_code == 1 and "incomplete" in result.stderr

    # The previous checkpoint loads, and resumes the epoch exactly.
    load = torchrun(1, "load", source, step1, str(out))
    assert load.returncode == 0, load.stdout[-3000:] + load.stderr[-3000:]
    with open(out / "load.json", encoding="utf-8") as fh:
        resumed = json.load(fh)
    (audit,) = resumed["audits"]
    assert audit["coverage_ok"] and audit["resumed_files"] == 2 * K * 4
    assert len(resumed["items"]) == len(names) - 2 * K * 4

    # The killed rank's scratch folder is swept by the next save on this node.
    scratch = os.path.join(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "checkpoints")
    (left,) = os.listdir(scratch)
    old = time.time() - 2 * STALE_SECONDS
    os.utime(os.path.join(scratch, left), (old, old))  # dead, and untouched long enough
    torch.distributed.checkpoint.save({"x": torch.ones(3)},
                                      storage_writer=Writer(str(parent / "step-3")))
    assert os.listdir(scratch) == []
