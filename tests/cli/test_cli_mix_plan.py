"""`ucstage shard-plan SRC1 SRC2 --weights/--repeat`, run as a user runs it:
the per-slot items of each source and each source's passes, and one clear
error (exit 2) for bad input."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ucstage.cli import cli


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, ["shard-plan", *args], catch_exceptions=False)


@pytest.fixture
def two(tmp_path):  # type: ignore[no-untyped-def]
    out = []
    for name, n in (("a", 100), ("b", 50)):
        root = tmp_path / name
        root.mkdir()
        for i in range(n):
            (root / f"{name}{i:03d}.txt").write_text(name)
        out.append(str(root))
    return out


def test_weights_print_each_slot_and_each_source_s_passes(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    result = run(a, b, "-w", "2", "-k", "2", "--weights", "0.5,0.5", "--epoch-size", "200",
                 "--epoch", "1", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["epoch_size"] == 200 and doc["epoch"] == 1
    assert [(s["source"], s["per_epoch"], s["passes_per_epoch"], s["passes"])
            for s in doc["sources"]] == [(a, 100, 1.0, [1, 1]), (b, 100, 2.0, [2, 3])]
    assert [s["items"] for s in doc["slots"]] == [[25, 25]] * 4
    human = run(a, b, "-w", "2", "-k", "2", "--weights", "0.7,0.3")
    assert human.exit_code == 0, human.output
    assert "143 items per epoch" in human.output and "0.86" in human.output
    assert "equal_length" in human.output  # 143 over 4 slots: 35..36


def test_repeat_and_a_single_source(two) -> None:  # type: ignore[no-untyped-def]
    a, b = two
    doc = json.loads(run(a, b, "-w", "1", "-k", "0", "--repeat", "0.1,2.5", "--json").output)
    assert [s["per_epoch"] for s in doc["sources"]] == [10, 125]
    one = json.loads(run(a, "-w", "1", "-k", "2", "--weights", "1", "--json").output)
    assert [s["items"] for s in one["slots"]] == [[50], [50]]


@pytest.mark.parametrize(("args", "message"), [
    (("--weights", "0,0"), "--weights must sum to a positive number"),
    (("--weights", "1,x"), "--weights must be numbers"),
    (("--weights", "1,2,3"), "--weights has 3 values for 2 sources"),
    (("--repeat", "1,-2"), "--repeat must be 0 or more"),
    (("--weights", "1,1", "--repeat", "1,1"), "pass weights or repeat, not both"),
    (("--weights", "1,1", "--slot", "0:0"), "--slot plan one source"),
    (("--weights", "1,1", "--shuffle"), "--shuffle plan one source"),
    (("--repeat", "1,1", "--epoch-size", "9"), "--epoch-size goes with weights"),
    (("--weights", "1,1", "-k", "2,1"), "one value for every rank"),
])
def test_bad_input_is_one_clear_error_and_exit_2(two, args, message) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(cli, ["shard-plan", *two, "-w", "2", "-k", "1", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_json_matches_the_documented_contract(two) -> None:  # type: ignore[no-untyped-def]
    from tests.cli.test_json_contract import assert_matches

    doc = json.loads(run(*two, "-w", "2", "-k", "2", "--weights", "0.7,0.3", "--json").output)
    assert_matches("json.md", "A mix (`--weights`, `--repeat`)", doc)
