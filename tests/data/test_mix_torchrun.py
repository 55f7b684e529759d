"""ucstage.Mix under torchrun: 2 ranks on gloo, 2 persistent workers each,
two sources on the rclone FUSE volume (100 and 50 files at 0.5/0.5 over 200
items). Checked against `ucstage shard-plan A B --weights --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from tests.common.parts import REPO, free_port, unique, wait_synced

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

WORKER = os.path.join(REPO, "tests", "workers", "mix_worker.py")


def make_source(fuse_volume: tuple[str, str], label: str, n: int) -> str:
    backing, mnt = fuse_volume
    key = unique(f"mix-{label}")
    for i in range(n):
        path = os.path.join(backing, key, f"d{i % 2}", f"{label}{i:03d}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(f"{label}{i:03d}")
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    return os.path.join(mnt, key)


def test_two_ranks_mix_by_weight_as_the_plan_says(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a, b = make_source(fuse_volume, "a", 100), make_source(fuse_volume, "b", 50)
    out = str(tmp_path / "out")
    os.makedirs(out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", WORKER, a, b, out]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(),
               UCSTAGE_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks: list[dict[str, Any]] = []
    for rank in (0, 1):
        with open(os.path.join(out, f"rank{rank}.json"), encoding="utf-8") as fh:
            ranks.append(json.load(fh))
    plan = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", a, b, "-w", "2",
                           "-k", "2", "--weights", "0.5,0.5", "--epoch-size", "200", "--seed",
                           "3", "--json"], capture_output=True, text=True, env=env)
    assert plan.returncode == 0, plan.stderr
    planned = {(s["rank"], s["worker"]): s["items"] for s in json.loads(plan.stdout)["slots"]}
    orders = []
    for epoch in (0, 1):
        items: Counter[str] = Counter()
        for r in ranks:
            e = r["epochs"][epoch]
            for worker, got in e["items"].items():
                per = Counter(i[0] for i in got)
                assert [per["a"], per["b"]] == planned[(r["rank"], int(worker))]
                items.update(got)
            mine = sum(len(v) for v in e["items"].values())
            assert e["len"] == mine == e["batches"] == 100  # equal batch counts per rank
            assert sum(e["source_items"].values()) == mine
            assert e["audit_ok"]
            assert e["audit_sources"] == [["a", 100, 0, 0], ["b", 100, 0, 0]]
        # a read once, b twice (two passes), over both ranks.
        assert items == Counter({f"a{i:03d}": 1 for i in range(100)}
                                | {f"b{i:03d}": 2 for i in range(50)})
        orders.append([r["epochs"][epoch]["items"] for r in ranks])
    assert orders[0] != orders[1]
    resumed = Counter(i for r in ranks for i in r["resume"]["before"] + r["resume"]["after"])
    assert sum(resumed.values()) == 200 and Counter(i[0] for i in resumed.elements()) == {
        "a": 100, "b": 100}
    assert all(r["resume"]["audit_ok"] and r["resume"]["resumed"] == 24 for r in ranks)
