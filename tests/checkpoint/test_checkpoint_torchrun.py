"""Checkpoints through the stage under torchrun (gloo), on each real part: 2
ranks save a model, its optimizer, a row-sharded DTensor (the bulk: about
300 MB in all) and the loader's state with ``dcp.async_save`` to an rclone
FUSE volume (``/Volumes/...`` through ``$UCSTAGE_VOLUMES_ROOT``), moto S3,
fake-gcs-server and Azurite; 1 rank loads it, resharded, gets equal
tensors and finishes the epoch, each sample once. Then a rank killed with
SIGKILL mid-upload to a folder."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from tests.checkpoint.conftest import (
    kill_a_rank_mid_upload,
    load_on_one_rank_and_check,
    make_samples,
    torchrun,
)
from ucstage.checkpoint import Reader, Writer
from ucstage.checkpoint.folder import METADATA, RECORD, read_record
from ucstage.checkpoint.place import place
from ucstage.checkpoint.retention import list_checkpoints
from ucstage.checkpoint.writer import STALE_SECONDS
from ucstage.cli.app import cli
from ucstage.errors import CheckpointCorrupt, CheckpointIncomplete

pytestmark = [pytest.mark.torchrun]

K = 3
"""Batches each rank trains before the save (4 samples a batch)."""
ROWS = 72 * 1024
"""Rows of the worker's ``big`` tensor: 288 MiB of float32, 144 MiB a rank
(the model and the optimizer add under 4 MB)."""
BUCKET = "ucstage-test"


@pytest.fixture
def destination(request: pytest.FixtureRequest, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """(the checkpoint path a job is given, the path ``list`` shows for it)
    on the part ``request.param`` names; removed afterwards, so that the
    stores' servers do not hold hundreds of MB for the rest of the session."""
    part = request.param
    if part == "fuse":
        backing, mnt = request.getfixturevalue("writable_volume")
        key = os.path.basename(str(tmp_path))
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", mnt)
        yield f"/Volumes/main/{key}/ckpt/step-{K}", os.path.join(mnt, "main", key, "ckpt",
                                                                   f"step-{K}")
        shutil.rmtree(os.path.join(backing, "main", key), ignore_errors=True)
        return
    request.getfixturevalue({"s3": "moto", "gs": "gcs", "az": "azurite"}[part])
    dest = f"{part}://{BUCKET}/dist-{uuid.uuid4().hex[:8]}/step-{K}"
    yield dest, dest
    at = place(dest)
    for name in at.files() or {}:
        at.remove(name)


@pytest.mark.parametrize("destination", [pytest.param("fuse", marks=pytest.mark.fuse),
                                         pytest.param("s3", marks=pytest.mark.s3), "gs", "az"],
                         indirect=True)
def test_two_ranks_save_hundreds_of_mb_and_one_rank_loads_them_resharded(
        destination: tuple[str, str], tmp_path: Path) -> None:
    dest, shown = destination
    source = str(tmp_path / "samples")
    names = make_samples(source)
    out = tmp_path / "out"
    out.mkdir()
    proc = torchrun(2, "save", source, dest, str(out), str(K), str(ROWS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # Published: both ranks' files, the record naming them, .metadata; nothing else.
    at = place(dest)
    landed = {name: size for name, (size, _) in (at.files() or {}).items()}
    assert sorted(landed) == sorted([METADATA, RECORD, "__0_0.distcp", "__1_0.distcp"])
    record = read_record(dest)
    assert record is not None and record.world_size == 2
    assert [(f.name, f.rank) for f in record.files] == [("__0_0.distcp", 0), ("__1_0.distcp", 1)]
    for f in record.files:  # each rank's half of big, whole
        assert landed[f.name] == f.size > ROWS * 4096 // 2
    # No rank left its scratch behind.
    scratch = os.path.join(os.environ["UCSTAGE_CACHE_DIR"], ".ucstage", "checkpoints")
    assert os.listdir(scratch) == []

    load_on_one_rank_and_check(source, dest, out, names, K, ROWS)

    runner = CliRunner()
    result = runner.invoke(cli, ["checkpoint", "list", os.path.dirname(dest), "--json"])
    assert result.exit_code == 0, result.output
    (ckpt,) = json.loads(result.stdout)["checkpoints"]
    assert (ckpt["name"], ckpt["complete"], ckpt["ranks"], ckpt["files"], ckpt["path"]) == \
        (f"step-{K}", True, 2, 2, shown)
    assert ckpt["bytes"] == landed["__0_0.distcp"] + landed["__1_0.distcp"]
    result = runner.invoke(cli, ["checkpoint", "verify", dest, "--json"])
    assert result.exit_code == 0, result.output
    assert [f["status"] for f in json.loads(result.stdout)["files"]] == ["ok", "ok"]

    # A rank's file gone: the load is refused before it starts, naming it.
    at.remove("__1_0.distcp")
    with pytest.raises(CheckpointCorrupt, match=r"is missing __1_0\.distcp \(rank 1's file"):
        Reader(dest)


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
