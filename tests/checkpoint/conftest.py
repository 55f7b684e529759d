"""Fixtures of the checkpoint tests: a writable rclone FUSE volume, a folder
of named sample files, a torchrun launcher, and the check of a checkpoint
loaded on 1 rank after 2 saved it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.common.parts import REPO, free_port, rclone_mount, wait_until

WORKER = os.path.join(REPO, "tests", "workers", "checkpoint_worker.py")
SAMPLES = 61


@pytest.fixture(scope="session")
def writable_volume(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(backing folder, writable rclone FUSE mount of it): a volume a job
    saves checkpoints to (no VFS cache: writes go through, as on the platform)."""
    base = tmp_path_factory.mktemp("ckptfuse")
    backing, mnt = str(base / "backing"), str(base / "mnt")
    os.makedirs(backing)
    with rclone_mount(backing, mnt, read_only=False):
        yield backing, mnt


def make_samples(folder: str, n: int = SAMPLES) -> list[str]:
    """``n`` files, each holding its own relative path; their names, sorted."""
    names = [f"d{i % 4}/f{i:03d}.txt" for i in range(n)]
    for name in names:
        path = os.path.join(folder, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(name)
    return sorted(names)


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--nnodes=1", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
            WORKER, *args]


def torchrun_env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.getcwd())


def kill_a_rank_mid_upload(source: str, parent: str, out: str, k: int) -> str:
    """Run 2 ranks that save step-1, then stall rank 1 in the middle of
    step-2's upload; kill that rank with SIGKILL and return the job's output
    (the job itself must fail)."""
    proc = subprocess.Popen(torchrun_cmd(2, "save-then-stall", source, parent, out, str(k)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=torchrun_env())
    try:
        stalled = Path(out) / "stalled"
        wait_until(lambda: (stalled.exists() and stalled.read_text() != "") or
                   proc.poll() is not None, "rank 1 to stall mid-upload", timeout=240)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        os.kill(int(stalled.read_text()), signal.SIGKILL)
        output, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, output[-3000:]
    return output


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_cmd(nproc, *args), capture_output=True, text=True,
                          timeout=300, env=torchrun_env())


def equal(a: Any, b: Any) -> bool:
    """``a`` and ``b`` hold the same values, tensors compared exactly."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def load_on_one_rank_and_check(source: str, dest: str, out: Path, names: list[str], k: int,
                               rows: int) -> None:
    """Load ``dest``, saved by the worker's ``save`` on 2 ranks after ``k``
    batches each, on 1 rank (resharded), and check what it got: the model
    and optimizer equal to what rank 0 saved (and in the model it trains),
    every block of ``big`` (``rows`` rows) equal to the save's, and the rest
    of the epoch each sample once (the audit agreeing)."""
    proc = torchrun(1, "load", source, dest, str(out), str(rows))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = torch.load(out / "expected.pt", weights_only=False)
    loaded = torch.load(out / "loaded.pt", weights_only=False)
    for key in ("model", "optim"):
        assert equal(expected[key], loaded[key]), key
    assert loaded["step"] == k
    # The model the one rank trains on now holds the saved weights.
    assert equal(expected["model"], loaded["net"])
    with open(out / "load.json", encoding="utf-8") as fh:
        resumed = json.load(fh)
    assert resumed["big"] == {"blocks": rows // 256, "differ": []}
    # 3 more steps ran after async_save returned: what was saved is the
    # state at the call, not the weights the upload raced with.
    before = []
    for rank in (0, 1):
        with open(out / f"rank{rank}.json", encoding="utf-8") as fh:
            before += json.load(fh)["items"]
    assert len(before) == 2 * k * 4
    assert Counter(before + resumed["items"]) == Counter(names)
    (audit,) = resumed["audits"]
    assert audit["coverage_ok"] and audit["duplicates"] == 0 and audit["gaps"] == 0
    assert audit["resumed_files"] == len(before) and audit["files"] == len(names)
