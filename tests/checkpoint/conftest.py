"""Fixtures of the checkpoint tests: a writable rclone FUSE volume, a folder
of named sample files, and a torchrun launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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
