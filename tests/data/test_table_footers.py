"""Parquet files other writers make, read by TableDataset with the rows
pyarrow.parquet.read_table gives, under every column subset: footers that
understate chunk sizes (PARQUET-816), chunks that point past the end, pages
that do not decode, INT96 timestamps at the end of time. Files are written
with pyarrow, then their footers edited (tests/common/footeredit.py)."""

from __future__ import annotations

import io
import itertools
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from tests.common import footeredit as fe
from ucstage import DataLoader, LocalCache, TableDataset
from ucstage.cli import cli
from ucstage.errors import CorruptParquet, InvalidArgument


def rows(folder: Path, cache: Path, columns: list[str] | None) -> pa.Table:
    """Every row of ``folder`` through TableDataset, in file order."""
    ds = TableDataset(str(folder), columns=columns, cache=LocalCache(cache))
    batches = list(DataLoader(ds, batch_size=None, num_workers=0))
    return pa.Table.from_batches(batches, schema=batches[0].schema)


def subsets(names: list[str]) -> list[list[str]]:
    return [list(c) for k in range(1, len(names) + 1)
            for c in itertools.combinations(names, k)]


def assert_same_rows(folder: Path, cache: Path, names: list[str]) -> None:
    for cols in subsets(names):
        want = pq.read_table(folder, columns=cols)
        got = rows(folder, cache / "-".join(cols), cols)
        assert got.equals(want), cols


def sample() -> pa.Table:
    """25 rows like nation.dict-malformed's: a key, a dictionary-encoded name,
    a region key and a comment."""
    return pa.table({
        "nation_key": pa.array(range(25), pa.int32()),
        "name": [f"NATION{i % 7}" for i in range(25)],
        "region_key": pa.array([i % 5 for i in range(25)], pa.int32()),
        "comment_col": [f"comment number {i} " * 3 for i in range(25)],
    })


def old_parquet_mr(data: bytes, lower: dict[int, int]) -> bytes:
    """``data`` as parquet-mr 1.2.8 wrote it: that ``created_by``, and column
    ``c``'s total_compressed_size lowered by ``lower[c]`` bytes (the size of
    the dictionary page header it left out)."""
    def edit(footer: list[Any]) -> None:
        fe.field(footer, fe.FILE_CREATED_BY)[2] = b"parquet-mr version 1.2.8 (build x)"
        for c, n in lower.items():
            fe.field(fe.chunk_meta(footer, 0, c), fe.META_TOTAL_COMPRESSED)[2] -= n
    return fe.rewrite(data, edit)


def parquet(t: pa.Table, **kw: Any) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf, **kw)
    return buf.getvalue()


def test_an_old_parquet_mr_footer_is_read_with_pyarrow_s_slack(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    # Every dictionary-encoded chunk understated, as parquet-mr 1.2.8 did.
    (folder / "nation.parquet").write_bytes(
        old_parquet_mr(parquet(sample()), {0: 12, 1: 20, 2: 12, 3: 30}))
    assert pq.read_table(folder).equals(sample())  # the reference reads it
    assert_same_rows(folder, tmp_path / "cache", sample().column_names)


def test_an_understated_chunk_from_a_writer_pyarrow_trusts_is_an_error(tmp_path: Path) -> None:
    # The same understatement from a writer without the bug: neither pyarrow
    # nor ucstage pads it; the chunk is short, and that is one named error,
    # never the zeros after the cached bytes decoded as values.
    folder = tmp_path / "t"
    folder.mkdir()

    def edit(footer: list[Any]) -> None:
        fe.field(fe.chunk_meta(footer, 0, 1), fe.META_TOTAL_COMPRESSED)[2] -= 20
    (folder / "short.parquet").write_bytes(fe.rewrite(parquet(sample()), edit))
    for cols in (["name"], ["name", "region_key"], None):
        with pytest.raises(CorruptParquet, match=r"short\.parquet.*row group 0.*'name'"):
            rows(folder, tmp_path / "cache" / str(cols), cols)


def test_a_chunk_past_the_end_of_its_file_is_refused_at_freeze(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()

    def edit(footer: list[Any]) -> None:
        fe.field(fe.chunk_meta(footer, 0, 3), fe.META_TOTAL_COMPRESSED)[2] += 1 << 20
    (folder / "long.parquet").write_bytes(fe.rewrite(parquet(sample()), edit))
    with pytest.raises(CorruptParquet, match=r"long\.parquet.*row group 0.*'comment_col'.*past"):
        TableDataset(str(folder), cache=LocalCache(tmp_path / "cache")).freeze()
    assert CorruptParquet("x").exit_code == 2
    # The CLI: one line, exit 2, nothing fetched (no short read retried, no rerun hint).
    done = CliRunner(env={"UCSTAGE_CACHE_DIR": str(tmp_path / "cache")}).invoke(
        cli, ["cache", "warm", str(folder), "--unit", "row-group"], catch_exceptions=False)
    assert done.exit_code == 2, done.output
    assert "long.parquet: row group 0, column 'comment_col'" in done.output
    assert "rerun" not in done.output and "attempts" not in done.output


def with_an_empty_group(dictionary: bool) -> bytes:
    """``sample()`` in two row groups with an empty one between them, as
    pyarrow writes it: the empty group's chunks hold no data page, and their
    ``data_page_offset`` is 0."""
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, sample().schema, use_dictionary=dictionary) as w:
        w.write_table(sample().slice(0, 10))
        w.write_table(sample().slice(0, 0))
        w.write_table(sample().slice(10))
    return buf.getvalue()


def every_offset_zero(data: bytes, group: int) -> bytes:
    """``data`` with every offset of row group ``group``'s chunks 0, as old
    writers left them (``file_offset`` too)."""
    def edit(footer: list[Any]) -> None:
        groups = fe.field(footer, fe.FILE_ROW_GROUPS)[2][1]
        for chunk in fe.field(groups[group], fe.ROW_GROUP_COLUMNS)[2][1]:
            fe.field(chunk, fe.CHUNK_FILE_OFFSET)[2] = 0
            meta = fe.field(chunk, fe.CHUNK_META)[2]
            for fid in (fe.META_DATA_PAGE_OFFSET, fe.META_DICT_PAGE_OFFSET):
                for entry in meta:
                    if entry[0] == fid:
                        entry[2] = 0
    return fe.rewrite(data, edit)


@pytest.mark.parametrize("kind", ["pyarrow-dictionary", "pyarrow-plain", "old-writer"])
def test_an_empty_row_group_whose_offsets_are_0_reads_as_pyarrow_reads_it(
        tmp_path: Path, kind: str) -> None:
    data = with_an_empty_group(kind != "pyarrow-plain")
    if kind == "old-writer":
        data = every_offset_zero(data, 1)
    md = pq.read_metadata(pa.BufferReader(data))
    assert md.row_group(1).num_rows == 0
    assert {fe.chunk_offsets(data, 1, c)[0] for c in range(4)} == {0}
    if kind != "pyarrow-plain":  # a dictionary page's bytes are stated at 0
        assert md.row_group(1).column(0).total_compressed_size > 0
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "empty.parquet").write_bytes(data)
    assert pq.read_table(folder).equals(sample())  # the reference reads it
    assert_same_rows(folder, tmp_path / "cache", sample().column_names)
    # Every group's entry fetched, the empty one included; then read from the cache.
    done = CliRunner(env={"UCSTAGE_CACHE_DIR": str(tmp_path / "cli")}).invoke(
        cli, ["cache", "warm", str(folder), "--unit", "row-group"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    assert rows(folder, tmp_path / "cli", None).equals(sample())


def test_a_group_with_rows_whose_data_page_offset_is_0_is_refused(tmp_path: Path) -> None:
    # Its pages cannot be found (pyarrow fails on it too): one error at freeze.
    data = every_offset_zero(with_an_empty_group(True), 2)
    with pytest.raises(OSError):
        pq.read_table(pa.BufferReader(data))
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "zero.parquet").write_bytes(data)
    with pytest.raises(CorruptParquet, match=r"zero\.parquet: row group 2, column 'nation_key': "
                                             r"its chunk \(\d+ bytes at 0\) lies past"):
        TableDataset(str(folder), cache=LocalCache(tmp_path / "cache")).freeze()


def test_a_column_listed_twice_is_refused_up_front(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    pq.write_table(sample(), folder / "a.parquet")
    with pytest.raises(InvalidArgument, match="'name' twice"):
        TableDataset(str(folder), columns=["name", "nation_key", "name"],
                     cache=LocalCache(tmp_path / "cache")).freeze()


def test_a_page_with_a_bad_bit_width_is_one_error_naming_file_group_and_column(
        tmp_path: Path) -> None:
    # A required, dictionary-encoded, uncompressed column: its data page's body
    # starts with the bit width of the dictionary indices; 127 is impossible.
    t = pa.table({"id": pa.array(range(40), pa.int64()),
                  "tag": pa.array([f"t{i % 3}" for i in range(40)])},
                 schema=pa.schema([pa.field("id", pa.int64()),
                                   pa.field("tag", pa.string(), nullable=False)]))
    data = bytearray(parquet(t, compression="NONE", row_group_size=20))
    page, _ = fe.chunk_offsets(bytes(data), 1, 1)
    body = fe.page_body(bytes(data), page)
    assert data[body] == 2  # three values: 2-bit indices
    data[body] = 127
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "bits.parquet").write_bytes(bytes(data))
    with pytest.raises(OSError):
        pq.read_table(folder)  # pyarrow refuses it too
    for cols in (["tag"], ["id", "tag"], None):
        with pytest.raises(CorruptParquet,
                           match=r"bits\.parquet: row group 1, column 'tag' does not decode"):
            rows(folder, tmp_path / "cache" / str(cols), cols)
    assert rows(folder, tmp_path / "cache" / "id", ["id"]).column("id").to_pylist() == \
        list(range(40))


def test_int96_timestamps_at_the_end_of_time_read_as_microseconds(tmp_path: Path) -> None:
    import datetime as dt

    last = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
    t = pa.table({"id": [0, 1, 2],
                  "ts": pa.array([last, dt.datetime(1970, 1, 1), None], pa.timestamp("us")),
                  "s": [{"at": last}, None, {"at": dt.datetime(1, 1, 1)}]})
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "spark.parquet").write_bytes(parquet(t, use_deprecated_int96_timestamps=True))
    assert pq.read_metadata(folder / "spark.parquet").schema.column(1).physical_type == "INT96"
    for cols in subsets(t.column_names):
        got = rows(folder, tmp_path / "cache" / "-".join(cols), cols)
        assert got.equals(t.select(cols)), cols


def test_which_writers_get_the_slack() -> None:
    from ucstage.tables.footers import understates_chunks

    for old in ("parquet-mr version 1.2.8", "Parquet-MR version 1.2.8 (build abc)",
                "parquet-mr version 1.0.0-SNAPSHOT", "parquet-mr", "parquet-mr version 1.2",
                "parquet-mr version"):
        assert understates_chunks(old), old
    for fine in ("parquet-mr version 1.2.9", "parquet-mr version 1.12.3 (build x)",
                 "parquet-cpp-arrow version 26.0.1", "impala version 1.0.0", "", None,
                 "parquet-rs version 0.1.0"):
        assert not understates_chunks(fine), fine
