"""benchmarks.epochs mix follows the --json contract (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys

from benchmarks.report import validate


def test_mix_benchmark_json_contract() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.epochs", "mix", "--files", "60", "--pairs",
                           "3", "--repeat", "1", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "epochs" and doc["params"]["variant"] == "mix"
    assert len(doc["results"]) == 3
    assert set(doc["summary"]) >= {"sources_us_per_item", "mix_us_per_item",
                                   "mix_extra_us_per_item", "met"}
