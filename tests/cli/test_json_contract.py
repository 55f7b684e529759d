"""Every command's --json against the documents in docs/: the keys, types and
nesting shown there are a contract (new keys may be added, none renamed,
removed or retyped). The schema is read from the docs' examples, so a doc
and the code cannot drift apart unnoticed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.parts import REPO, small_tree
from tests.common.spark import Warehouse  # noqa: F401  (fixture type)
from ucstage.cli.app import cli

DOCS = Path(REPO) / "docs"
_ANY = object()


def doc_examples(name: str) -> dict[str, Any]:
    """The first ```json block under each heading of ``docs/<name>``, parsed.

    The examples are written for people: ``// comments`` and ``…`` for
    elided list items are stripped before parsing.
    """
    found: dict[str, Any] = {}
    heading = ""
    text = (DOCS / name).read_text(encoding="utf-8")
    for match in re.finditer(r"^(#+ [^\n]*)$|^```json\n(.*?)^```", text, flags=re.M | re.S):
        if match.group(1):
            heading = match.group(1).lstrip("#").strip()
            continue
        if heading in found:
            continue
        block = re.sub(r"\s{2,}//[^\n]*", "", match.group(2))
        block = re.sub(r",\s*…", "", block)
        found[heading] = json.loads(block)
    return found


def schema_of(value: Any) -> Any:
    """The shape of a documented value: dict of shapes, [element shape], or a type."""
    if value is None:
        return _ANY  # documented as null: the type depends on the options
    if isinstance(value, dict):
        return {k: schema_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [schema_of(value[0])] if value else [_ANY]
    if isinstance(value, bool):
        return bool
    if isinstance(value, (int, float)):
        return float  # JSON numbers: 40 and 40.0 are one type
    return type(value)


def check(actual: Any, schema: Any, where: str = "$") -> list[str]:
    """Where ``actual`` breaks ``schema`` (documented keys missing or retyped)."""
    if schema is _ANY or actual is None:
        return []  # null where the docs show a value: optional fields (e.g. without -b)
    if isinstance(schema, dict):
        if not isinstance(actual, dict):
            return [f"{where}: expected an object, got {type(actual).__name__}"]
        problems = [f"{where}.{k}: missing" for k in schema if k not in actual]
        for key, sub in schema.items():
            if key in actual:
                problems += check(actual[key], sub, f"{where}.{key}")
        return problems
    if isinstance(schema, list):
        if not isinstance(actual, list):
            return [f"{where}: expected a list, got {type(actual).__name__}"]
        return [p for i, item in enumerate(actual[:3]) for p in check(item, schema[0], f"{where}[{i}]")]
    if schema is float:
        ok = isinstance(actual, (int, float)) and not isinstance(actual, bool)
    else:
        ok = isinstance(actual, schema)
    return [] if ok else [f"{where}: expected {schema.__name__}, got {type(actual).__name__}"]


def test_checker_catches_drift():
    schema = schema_of({"files": 3, "ranks": [{"rank": 0}], "name": "x", "n": None})
    assert check({"files": 3, "ranks": [{"rank": 1}], "name": "y", "n": [1]}, schema) == []
    assert check({"files": "3", "ranks": [{}], "n": 1}, schema) == [
        "$.name: missing", "$.files: expected float, got str", "$.ranks[0].rank: missing"]


def run_json(*args: str, codes: tuple[int, ...] = (0,)) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code in codes, result.output
    return json.loads(result.stdout)


def assert_matches(doc: str, heading: str, actual: Any) -> None:
    problems = check(actual, schema_of(doc_examples(doc)[heading]))
    assert problems == [], f"{doc} '{heading}' vs --json output:\n" + "\n".join(problems)


@pytest.fixture
def source(tmp_path: Path) -> str:
    return small_tree(tmp_path / "vol", files=12, folders=3, name="f{i:02d}.bin")


def test_shard_plan(source: str) -> None:
    assert_matches("json.md", "`ucstage shard-plan`",
                   run_json("shard-plan", source, "-w", "2", "-k", "3", "-b", "4"))
    # Without --batch-size the documented nullable fields are null, not missing.
    doc = run_json("shard-plan", source, "-w", "2", "-k", "3")
    assert doc["batch_size"] is None and doc["batches"] is None
    slot = run_json("shard-plan", source, "-w", "2", "-k", "3", "--slot", "1:2")
    assert set(slot) == {"rank", "worker", "node", "files", "bytes"}
    doc = run_json("shard-plan", source, "-w", "4", "-k", "1", "--nproc-per-node", "2",
                   "--shuffle", "--epochs", "2", "--max-bytes", "1G")
    assert_matches("json.md", "`ucstage shard-plan`", doc)
    assert_matches("json.md", "The network forecast (`--epochs`)", {"forecast": doc["forecast"]})


def test_shard_plan_group(source: str) -> None:
    doc = run_json("shard-plan", source, "-w", "2", "-k", "2", "--group", "key")
    assert_matches("json.md", "`ucstage shard-plan`", doc)
    assert_matches("json.md", "Grouped samples (`--group key`)", doc)


def test_shard_plan_resume(source: str, tmp_path: Path) -> None:
    from ucstage import manifest as mf
    from ucstage.resume import LoaderState
    from ucstage.sharding import Layout, ReadOrder, Segment

    listing = mf.snapshot(source)
    state = LoaderState(listing.fingerprint,
                        ReadOrder(12, shuffle=True, seed=3, epoch=0, equal_length=None,
                                  shuffle_scope="global"),
                        (Segment(Layout(2, 2), (2, 1, 2, 1)),))
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state.to_dict()))
    doc = run_json("shard-plan", source, "-w", "3", "-k", "1", "-b", "2", "--resume", str(path))
    assert_matches("json.md", "`ucstage shard-plan --resume`", doc)
    assert doc["mode"] == "resplit" and doc["remaining_files"] == 6
    slot = run_json("shard-plan", source, "-w", "3", "-k", "1", "--slot", "2:0",
                    "--resume", str(path))
    assert set(slot) == {"rank", "worker", "files", "bytes"}


def test_error_document(source: str) -> None:
    doc = run_json("shard-plan", source, "-w", "0", "-k", "1", codes=(2,))
    assert_matches("json.md", "JSON output", doc)


def test_cache_commands(source: str) -> None:
    assert_matches("json-cache.md", "warm", run_json("cache", "warm", source))
    assert_matches("json-cache.md", "warm", run_json("cache", "warm", source, "--rank", "0",
                                                      "-w", "2", "-k", "1"))
    assert_matches("json-cache.md", "lazy", run_json("cache", "lazy", source))
    assert_matches("json-cache.md", "status", run_json("cache", "status"))
    assert_matches("json-cache.md", "verify", run_json("cache", "verify", "--checksum"))
    assert_matches("json-cache.md", "verify", run_json("cache", "verify", source))
    assert_matches("json-cache.md", "prune", run_json("cache", "prune", "--max-bytes", "0",
                                                       "--lease", "0"))
    assert_matches("json-cache.md", "clear", run_json("cache", "clear", "--yes")
                   if "--yes" in CliRunner().invoke(cli, ["cache", "clear", "--help"]).output
                   else run_json("cache", "clear"))


def test_bench(source: str, tmp_path: Path) -> None:
    doc = run_json("bench", source, "-k", "1,2", "-m", "direct,cold,warm",
                   "--scratch-dir", str(tmp_path / "scratch"))
    example = doc_examples("bench.md")["JSON"]
    example.pop("plot")  # present only with --plot
    problems = check(doc, schema_of(example))
    assert problems == [], "\n".join(problems)


@pytest.mark.spark
def test_export(spark_session: Any, warehouse: Any, tmp_path: Path) -> None:
    doc = run_json("export", "main.ml.events", str(tmp_path / "events"), "--files", "2",
                   "-w", "1", "-k", "2")
    headings = doc_examples("export.md")
    record = next(v for k, v in headings.items() if "_ucstage_export.json" in k)
    problems = check(doc, schema_of({**record, "skipped_unchanged": False, "seconds": 1.0,
                                     "dest": "/x", "suggested_files": 2,
                                     "row_groups": {"count": 2, "rows_min": 800,
                                                    "rows_max": 800, "per_file": [1, 1]},
                                     "row_group_slots": {"slots": 2, "filled": 2,
                                                         "row_groups": [1, 1],
                                                         "rows": [800, 800]}}))
    assert problems == [], "\n".join(problems)


def test_pack(source: str, tmp_path: Path) -> None:
    dest = str(tmp_path / "packed")
    published = run_json("pack", source, dest, "--samples-per-shard", "2")
    assert_matches("json.md", "`ucstage pack`", published)
    assert published["pack"] is not None
    assert_matches("json.md", "`ucstage pack`", run_json("pack", source, dest,
                                                          "--samples-per-shard", "2"))
    waiting = run_json("pack", source, str(tmp_path / "two"), "--rank", "1", "-w", "2")
    assert waiting["pack"] is None and waiting["parts_done"] == 1
