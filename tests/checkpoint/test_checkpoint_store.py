"""Checkpoints on object stores (moto S3, fake-gcs-server, Azurite): a round
trip with multipart uploads checked against what each store reports, ranged
loads refetching a flipped byte and riding out throttling through the fault
proxy, list/verify/prune and keep=N on a store, and under torchrun (gloo) a
rank killed with SIGKILL mid-upload to s3:// (the 2-rank save of hundreds of
MB to each store: test_checkpoint_torchrun.py)."""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner
from torch.distributed.checkpoint.api import CheckpointException

from tests.checkpoint.conftest import equal, kill_a_rank_mid_upload, make_samples, torchrun
from tests.common import faults as faultkit
from tests.common.faults import Faults
from ucstage.checkpoint import Reader, Writer, latest
from ucstage.checkpoint.folder import METADATA, RECORD, read_record
from ucstage.checkpoint.place import place
from ucstage.checkpoint.retention import list_checkpoints
from ucstage.cli.app import cli
from ucstage.engines import objput
from ucstage.errors import CheckpointCorrupt, CheckpointError, CheckpointIncomplete

BUCKET = "ucstage-test"
fault_proxy = faultkit.fault_proxy


def _state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    # 12 MB in one tensor: a multipart upload of 3 parts at 5 MiB a part.
    return {"big": torch.randn(3 * 1024 * 1024, generator=g),
            "small": torch.arange(100, dtype=torch.float32) * seed, "step": seed,
            "loader": json.dumps({"epoch": 1, "seen": [seed, 2]})}


def _empty() -> dict[str, Any]:
    return {"big": torch.zeros(3 * 1024 * 1024), "small": torch.zeros(100), "step": 0,
            "loader": ""}


def _keys(url: str) -> dict[str, int]:
    at = place(url)
    return {n: s for n, (s, _) in (at.files() or {}).items()}


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objput, "PART", 5 * 1024 * 1024)  # S3's smallest part


@pytest.fixture(params=["s3", "gs", "az"])
def store_url(request: pytest.FixtureRequest, small_parts: None) -> str:
    kind = request.param
    request.getfixturevalue({"s3": "moto", "gs": "gcs", "az": "azurite"}[kind])
    return f"{kind}://{BUCKET}/ckpt-{uuid.uuid4().hex[:8]}"


def test_a_round_trip_on_each_store_is_checked_and_loadsequal(store_url: str) -> None:
    dest = f"{store_url}/step-1"
    saved = _state(1)
    dcp.save(saved, storage_writer=Writer(dest))
    keys = _keys(dest)
    assert sorted(keys) == sorted([METADATA, RECORD, "__0_0.distcp"])
    record = read_record(dest)
    assert record is not None and record.world_size == 1
    (f,) = record.files
    assert f.size == keys["__0_0.distcp"] > 12 * 1024 * 1024
    assert latest(store_url) == dest
    loaded = _empty()
    dcp.load(loaded, storage_reader=Reader(dest))
    assert equal(saved, loaded)
    result = CliRunner().invoke(cli, ["checkpoint", "verify", dest, "--json"])
    assert result.exit_code == 0, result.output
    assert [c["status"] for c in json.loads(result.stdout)["files"]] == ["ok"]


def test_s3_puts_are_checked_by_etag_multipart_included(moto: Any, small_parts: None,
                                                        tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "f"
    data = os.urandom(11 * 1024 * 1024 + 7)
    path.write_bytes(data)
    key = f"put-{uuid.uuid4().hex[:8]}"
    put = objput.put_file("s3", BUCKET, key, str(path), "crc32c")
    assert put.how == "etag" and put.size == len(data)
    assert put.checksum == objput.read_back("s3", BUCKET, key, "crc32c")[1]
    small = objput.put_file("s3", BUCKET, key + "-small", str(path), "md5")
    assert small.how == "etag"


def test_a_byte_flipped_on_the_way_is_fetched_again(fault_proxy: Faults, small_parts: None) -> None:
    dest = f"s3://{BUCKET}/flip-{uuid.uuid4().hex[:8]}/step-1"
    saved = _state(2)
    dcp.save(saved, storage_writer=Writer(dest))
    key = dest[len("s3://"):] + "/__0_0.distcp"
    fault_proxy.set("flip", [key], attempts=1)
    loaded = _empty()
    dcp.load(loaded, storage_reader=Reader(dest))
    assert fault_proxy.done["flip"] == 1
    assert equal(saved, loaded)
    # Ranged GETs only: each of the file's items by its own range, none whole.
    assert fault_proxy.ranges and all(k == key for k, *_ in fault_proxy.ranges)

    # Damaged at rest: every read differs, the load fails (past the local
    # cache, which holds the ranges the first load checked).
    fault_proxy.set("corrupt", [key])
    with pytest.raises(CheckpointException) as info:
        dcp.load(_empty(), storage_reader=Reader(dest, cache=False))
    ((err, _),) = info.value.failures.values()
    assert isinstance(err, CheckpointCorrupt)
    assert "__0_0.distcp fail their checksum (3 reads)" in str(err)


def test_a_dropped_upload_is_sent_again_and_a_store_that_keeps_dropping_it_fails_in_one_line(
        fault_proxy: Faults, small_parts: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A PUT whose connection is reset (a store, or an emulator on a loaded
    machine, drops one now and then) is sent again; one that fails more than
    TRANSIENT_RETRIES times in a row fails the upload with a one-line error."""
    path = tmp_path / "f"
    data = os.urandom(11 * 1024 * 1024 + 7)  # 3 parts: a multipart upload
    path.write_bytes(data)
    key = f"{BUCKET}/drop-{uuid.uuid4().hex[:8]}"
    bucket, _, name = key.partition("/")
    fault_proxy.put_resets = 1
    put = objput.put_file("s3", bucket, name, str(path), "crc32c")
    assert fault_proxy.done["put_reset"] == 1
    assert put.size == len(data)
    assert put.checksum == objput.read_back("s3", bucket, name, "crc32c")[1]

    fault_proxy.put_resets = 1 << 30  # every PUT from now on
    started = fault_proxy.uploads
    with pytest.raises(OSError) as info:
        objput.put_file("s3", bucket, name + "-2", str(path), "crc32c")
    assert "\n" not in str(info.value) and name + "-2" in str(info.value)
    # The first try and TRANSIENT_RETRIES more, each a multipart upload of its own.
    assert fault_proxy.uploads - started == 1 + objput.TRANSIENT_RETRIES
    fault_proxy.put_resets = 0


def test_a_throttling_store_is_ridden_out(fault_proxy: Faults) -> None:
    prefix = f"{BUCKET}/slow-{uuid.uuid4().hex[:8]}"
    dest = f"s3://{prefix}/step-1"
    saved = {f"t{i}": torch.full((1000,), float(i)) for i in range(16)}
    dcp.save(saved, storage_writer=Writer(dest))
    # 5 GETs a second: the load's 16 ranged GETs (one per item, kept in the
    # local cache as they come) outrun it however fast the machine is.
    fault_proxy.limit(5.0, burst=1.0, prefix=prefix)
    loaded = {f"t{i}": torch.zeros(1000) for i in range(16)}
    dcp.load(loaded, storage_reader=Reader(dest))
    assert fault_proxy.done["throttled"] > 0
    assert equal(saved, loaded)


def test_list_verify_and_prune_on_a_store(moto: Any) -> None:
    parent = f"s3://{BUCKET}/many-{uuid.uuid4().hex[:8]}"
    for step in (1, 2, 3):
        dcp.save({"x": torch.full((10,), float(step))},
                 storage_writer=Writer(f"{parent}/step-{step}"))
    runner = CliRunner()
    result = runner.invoke(cli, ["checkpoint", "list", parent, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)["checkpoints"]
    assert [(c["name"], c["complete"], c["path"]) for c in found] == \
        [(f"step-{s}", True, f"{parent}/step-{s}") for s in (1, 2, 3)]
    # A complete checkpoint is never written over (refused in the save's own
    # thread on a store: making the Writer lists nothing).
    with pytest.raises(CheckpointException) as info:
        dcp.save({"x": torch.ones(10)}, storage_writer=Writer(f"{parent}/step-3"))
    ((err, _),) = info.value.failures.values()
    assert isinstance(err, CheckpointError) and "already exists and is complete" in str(err)
    result = runner.invoke(cli, ["checkpoint", "prune", parent, "--keep", "2", "--json"])
    assert result.exit_code == 0, result.output
    assert [c["name"] for c in json.loads(result.stdout)["removed"]] == ["step-1"]
    assert _keys(f"{parent}/step-1") == {}
    assert [c.name for c in list_checkpoints(parent)] == ["step-2", "step-3"]
    # keep=N on a save prunes the same way.
    dcp.save({"x": torch.ones(10)}, storage_writer=Writer(f"{parent}/step-4", keep=1))
    assert [c.name for c in list_checkpoints(parent)] == ["step-4"]
    # A file removed behind the store's back: verify names it, exit 1.
    place(f"{parent}/step-4").remove("__0_0.distcp")
    result = runner.invoke(cli, ["checkpoint", "verify", f"{parent}/step-4", "--json"])
    assert result.exit_code == 1
    assert [c["status"] for c in json.loads(result.stdout)["files"]] == ["missing"]
    with pytest.raises(CheckpointCorrupt, match=r"step-4 is missing __0_0\.distcp"):
        Reader(f"{parent}/step-4")


@pytest.mark.torchrun
def test_a_rank_killed_mid_upload_to_s3_leaves_the_previous_checkpoint(moto: Any, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source = str(tmp_path / "samples")
    make_samples(source)
    out = tmp_path / "out"
    out.mkdir()
    parent = f"s3://{BUCKET}/killed-{uuid.uuid4().hex[:8]}"
    kill_a_rank_mid_upload(source, parent, str(out), 3)
    found = {c.name: c for c in list_checkpoints(parent)}
    assert sorted(found) == ["step-1", "step-2"]
    assert found["step-1"].complete and not found["step-2"].complete
    assert "__1_0.distcp" in found["step-2"].files  # half of it landed, then the kill
    assert latest(parent) == f"{parent}/step-1"
    with pytest.raises(CheckpointIncomplete, match=r"step-2 is incomplete"):
        Reader(f"{parent}/step-2")
    result = CliRunner().invoke(cli, ["checkpoint", "list", parent, "--json"])
    # Sorted: an incomplete one's age is its newest object's, which S3 keeps to the second.
    assert sorted((c["name"], c["complete"]) for c in json.loads(result.stdout)["checkpoints"]) \
        == [("step-1", True), ("step-2", False)]
    load = torchrun(1, "load", source, f"{parent}/step-1", str(out))
    assert load.returncode == 0, load.stdout[-3000:] + load.stderr[-3000:]


def test_volumes_mapped_to_a_store_and_abfss_urls(moto: Any, azurite: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    run = uuid.uuid4().hex[:8]
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", f"s3://{BUCKET}/vols-{run}")
    dest = "/Volumes/main/ml/ckpt/step-1"
    dcp.save({"x": torch.arange(10.0)}, storage_writer=Writer(dest))
    assert sorted(_keys(f"s3://{BUCKET}/vols-{run}/main/ml/ckpt/step-1")) == \
        sorted([METADATA, RECORD, "__0_0.distcp"])
    assert latest("/Volumes/main/ml/ckpt") == f"s3://{BUCKET}/vols-{run}/main/ml/ckpt/step-1"
    loaded = {"x": torch.zeros(10)}
    dcp.load(loaded, storage_reader=Reader(dest))
    assert torch.equal(loaded["x"], torch.arange(10.0))

    account = "devstoreaccount1"  # Azurite's
    url = f"abfss://{BUCKET}@{account}.dfs.core.windows.net/abfss-{run}/step-1"
    dcp.save({"y": torch.ones(5)}, storage_writer=Writer(url))
    found = list_checkpoints(f"abfss://{BUCKET}@{account}.dfs.core.windows.net/abfss-{run}")
    assert [(c.name, c.complete) for c in found] == [("step-1", True)]
    loaded = {"y": torch.zeros(5)}
    dcp.load(loaded, storage_reader=Reader(url))
    assert torch.equal(loaded["y"], torch.ones(5))


def test_a_cancelled_upload_stops_mid_file_and_leaves_no_object(moto: Any, small_parts: None,
                                                               tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ucstage.checkpoint.place import StorePlace
    from ucstage.checkpoint.upload import Cancelled, ObjectDestination

    path = tmp_path / "f"
    path.write_bytes(os.urandom(30 * 1024 * 1024))
    url = f"s3://{BUCKET}/cancel-{uuid.uuid4().hex[:8]}"
    at = place(url)
    assert isinstance(at, StorePlace)
    dest = ObjectDestination(at)
    sent = [0]
    real = dest._go_on

    def go_on(n: int = 0) -> None:
        sent[0] += n
        if sent[0] > 10 * 1024 * 1024:
            dest.cancel()  # Ctrl-C, from another thread in a save
        real(n)

    dest._go_on = go_on  # type: ignore[method-assign]
    with pytest.raises(Cancelled, match="was stopped"):
        dest.put(str(path), "__0_0.distcp", "crc32c")
    assert sent[0] < 30 * 1024 * 1024  # stopped at a block, not after the file
    assert _keys(url) == {}  # the multipart upload was never completed
