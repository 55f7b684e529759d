"""The benchmarks/ harness: the pairs arithmetic, the command timing, and the
--json contract of one cheap benchmark (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.pairs import Comparison, alternate, order, schedule
from benchmarks.report import Report, numbers, validate
from benchmarks.timing import CommandFailed, run_command

ROOT = Path(__file__).resolve().parents[2]


def test_alternating_order() -> None:
    assert order(["a", "b"], 0) == ["a", "b"]
    assert order(["a", "b"], 1) == ["b", "a"]
    assert schedule(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"),
                                       (2, "a"), (2, "b")]
    ran: list[str] = []
    found = alternate({"a": lambda: ran.append("a") or 1.0,
                       "b": lambda: ran.append("b") or 2.0}, 3)
    assert ran == ["a", "b", "b", "a", "a", "b"]
    assert found == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}
    with pytest.raises(ValueError):
        alternate({"a": lambda: 1.0}, 0)


def test_comparison_by_hand() -> None:
    # base 1, 3, 2 (median 2); head 2, 3, 6 (median 3); per pair 2, 1, 3 (median 2)
    c = Comparison([1.0, 3.0, 2.0], [2.0, 3.0, 6.0])
    assert (c.a_median, c.b_median) == (2.0, 3.0)
    assert c.ratio == pytest.approx(1.5)
    assert c.pair_ratios == [2.0, 1.0, 3.0]
    assert c.median_pair_ratio == 2.0
    assert not c.within(0.10) and c.within(0.5)
    with pytest.raises(ValueError):
        Comparison([1.0], [1.0, 2.0])


def test_run_command_measures_the_child() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\nprint('done')"
    run = run_command([sys.executable, "-c", burn])
    assert run.last_line == "done" and run.returncode == 0
    assert run.timing.cpu_s >= 0.15 and run.timing.wall_s >= run.timing.cpu_s * 0.5
    assert run.timing.peak_rss_mib > 1
    with pytest.raises(CommandFailed):
        run_command([sys.executable, "-c", "raise SystemExit(3)"])
    assert run_command([sys.executable, "-c", "raise SystemExit(3)"], check=False).returncode == 3


def test_numbers_key_rows_by_name() -> None:
    doc = Report("x", {"n": 1}, [{"name": "step", "seconds": 2, "label": "s"}, {"v": 1.5}],
                 {"peak": 3, "nested": {"a": [1, 2]}, "flag": True}).to_dict()
    validate(doc)
    assert numbers(doc) == {"summary.peak": 3.0, "summary.nested.a.0": 1.0,
                            "summary.nested.a.1": 2.0, "results.step.seconds": 2.0,
                            "results.1.v": 1.5}
    with pytest.raises(ValueError):
        validate({"benchmark": "x"})


def test_shard_plan_json_contract(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.shard_plan", "--files", "2000",
                           "--world-size", "4", "--num-workers", "2", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)  # stdout is the one document; the table went to stderr
    validate(doc)
    assert doc["benchmark"] == "shard_plan"
    assert doc["params"] == {"files": 2000, "world_size": 4, "num_workers": 2}
    names = [r["name"] for r in doc["results"]]
    assert "fingerprint" in names and len(names) == len(set(names)) == 9
    assert all(r["seconds"] >= 0 and r["peak_rss_mib"] > 0 for r in doc["results"])
    assert doc["summary"]["slots"] == 8
    assert Path(doc["env"]["ucstage_file"]).resolve().is_relative_to(ROOT)
    assert "| step | seconds |" in proc.stderr


@pytest.mark.parametrize("mode", ["warm", "plan"])
def test_grouped_json_contract(tmp_path: Path, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "UCSTAGE_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.planning", "grouped", mode, "--samples", "30",
                           "--files", "4000", "--pairs", "1", "--dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "planning" and doc["params"]["variant"] == "grouped"
    assert doc["params"]["mode"] == mode
    assert [r["target"] for r in doc["results"]] == [1.1 if mode == "warm" else 1.5] * 2
    assert all(r["ungrouped_s"] > 0 and r["grouped_s"] > 0 for r in doc["results"])


def test_ab_compare_runs_both_sides(tmp_path: Path) -> None:
    """Two commits' ucstage under this tree's benchmark: both sides in one document."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                      capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.ab_compare", "--base", "HEAD",
                           "--head", str(ROOT), "--json", "--metric", "summary.slots",
                           "shard_plan", "--files", "200", "--world-size", "2",
                           "--num-workers", "3"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert [len(doc["runs"][side]) for side in ("base", "head")] == [3, 3]
    assert doc["params"]["base_spec"] == "HEAD"
    assert "/base-" in doc["runs"]["base"][0]["env"]["ucstage_file"]
    assert Path(doc["runs"]["head"][0]["env"]["ucstage_file"]).resolve().is_relative_to(ROOT)
    assert doc["results"] == [{"name": "summary.slots", "base": 6.0, "head": 6.0, "ratio": 1.0,
                               "pair_ratios": [1.0, 1.0, 1.0], "median_pair_ratio": 1.0,
                               "within": True}]


def test_tables_json_contract(tmp_path: Path) -> None:
    """benchmarks.tables datasets at a tiny scale: every arm runs in its own process, the
    TableDataset one included, and the document follows the contract."""
    pytest.importorskip("datasets")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.tables", "datasets", "--rows", "3000",
                           "--vector-rows", "60", "--files", "2", "--groups-per-file", "3",
                           "--pairs", "1", "--only", "first,epoch", "--tables", "small",
                           "--dir", str(tmp_path / "b"), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "tables" and doc["params"]["variant"] == "datasets"
    rows = {r["name"]: r for r in doc["results"]}
    assert set(rows) == {"first_batch_small", "epoch_small"}
    first = rows["first_batch_small"]
    assert all(first[f"{k}_s"] > 0 for k in ("datasets", "table", "pyarrow"))
    epoch = rows["epoch_small"]
    assert all(epoch[f"{k}_rows_s"] > 0 for k in ("pyarrow", "table_0w", "table_torch_2w"))
    assert "epoch_small.table_0w_over_pyarrow" in doc["summary"]


def test_profile_warm_epoch_cpu_json_contract(tmp_path: Path) -> None:
    """``--cpu`` times each step's CPU: one row per step, labelled as CPU."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.epochs", "profile", "--cpu",
                           "--files", "40", "--size-kib", "1", "--repeat", "1", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "epochs" and doc["params"]["variant"] == "profile"
    assert doc["params"]["cpu"] is True
    names = [r["name"] for r in doc["results"]]
    assert "vds" in names and "ucstage-loader" in names and len(names) == len(set(names))
    # (a 40-file step can take less CPU than the clock resolves: 0 is a figure too)
    assert all(r["us_per_file"] >= 0 for r in doc["results"])
    assert "µs CPU per file" in proc.stderr


def test_throttle_json_contract(tmp_path: Path) -> None:
    """benchmarks.faults throttle at a tiny scale: a warm through the rate-limited
    proxy of tests/common/faults.py, every file right, the document follows
    the contract."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.faults", "throttle", "--moto", "30x4K",
                           "--rate", "40", "--pairs", "1", "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    validate(doc)
    assert doc["benchmark"] == "faults" and doc["params"]["variant"] == "throttle"
    summary = doc["summary"]
    assert (summary["files"], summary["wrong_files"], summary["failed"]) == (30, 0, 0)
    assert summary["ideal_s"] == 0.75 and summary["ucstage_vs_ideal"] > 0
