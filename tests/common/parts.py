"""Real parts for the tests: an rclone FUSE mount and a moto S3 server.

Each is started as a real process and stopped cleanly. Outside CI a missing
part skips the tests that need it; in CI (CI=true) it fails them, because a
green run that skipped its real parts proves nothing.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from ucstage.ports import free_port, wait_port

__all__ = [
    "IN_CI",
    "REPO",
    "MotoServer",
    "free_port",
    "in_lock_wait",
    "rclone_mount",
    "readable",
    "require",
    "small_tree",
    "tmpfs",
    "unique",
    "wait_port",
    "wait_synced",
    "wait_until",
    "wait_visible",
]

IN_CI = os.environ.get("CI", "").lower() == "true"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository's root folder, wherever a test file sits below it."""


def require(ok: bool, reason: str) -> None:
    """Skip (locally) or fail (in CI) when a real part is missing."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"CI needs this real part: {reason}")
    pytest.skip(reason)


def fuse_available() -> tuple[bool, str]:
    if not shutil.which("rclone"):
        return False, "rclone is not installed (scripts/test.sh installs it as root)"
    if not shutil.which("fusermount3") and not shutil.which("fusermount"):
        return False, "fuse3 is not installed"
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse is missing"
    return True, ""


def unmount(mountpoint: str) -> None:
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount3"
    for args in ([tool, "-u", mountpoint], [tool, "-uz", mountpoint]):
        if subprocess.run(args, capture_output=True).returncode == 0:
            break
    deadline = time.monotonic() + 10
    while os.path.ismount(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)


def _tree(root: str) -> dict[str, tuple[int, int]]:
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                found[os.path.relpath(path, root)] = (st.st_size, int(st.st_mtime))
            except OSError:
                pass  # vanished between listing and stat: the next round sees it
    return found


def wait_synced(backing: str, mounted: str, timeout: float = 120.0) -> None:
    """Wait until the mount shows exactly the backing folder's files and sizes.

    rclone caches directory listings (about a second here), so a tree written
    to the backing folder appears in the mount a little later. Waiting for the
    listings to agree, rather than sleeping a fixed time, keeps tests from
    racing the cache on a loaded machine (the timeout only stops a hang).
    rclone hides symlinks, so they are left out of the comparison (os.walk
    does not descend into linked folders).
    """
    deadline = time.monotonic() + timeout
    while True:
        want = {p: s for p, s in _tree(backing).items() if not os.path.islink(os.path.join(backing, p))}
        if os.path.isdir(mounted) and _tree(mounted) == want:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{mounted} did not show {backing}'s files within {timeout}s")
        time.sleep(0.1)


@contextmanager
def rclone_mount(source: str, mountpoint: str, *extra: str, read_only: bool = True) -> Iterator[str]:
    """Mount ``source`` (a folder) at ``mountpoint`` with rclone, read-only
    unless ``read_only`` is False (a volume a job writes to: checkpoints).

    Directory and attribute caches are kept short so tests that rewrite the
    backing folder see the change within about a second, as on the platform.
    """
    ok, reason = fuse_available()
    require(ok, reason)
    os.makedirs(mountpoint, exist_ok=True)
    log = os.path.join(os.path.dirname(mountpoint), os.path.basename(mountpoint) + ".rclone.log")
    cmd = ["rclone", "mount", source, mountpoint, "--daemon", *(["--read-only"] if read_only else []),
           "--dir-cache-time", "1s", "--attr-timeout", "0s", "--log-file", log, *extra]
    # --daemon forks a child that keeps inherited pipes open, so output must go
    # to a file: capturing it would wait for EOF forever.
    with open(log + ".stderr", "wb") as errfile:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=errfile)
    if proc.returncode != 0:
        with open(log + ".stderr", errors="replace") as fh:
            require(False, f"rclone mount failed: {fh.read().strip()[:300]}")
    deadline = time.monotonic() + 120  # only stops a hang: rclone starts slowly under load
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            require(False, f"rclone mount did not appear at {mountpoint}")
        time.sleep(0.05)
    try:
        yield mountpoint
    finally:
        unmount(mountpoint)


class MotoServer:
    """A moto S3 server on 127.0.0.1, used through s3fs with ordinary env config."""

    def __init__(self, workdir: str) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(os.path.join(workdir, "moto.log"), "wb")  # noqa: SIM115
        exe = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        require(exe is not None, "moto[server] is not installed")
        assert exe is not None  # require() skipped or failed the test otherwise
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.port, 30, self.proc)

    def env(self) -> dict[str, str]:
        """Variables that point boto (and so s3fs and ucstage) at this server."""
        return {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self):  # type: ignore[no-untyped-def]
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing",
                                 client_kwargs={"endpoint_url": self.endpoint},
                                 use_listings_cache=False, skip_instance_cache=True)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@contextmanager
def tmpfs(mountpoint: str, options: str) -> Iterator[str]:
    """Mount a tmpfs (e.g. ``size=2m`` for a full disk, ``ro,size=1m`` for a
    read-only one) at ``mountpoint`` for the block; needs root."""
    os.makedirs(mountpoint, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", mountpoint],
                          capture_output=True, text=True)
    require(proc.returncode == 0, f"cannot mount a tmpfs ({options}): {proc.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", mountpoint], capture_output=True)


def wait_visible(path: str, timeout: float = 120.0) -> None:
    """Wait out rclone's directory cache until a new folder shows in the mount
    (the timeout only stops a hang: rclone is slow to answer on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in the FUSE mount")
        time.sleep(0.1)


def readable(fd: int | Any, timeout: float) -> bool:
    """Whether ``fd`` (a descriptor, or anything with ``fileno()``) has bytes
    to read (or has closed) within ``timeout`` seconds. ``poll``, not
    ``select``: a pytest worker that has opened many files hands out
    descriptors above 1024, which ``select`` refuses (ValueError)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(timeout * 1000))


def wait_until(ok: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll ``ok`` until it is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def in_lock_wait(native_id: int) -> bool:
    """Whether the thread ``native_id`` of this process sleeps in the kernel's
    file-lock wait (its wait channel names it): it has reached ``flock``."""
    try:
        with open(f"/proc/self/task/{native_id}/wchan") as fh:
            return "lock" in fh.read()
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def unique(prefix: str = "t") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def small_tree(root: str | os.PathLike[str], files: int, folders: int,
               name: str = "f{i}.bin") -> str:
    """``files`` small distinct files spread over ``folders`` folders
    (``d0/``, ``d1/``...; file ``i`` holds byte ``i`` repeated 100 + i times)."""
    for i in range(files):
        path = os.path.join(root, f"d{i % folders}", name.format(i=i))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(bytes([i]) * (100 + i))
    return os.fspath(root)
