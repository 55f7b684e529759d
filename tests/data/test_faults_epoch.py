"""The network faults of tests/cache/test_faults.py under a VolumeDataset
epoch: a DataLoader with 2 workers (forkserver, each on its own obstore
client) reads moto through the fault proxy, and every file it hands out is
right; the epoch's counters say which check the copies got."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch.utils.data as tud

from tests.common import faults as faultkit
from tests.common.backends import make_source
from tests.common.faults import Faults
from ucstage import DataLoader, VolumeDataset
from ucstage.data import holding

KB = 1024
fault_proxy = faultkit.fault_proxy


class Named(tud.IterableDataset):  # type: ignore[type-arg]
    """Each file's relative name and bytes, read in the worker."""

    def __init__(self, paths: VolumeDataset) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for path in self.paths:
            with open(path, "rb") as fh:
                yield {"name": os.path.basename(path), "data": fh.read()}


@pytest.mark.parametrize("kind", ["flip", "reset", "stall"])
def test_an_epoch_through_faults_hands_out_only_right_bytes(
        fault_proxy: Faults, kind: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", "8")
    if kind != "stall":
        # The proxy faults floor(GETs x share) requests, so the count below
        # holds only while every GET is a fetch or its retry. A hedged GET is
        # a second GET by design, and with read_ahead="auto" keeping dozens in
        # flight against moto on a loaded machine, late headers fire hedges
        # (6 faults for 60 files in one fresh-clone run). A stall is the case
        # hedges are for: there they stay on.
        monkeypatch.setenv("UCSTAGE_HEDGE", "0")
    files = {f"f{i:03}.bin": os.urandom(64 * KB) for i in range(60)}
    src = make_source("s3", "", files)
    fault_proxy.set(kind, 0.05, prefix=src[len("s3://"):])
    ds = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Named(ds), batch_size=None, num_workers=2, log_mlflow=False)
    before = holding.rank_stats(ds, 0)
    got = list(loader)
    assert sorted(g["name"] for g in got) == sorted(files)
    assert all(g["data"] == files[g["name"]] for g in got)
    assert fault_proxy.done[kind] == 3
    metrics = holding.epoch_metrics(ds, 0, before)
    assert metrics["epoch_checked_md5"] == 60 and metrics["epoch_checked_size"] == 0
    assert metrics["epoch_check_mismatches"] == (3 if kind == "flip" else 0)
    if kind == "stall":
        assert max(fault_proxy.stalls) < 8
