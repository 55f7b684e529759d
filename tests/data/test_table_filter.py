"""TableDataset(filter=...): the rows are pyarrow.dataset's for the same
filter; partition values and statistics keep whole files and row groups
from being fetched; len(), equal_length, resume and the audit count matching
rows; a bad filter is one line naming the column or the character.

Delta tables are written by deltalake; the object-store tables are Parquet
folders on moto, read through the fault proxy (no faults set), which notes
every ranged GET so the bytes fetched are counted."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.common.faults import fault_proxy  # noqa: F401  (a fixture)
from tests.common.parts import unique
from ucstage import DataLoader, LocalCache, TableDataset
from ucstage.errors import InvalidArgument, UnknownColumn
from ucstage.tables import row_groups

N = 3000
DAY0 = datetime.date(2024, 1, 1)


def events(n: int = N) -> pa.Table:
    """``id`` 0..n-1 (sorted), ``split`` (every 4th test), ``label`` (null every
    7th), ``name`` (text), ``day`` (a date, 100 rows each), ``pad`` (bulk)."""
    ids = np.arange(n, dtype=np.int64)
    return pa.table({
        "id": ids,
        "split": ["test" if i % 4 == 0 else "train" for i in range(n)],
        "label": pa.array([None if i % 7 == 0 else i % 10 for i in range(n)], pa.int32()),
        "name": [f"n{i % 13:02d}" for i in range(n)],
        "day": pa.array([DAY0 + datetime.timedelta(days=i // 100) for i in range(n)]),
        "pad": [f"{i:08d}" * 8 for i in range(n)],
    })


def delta_table(path: Path, n: int = N) -> str:
    import deltalake

    deltalake.write_deltalake(str(path), events(n), partition_by=["split"],
                              writer_properties=deltalake.WriterProperties(
                                  max_row_group_size=250))
    return str(path)


def expected(path: str, expression: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    import deltalake

    got = deltalake.DeltaTable(path).to_pyarrow_dataset().to_table(filter=expression)
    return sorted(zip(*(got.column(c).to_pylist() for c in columns), strict=True))


def rows(batches: Any, columns: list[str]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for b in batches:
        assert b.schema.names == columns  # the filter's own columns are dropped
        out += zip(*(b.column(c).to_pylist() for c in columns), strict=True)
    return sorted(out)


F = pc.field
FILTERS = [
    ("label >= 3 and split = 'train'", (F("label") >= 3) & (F("split") == "train")),
    ("label is null or id < 40", F("label").is_null() | (F("id") < 40)),
    ("label is not null and not (label < 8)", F("label").is_valid() & ~(F("label") < 8)),
    ("label in (1, 2) and name <> 'n03'", F("label").isin([1, 2]) & (F("name") != "n03")),
    ("label not in (1, 2, 3)", ~F("label").isin([1, 2, 3]) & F("label").is_valid()),
    ("day >= '2024-01-10' and day < '2024-01-13'",
     (F("day") >= pa.scalar(DAY0 + datetime.timedelta(days=9)))
     & (F("day") < pa.scalar(DAY0 + datetime.timedelta(days=12)))),
    ("NAME = 'n05' or \"name\" = 'n07'", None),  # keywords any case, a quoted column
]


@pytest.mark.parametrize("text,expression", FILTERS, ids=[f[0] for f in FILTERS])
def test_rows_equal_pyarrow_dataset_s_for_the_same_filter(tmp_path: Path, text: str,
                                                          expression: Any) -> None:
    if expression is None:
        text, expression = "name = 'n05' or \"name\" = 'n07'", \
            (F("name") == "n05") | (F("name") == "n07")
    path = delta_table(tmp_path / "t")
    columns = ["id", "pad"]
    want = expected(path, expression, columns)
    assert 0 < len(want) < N
    for given in (text, expression):  # the string, and pyarrow's expression
        ds = TableDataset(path, columns=columns, filter=given, batch_rows=97,
                          cache=LocalCache(tmp_path / "cache"))
        assert rows(ds, columns) == want
        assert ds.freeze().rows == len(want)


def test_two_workers_shuffled_equal_length_and_a_resume_count_matching_rows(
        tmp_path: Path) -> None:
    path = delta_table(tmp_path / "t")
    want = {r[0] for r in expected(path, (F("id") >= 500) & (F("label") >= 2), ["id"])}

    def make() -> DataLoader:
        ds = TableDataset(path, columns=["id"], filter="id >= 500 and label >= 2",
                          shuffle=True, seed=7, shuffle_window=2, batch_rows=50,
                          cache=LocalCache(tmp_path / "cache"))
        return DataLoader(ds, batch_size=None, num_workers=2)

    loader = make()
    got = [b.column("id").to_pylist() for b in loader]
    assert len(got) == len(loader)  # len() counts matching rows' batches
    assert Counter(i for b in got for i in b) == Counter(want)
    audit = loader.audits[-1]
    assert audit.coverage_ok and audit.duplicates == 0 and audit.gaps == 0
    # Stopped mid-epoch, resumed: every matching row once, audited.
    first = make()
    it = iter(first)
    head = [next(it).column("id").to_pylist() for _ in range(5)]
    state = first.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    rest = [b.column("id").to_pylist() for b in again]
    assert Counter(i for b in head + rest for i in b) == Counter(want)
    assert again.audits[-1].coverage_ok and again.audits[-1].gaps == 0
    # equal_length="drop": every slot the same number of full batches of matching rows.
    ds = TableDataset(path, columns=["id"], filter="id >= 500 and label >= 2", batch_rows=50,
                      equal_length="drop", cache=LocalCache(tmp_path / "cache"))
    drop = DataLoader(ds, batch_size=None, num_workers=2)
    batches = [b.column("id").to_pylist() for b in drop]
    assert len(batches) == len(drop) and {len(b) for b in batches} == {50}
    assert set(i for b in batches for i in b) <= want
    assert drop.audits[-1].coverage_ok


def test_a_partition_filter_reads_no_file_of_another_partition(tmp_path: Path) -> None:
    """Every file of the other partition is overwritten with zeros: reading
    any byte of one (its footer, a chunk) would fail."""
    path = delta_table(tmp_path / "t")
    train = [os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "split=train"))
             for f in fs]
    assert train
    for f in train:
        size = os.path.getsize(f)
        with open(f, "wb") as fh:
            fh.write(b"\0" * size)
    cache = LocalCache(tmp_path / "cache")
    ds = TableDataset(path, columns=["id", "split"], filter="split = 'test'", cache=cache)
    got = [r for b in ds for r in b.column("id").to_pylist()]
    assert sorted(got) == list(range(0, N, 4))
    pruned = ds.freeze().filter["pruned"]
    assert pruned["files"] == [1, 2]
    cached = [os.path.relpath(os.path.join(d, f), cache.root)
              for d, _, fs in os.walk(cache.root) for f in fs]
    assert not any("split=train" in c for c in cached)
    assert any("split=test" in c for c in cached)


def test_delta_statistics_prune_files_before_their_footers(tmp_path: Path) -> None:
    """Two commits of ids 0..999 and 1000..1999: the log's min/max of ``id``
    leave the first commit's file out, so its footer is never read (its
    row groups are not among those listed)."""
    import deltalake

    path = str(tmp_path / "t")
    for start in (0, 1000):
        deltalake.write_deltalake(path, events(2000).slice(start, 1000).drop_columns(["split"]),
                                  mode="append", writer_properties=deltalake.WriterProperties(
                                      max_row_group_size=250))
    m = row_groups(path, filter="id >= 1600")
    assert m.filter["pruned"]["files"] == [1, 2]
    assert m.filter["pruned"]["row_groups"] == [2, 4]  # the second file's footer alone
    assert m.rows == 400


def test_truncated_or_missing_delta_statistics_keep_the_file(tmp_path: Path) -> None:
    """The log's string maximum is a writer's truncated prefix (Spark keeps 32
    characters): a row above it may still be in the file. A file whose
    stats the log lacks is kept too."""
    import json

    import deltalake

    path = str(tmp_path / "t")
    t = pa.table({"id": pa.array([1, 2], pa.int64()), "s": ["a" * 40 + "z", "a"]})
    deltalake.write_deltalake(path, t)
    log = os.path.join(path, "_delta_log", f"{0:020d}.json")

    def edit(change: Any) -> None:
        lines = [json.loads(x) for x in Path(log).read_text(encoding="utf-8").splitlines()]
        for action in lines:
            if "add" in action:
                change(action["add"])
        with open(log, "w", encoding="utf-8") as fh:
            fh.write("\n".join(json.dumps(a) for a in lines) + "\n")

    def truncate(add: dict[str, Any]) -> None:
        stats = json.loads(add["stats"])
        stats["maxValues"]["s"] = "a" * 32  # as Spark truncates
        add["stats"] = json.dumps(stats)

    edit(truncate)
    m = row_groups(path, filter="s > '" + "a" * 36 + "'")
    assert m.rows == 1 and m.filter["pruned"]["files"] == [1, 1]
    # The footer's own statistics are exact: 'c' is above every value.
    assert row_groups(path, filter="s > 'c'").row_groups == 0
    # No stats in the log: the file is kept, and its footer decides.
    edit(lambda add: add.pop("stats"))
    m = row_groups(path, filter="id > 100")
    assert m.row_groups == 0 and m.filter["pruned"]["row_groups"] == [0, 1]


def _store_table(moto: Any, parts: int = 4, rows: int = 2500, group: int = 250) -> str:
    """Sorted ids in ``parts`` files; ``pad`` 400 bytes of random hex a row, so
    the data, not the footers, is most of the bytes (a footer is read as the
    file's last 64 KiB)."""
    url = f"s3://ucstage-test/{unique('filter')}"
    fs = moto.filesystem()
    t = events(parts * rows).drop_columns(["split", "pad"])
    t = t.append_column("pad", pa.array([os.urandom(200).hex() for _ in range(t.num_rows)]))
    for p in range(parts):
        import io

        buf = io.BytesIO()
        pq.write_table(t.slice(p * rows, rows), buf, row_group_size=group)
        fs.pipe(f"{url[5:]}/part-{p}.parquet", buf.getvalue())
    return url


def test_a_sorted_column_filter_fetches_only_the_row_groups_that_can_match(
        moto: Any, fault_proxy: Any, tmp_path: Path) -> None:  # noqa: F811
    """40 row groups of 250 sorted ids in 4 files on S3: ``id`` in
    [1000, 1500) can only be in 2 of them. Every byte GET from the store
    (footers, the filter's column counted at freeze, the chunks read) is
    counted against the whole table's bytes."""
    url = _store_table(moto)
    size = sum(moto.filesystem().du(url[5:], total=False).values())
    fault_proxy.ranges.clear()
    ds = TableDataset(url, columns=["id", "pad"], filter="id >= 1000 and id < 1500",
                      cache=LocalCache(tmp_path / "cache"), batch_rows=100)
    got = sorted(i for b in ds for i in b.column("id").to_pylist())
    assert got == list(range(1000, 1500))
    m = ds.freeze()
    assert m.row_groups == 2 and m.filter["pruned"]["row_groups"] == [2, 40]
    fetched = sum(end - start + 1 for _, start, end, _ in fault_proxy.ranges)
    assert 0 < fetched <= 0.2 * size, (fetched, size)
    # Unfiltered, the same read fetches every group's chunks: ten times more.
    fault_proxy.ranges.clear()
    whole = TableDataset(url, columns=["id", "pad"], cache=LocalCache(tmp_path / "c2"))
    assert sum(b.num_rows for b in whole) == 10000
    assert sum(end - start + 1 for _, start, end, _ in fault_proxy.ranges) > 5 * fetched


def test_a_changed_filter_is_another_frozen_listing(tmp_path: Path) -> None:
    from ucstage.manifest import save

    path = delta_table(tmp_path / "t")
    a = TableDataset(path, filter="id < 100", cache=LocalCache(tmp_path / "c"))
    b = TableDataset(path, filter="id < 200", cache=LocalCache(tmp_path / "c"))
    assert a.freeze().fingerprint != b.freeze().fingerprint
    assert a._request() != b._request()  # ranks compare what they ask for
    saved = str(tmp_path / "t.rowgroups.arrow")
    save(a.freeze(), saved)
    # A frozen listing keeps its filter: read back, it yields the same rows...
    again = TableDataset(saved, columns=["id"], cache=LocalCache(tmp_path / "c"))
    assert sorted(i for x in again for i in x.column("id").to_pylist()) == list(range(100))
    # ...and another filter with it is refused, not silently ignored.
    with pytest.raises(InvalidArgument, match="was frozen with filter 'id < 100'"):
        TableDataset(saved, filter="id < 200", cache=LocalCache(tmp_path / "c"))


@pytest.mark.parametrize("given,error,message", [
    ("label >= ", InvalidArgument, r"expected a column or a value, found the end at "
                                   r"character 9"),
    ("label >= 3 and split = 'train", InvalidArgument, "unclosed ' at character 24"),
    ("label => 3", InvalidArgument, "expected a column or a value, found '>' at character 8"),
    ("label in (3, split)", InvalidArgument, "takes values, not columns at character 14"),
    ("day > '2024-13-01'", InvalidArgument, r"'2024-13-01' is not a value of column 'day' "
                                            r"\(date32\[day\]\) at character 7"),
    ("split = 3", InvalidArgument, "3 is not a value of column 'split'"),
])
def test_a_bad_filter_is_one_line_pointing_at_its_character(tmp_path: Path, given: str,
                                                            error: type, message: str) -> None:
    path = delta_table(tmp_path / "t", n=40)
    with pytest.raises(error, match=message) as caught:
        TableDataset(path, filter=given, cache=LocalCache(tmp_path / "c")).freeze()
    assert "\n" not in str(caught.value)


def test_a_filter_naming_a_column_the_table_lacks_is_refused_by_name(tmp_path: Path) -> None:
    path = delta_table(tmp_path / "t", n=40)
    for given in ("labl >= 3", F("labl") >= 3):
        with pytest.raises(UnknownColumn, match=r"names column 'labl', which .* lacks"):
            TableDataset(path, filter=given, cache=LocalCache(tmp_path / "c")).freeze()
    with pytest.raises(InvalidArgument, match=r"must be a pyarrow\.compute\.Expression or a str"):
        TableDataset(path, filter=3)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.getcwd()))


def test_shard_plan_and_cache_warm_take_filter(tmp_path: Path) -> None:
    import json

    path = delta_table(tmp_path / "t")
    plan = _cli("shard-plan", path, "--unit", "row-group", "-w", "1", "-k", "1", "--filter",
                "split = 'test' and id < 1000", "--json")
    assert plan.returncode == 0, plan.stderr
    doc = json.loads(plan.stdout)
    m = row_groups(path, filter="split = 'test' and id < 1000")
    assert doc["rows"] == 250 == m.rows
    assert doc["filter"]["pruned"] == {"files": [1, 2], "row_groups": [m.row_groups, 3],
                                       "bytes": [m.bytes, doc["filter"]["pruned"]["bytes"][1]]}
    text = _cli("shard-plan", path, "--unit", "row-group", "-w", "1", "-k", "1", "--filter",
                "split = 'test' and id < 1000")
    assert "kept 1 of 2 files, 1 of 3 row groups (in the files read)" in text.stdout
    for bad, said in (("labl = 1", "names column 'labl'"), ("id <", "at character 5")):
        out = _cli("shard-plan", path, "--unit", "row-group", "-w", "1", "-k", "1",
                   "--filter", bad)
        assert out.returncode == 2 and said in out.stderr and "Traceback" not in out.stderr
        assert out.stderr.count("error:") == 1
    refused = _cli("shard-plan", path, "-w", "1", "-k", "1", "--filter", "id < 3")
    assert refused.returncode == 2 and "only apply to" in refused.stderr
    warm = _cli("cache", "warm", path, "--unit", "row-group", "--columns", "pad", "--filter",
                "id < 300", "--json")
    assert warm.returncode == 0, warm.stderr
    report = json.loads(warm.stdout)
    kept = row_groups(path, filter="id < 300")
    assert report["files"] == kept.row_groups < row_groups(path).row_groups
