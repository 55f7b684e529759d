"""Every Parquet feature pyarrow reads gives TableDataset the rows
pyarrow.parquet.read_table gives, under every column subset: page indexes,
DataPage v2, the delta / byte-stream-split encodings, every codec, nested
types, decimals of every physical type, float16, dictionaries with nulls;
plus the Parquet files pyarrow ships with its own tests (when installed).
The files are written with pyarrow's writer options, several row groups and
files each."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.data.test_table_footers import rows, subsets
from ucstage import DataLoader, LocalCache, TableDataset

N = 120


def _ids() -> pa.Array:
    return pa.array(np.arange(N, dtype=np.int64))


def _strings(prefix: str, nulls: bool = False) -> pa.Array:
    return pa.array([None if nulls and i % 7 == 3 else f"{prefix}{i % 11}-{i}"
                     for i in range(N)])


def _floats() -> pa.Array:
    return pa.array(np.linspace(-3, 3, N))


CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # name: (columns besides id, write_table options)
    "page-index": ({"s": _strings("p"), "f": _floats()},
                   {"write_page_index": True, "data_page_size": 256}),
    "data-page-v2": ({"s": _strings("v", nulls=True), "f": _floats()},
                     {"data_page_version": "2.0", "data_page_size": 256}),
    "delta-encodings": ({"d": pa.array(np.arange(N, dtype=np.int32) * 3 - 50),
                         "dl": _strings("dl", nulls=True), "db": _strings("common-prefix-")},
                        {"use_dictionary": False,
                         "column_encoding": {"d": "DELTA_BINARY_PACKED",
                                             "dl": "DELTA_LENGTH_BYTE_ARRAY",
                                             "db": "DELTA_BYTE_ARRAY"}}),
    "byte-stream-split": ({"f": _floats(), "g": pa.array(np.arange(N, dtype=np.float32) / 7),
                           "i": pa.array(np.arange(N, dtype=np.int32))},
                          {"use_dictionary": False,
                           "column_encoding": {"f": "BYTE_STREAM_SPLIT",
                                               "g": "BYTE_STREAM_SPLIT",
                                               "i": "BYTE_STREAM_SPLIT"}}),
    "lz4": ({"s": _strings("l"), "f": _floats()}, {"compression": "lz4"}),
    "zstd-gzip-brotli": ({"s": _strings("z"), "f": _floats(), "b": _strings("b")},
                         {"compression": {"s": "zstd", "f": "gzip", "b": "brotli"}}),
    "uncompressed": ({"s": _strings("u"), "f": _floats()}, {"compression": "NONE"}),
    "nested": ({"l": pa.array([[i, i + 1] if i % 5 else None for i in range(N)]),
                "st": pa.array([{"a": i, "b": [f"x{i}"] * (i % 3)} for i in range(N)]),
                "m": pa.array([[("k", i), ("j", -i)] if i % 4 else [] for i in range(N)],
                              pa.map_(pa.string(), pa.int64()))},
               {}),
    "list-of-structs": ({"ls": pa.array([[{"p": i, "q": None}, {"p": -i, "q": "w"}]
                                         for i in range(N)])}, {}),
    "decimals": ({"d32": pa.array([decimal.Decimal(i) / 100 for i in range(N)],
                                  pa.decimal128(7, 2)),
                  "d64": pa.array([decimal.Decimal(i * 10**9) / 10**4 for i in range(N)],
                                  pa.decimal128(18, 4)),
                  "dflba": pa.array([decimal.Decimal(i) ** 5 / 10**10 for i in range(N)],
                                    pa.decimal128(38, 10)),
                  "d256": pa.array([decimal.Decimal(i) ** 9 for i in range(N)],
                                   pa.decimal256(50, 0))},
                 {"store_decimal_as_integer": True}),
    "float16": ({"h": pa.array(np.linspace(-2, 2, N).astype(np.float16)),
                 "hn": pa.array([None if i % 9 == 0 else float(i) / 8 for i in range(N)],
                                pa.float16())}, {}),
    "dictionary-with-nulls": ({"c": pa.array([None if i % 6 == 0 else f"cat{i % 3}"
                                              for i in range(N)]).dictionary_encode(),
                               "s": _strings("n", nulls=True)}, {}),
    "times-and-binaries": ({"date": pa.array([dt.date(2000, 1, 1) + dt.timedelta(days=i)
                                              for i in range(N)]),
                            "tz": pa.array([dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
                                            + dt.timedelta(seconds=i) for i in range(N)],
                                           pa.timestamp("ms", tz="UTC")),
                            "fsb": pa.array([i.to_bytes(4, "little") for i in range(N)],
                                            pa.binary(4)),
                            "ok": pa.array([i % 3 == 0 for i in range(N)])},
                           {}),
}


def write_case(folder: Path, name: str) -> None:
    columns, options = CASES[name]
    t = pa.table({"id": _ids(), **columns})
    folder.mkdir()
    half = N // 2
    for i, part in enumerate((t.slice(0, half), t.slice(half))):
        pq.write_table(part, folder / f"part-{i}.parquet", row_group_size=25, **options)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_column_subset_reads_as_pyarrow_reads_it(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    write_case(folder, name)
    names = pq.read_schema(folder / "part-0.parquet").names
    for cols in subsets(names):
        want = pq.read_table(folder, columns=cols)
        got = rows(folder, tmp_path / "cache" / "-".join(cols), cols)
        assert got.equals(want), (name, cols)
    # Shuffled, from 2 workers, in batches that cut row groups (each copied
    # into buffers of its own, whatever the types): the same rows.
    ds = TableDataset(str(folder), batch_rows=7, shuffle=True, seed=3,
                      cache=LocalCache(tmp_path / "cache" / "all"))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert max(b.num_rows for b in batches) == 7
    # (+256: a 7-row batch's buffers are padded and its bitmaps whole bytes)
    assert all(b.get_total_buffer_size() <= 1.2 * b.nbytes + 256 for b in batches), name
    got = pa.Table.from_batches(batches).sort_by("id")
    assert got.equals(pq.read_table(folder).sort_by("id")), name


def _shipped() -> list[str]:
    folder = os.path.join(os.path.dirname(pa.__file__), "tests", "data", "parquet")
    if not os.path.isdir(folder):
        return []
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".parquet"))


@pytest.mark.skipif(not _shipped(), reason="this pyarrow ships no Parquet test files")
@pytest.mark.parametrize("path", _shipped(), ids=os.path.basename)
def test_pyarrow_s_own_test_files_read_as_pyarrow_reads_them(tmp_path: Path, path: str) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    shutil.copyfile(path, folder / os.path.basename(path))  # the listing skips symlinks
    names = pq.read_schema(path).names
    for cols in subsets(names)[:31]:
        want = pq.read_table(folder, columns=cols)
        got = rows(folder, tmp_path / "cache" / "-".join(cols), cols)
        assert got.equals(want), cols
