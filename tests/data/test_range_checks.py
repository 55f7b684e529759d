"""A row group's byte-range entry is checked before it is cached, wherever a
check exists, against real stores through the fault proxy
(tests/common/faults.py) flipping a byte of a data file's GET:

* Azure (Azurite): a Delta table written by deltalake (no page CRCs), its
  ranges read in pieces of at most 4 MiB whose MD5 Azure gives, on the
  obstore engine and on the fsspec one (a forked worker's);
* S3 (moto): a Parquet file pyarrow wrote with page CRCs, every page
  checked against its CRC;
* S3, a file without page CRCs: no check exists beyond the size and the
  ETag, and the counts say so.

The flip is caught (counted as a mismatch), the rows are right, every cached
entry holds the source's bytes, and a rerun fetches no data byte."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.common import faults as faultkit
from tests.common.deltastore import build, upload
from tests.common.faults import Faults, azurite_behind
from tests.common.parts import unique
from tests.data.test_delta_reader import multiset
from tests.data.test_delta_stores import deltalake_rows
from ucstage import DataLoader, TableDataset
from ucstage.cache import LocalCache
from ucstage.engines import checks
from ucstage.tables import RowGroupManifest
from ucstage.tables.entries import group_entries

fault_proxy = faultkit.fault_proxy


def _frozen(url: str, cache: LocalCache) -> tuple[TableDataset, RowGroupManifest]:
    """A dataset of the table, frozen (its footers read: faults set after
    it hit only the row groups' GETs)."""
    ds = TableDataset(url, cache=cache, batch_rows=7)
    m = ds.freeze()
    assert isinstance(m, RowGroupManifest)
    return ds, m


def _epoch(ds: TableDataset) -> list[dict[str, Any]]:
    loader = DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False)
    return [r for b in loader for r in b.to_pylist()]


def _cached_right(m: RowGroupManifest, cache: LocalCache, fs: Any, where: str) -> int:
    """How many row-group entries are cached, each asserted to hold the
    source's bytes of its ranges (read straight from the store)."""
    volume, n = m.volume(), 0
    for entry in group_entries(m):
        local = cache.lookup(volume, entry)
        if local is None:
            continue
        want = b"".join(fs.cat_file(f"{where}/{entry.source}", start=o, end=o + k)
                        for o, k in entry.ranges)
        assert Path(local).read_bytes() == want, entry.path
        n += 1
    return n


def _data_gets(faults: Faults, sizes: dict[str, int]) -> list[tuple[str, int, int, bool]]:
    """Ranged GETs of data files other than their footer (the footer's ends
    at the file's last byte)."""
    return [r for r in faults.ranges if r[0].endswith(".parquet") and "/_delta_log/" not in r[0]
            and r[2] != sizes[r[0]] - 1]


# -- Azure: every range's MD5 ---------------------------------------------------


@pytest.fixture
def azure_proxy(azurite: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """Azurite behind the fault proxy (no faults until the test sets them)."""
    yield from azurite_behind(azurite, monkeypatch)


@pytest.mark.parametrize("engine", ["obstore", "fsspec"])
def test_a_flipped_byte_of_a_row_group_on_azure_is_caught_by_the_range_md5(
        azurite: Any, azure_proxy: Faults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        engine: str) -> None:
    """A Delta table written by deltalake (its pages carry no CRC) on
    Azurite: the first GET of every data file gets a byte flipped. Each
    entry's ranges are asked with their MD5 (pieces of at most 4 MiB), the
    flipped piece is read again, the rows are deltalake's, every cached
    entry holds the source's bytes, and a rerun reads no data range."""
    monkeypatch.setenv("UCSTAGE_ENGINE", engine)
    key = unique("delta")
    container = azurite.CONTAINER
    table = build(str(tmp_path / "built"), f"az://{container}/{key}")
    fs = azurite.filesystem()  # straight to Azurite, not through the proxy
    upload(fs, table.local, f"{container}/{key}")
    with monkeypatch.context() as direct:
        direct.setenv("AZURITE_BLOB_STORAGE_URL", azurite.endpoint)
        reference = deltalake_rows(table.url)
    cache = LocalCache(str(tmp_path / "cache"), hedge=False)
    ds, m = _frozen(table.url, cache)
    sizes = {f"devstoreaccount1/{p}": int(fs.info(p)["size"])
             for p in fs.find(f"{container}/{key}")}
    files = sorted(k for k in sizes if k.endswith(".parquet") and "/_delta_log/" not in k)
    azure_proxy.set("flip", files)
    before = checks.TALLY.snapshot()
    rows = _epoch(ds)
    done = checks.TALLY.since(before)
    assert multiset(rows) == multiset(reference)
    flips = azure_proxy.done["flip"]
    assert flips == len(files) > 0  # every data file's first GET was damaged...
    assert done["mismatches"] == flips  # ...and caught, each read again
    # Row groups with a live row (the absolute vector deletes one whole: never fetched).
    entries = sum(1 for g, e in enumerate(group_entries(m)) if e.size and m.rows_per_group[g])
    assert (done["md5"], done["page_crc"], done["size"]) == (entries, 0, 0)
    data = _data_gets(azure_proxy, sizes)
    assert data and all(md5 and last - first + 1 <= 4 * 2**20 for _, first, last, md5 in data)
    assert _cached_right(m, cache, fs, f"{container}/{key}") == entries
    azure_proxy.set("", [])
    again = _epoch(_frozen(table.url, cache)[0])
    assert multiset(again) == multiset(reference)
    assert not _data_gets(azure_proxy, sizes)  # every row group from the cache


# -- S3: page CRCs --------------------------------------------------------------


def _parquet_on_s3(moto: Any, checksums: bool) -> tuple[str, str, pa.Table]:
    """A folder of one Parquet file of 4 row groups on moto, written by
    pyarrow with page CRCs or without; returns (url, bucket/prefix, rows)."""
    rows = pa.table({"id": pa.array(range(400), pa.int64()),
                     "w": pa.array([f"w{i % 13}" for i in range(400)])})
    where = f"ucstage-test/{unique('pages')}"
    sink = pa.BufferOutputStream()
    pq.write_table(rows, sink, row_group_size=100, write_page_checksum=checksums)
    moto.filesystem().pipe_file(f"{where}/part-0.parquet", sink.getvalue().to_pybytes())
    return f"s3://{where}", where, rows


def test_a_flipped_byte_of_a_row_group_on_s3_is_caught_by_its_page_crcs(
        moto: Any, fault_proxy: Faults, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """S3 gives no checksum of a range; the file's page CRCs are checked:
    the flipped chunk is read again, never cached, and every entry counts as
    ``page_crc``."""
    monkeypatch.setenv("UCSTAGE_HEDGE", "0")  # a hedge could win against the flipped GET
    url, where, rows = _parquet_on_s3(moto, checksums=True)
    fs = moto.filesystem()
    cache = LocalCache(str(tmp_path / "cache"), hedge=False)
    ds, m = _frozen(url, cache)
    key = f"{where}/part-0.parquet"
    sizes = {key: int(fs.info(key)["size"])}
    fault_proxy.set("flip", [key], attempts=2)  # the first two GETs of the file
    before = checks.TALLY.snapshot()
    got = _epoch(ds)
    done = checks.TALLY.since(before)
    assert sorted(r["id"] for r in got) == rows.column("id").to_pylist()
    assert got == [r for r in got if r["w"] == f"w{r['id'] % 13}"]  # every value right
    assert fault_proxy.done["flip"] == 2 and done["mismatches"] == 2
    assert (done["page_crc"], done["size"], done["md5"]) == (m.row_groups, 0, 0)
    assert _cached_right(m, cache, fs, where) == m.row_groups
    fault_proxy.set("", [])
    assert sorted(r["id"] for r in _epoch(_frozen(url, cache)[0])) == rows.column("id").to_pylist()
    assert not _data_gets(fault_proxy, sizes)  # nothing fetched but the footer


def test_a_row_group_without_page_crcs_on_s3_is_checked_by_size_only(
        moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit, as ``cache warm --json`` reports it: a file without page
    CRCs (pyarrow's default, delta-rs's always) on S3 has no check of its
    ranges beyond their size and the file's ETag."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    url, _, _ = _parquet_on_s3(moto, checksums=False)
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", url, "--unit",
                           "row-group", "--json"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["fetched"] == 4
    assert doc["checks"] == {"md5": 0, "crc32c": 0, "page_crc": 0, "size": 4, "none": 0}
    assert doc["checksum_mismatches"] == 0
