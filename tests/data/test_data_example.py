"""The decoding example (docs/examples/train_images.py) trains over an rclone FUSE volume."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.common.parts import REPO, unique, wait_synced

pytestmark = pytest.mark.fuse

EXAMPLE = os.path.join(REPO, "docs", "examples", "train_images.py")


def test_train_images_example_reads_every_image_each_epoch(fuse_volume) -> None:  # type: ignore[no-untyped-def]
    backing, mnt = fuse_volume
    key = unique("images")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    made = subprocess.run([sys.executable, EXAMPLE, "--make-sample", os.path.join(backing, key)],
                          capture_output=True, text=True, env=env)
    assert made.returncode == 0, made.stderr
    with open(os.path.join(backing, key, "README.txt"), "w") as fh:
        fh.write("not an image: the example's include globs skip it")
    wait_synced(os.path.join(backing, key), os.path.join(mnt, key))
    proc = subprocess.run([sys.executable, EXAMPLE, os.path.join(mnt, key), "--epochs", "2",
                           "--num-workers", "2", "--batch-size", "16", "--json"],
                          capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert [r["images"] for r in report] == [96, 96]
    # 2 workers x 48 images at batch 16: 3 batches each.
    assert [r["batches"] for r in report] == [6, 6]
    assert all(0 <= r["stall_share"] <= 1 for r in report)
    assert "epoch 1: 96 images in 6 batches" in proc.stderr
