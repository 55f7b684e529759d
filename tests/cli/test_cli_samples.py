"""`ucstage shard-plan SOURCE --unit sample` on real shards (tar shards by
webdataset's ShardWriter, JSON Lines by pandas): each slot's shards and
sample ranges, checked against what ShardDataset reads in each slot of the
same layout; its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import CliRunner

from tests.common.shards import write_shards
from ucstage import ShardDataset
from ucstage.cli import cli
from ucstage.sharding import World


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["shard-plan", *args], catch_exceptions=False)


def planned(doc: dict[str, Any]) -> list[set[tuple[str, int]]]:
    """Per slot of the JSON plan: its (shard, sample number) pairs."""
    return [{(r["shard"], i) for r in s["ranges"] for i in range(r["first"], r["stop"])}
            for s in doc["slots"]]


def read(ds: ShardDataset, world: int) -> list[set[tuple[str, int]]]:
    """Per rank (num_workers 0): what the dataset reads, as (shard, sample number)."""
    out = []
    for rank in range(world):
        ds.world = lambda rank=rank: World(rank, world, 0, 0, None, None)  # type: ignore[method-assign]
        slot = [(s["__shard__"], int(json.loads(s["json"])["i"]) % 30) for s in ds]
        assert len(slot) == len(set(slot))
        out.append(set(slot))
    return out


@pytest.mark.parametrize("extra", [[], ["--shuffle", "--seed", "3", "--epoch", "2"],
                                   ["--shuffle", "--nproc-per-node", "2"],
                                   ["--shuffle", "--shuffle-scope", "global",
                                    "--nproc-per-node", "2"]])
def test_the_plan_is_what_each_slot_reads(tmp_path: Path, extra: list[str]) -> None:
    write_shards(str(tmp_path / "src"), 95, 30)  # shards of 30, 30, 30, 5
    result = run(str(tmp_path / "src"), "--unit", "sample", "-w", "4", "-k", "0",
                 "--block-samples", "7", "--json", *extra)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["unit"], doc["shards"], doc["samples"], doc["blocks"]) == ("sample", 4, 95, 16)
    assert doc["consistent"] and doc["empty_slots"] is None
    plan = planned(doc)
    assert sum(len(p) for p in plan) == 95 and len(set().union(*plan)) == 95
    assert [s["samples"] for s in doc["slots"]] == [len(p) for p in plan]
    shuffle = "--shuffle" in extra
    nproc = 2 if "--nproc-per-node" in extra else None
    ds = ShardDataset(str(tmp_path / "src"), block_samples=7, shuffle=shuffle,
                      seed=3 if "--seed" in extra else 0, nproc_per_node=nproc,
                      shuffle_scope="global" if "global" in extra else "node",
                      cache_dir=str(tmp_path / "cache"))
    ds.set_epoch(2 if "--epoch" in extra else 0)
    ds.num_workers = 0
    assert read(ds, 4) == plan


def test_the_human_view_names_each_slots_ranges(tmp_path: Path) -> None:
    write_shards(str(tmp_path / "src"), 60, 30)
    result = run(str(tmp_path / "src"), "--unit", "sample", "-w", "2", "-k", "2",
                 "--block-samples", "10")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "60 in 2 shards, 6 blocks of at most 10" in out
    assert "shard[first:stop]" in out
    assert "part-000.tar[0:10]" in out and "0:1" in out and "1:1" in out
    assert "every sample is read exactly once" in out


def test_jsonl_by_pandas_with_format_and_equal_length(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, n in enumerate((13, 4)):
        pd.DataFrame({"i": range(n)}).to_json(src / f"part-{i}.data", orient="records",
                                              lines=True)
    result = run(str(src), "--unit", "sample", "--format", "jsonl", "-w", "2", "-k", "1",
                 "--block-samples", "5", "--equal-length", "drop", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["samples"], doc["blocks"]) == (17, 4)  # 5 + 5 + 3, then 4
    assert [s["samples"] for s in doc["slots"]] == [8, 9]  # blocks 0, 2 / 1, 3
    assert doc["samples_per_slot_equal"] == 8
    # Without --format the .data files are no shards: a clear refusal.
    bad = run(str(src), "--unit", "sample", "-w", "1", "-k", "0")
    assert bad.exit_code == 2 and "holds no shard file" in bad.output


def test_more_slots_than_blocks_exits_1(tmp_path: Path) -> None:
    write_shards(str(tmp_path / "src"), 10, 10)
    result = run(str(tmp_path / "src"), "--unit", "sample", "-w", "4", "-k", "1",
                 "--block-samples", "5")
    assert result.exit_code == 1
    assert "2 of 4 slots read no sample" in result.output


@pytest.mark.parametrize(("args", "says"), [
    (["--unit", "sample", "--batch-rows", "4"], "do not apply to --unit sample"),
    (["--unit", "sample", "--batch-size", "4"], "do not apply to --unit sample"),
    (["--block-samples", "4"], "only apply to --unit sample"),
    (["--unit", "row-group", "--format", "tar"], "only apply to --unit sample"),
    (["--unit", "sample", "--block-samples", "0"], "at least 1"),
    (["--unit", "sample", "--seed", "2"], "only matter with"),
])
def test_options_that_do_not_go_with_samples_are_refused(tmp_path: Path, args: list[str],
                                                         says: str) -> None:
    write_shards(str(tmp_path / "src"), 10, 10)
    result = CliRunner().invoke(cli, ["shard-plan", str(tmp_path / "src"), "-w", "1",
                                      "-k", "0", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "Traceback" not in result.output
