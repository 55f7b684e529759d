"""A FUSE mount whose server dies mid-epoch: the VolumeDataset reading
through it fails at once with an error naming the mount, not a hang and not
an errno traceback; files copied before stay cached and right."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.common.parts import rclone_mount
from ucstage import VolumeDataset
from ucstage.errors import MountLost

KB = 1024


def _rclone_pid(mountpoint: str) -> int:
    """The pid of the rclone process serving ``mountpoint`` (this test's own)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"rclone") and mountpoint.encode() in args:
            return int(name)
    raise AssertionError(f"no rclone process serves {mountpoint}")


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dead_mount_is_a_clear_error_naming_it(tmp_path: Path, num_workers: int) -> None:
    from ucstage.data import DataLoader

    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    files = {f"f{i:03}.bin": os.urandom(16 * KB) for i in range(60)}
    for name, data in files.items():
        (backing / name).write_bytes(data)
    with rclone_mount(str(backing), str(mnt)):
        ds = VolumeDataset(str(mnt), cache_dir=str(tmp_path / "cache"), read_ahead=2)
        loader = DataLoader(ds, batch_size=None, num_workers=num_workers, log_mlflow=False)
        seen: list[str] = []
        killed = 0.0
        with pytest.raises(Exception) as caught:
            for path in loader:
                with open(path, "rb") as fh:
                    assert fh.read() == files[os.path.basename(path)]
                seen.append(path)
                if len(seen) == 5:
                    os.kill(_rclone_pid(str(mnt)), signal.SIGKILL)
                    killed = time.monotonic()
        after_kill = time.monotonic() - killed
    message = str(caught.value)
    if num_workers == 0:
        assert isinstance(caught.value, MountLost), repr(caught.value)
    assert f"the mount at {mnt}" in message and "stopped answering" in message, message
    # "At once" is what the message shows (MountLost is not retried: no
    # "after N attempts") and the count below (the epoch stopped short); the
    # bound only tells a hang from an answer, however loaded the machine.
    assert not re.search(r"after \d+ attempts", message), message
    assert after_kill < 300
    assert 5 <= len(seen) < len(files)
