"""Interop, same layout: torchdata's StatefulDataLoader over a VolumeDataset
resumes mid-epoch from the states VolumeDataset.state_dict() gives it."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.common.resume import make_named_volume
from ucstage.data import VolumeDataset
from ucstage.resume import FORMAT

stateful = pytest.importorskip("torchdata.stateful_dataloader",
                               reason="torchdata is not installed")
pytestmark = [pytest.mark.fuse]


def names(batch: list[str]) -> list[str]:
    out = []
    for local in batch:
        with open(local, encoding="utf-8") as fh:
            out.append(fh.read())
    return out


def dataset_states(state: object) -> list[dict]:  # type: ignore[type-arg]
    if isinstance(state, dict):
        if state.get("format") == FORMAT:
            return [state]
        return [d for key in sorted(state) for d in dataset_states(state[key])]
    return []


@pytest.mark.parametrize("workers", [2, 0])
def test_stateful_dataloader_resumes_a_volume_dataset(fuse_volume, workers) -> None:  # type: ignore[no-untyped-def]
    source, listing = make_named_volume(fuse_volume, 203)
    loader = stateful.StatefulDataLoader(VolumeDataset(source, shuffle=True, seed=5),
                                         batch_size=4, num_workers=workers)
    before: list[str] = []
    for step, batch in enumerate(loader):
        before += names(batch)
        if step == 4:  # 5 batches: not a multiple of the 2 workers
            break
    state = loader.state_dict()
    # The worker (or main process) states are VolumeDataset's own, so torchdata
    # restores them instead of naively re-reading the first 20 files.
    assert [d["segments"][0]["delivered"] for d in dataset_states(state)] \
        == ([[12, None], [None, 8]] if workers else [[20]])
    resumed = stateful.StatefulDataLoader(VolumeDataset(source, shuffle=True, seed=5),
                                          batch_size=4, num_workers=workers)
    resumed.load_state_dict(state)
    after = [name for batch in resumed for name in names(batch)]
    assert len(before) == 20
    assert Counter(before + after) == Counter(listing)
