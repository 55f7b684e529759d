"""The shard-plan request is the library's: it checks the rules between the
options itself (naming parameters, which the CLI's mapper says as flags) and
plans every mode without the CLI."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ucstage.cli.output import flag_names
from ucstage.cli.shard_plan import shard_plan
from ucstage.errors import InvalidArgument
from ucstage.planning import FilePlan, PlanRequest, SlotFiles


@pytest.fixture
def folder(tmp_path: Path) -> str:
    root = tmp_path / "files"
    root.mkdir()
    for i in range(8):
        (root / f"s{i}.jpg").write_bytes(b"x" * (10 + i))
        (root / f"s{i}.txt").write_bytes(b"y")
    return str(root)


@pytest.mark.parametrize(("options", "message"), [
    ({"seed": 0}, "--seed/--epoch only matter with --shuffle"),  # 0 is a seed given
    ({"shuffle_scope": "global"}, "--shuffle-scope only matters with --shuffle"),
    ({"slot": (0, 0), "epochs": 2}, "--epochs forecasts the whole job; it does not combine "
                                    "with --slot"),
    ({"max_bytes": 10}, "--max-bytes checks the forecast's node shares; it needs --epochs"),
    ({"resume": "s.json", "shuffle": True, "seed": 1},
     "--resume takes shuffle, its scope, seed and epoch from the state"),
    ({"resume": "s.json", "num_workers": (1, 2), "world_size": 2},
     "--resume takes one --num-workers for every rank"),
    ({"batch_rows": 4}, "--batch-rows only apply to --unit row-group"),
    ({"unit": "row-group", "include": ("*.jpg",), "batch_size": 2},
     "--include and --batch-size do not apply to --unit row-group"),
    ({"unit": "row-group", "equal_length": "pad"},
     "--equal-length counts batches, so it needs --batch-rows"),
    ({"weights": (1.0,), "group": "key", "unit": "file"},
     "--group and --unit plan one source; a mix (several SOURCEs, --weights, --repeat or "
     "--epoch-size) does not take them"),
    ({"sources": ("a", "b"), "num_workers": (1, 2), "world_size": 2},
     "--num-workers takes one value for every rank in a mix plan"),
])
def test_the_rules_are_the_requests_and_read_as_flags(options: dict, message: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        PlanRequest(**{"sources": ("src",), **options})
    assert "--" not in raised.value.message  # the library names parameters
    assert flag_names(raised.value.message, shard_plan) == message


def test_every_mode_plans_without_the_cli(folder: str, tmp_path: Path) -> None:
    files = PlanRequest((folder,), world_size=2, num_workers=2).plan()
    assert isinstance(files, FilePlan) and files.plan.ok and files.forecast is None
    assert files.to_json()["files"] == 16
    samples = PlanRequest((folder,), world_size=2, num_workers=2, group="key", shuffle=True,
                          epochs=2, max_bytes=10).plan()
    assert isinstance(samples, FilePlan) and not samples.fits  # a node holds more than 10 B
    assert samples.to_json()["grouping"]["samples"] == 8
    one = PlanRequest((folder,), world_size=2, num_workers=2, slot=(1, 0)).plan()
    # Slot 1:0 is slot 2 of 4: files 2, 6, 10 and 14 of the listing.
    assert isinstance(one, SlotFiles) and [e.path for e in one.files] == ["s1.jpg", "s3.jpg",
                                                                          "s5.jpg", "s7.jpg"]
    mix = PlanRequest((folder, folder), world_size=1, num_workers=1, weights=(3.0, 1.0),
                      epoch_size=8).plan()
    assert [s["per_epoch"] for s in mix.to_json()["sources"]] == [6, 2]
    table = tmp_path / "table"
    table.mkdir()
    pq.write_table(pa.table({"id": list(range(40))}), table / "part-0.parquet",
                   row_group_size=10)
    request = PlanRequest((str(table),), world_size=2, num_workers=1, unit="row-group",
                          batch_rows=5)
    assert request.mode == "row-group"
    assert [r.batches for r in request.plan().ranks] == [4, 4]  # 2 row groups of 10 rows each
