"""Loopback ports for the servers ucstage starts: the embedded Spark Connect
server, and the test suite's and benchmarks' moto and MLflow servers.
One implementation, so every caller binds and waits the same way."""

from __future__ import annotations

import socket
import subprocess
import time

__all__ = ["free_port", "port_open", "wait_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Another process could take it before the caller binds it; the servers
    started with it are retried or fail loudly, so the race only costs a retry.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    """True when something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections.

    Raises:
        RuntimeError: ``proc`` (the server, when given) exited first, or
            ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        if port_open(port):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open within {timeout:g}s")
