"""Grouped samples under torchrun: 300 samples of .jpg + .json (and a few
incomplete ones) on the rclone FUSE volume, 2 ranks on gloo x 2 DataLoader
workers, two shuffled epochs. Every sample arrives exactly once per epoch,
whole, with both members cached, and the loader's audit agrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from tests.common.parts import REPO, free_port, unique, wait_synced

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

WORKER = os.path.join(REPO, "tests", "workers", "group_worker.py")
N_SAMPLES = 300


def test_every_sample_once_per_epoch_whole_and_cached(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    backing, mnt = fuse_volume
    key = unique("grouped")
    names = []
    for i in range(N_SAMPLES + 3):
        suffixes = ("jpg", "json") if i < N_SAMPLES else ("jpg",)  # 3 incomplete samples
        for suffix in suffixes:
            name = f"p{i % 7}/{i:05d}.{suffix}"
            path = os.path.join(backing, key, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(name)
            names.append(name)
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER,
           os.path.join(mnt, key), str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(),
               UCSTAGE_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dropped 3 of 303 samples" in done.stderr
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    want = {f"p{i % 7}/{i:05d}" for i in range(N_SAMPLES)}
    orders = []
    for epoch in (0, 1):
        items = [tuple(item) for r in ranks for item in r["epochs"][epoch]["items"]]
        keys = Counter(k for k, _, _ in items)
        assert keys == Counter(want), epoch  # exactly once, incomplete ones dropped
        assert all(members == ["jpg", "json"] and ok for _, members, ok in items)
        # The two ranks read disjoint samples: no sample was split between them.
        per_rank = [{i[0] for i in r["epochs"][epoch]["items"]} for r in ranks]
        assert not per_rank[0] & per_rank[1] and len(per_rank[0]) == 150
        audit = ranks[0]["epochs"][epoch]["audit"]
        assert audit is not None and audit["coverage_ok"] and audit["files"] == N_SAMPLES
        orders.append([k for k, _, _ in ranks[0]["epochs"][epoch]["items"]])
    assert orders[0] != orders[1]  # shuffled per epoch, by sample
    assert ranks[0]["len"] == ranks[1]["len"] == 150
