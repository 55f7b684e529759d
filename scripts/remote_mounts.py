"""Helpers for benchmarks that run inside scripts/remote-volume.sh (or
scripts/bench_remote.sh): its variables, and fresh rclone mounts of its bucket."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time


def remote_env(name: str) -> str:
    """A variable the emulated remote volume sets; exit with a hint when missing."""
    value = os.environ.get(name)
    if not value:
        script = os.path.basename(sys.argv[0])
        sys.exit(f"{script}: {name} is not set; run it inside scripts/remote-volume.sh")
    return value


def fresh_mount(work: str, label: str) -> str:
    """A new read-only rclone mount of the remote volume (cold caches), under ``work``."""
    mnt = tempfile.mkdtemp(prefix=f"mnt-{label}-", dir=work)
    subprocess.run(["rclone", "mount", remote_env("UCSTAGE_REMOTE_RCLONE"), mnt, "--daemon",
                    "--read-only", "--use-server-modtime", "--dir-cache-time", "5m",
                    "--log-file", mnt + ".log"], check=True,
                   # A CA bundle for plain http makes rclone's S3 client fail to start.
                   env={k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"})
    wait_mounted(mnt)
    return mnt


def wait_mounted(mnt: str, log: str = "") -> None:
    """Wait (up to 15 s) for a daemonised rclone mount to appear at ``mnt``."""
    deadline = time.monotonic() + 15
    while not os.path.ismount(mnt):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rclone mount did not appear at {mnt}"
                               + (f" (see {log})" if log else ""))
        time.sleep(0.05)


def unmount(mnt: str) -> None:
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)
