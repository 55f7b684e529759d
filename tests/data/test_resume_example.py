"""The checkpoint recipe (docs/examples/train_resume.py) under torchrun over the
FUSE volume: 2 ranks are killed right after a checkpoint, 3 ranks resume it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.parts import REPO, free_port, unique, wait_synced

pytestmark = [pytest.mark.torchrun, pytest.mark.fuse]

EXAMPLE = os.path.join(REPO, "docs", "examples", "train_resume.py")


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           EXAMPLE, *args]
    # PYTHONFAULTHANDLER: a rank that dies of a signal (an abort in native
    # code) prints every thread's Python stack, so a failure says where.
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd(), PYTHONFAULTHANDLER="1")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)


def test_killed_run_resumes_on_another_number_of_ranks(fuse_volume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    backing, mnt = fuse_volume
    key = unique("texts")
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    made = subprocess.run([sys.executable, EXAMPLE, "--make-sample", os.path.join(backing, key)],
                          capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    source, ckpt = os.path.join(mnt, key), str(tmp_path / "ckpt")
    killed = torchrun(2, source, "--ckpt", ckpt, "--save-every", "5", "--kill-after", "5",
                      "--epochs", "1")
    assert killed.returncode != 0 and os.path.exists(os.path.join(ckpt, "checkpoint.pt"))
    resumed = torchrun(3, source, "--ckpt", ckpt, "--num-workers", "1", "--epochs", "2")
    assert resumed.returncode == 0, f"{resumed.stdout[-1500:]}\n{resumed.stderr[-6000:]}"
    assert "resumed at step 5, epoch 0" in resumed.stderr
    epochs = [json.loads(line) for line in resumed.stdout.splitlines()]
    first, second = epochs[0]["audit"], epochs[1]["audit"]
    # 2 ranks x 5 batches of 4 before the kill; the rest re-split over 3 ranks,
    # padded so that the ranks get equal batches: every file, a few twice.
    assert first["resumed_files"] == 40 and first["files"] == 203 and first["gaps"] == 0
    assert first["coverage_ok"] and first["duplicates"] == first["expected_duplicates"]
    assert second["resumed_files"] == 0 and second["coverage_ok"] and second["files"] == 203
