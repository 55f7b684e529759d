"""Timing a command or a function, with CPU time and peak RSS.

A command's figures come from ``os.wait4`` on that one child: its wall time,
its user + sys CPU and its peak RSS (``ru_maxrss``), which on Linux include
the descendants it waited for itself. A function's come from this process's
``getrusage``: the CPU it spent, and the process's peak RSS so far (which
only grows, so read it as "peak up to this step").
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


class CommandFailed(RuntimeError):
    """A timed command exited non-zero (``check=True``)."""


@dataclass(frozen=True)
class Timing:
    """One measured run.

    ``wall_s``: elapsed seconds; ``cpu_s``: user + sys seconds of the child
    (a command) or of this process (a function); ``peak_rss_mib``: the child's
    peak RSS, or this process's peak so far.
    """

    wall_s: float
    cpu_s: float
    user_s: float
    sys_s: float
    peak_rss_mib: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class CommandRun:
    """A command's :class:`Timing`, exit code and output."""

    timing: Timing
    returncode: int
    stdout: str
    stderr: str

    @property
    def last_line(self) -> str:
        lines = self.stdout.strip().splitlines()
        return lines[-1] if lines else ""


def peak_rss_mib() -> float:
    """This process's peak RSS so far, in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def children_cpu_s() -> float:
    """User + sys seconds of every child this process has waited for so far.

    For CPU that :func:`run_command` cannot see: processes the child leaves
    behind (a forkserver, a resource tracker) that this process adopts and
    reaps as a child subreaper.
    """
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(cmd: Sequence[str], *, env: Mapping[str, str] | None = None,
                cwd: str | None = None, check: bool = True,
                capture: bool = True) -> CommandRun:
    """Run ``cmd`` to completion and measure it.

    Output goes to temporary files rather than pipes, so the child can never
    block on a full pipe while this process waits in ``os.wait4`` (which
    ``subprocess.communicate`` would not let us call: it reaps the child
    itself and the rusage is lost). ``capture=False`` sends both to
    /dev/null. ``check``: raise :class:`CommandFailed` on a non-zero exit.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sinks: tuple[Any, Any] = (out, err) if capture else (subprocess.DEVNULL,) * 2
        start = time.perf_counter()
        proc = subprocess.Popen(list(cmd), env=None if env is None else dict(env), cwd=cwd,
                                stdout=sinks[0], stderr=sinks[1], stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    timing = Timing(wall_s=wall, cpu_s=usage.ru_utime + usage.ru_stime, user_s=usage.ru_utime,
                    sys_s=usage.ru_stime, peak_rss_mib=usage.ru_maxrss / 1024)
    run = CommandRun(timing, proc.returncode, stdout, stderr)
    if check and run.returncode != 0:
        raise CommandFailed(f"{cmd[0]} exited {run.returncode}: {stderr.strip()[-800:]}")
    return run


def time_call(fn: Callable[[], T]) -> tuple[T, Timing]:
    """Call ``fn`` once in this process; its result and :class:`Timing`."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return result, Timing(wall_s=wall, cpu_s=user + sys_, user_s=user, sys_s=sys_,
                          peak_rss_mib=after.ru_maxrss / 1024)


def median_seconds(fn: Callable[[], object], repeat: int = 3) -> float:
    """Median wall seconds of ``repeat`` calls of ``fn``."""
    return statistics.median(time_call(fn)[1].wall_s for _ in range(repeat))


def best_seconds(fn: Callable[[], object], repeat: int, warmup: bool = False) -> float:
    """Fastest wall seconds of ``repeat`` calls (after one untimed call with ``warmup``)."""
    if warmup:
        fn()
    return min(time_call(fn)[1].wall_s for _ in range(repeat))


@dataclass
class Steps:
    """Named steps timed one after another in this process (a benchmark's rows)."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def time(self, name: str, fn: Callable[[], T]) -> T:
        """Call ``fn``, record its timing under ``name``, return its result."""
        result, timing = time_call(fn)
        self.rows.append({"name": name, "seconds": timing.wall_s, "cpu_s": timing.cpu_s,
                          "peak_rss_mib": timing.peak_rss_mib})
        return result

    def markdown(self) -> str:
        lines = ["| step | seconds | peak RSS MiB |", "|---|---:|---:|"]
        lines += [f"| {r['name']} | {r['seconds']:.2f} | {r['peak_rss_mib']:.0f} |"
                  for r in self.rows]
        return "\n".join(lines)
