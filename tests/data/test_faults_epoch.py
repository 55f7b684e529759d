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
from ucstage.data import slotread

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
    if kind == "flip":
        # The proxy faults the first GET of 3 named files, whatever else is
        # sent; but a hedge that won against a flipped response would leave
        # its mismatch unseen, and the mismatch count below is exact.
        monkeypatch.setenv("UCSTAGE_HEDGE", "0")
    files = {f"f{i:03}.bin": os.urandom(64 * KB) for i in range(60)}
    src = make_source("s3", "", files)
    fault_proxy.set(kind, faultkit.every(files, 20), prefix=src[len("s3://"):])
    ds = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    loader = DataLoader(Named(ds), batch_size=None, num_workers=2, log_mlflow=False)
    before = slotread.rank_stats(ds, 0)
    got = list(loader)
    assert sorted(g["name"] for g in got) == sorted(files)
    assert all(g["data"] == files[g["name"]] for g in got)
    assert fault_proxy.done[kind] == 3
    metrics = slotread.epoch_metrics(ds, 0, before)
    assert metrics["epoch_checked_md5"] == 60 and metrics["epoch_checked_size"] == 0
    assert metrics["epoch_check_mismatches"] == (3 if kind == "flip" else 0)
    if kind == "stall":
        assert fault_proxy.dropped() == 3  # the client dropped each


def test_an_epoch_raises_on_a_corrupt_object_rather_than_serving_it(
        fault_proxy: Faults, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One object read back with the same wrong byte on every GET, the
    others matching their MD5 ETags: the epoch stops naming it, and no copy
    of it is cached (the source is not taken to serve ETags that are not MD5s)."""
    from ucstage.cache import LocalCache
    from ucstage.engines import checks
    from ucstage.errors import FetchFailed

    files = {f"f{i:03}.bin": os.urandom(64 * KB) for i in range(12)}
    bad = "f011.bin"
    src = make_source("s3", "", files)
    fault_proxy.set("corrupt", [bad], prefix=src[len("s3://"):])
    ds = VolumeDataset(src, cache_dir=str(tmp_path / "cache"))
    served: dict[str, bytes] = {}
    with pytest.raises(FetchFailed, match=f"{bad}.*corrupt"):
        for path in ds:
            with open(path, "rb") as fh:
                served[os.path.basename(path)] = fh.read()
    assert bad not in served
    assert all(data == files[name] for name, data in served.items())
    assert checks.marked() == set()
    cache = LocalCache(str(tmp_path / "cache"))
    from ucstage.manifest import snapshot

    m = snapshot(src)
    [entry] = [e for e in m.entries if e.path == bad]
    assert cache.lookup(m.volume(), entry) is None
