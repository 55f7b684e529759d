"""benchmarks.tables delta_dv at a tiny scale: both tables are built, every run is
its own process, the deleted rows are gone from the dv side's counts, and
the document follows the --json contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.report import validate

ROOT = Path(__file__).resolve().parents[2]


def test_delta_dv_json_contract(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tables", "delta_dv", "--rows", "4000",
                           "--files", "2", "--groups-per-file", "2", "--deleted", "0.25",
                           "--pairs", "1", "--dir", str(tmp_path / "b"), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "tables" and doc["params"]["variant"] == "delta_dv"
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == {"freeze", "epoch"}
    for r in rows.values():
        assert r["rows"] == {"plain": 4000, "dv": 3000}  # a quarter of each file deleted
        assert r["a_median"] > 0 and r["b_median"] > 0
    assert isinstance(doc["summary"]["target_met"], bool)
