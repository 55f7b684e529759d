"""Issue 15 targets: a 1M-file manifest, one slot, a whole plan, freezing.

    python -m benchmarks.manifest [--files 1000000] [--dir /tmp/ucstage-bench-manifest] [--json]
    python -m benchmarks.manifest --slot-only --repeat 5   # issue 21: one slot from the shell

Each figure is one fresh subprocess (time, CPU and peak RSS of the whole
process, from its rusage; peak RssAnon, the process's own memory without the
shared mapped manifest and libraries, sampled from /proc/PID/status every
millisecond); the listing is synthetic (no files are created). ``--repeat``
runs each shard-plan figure that many times and reports the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.report import Report, benchmark_name, json_argument, params_of
from benchmarks.timing import run_command

WORKER = """
import resource, sys, time
t = time.perf_counter()
from ucstage.manifest import load
from ucstage.sharding import Layout, ReadOrder, Slot, slot_array
m = load(sys.argv[1], verify=False, expect_fingerprint=sys.argv[2])
rows = m.take(slot_array(ReadOrder(len(m), shuffle=True), Layout(128, 8), Slot(5, 3)))
print(len(rows), time.perf_counter() - t)
"""

FREEZE = """
import sys, time
from ucstage.manifest import Manifest, fingerprint, save
from ucstage.volumes import FileEntry
n = int(sys.argv[1])
entries = [FileEntry(f"d{i % 1000}/f{i:08d}.jpg", 1000 + i % 5000, f"{1764403200 + i}.0")
           for i in range(n)]
t = time.perf_counter()
save(Manifest("/bench", entries, fingerprint(entries)), sys.argv[2])
print(time.perf_counter() - t)
"""


def run(cmd: list[str]) -> tuple[float, float, str]:
    """Wall time, peak RSS (MiB) of this one child, its last stdout line."""
    done = run_command(cmd)
    return done.timing.wall_s, done.timing.peak_rss_mib, done.last_line


def _rss_anon_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def sampled(cmd: list[str]) -> dict[str, float]:
    """One fresh run of ``cmd``: wall and CPU seconds, peak RSS and peak
    RssAnon (MiB; sampled every millisecond by a thread while this one waits)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_anon_kib(proc.pid))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # already reaped: tell Popen
    return {"seconds": wall, "cpu_seconds": usage.ru_utime + usage.ru_stime,
            "peak_rss_mib": usage.ru_maxrss / 1024, "peak_rss_anon_mib": peak[0] / 1024,
            "exit_code": proc.returncode}


def median_run(cmd: list[str], repeat: int) -> dict[str, float]:
    """The median of each figure over ``repeat`` fresh runs of ``cmd``."""
    runs = [sampled(cmd) for _ in range(repeat)]
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/ucstage-bench-manifest")
    ap.add_argument("--repeat", type=int, default=1,
                    help="fresh runs per shard-plan figure (the median is reported)")
    ap.add_argument("--slot-only", action="store_true",
                    help="only `shard-plan ARROW -w 128 -k 8 --slot 5:3` (the manifest is "
                         "written if missing)")
    json_argument(ap)
    a = ap.parse_args(argv)
    os.makedirs(a.dir, exist_ok=True)
    arrow = os.path.join(a.dir, "m.manifest.arrow")
    js = os.path.join(a.dir, "m.manifest.json")
    py = sys.executable
    rows: list[dict[str, Any]] = []
    lines: list[str] = []

    def record(name: str, wall: float, peak: float, text: str, **more: Any) -> None:
        rows.append({"name": name, "seconds": wall, "peak_rss_mib": peak, **more})
        lines.append(text)

    def shard_plan(path: str, extra: list[str]) -> None:
        label = f"shard-plan {os.path.basename(path)} -w 128 -k 8 {' '.join(extra)}".strip()
        m = median_run([py, "-m", "ucstage", "shard-plan", path, "-w", "128", "-k", "8", *extra],
                       a.repeat)
        wall, peak = m.pop("seconds"), m.pop("peak_rss_mib")
        record(label, wall, peak, f"{label}: {wall:.2f} s ({m['cpu_seconds']:.2f} s CPU), "
               f"{peak:.0f} MiB peak RSS, {m['peak_rss_anon_mib']:.0f} MiB peak RssAnon"
               + (f" (median of {a.repeat})" if a.repeat > 1 else ""), **m)

    if a.slot_only:
        if not os.path.exists(arrow):
            run([py, "-c", FREEZE, str(a.files), arrow])
        shard_plan(arrow, ["--slot", "5:3"])
        Report(benchmark_name(__file__), params_of(a), rows).emit(a.json, "\n".join(lines))
        return 0
    for path in (js, arrow):
        wall, peak, inner = run([py, "-c", FREEZE, str(a.files), path])
        record(f"freeze {os.path.basename(path)}", float(inner), peak,
               f"freeze {os.path.basename(path)}: {float(inner):.2f} s beyond the listing "
               f"(process peak {peak:.0f} MiB)", process_seconds=wall)
    from ucstage.manifest import load

    fp = load(arrow, verify=False).fingerprint
    base_wall, base_peak, _ = run([py, "-c", "import ucstage.manifest, pyarrow.ipc, numpy"])
    record("baseline imports", base_wall, base_peak,
           f"baseline: python + ucstage.manifest + pyarrow + numpy imports: {base_wall:.2f} s, "
           f"{base_peak:.0f} MiB")
    wall, peak, inner = run([py, "-c", WORKER, arrow, fp])
    record("worker slot 5:3", wall, peak,
           f"worker slot 5:3 of {a.files:,} (header check, shuffled): {wall:.2f} s, "
           f"{peak:.0f} MiB peak ({inner})")
    for path in (js, arrow):
        for extra in ([], ["--slot", "5:3"], ["--shuffle", "--slot", "5:3"]):
            shard_plan(path, extra)
    Report(benchmark_name(__file__), params_of(a), rows).emit(a.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
