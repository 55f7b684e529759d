"""`ucstage shard-plan SOURCE --unit row-group` on real tables: Parquet folders
written with pyarrow, Delta tables written with deltalake; checked against a
brute-force model of the slot rule over row groups."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from ucstage.cli import cli


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["shard-plan", *args], catch_exceptions=False)


def _table(start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "text": pa.array([f"event {i}" for i in ids]),
                     "vec": pa.FixedSizeListArray.from_arrays(
                         pa.array(np.repeat(ids, 4).astype(np.float32)), 4)})


FILES = [(0, 70, 20), (70, 45, 20), (115, 33, 10)]
"""(first id, rows, rows per row group) of each file: 4 + 3 + 4 = 11 row groups."""


@pytest.fixture
def folder(tmp_path: Path) -> str:
    root = tmp_path / "events"
    root.mkdir()
    for i, (start, n, per) in enumerate(FILES):
        pq.write_table(_table(start, n), root / f"part-{i}.parquet", row_group_size=per)
    (root / "_SUCCESS").write_bytes(b"")
    return str(root)


def _groups() -> list[int]:
    """Rows of every row group in listing order (files sorted, groups in file order)."""
    out = []
    for _, n, per in FILES:
        out += [min(per, n - at) for at in range(0, n, per)]
    return out


def _model(world: int, workers: int) -> list[list[int]]:
    """The slot rule by hand: slot s = rank * K + worker reads s, s + W*K, ..."""
    k = max(1, workers)
    n = len(_groups())
    return [list(range(s, n, world * k)) for s in range(world * k)]


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 2), (3, 1), (1, 4)])
def test_slots_read_the_row_groups_the_rule_gives(folder: str, world: int,
                                                  workers: int) -> None:
    result = run(folder, "--unit", "row-group", "-w", str(world), "-k", str(workers),
                 "--batch-rows", "8", "--json")
    rows = _groups()
    doc = json.loads(result.stdout)
    assert result.exit_code == (0 if doc["batches_equal"] else 1), result.output
    assert (doc["unit"], doc["kind"], doc["row_groups"], doc["rows"]) == (
        "row-group", "parquet", 11, 148)
    model = _model(world, workers)
    got = {(s["rank"], s["worker"]): s for s in doc["slots"]}
    k = max(1, workers)
    for slot, groups in enumerate(model):
        s = got[(slot // k, slot % k)]
        assert s["row_groups"] == groups
        assert s["rows"] == sum(rows[g] for g in groups)
        assert s["batches"] == -(-s["rows"] // 8)
    for r in doc["ranks"]:
        mine = [got[(r["rank"], w)] for w in range(k)]
        assert r["rows"] == sum(s["rows"] for s in mine)
        assert r["batches"] == sum(s["batches"] for s in mine)
    assert sorted(g for s in doc["slots"] for g in s["row_groups"]) == list(range(11))
    assert doc["batches_equal"] == (len({r["batches"] for r in doc["ranks"]}) == 1)
    assert doc["summary"]["rows_per_slot"]["max"] == max(s["rows"] for s in doc["slots"])


def test_human_plan_and_the_batch_check(folder: str) -> None:
    # 2 x 2 slots: rows per slot 70, 20, 33, 25; batches of 8 differ by rank.
    uneven = run(folder, "--unit", "row-group", "-w", "2", "-k", "2", "--batch-rows", "8")
    assert uneven.exit_code == 1
    out = " ".join(uneven.output.split())
    assert "148 in 11 row groups of 3 files" in out
    assert "every row group is read exactly once" in out
    assert "ranks yield different batch counts" in out and "--equal-length drop" in out
    assert "error: ranks would get different batch counts" in out

    drop = run(folder, "--unit", "row-group", "-w", "2", "-k", "2", "--batch-rows", "8",
               "--equal-length", "drop", "--json")
    assert drop.exit_code == 0, drop.output
    doc = json.loads(drop.stdout)
    fewest = min(s["rows"] for s in doc["slots"])
    assert doc["batches_per_slot"] == fewest // 8
    assert [r["batches"] for r in doc["ranks"]] == [2 * (fewest // 8)] * 2
    pad = json.loads(run(folder, "--unit", "row-group", "-w", "2", "-k", "2",
                         "--batch-rows", "8", "--equal-length", "pad", "--json").stdout)
    assert pad["batches_per_slot"] == -(-max(s["rows"] for s in doc["slots"]) // 8)
    human = run(folder, "--unit", "row-group", "-w", "2", "-k", "2", "--batch-rows", "8",
                "--equal-length", "drop")
    assert "every rank yields" in human.output and "equal_length=drop" in human.output


def test_an_empty_epoch_is_a_warning_never_a_check(folder: str) -> None:
    """Issue 30 item 2: equal-length batches larger than every slot's rows
    make an empty epoch: a warning and exit 1, not `✓ every rank yields 0`."""
    empty = CliRunner().invoke(cli, ["shard-plan", folder, "--unit", "row-group", "-w", "2",
                                     "-k", "2", "--batch-rows", "64", "--equal-length", "drop"],
                               env={"COLUMNS": "80"})
    assert empty.exit_code == 1, empty.output
    out = " ".join(empty.output.split())
    assert "✓ every rank yields" not in out
    assert "! every rank yields 0 batches: the epoch is empty" in out
    assert "use a smaller --batch-rows, fewer slots, or --equal-length pad" in out
    assert "error: every rank yields 0 batches: the epoch is empty" in out
    one = CliRunner().invoke(cli, ["shard-plan", folder, "--unit", "row-group", "-w", "1",
                                   "-k", "1", "--batch-rows", "148", "--equal-length", "drop"])
    assert one.exit_code == 0 and "✓ every rank yields 1 batch" in one.output  # singular


def test_more_slots_than_row_groups_fails_and_names_the_export_option(folder: str) -> None:
    result = run(folder, "--unit", "row-group", "-w", "4", "-k", "4")
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "5 of 16 slots read no row group" in out and "--row-group-rows" in out
    doc = json.loads(run(folder, "--unit", "row-group", "-w", "4", "-k", "4",
                         "--json").stdout)
    assert doc["empty_slots"]["count"] == 5 and len(doc["slots"]) == 11


def test_shuffle_deals_every_row_group_once_per_node(folder: str) -> None:
    seen = []
    for epoch in (0, 1):
        doc = json.loads(run(folder, "--unit", "row-group", "-w", "4", "-k", "1",
                             "--nproc-per-node", "2", "--shuffle", "--seed", "3",
                             "--epoch", str(epoch), "--json").stdout)
        groups = [g for s in doc["slots"] for g in s["row_groups"]]
        assert sorted(groups) == list(range(11))
        seen.append({s["node"]: sorted(g for x in doc["slots"] if x["node"] == s["node"]
                                       for g in x["row_groups"]) for s in doc["slots"]})
    assert seen[0] == seen[1]  # the node scope: each node keeps its row groups


def test_columns_count_only_their_bytes(folder: str) -> None:
    every = json.loads(run(folder, "--unit", "row-group", "-w", "1", "-k", "1",
                           "--json").stdout)
    ids = json.loads(run(folder, "--unit", "row-group", "-w", "1", "-k", "1",
                         "--columns", "id", "--json").stdout)
    assert ids["columns"] == ["id"] and every["columns"] == ["id", "text", "vec"]
    assert 0 < ids["bytes"] < every["bytes"]


def test_delta_table_at_a_version(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "delta")
    write_deltalake(path, _table(0, 40))
    write_deltalake(path, _table(40, 25), mode="append")
    latest = json.loads(run(path, "--unit", "row-group", "-w", "1", "-k", "2",
                            "--json").stdout)
    first = json.loads(run(path, "--unit", "row-group", "-w", "1", "-k", "2", "--version",
                           "0", "--json").stdout)
    assert (latest["kind"], latest["table_version"], latest["rows"]) == ("delta", 1, 65)
    assert (first["table_version"], first["rows"]) == (0, 40)


@pytest.mark.parametrize(("args", "message"), [
    (["-w", "2", "-k", "1", "--batch-rows", "4"],
     "--batch-rows only apply to --unit row-group"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--include", "*.parquet"],
     "--include do not apply to --unit row-group"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "-b", "4"],
     "--batch-size do not apply to --unit row-group"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--group", "key"],
     "--group do not apply to --unit row-group"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--equal-length", "drop"],
     "--equal-length counts batches, so it needs --batch-rows"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--batch-rows", "0"],
     "--batch-rows must be at least 1, got 0"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--columns", "id,nope"],
     "has no column 'nope'"),
    (["-w", "2", "-k", "1", "--unit", "row-group", "--seed", "3"],
     "--seed/--epoch only matter with --shuffle"),
])
def test_bad_input_exits_2_with_one_line(folder: str, args: list[str], message: str) -> None:
    result = run(folder, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and result.output.count("error:") == 1


def test_a_folder_that_is_not_parquet_exits_2(tmp_path: Path) -> None:
    root = tmp_path / "text"
    root.mkdir()
    (root / "a.parquet").write_text("not parquet at all")
    result = run(str(root), "--unit", "row-group", "-w", "1", "-k", "1")
    assert result.exit_code == 2, result.output
    assert "a.parquet is not a Parquet file" in result.output
    assert "Traceback" not in result.output


def test_a_saved_row_group_manifest_plans_the_same(folder: str, tmp_path: Path) -> None:
    from ucstage.manifest import save
    from ucstage.tables import row_groups

    saved = save(row_groups(folder), os.path.join(tmp_path, "events.rowgroups.arrow"))
    direct = json.loads(run(folder, "--unit", "row-group", "-w", "2", "-k", "2",
                            "--json").stdout)
    frozen = json.loads(run("--manifest", saved, "--unit", "row-group", "-w", "2", "-k", "2",
                            "--json").stdout)
    assert frozen["fingerprint"] == direct["fingerprint"]
    assert frozen["slots"] == direct["slots"]


# -- cache warm --unit row-group --------------------------------------------------

def warm(*args: str) -> Any:
    return CliRunner().invoke(cli, ["cache", "warm", *args], catch_exceptions=False)


def _cached_groups(cache_dir: Path) -> set[tuple[str, str]]:
    """(file, entry name) of every row-group entry under the cache root."""
    found = set()
    for ns in cache_dir.iterdir():
        ranges = ns / ".ucstage-ranges"
        if ranges.is_dir():
            for d, _, names in os.walk(ranges):
                for n in names:
                    if n.startswith("rg"):
                        found.add((os.path.relpath(d, ranges), n))
    return found


def test_warm_a_nodes_share_is_what_its_ranks_read(folder: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from ucstage.tables import row_groups

    manifest = row_groups(folder)
    names = [(manifest.files[int(f)].path, f"rg{int(i)}")
             for f, i in zip(manifest.file, manifest.index, strict=True)]
    job = ["-w", "4", "-k", "2", "--nproc-per-node", "2", "--shuffle", "--seed", "5"]
    plan = json.loads(run(folder, "--unit", "row-group", *job, "--json").stdout)
    for node in (0, 1):
        cache = tmp_path / f"node{node}"
        monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(cache))
        result = warm(folder, "--unit", "row-group", "--node-rank", str(node), *job,
                      "--json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        mine = {g for s in plan["slots"] if s["node"] == node for g in s["row_groups"]}
        assert doc["files"] == len(mine) and doc["failed"] == []
        assert _cached_groups(cache) == {names[g] for g in mine}
        again = warm(folder, "--unit", "row-group", "--node-rank", str(node), *job)
        assert f"Warmed {len(mine)} row groups" in again.output
        assert f"already cached {len(mine)}" in again.output


def test_warmed_columns_serve_table_dataset_without_the_source(
        folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from ucstage import TableDataset
    from ucstage.manifest import save
    from ucstage.tables import row_groups

    saved = save(row_groups(folder), str(tmp_path / "events.rowgroups.arrow"))
    cache = tmp_path / "cache"
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(cache))
    result = warm("--manifest", saved, "--unit", "row-group", "--columns", "id")
    assert result.exit_code == 0, result.output
    assert "Warmed 11 row groups" in result.output
    assert all("-" in name for _, name in _cached_groups(cache))  # named by their columns
    # The source is gone: only the warmed entries can deliver these rows.
    os.rename(folder, folder + ".gone")
    ds = TableDataset(saved, columns=["id"], cache_dir=str(cache))
    ids = sorted(i for batch in ds for i in batch.column("id").to_pylist())
    assert ids == list(range(148))


@pytest.mark.parametrize(("args", "message"), [
    (["--unit", "row-group", "--include", "*.parquet"],
     "--include do not apply to --unit row-group"),
    (["--columns", "id"], "--columns only apply to --unit row-group"),
    (["--unit", "row-group", "--group", "key"], "--group do not apply to --unit row-group"),
    (["--unit", "row-group", "--columns", "nope"], "has no column 'nope'"),
])
def test_warm_bad_input_exits_2(folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                args: list[str], message: str) -> None:
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    result = warm(folder, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "cache").exists() or not _cached_groups(tmp_path / "cache")


@pytest.mark.parametrize("equal", [None, "drop", "pad"])
def test_plan_counts_the_batches_table_dataset_yields(folder: str, tmp_path: Path,
                                                      equal: str | None) -> None:
    pytest.importorskip("torch")
    from ucstage import TableDataset

    extra = ["--equal-length", equal] if equal else []
    doc = json.loads(run(folder, "--unit", "row-group", "-w", "1", "-k", "3",
                         "--batch-rows", "8", *extra, "--json").stdout)
    ds = TableDataset(folder, batch_rows=8, equal_length=equal or False,
                      cache_dir=str(tmp_path / "cache"))
    ds.freeze()
    ds.num_workers = 3  # what the DataLoader sets: len() counts the rank's 3 slots
    assert len(ds) == doc["ranks"][0]["batches"]
    # Read in the main process (one slot, worker 0 of 1): the rows the plan gives it.
    one = json.loads(run(folder, "--unit", "row-group", "-w", "1", "-k", "0",
                         "--batch-rows", "8", *extra, "--json").stdout)
    got = list(ds)
    assert len(got) == one["slots"][0]["batches"]
    if equal is None:
        assert sum(b.num_rows for b in got) == one["slots"][0]["rows"] == 148


def test_ranks_without_a_row_group_count_as_zero_batches(folder: str) -> None:
    # 16 ranks of one worker, 11 row groups: 5 ranks yield no batch, the others 1.
    result = run(folder, "--unit", "row-group", "-w", "16", "-k", "1")
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "5 ranks read no row group" in out
    assert "ranks yield different batch counts (0..1)" in out
