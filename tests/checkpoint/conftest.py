"""Fixtures of the checkpoint tests: a writable rclone FUSE volume, a folder
of named sample files, and a torchrun launcher."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.common.parts import REPO, free_port, rclone_mount

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


def torchrun(nproc: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(torchrun_cmd(nproc, *args), capture_output=True, text=True,
                          timeout=300, env=torchrun_env())
