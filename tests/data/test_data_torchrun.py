"""VolumeDataset and DataLoader under torchrun: 2 ranks on gloo, 2 workers each,
reading an rclone FUSE volume. Checked against `ucstage shard-plan --json`."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from tests.common.parts import REPO, free_port, unique, wait_synced
from tests.common.usage import sampled_usage
from ucstage import manifest as mf

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

WORKER = os.path.join(REPO, "tests", "workers", "data_worker.py")
N_FILES = 23  # not a multiple of the 4 slots, so equal_length has work to do


def make_volume(fuse_volume: tuple[str, str], n: int = N_FILES) -> tuple[str, list[str]]:
    backing, mnt = fuse_volume
    key = unique("data")
    names = [f"f{i:02d}.bin" if i % 3 else f"sub/d{i % 2}/f{i:02d}.bin" for i in range(n)]
    for i, name in enumerate(names):
        path = os.path.join(backing, key, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(bytes([i]) * (100 + 37 * i))
    with open(os.path.join(backing, key, "_SUCCESS"), "wb"):
        pass  # hidden: never listed
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    return os.path.join(mnt, key), sorted(names)


def torchrun(mode: str, source: str, out: str, *extra: str,
             env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={port}",
           WORKER, mode, source, out, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(), **(env_extra or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def results(out: str) -> list[dict[str, Any]]:
    found = []
    for rank in (0, 1):
        path = os.path.join(out, f"rank{rank}.json")
        assert os.path.exists(path), f"rank {rank} wrote no result"
        with open(path, encoding="utf-8") as fh:
            found.append(json.load(fh))
    return found


def shard_plan(source: str, *extra: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", source, "-w", "2",
                           "-k", "2", "--json", *extra], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def yielded(ranks: list[dict[str, Any]], key: str) -> dict[tuple[int, int], list[str]]:
    return {(r["rank"], int(w)): files for r in ranks for w, files in r[key].items()}


def planned(plan: dict[str, Any]) -> dict[tuple[int, int], list[str]]:
    return {(s["rank"], s["worker"]): s["files"] for s in plan["slots"]}


def test_two_ranks_two_workers_read_the_shard_plan(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, names = make_volume(fuse_volume, N_FILES - 1)
    out = str(tmp_path / "out")
    os.makedirs(out)
    # A manifest frozen before the volume grows: ranks given it read only its files.
    manifest = mf.save(mf.snapshot(source), str(tmp_path / "train.manifest.json"))
    with open(os.path.join(fuse_volume[0], os.path.basename(source), "late.bin"), "wb") as fh:
        fh.write(b"added after the manifest")
    wait_synced(os.path.join(fuse_volume[0], os.path.basename(source)), source)
    proc = torchrun("shard", source, out, manifest)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(out)

    from_manifest = yielded(ranks, "manifest")
    assert sorted(f for files in from_manifest.values() for f in files) == names
    assert from_manifest == planned(shard_plan(manifest))
    names = sorted([*names, "late.bin"])  # what a fresh listing sees now

    # Every rank sharded one frozen listing (rank 0 listed and broadcast it).
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"]
    assert all(r["manifest_in_cache"] for r in ranks)

    # Listing order: every file exactly once, slot by slot what shard-plan prints.
    plain = yielded(ranks, "plain")
    assert sorted(f for files in plain.values() for f in files) == names
    assert plain == planned(shard_plan(source))

    # Shuffled: each epoch is the plan's permutation for that epoch on both
    # ranks (one permutation shared by the ranks), epochs differ, and
    # re-running an epoch reproduces it.
    for epoch in (0, 1):
        got = yielded(ranks, f"shuffle_epoch{epoch}")
        assert sorted(f for files in got.values() for f in files) == names
        assert got == planned(shard_plan(source, "--shuffle", "--seed", "7",
                                         "--epoch", str(epoch)))
    assert yielded(ranks, "shuffle_epoch0") != yielded(ranks, "shuffle_epoch1")
    assert yielded(ranks, "shuffle_epoch0_again") == yielded(ranks, "shuffle_epoch0")

    # Node scope, one rank per node: each rank keeps its files every epoch, in
    # another order, exactly as `shard-plan --nproc-per-node 1` plans it.
    for epoch in (0, 1):
        got = yielded(ranks, f"nodes_epoch{epoch}")
        assert sorted(f for files in got.values() for f in files) == names
        assert got == planned(shard_plan(source, "--shuffle", "--seed", "7", "--epoch",
                                         str(epoch), "--nproc-per-node", "1"))
    for rank in (0, 1):
        mine = [[f for w in (0, 1) for f in yielded(ranks, f"nodes_epoch{e}")[(rank, w)]]
                for e in (0, 1)]
        assert sorted(mine[0]) == sorted(mine[1]) and mine[0] != mine[1]
        assert ranks[rank]["len_nodes"] == len(mine[0])

    # Equal length: 23 files over 4 slots. pad -> 6 per slot, every file read,
    # 1 read twice; drop -> 5 per slot, no file twice, 3 skipped.
    pad = yielded(ranks, "pad")
    assert {len(files) for files in pad.values()} == {6}
    counts = Counter(f for files in pad.values() for f in files)
    assert set(counts) == set(names) and sum(counts.values()) == 24
    drop = yielded(ranks, "drop")
    assert {len(files) for files in drop.values()} == {5}
    counts = Counter(f for files in drop.values() for f in files)
    assert max(counts.values()) == 1 and len(counts) == 20
    for key in ("pad", "drop"):
        per_rank = [sum(len(v) for v in r[key].values()) for r in ranks]
        assert per_rank[0] == per_rank[1]
    # len() in each rank's main process is what that rank's workers yielded.
    for r in ranks:
        for key in ("plain", "pad", "drop"):
            assert r[f"len_{key}"] == sum(len(v) for v in r[key].values()), (r["rank"], key)

    # num_workers=0: each rank's main process reads its one slot.
    main = yielded(ranks, "main_process")
    plan0 = shard_plan_k0(source)
    assert main == plan0


def shard_plan_k0(source: str) -> dict[tuple[int, int], list[str]]:
    proc = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", source, "-w", "2",
                           "-k", "0", "--json"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return planned(json.loads(proc.stdout))


def test_guard_stops_every_rank_when_ranks_disagree(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    source, _ = make_volume(fuse_volume)
    out = str(tmp_path)
    proc = torchrun("guard", source, out)
    assert proc.returncode != 0
    ranks = results(out)
    for r in ranks:
        # Different filters: refused before rank 1 could adopt rank 0's listing.
        assert "ranks ask for different listings" in r["filters"]
        assert "rank 1:" in r["filters"] and "exclude=['f00.bin']" in r["filters"]
        # Different frozen listings: fingerprints and file counts named per rank.
        assert "ranks shard different listings" in r["listing"]
        assert "rank 0: fingerprint" in r["listing"] and "(23 files)" in r["listing"]
        assert "rank 1: fingerprint" in r["listing"] and "(22 files)" in r["listing"]
        # Different num_workers: both values named, with the shard-plan to inspect.
        assert "num_workers (rank 0: 2, rank 1: 1)" in r["workers"]
        assert "-k 2,1" in r["workers"]
        # Different shuffle scopes: named per rank.
        assert "ranks disagree on the shuffle or its node layout" in r["scope"]
        assert "rank 0: shuffle=True shuffle_scope=node" in r["scope"]
        assert "rank 1: shuffle=True shuffle_scope=global" in r["scope"]
    assert ranks[0]["workers"] == ranks[1]["workers"]


def test_two_ranks_share_one_cache_a_quarter_of_the_dataset(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """2 ranks x 2 workers, 3 shuffled epochs, one cache capped at a quarter
    of the FUSE volume: every epoch whole and byte-exact, usage never over the
    cap (sampled from this process), each rank hitting its share from epoch 2."""
    backing, mnt = fuse_volume
    key = unique("small")
    n, size = 800, 2048
    digests = {}
    os.makedirs(os.path.join(backing, key))
    for i in range(n):
        data = hashlib.sha256(b"%d" % i).digest() * (size // 32)
        with open(os.path.join(backing, key, f"f{i:03d}.bin"), "wb") as fh:
            fh.write(data)
        digests[f"f{i:03d}.bin"] = hashlib.sha256(data).hexdigest()
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    cap = n * size // 4
    cache_dir = str(tmp_path / "cache")
    os.makedirs(cache_dir, mode=0o700)
    out = str(tmp_path / "out")
    os.makedirs(out)
    with sampled_usage(cache_dir, str(tmp_path)) as usage:
        proc = torchrun("smallcache", os.path.join(mnt, key), out,
                        env_extra={"UCSTAGE_CACHE_DIR": cache_dir,
                                   "UCSTAGE_CACHE_MAX_BYTES": str(cap)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = results(out)
    for epoch in range(3):
        read = [item for r in ranks for item in r["epochs"][epoch]]
        assert sorted(name for name, _ in read) == sorted(digests)
        assert all(digests[name] == digest for name, digest in read)
    assert usage.samples > 10 and 0 < usage.peak <= cap, (usage.peak, usage.samples)
    # From epoch 2 on the job hits about cap / dataset of its reads (each rank
    # reads 400 random files of the 800, so one rank's share varies by a few %).
    rates = [r["hit_rates"] for r in ranks]
    assert all(rate[0] == 0.0 for rate in rates)
    for epoch in (1, 2):
        assert (rates[0][epoch] + rates[1][epoch]) / 2 >= 0.8 * 0.25, rates
        assert min(rates[0][epoch], rates[1][epoch]) >= 0.5 * 0.25, rates
    # One run, both ranks: `cache status` adds up every process of the job.
    assert ranks[0]["run"] == ranks[1]["run"]
    status = subprocess.run([sys.executable, "-m", "ucstage", "cache", "status", "--json"],
                            env=dict(os.environ, UCSTAGE_CACHE_DIR=cache_dir,
                                     PYTHONPATH=os.getcwd()), capture_output=True, text=True)
    last = json.loads(status.stdout)["last_run"]
    assert last["run"] == ranks[0]["run"] and last["hits"] + last["misses"] == 3 * n

