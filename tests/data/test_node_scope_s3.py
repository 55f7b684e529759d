"""Issue 12's proof from the shell: a 2-node job (two torchrun "nodes" on this
machine, 2 ranks each, each node with its own cache folder) reads a moto S3
volume, shuffled, for 3 epochs. Under the node scope every object crosses the
network once over the whole job; under the global scope many cross twice.

Fetches are counted twice over: per node from its cache folder (no cap, so a
node fetches an object at most once and keeps it), and per object from the
moto server's request log (every GET of an object, both nodes together).
Run with -s to print the figures docs/benchmarks.md records.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.common.parts import REPO, MotoServer, free_port, unique

pytestmark = [pytest.mark.torchrun]

WORKER = os.path.join(REPO, "tests", "workers", "epochs_worker.py")
N_FILES, EPOCHS, NODES, PER_NODE = 240, 3, 2, 2


def two_nodes(moto: MotoServer, source: str, scope: str, tmp: Path) -> list[dict[str, Any]]:
    """Run both nodes of one job at once; each rank's record, in rank order."""
    out = tmp / f"out-{scope}"
    out.mkdir()
    port = free_port()
    procs = []
    for node in range(NODES):
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
               f"--node_rank={node}", f"--nproc_per_node={PER_NODE}",
               "--master_addr=127.0.0.1", f"--master_port={port}",
               WORKER, source, str(out), scope, str(EPOCHS)]
        # UCSTAGE_HEDGE=0: a hedged GET is a second GET of one fetch by design
        # (tests/cache/test_faults.py), and on a loaded machine the latency
        # estimate fires hedges; the count below is of fetches.
        env = dict(os.environ, **moto.env(), OMP_NUM_THREADS="1", PYTHONPATH=REPO,
                   UCSTAGE_HEDGE="0",
                   UCSTAGE_CACHE_DIR=str(tmp / f"cache-{scope}-node{node}"))
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(NODES * PER_NODE)]
    assert [r["node"] for r in ranks] == [0, 0, 1, 1]
    assert {r["local_world_size"] for r in ranks} == {PER_NODE}
    return ranks


def cached(tmp: Path, scope: str, node: int) -> dict[str, int]:
    """The objects node ``node``'s cache holds (relative path -> bytes): what it fetched."""
    root = tmp / f"cache-{scope}-node{node}"
    found = {}
    for ns in (p for p in root.iterdir() if not p.name.startswith(".")):
        for path in ns.rglob("*.bin"):
            found[str(path.relative_to(ns))] = path.stat().st_size
    return found


def gets(moto: MotoServer, prefix: str) -> Counter[str]:
    moto.log.flush()
    log = Path(moto.log.name).read_text(errors="replace")
    return Counter(re.findall(rf"GET /ucstage-test/{prefix}/(\S+) HTTP", log))


def test_node_scope_fetches_each_object_once_over_a_multi_epoch_job(moto, tmp_path) -> None:  # type: ignore[no-untyped-def]
    fs = moto.filesystem()
    figures: dict[str, dict[str, Any]] = {}
    for scope in ("node", "global"):
        prefix = unique("epochs")  # a fresh volume per scope: moto's log counts each apart
        files = {f"c{i % 6}/f{i:03d}.bin": os.urandom(1000 + 17 * i) for i in range(N_FILES)}
        fs.pipe({f"ucstage-test/{prefix}/{k}": v for k, v in files.items()})
        ranks = two_nodes(moto, f"s3://ucstage-test/{prefix}", scope, tmp_path)

        # Every epoch reads every file exactly once over the 4 ranks.
        for epoch in range(EPOCHS):
            read = sorted(f for r in ranks for f in r["epochs"][epoch])
            assert read == sorted(files), (scope, epoch)
        per_node = [cached(tmp_path, scope, node) for node in range(NODES)]
        node_reads = [{f for r in ranks if r["node"] == node for e in r["epochs"] for f in e}
                      for node in range(NODES)]
        assert [set(c) for c in per_node] == node_reads  # a node fetched what it read
        count = gets(moto, prefix)
        assert set(count) == set(files)
        # Each GET of an object is one node's one fetch: what the caches hold.
        assert sum(count.values()) == sum(len(c) for c in per_node)
        figures[scope] = {
            "per_node": [(len(c), sum(c.values())) for c in per_node],
            "gets": sum(count.values()),
            "bytes": sum(len(files[k]) * v for k, v in count.items()),
            "twice": sum(1 for v in count.values() if v > 1),
        }
        if scope == "node":
            # Each node reads the same files every epoch, and the nodes split the volume.
            for node in range(NODES):
                epochs = [{f for r in ranks if r["node"] == node for f in r["epochs"][e]}
                          for e in range(EPOCHS)]
                assert epochs[0] == epochs[1] == epochs[2]
            assert set(count.values()) == {1}  # every object crossed the network once
            assert sorted(len(c) for c in per_node) == [N_FILES // 2, N_FILES // 2]
        else:
            assert figures[scope]["twice"] > N_FILES // 4  # many crossed twice
    total = sum(len(v) for v in files.values())
    print(f"\n{N_FILES} objects ({total} bytes), {NODES} nodes x {PER_NODE} ranks x 1 "
          f"worker, {EPOCHS} epochs, seed 11")
    for scope, f in figures.items():
        nodes = ", ".join(f"node {i}: {n} objects / {b} bytes"
                          for i, (n, b) in enumerate(f["per_node"]))
        print(f"{scope}: {nodes}; object GETs {f['gets']} ({f['bytes']} bytes); "
              f"objects fetched twice {f['twice']}")
