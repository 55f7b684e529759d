"""`shard-plan --shuffle-scope/--nproc-per-node/--epochs`: the scope and the network
forecast from the shell."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from tests.common.parts import small_tree
from ucstage.cli import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def vol(tmp_path) -> str:  # type: ignore[no-untyped-def]
    return small_tree(tmp_path / "vol", files=120, folders=4, name="f{i:03d}.bin")


JOB = ("-w", "4", "-k", "2", "--nproc-per-node", "2", "--shuffle", "--seed", "1")


def test_forecast_shows_no_new_files_after_the_first_epoch_and_global_beside_it(vol) -> None:  # type: ignore[no-untyped-def]
    result = run("shard-plan", vol, *JOB, "--epochs", "3")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "shuffled within each node" in out and "2 x 2 ranks per node" in out
    assert "Network forecast over 3 epochs" in out
    assert "node scope:    the job fetches 120 files" in out and "after epoch 0: 0 files" in out
    global_line = next(line for line in out.splitlines() if "global scope:" in line)
    fetched = int(global_line.split("fetches ")[1].split(" files")[0].replace(",", ""))
    assert fetched > 120  # global re-reads files on other nodes

    doc = json.loads(run("shard-plan", vol, *JOB, "--epochs", "3", "--json").stdout)
    f = doc["forecast"]
    assert f["epochs"] == 3 and f["shuffle_scope"] == "node" and f["max_bytes"] is None
    node, glob = f["scopes"]["node"], f["scopes"]["global"]
    assert [r["new_files"] for r in node["epochs"] if r["epoch"] > 0] == [0, 0, 0, 0]
    assert node["new_files"] == 120 and glob["new_files"] == fetched
    assert [s["files"] for s in node["shares"]] == [60, 60]
    assert {s["node"] for s in doc["slots"]} == {0, 1}
    assert [(n["node"], n["ranks"], n["files"]) for n in doc["nodes"]] == [(0, [0, 1], 60),
                                                                           (1, [2, 3], 60)]
    assert sum(n["bytes"] for n in doc["nodes"]) == doc["bytes"]


def test_a_share_over_max_bytes_is_reported_and_exits_1(vol) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(run("shard-plan", vol, *JOB, "--epochs", "2", "--json").stdout)
    share = max(s["bytes"] for s in doc["forecast"]["scopes"]["node"]["shares"])
    result = run("shard-plan", vol, *JOB, "--epochs", "2", "--max-bytes", str(share - 1))
    assert result.exit_code == 1
    assert "node shares over the cap" in result.output
    assert "node shares exceed --max-bytes" in result.output
    assert run("shard-plan", vol, *JOB, "--epochs", "2", "--max-bytes", str(share)).exit_code == 0


def test_one_node_plan_is_unchanged_by_the_scope(vol) -> None:  # type: ignore[no-untyped-def]
    def slots(*extra: str) -> list:
        doc = json.loads(run("shard-plan", vol, "-w", "3", "-k", "2", "--shuffle", "--seed", "4",
                             "--epoch", "2", *extra, "--json").stdout)
        return [(s["rank"], s["worker"], s["files"]) for s in doc["slots"]]

    assert slots() == slots("--shuffle-scope", "global") == slots("--shuffle-scope", "node") \
        == slots("--nproc-per-node", "3")


def test_bad_scope_options_exit_2(vol) -> None:  # type: ignore[no-untyped-def]
    result = run("shard-plan", vol, "-w", "6", "-k", "1", "--nproc-per-node", "4", "--shuffle")
    assert result.exit_code == 2 and "not a multiple of --nproc-per-node 4" in result.output
    result = run("shard-plan", vol, "-w", "2", "-k", "1", "--shuffle-scope", "global")
    assert result.exit_code == 2 and "--shuffle-scope only matters with --shuffle" in result.output
    result = run("shard-plan", vol, "-w", "2", "-k", "1", "--max-bytes", "1G")
    assert result.exit_code == 2 and "needs --epochs" in result.output
    result = run("shard-plan", vol, "-w", "2", "-k", "1", "--epochs", "2", "--slot", "0:0")
    assert result.exit_code == 2


def test_slot_json_names_its_node(vol) -> None:  # type: ignore[no-untyped-def]
    doc = json.loads(run("shard-plan", vol, *JOB, "--slot", "3:1", "--json").stdout)
    assert doc["node"] == 1
    plan = json.loads(run("shard-plan", vol, *JOB, "--json").stdout)
    assert doc["files"] == next(s["files"] for s in plan["slots"]
                                if (s["rank"], s["worker"]) == (3, 1))


def test_forecast_warns_when_a_share_exceeds_this_machines_cache_disk(tmp_path,
                                                                        monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tests.common.parts import tmpfs

    src = tmp_path / "big"
    src.mkdir()
    for i in range(40):
        (src / f"f{i:02d}.bin").write_bytes(b"x" * 10_000)
    with tmpfs(str(tmp_path / "small"), "size=64k") as small:
        monkeypatch.setenv("UCSTAGE_CACHE_DIR", os.path.join(small, "c"))
        result = run("shard-plan", str(src), *JOB, "--epochs", "2")
        assert result.exit_code == 0, result.output
        assert "the largest share does not fit in the" in result.output
        doc = json.loads(run("shard-plan", str(src), *JOB, "--epochs", "2", "--json").stdout)
        assert doc["forecast"]["disk_free"] <= 64 * 1024
        assert doc["forecast"]["cache_dir"] == os.path.join(small, "c")
    assert "does not fit" not in run("shard-plan", str(src), *JOB, "--epochs", "2").output
