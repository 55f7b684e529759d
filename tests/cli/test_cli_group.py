"""`shard-plan --group key` and `cache warm --group key`, run as a user runs them
(a local folder, and the moto S3 server once)."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from tests.common.parts import unique
from ucstage.cli import cli


def run(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def vol(tmp_path):
    root = tmp_path / "vol"
    for i in range(21):
        for suffix in ("jpg", "json") if i != 5 else ("jpg",):
            path = root / f"d{i % 2}" / f"{i:03d}.{suffix}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * (i + 1))
    # Path order would split sample d0/K: d0/K.jpg < d0/K.jpgx/a.txt < d0/K.json
    (root / "d0" / "K.jpg").write_bytes(b"k")
    (root / "d0" / "K.jpgx").mkdir()
    (root / "d0" / "K.jpgx" / "a.txt").write_bytes(b"a")
    (root / "d0" / "K.json").write_bytes(b"k")
    return str(root)


def test_shard_plan_counts_samples_and_members_per_slot(vol) -> None:  # type: ignore[no-untyped-def]
    result = run("shard-plan", vol, "-w", "2", "-k", "2", "--group", "key", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    g = doc["grouping"]
    assert doc["files"] == g["samples"] == 23 and g["members"] == 44
    assert sum(s["samples"] for s in g["slots"]) == 23
    assert sum(s["members"] for s in g["slots"]) == 44
    # The plan's items are samples named by key; every key once.
    named = [k for s in doc["slots"] for k in s["files"]]
    assert sorted(named) == sorted({*(f"d{i % 2}/{i:03d}" for i in range(21)), "d0/K",
                                    "d0/K.jpgx/a"})
    human = run("shard-plan", vol, "-w", "2", "-k", "2", "--group", "key")
    assert "23 samples of 44 files" in human.output
    assert "every sample is read exactly once" in human.output  # counted as samples
    heads = [line.split("  ")[0] for line in human.output.splitlines()]
    assert "samples per slot" in heads and "files per slot" not in heads
    # --slot prints the members of the slot's samples, a sample's files together.
    one = run("shard-plan", vol, "-w", "1", "-k", "0", "--group", "key", "--slot", "0:0")
    lines = one.output.split()
    assert lines.index("d0/K.json") == lines.index("d0/K.jpg") + 1


def test_warm_with_rank_warms_that_ranks_whole_samples(vol, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    plan = json.loads(run("shard-plan", vol, "-w", "2", "-k", "2", "--group", "key",
                          "--json").output)
    want = sum(s["members"] for s in plan["grouping"]["slots"] if s["rank"] == 1)
    result = run("cache", "warm", vol, "--group", "key", "--rank", "1", "-w", "2", "-k", "2",
                 "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["files"] == doc["fetched"] == want
    cached = {os.path.relpath(os.path.join(d, f), doc["namespace"])
              for d, _, fs in os.walk(doc["namespace"]) for f in fs}
    stems = {c.split(".", 1)[0] for c in cached}
    for stem in stems:  # whole samples: both members of every two-member sample
        if stem.startswith("d") and stem.split("/")[-1] not in ("005", "K"):
            assert {f"{stem}.jpg", f"{stem}.json"} <= cached, stem


def test_group_takes_only_key(vol) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(cli, ["shard-plan", vol, "-w", "1", "-k", "1", "--group",
                                      "name"])
    assert result.exit_code == 2
    result = CliRunner().invoke(cli, ["shard-plan", vol, "-w", "1", "-k", "1", "--group",
                                      "key", "--resume", "state.json"])
    assert result.exit_code == 2 and "--group" in result.output


def test_group_over_s3(moto, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    for name, value in moto.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    prefix = unique("groupcli")
    moto.filesystem().pipe({f"ucstage-test/{prefix}/t/{i}.{suffix}": b"y" * (i + 1)
                            for i in range(6) for suffix in ("jpg", "json")})
    source = f"s3://ucstage-test/{prefix}/t"
    result = run("shard-plan", source, "-w", "2", "-k", "1", "--group", "key", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["grouping"]["samples"] == 6
    warmed = run("cache", "warm", source, "--group", "key", "--rank", "0", "-w", "2", "-k", "1",
                 "--json")
    assert warmed.exit_code == 0, warmed.output
    assert json.loads(warmed.output)["files"] == 6  # 3 samples of 2 members
