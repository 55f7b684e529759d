"""Mid-epoch resume under torchrun (gloo) over the FUSE volume: 2 ranks x 2
workers stop after 5 batches, 3 ranks x 1 worker finish the epoch from the
gathered state; the exactly-once audit counts both runs. Then the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from tests.common.parts import REPO, free_port
from tests.common.resume import make_named_volume

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

WORKER = os.path.join(REPO, "tests", "workers", "resume_worker.py")
N = 203


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           WORKER, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def results(out: str, ranks: int) -> list[dict[str, Any]]:
    found = []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as fh:
            found.append(json.load(fh))
    return found


@pytest.fixture(scope="module")
def interrupted(fuse_volume, tmp_path_factory):  # type: ignore[no-untyped-def]
    source, names = make_named_volume(fuse_volume, N)
    out = str(tmp_path_factory.mktemp("first"))
    proc = torchrun(2, "first", source, out, "5")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(out, 2)
    state = os.path.join(out, "state.json")
    with open(state, "w", encoding="utf-8") as fh:
        json.dump(ranks[0]["merged"], fh)
    return source, names, ranks, state


def test_resume_on_three_ranks_delivers_the_epoch_exactly_once(interrupted, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, names, first, state = interrupted
    before = [item for r in first for item in r["items"]]
    assert len(before) == 2 * 5 * 4
    # gather=True gives every rank the same global state; the ranks' own
    # states hold only their slots.
    assert first[0]["merged"] == first[1]["merged"]
    assert first[0]["merged"]["segments"][0]["delivered"] == [12, 8, 12, 8]
    assert first[1]["state"]["segments"][0]["delivered"] == [None, None, 12, 8]
    for r in first:  # both left the epoch early: the audit was skipped, saying why
        assert r["audits"] == []
        assert any("left the epoch early" in w for w in r["warnings"])

    proc = torchrun(3, "resume", source, str(tmp_path), state, "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = results(str(tmp_path), 3)
    after = [item for r in resumed for item in r["epochs"]["0"]]
    assert Counter(before + after) == Counter(names)
    nxt = [item for r in resumed for item in r["epochs"]["1"]]
    assert Counter(nxt) == Counter(names)  # the next epoch: the new layout, from the start
    for r in resumed:
        first_audit, second_audit = r["audits"]
        assert first_audit == {"epoch": 0, "files": N, "duplicates": 0, "gaps": 0, "skipped": 0,
                               "expected_duplicates": 0, "expected_gaps": 0,
                               "resumed_files": 40, "coverage_ok": True,
                               "sources": []}  # one source: no per-source split
        assert second_audit["resumed_files"] == 0 and second_audit["coverage_ok"]
        assert not r["warnings"]


def test_a_state_one_rank_cannot_honour_stops_every_rank(interrupted, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, _, _, state = interrupted
    proc = torchrun(2, "refuse", source, str(tmp_path), state)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(str(tmp_path), 2)
    for r in ranks:
        assert "rank 1: cannot resume epoch 0" in r["refused"]
        assert "seed 3 in the state, 4 here" in r["refused"]
    # Rank 1 never finished the epoch: rank 0's audit waited its 3 s, warned, went on.
    assert ranks[0]["rest"] > 0 and ranks[0]["audits"] == []
    assert any("audit of epoch 0 skipped: not every rank" in w for w in ranks[0]["warnings"])
