"""Issue 15 targets: a 1M-file manifest, one slot, a whole plan, freezing.

    python -m benchmarks.manifest [--files 1000000] [--dir /tmp/ucstage-bench-manifest] [--json]

Each figure is one fresh subprocess (time and peak RSS of the whole process,
from its rusage); the listing is synthetic (no files are created).
"""

from __future__ import annotations

import argparse
import os
import sys
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--dir", default="/tmp/ucstage-bench-manifest")
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
            wall, peak, _ = run([py, "-m", "ucstage", "shard-plan", path, "-w", "128", "-k", "8",
                                 *extra])
            label = f"shard-plan {os.path.basename(path)} -w 128 -k 8 {' '.join(extra)}".strip()
            record(label, wall, peak, f"{label}: {wall:.2f} s, {peak:.0f} MiB")
    Report(benchmark_name(__file__), params_of(a), rows).emit(a.json, "\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
