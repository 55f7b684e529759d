"""The page walk of a row group's column chunks (ucstage.engines.pagecrc), on
files pyarrow and deltalake write: every CRC a page carries is checked, a
flipped byte in a page or its header is caught and the chunk read again, a
file without CRCs keeps the size check; and what the walk costs on a 64 MiB
row group."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ucstage.engines import checks, pagecrc
from ucstage.engines.azranges import TRIES
from ucstage.tables.footers import chunk_ranges


def _table(rows: int = 2000) -> pa.Table:
    return pa.table({"id": pa.array(range(rows), pa.int64()),
                     "s": pa.array([f"v{i % 17}" for i in range(rows)]),
                     "x": pa.array(np.random.default_rng(1).random(rows))})


def _chunks(path: Path, group: int = 0) -> list[bytes]:
    data = path.read_bytes()
    md = pq.ParquetFile(path).metadata
    return [data[o:o + n] for o, n in chunk_ranges(md, group, len(data))]


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_every_page_of_a_file_written_with_checksums_is_checked(tmp_path: Path,
                                                                version: str) -> None:
    path = tmp_path / "crc.parquet"
    pq.write_table(_table(), path, write_page_checksum=True, data_page_version=version,
                   data_page_size=1024, compression="zstd")
    for chunk in _chunks(path):
        pages, crcs = pagecrc.walk(chunk)
        assert pages > 1 and crcs == pages  # a dictionary page and several data pages
    before = checks.TALLY.snapshot()
    assert pagecrc.verified("k", _chunks(path), lambda i: b"") is True
    assert checks.TALLY.since(before)["mismatches"] == 0


@pytest.mark.parametrize("writer", ["pyarrow", "deltalake"])
def test_files_without_checksums_walk_but_are_not_covered(tmp_path: Path, writer: str) -> None:
    """pyarrow by default, and delta-rs always (deltalake 1.6), write no page
    CRC: the pages still walk to the chunk's end, and the entry keeps the
    size check."""
    if writer == "pyarrow":
        path = tmp_path / "plain.parquet"
        pq.write_table(_table(), path)
    else:
        from deltalake import write_deltalake

        write_deltalake(str(tmp_path / "t"), _table())
        path = next((tmp_path / "t").glob("*.parquet"))
    for chunk in _chunks(path):
        pages, crcs = pagecrc.walk(chunk)
        assert pages >= 1 and crcs == 0
    assert pagecrc.verified("k", _chunks(path), lambda i: b"") is False


def test_a_flipped_byte_is_read_again_and_a_repeated_one_fails(tmp_path: Path) -> None:
    path = tmp_path / "crc.parquet"
    pq.write_table(_table(), path, write_page_checksum=True)
    good = _chunks(path)
    # One byte in the last page's body (its last byte), and one in the
    # first page's header (its compressed size, which moves the walk).
    for where in (-1, 2):
        bad = bytearray(good[0])
        bad[where] ^= 0xFF
        blobs = [bytes(bad), *good[1:]]
        reads: list[int] = []

        def reread(i: int, reads: list[int] = reads) -> bytes:
            reads.append(i)
            return good[i]

        before = checks.TALLY.snapshot()
        assert pagecrc.verified("k", blobs, reread) is True
        assert blobs == good and reads == [0]
        assert checks.TALLY.since(before)["mismatches"] == 1
    # The same wrong byte on every read: the entry fails, never passed on.
    bad = bytearray(good[1])
    bad[-1] ^= 0xFF
    blobs = [good[0], bytes(bad), *good[2:]]
    before = checks.TALLY.snapshot()
    with pytest.raises(checks.Mismatch, match="page CRC32 mismatch"):
        pagecrc.verified("k", blobs, lambda i: bytes(bad))
    assert checks.TALLY.since(before)["mismatches"] == TRIES


def test_a_layout_read_the_same_way_twice_is_the_files_own(tmp_path: Path) -> None:
    """Bytes that are not whole pages (a range starting at the file's magic,
    a chunk whose stated length is short) but come back identical: the
    file's own layout, read as pyarrow reads it, with the size check."""
    path = tmp_path / "crc.parquet"
    pq.write_table(_table(), path, write_page_checksum=True)
    odd = b"PAR1" + _chunks(path)[0]
    reads = []
    assert pagecrc.verified("k", [odd], lambda i: reads.append(i) or odd) is False
    assert reads == [0]


def test_the_walk_of_a_64_mib_row_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    """The cost quoted in ucstage/engines/pagecrc.py and docs/cache.md: a
    64 MiB row group (two columns of random doubles, 1 MiB pages) walked and
    every page's CRC32 checked. Printed, not asserted (no wall-clock limits)."""
    rows = 4 * 1024 * 1024
    rng = np.random.default_rng(0)
    table = pa.table({"a": rng.random(rows), "b": rng.random(rows)})
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, write_page_checksum=True, compression="none",
                   use_dictionary=False, row_group_size=rows)
    chunks = _chunks(path)
    size = sum(len(c) for c in chunks)
    assert size >= 64 * 1024 * 1024
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        pages = sum(pagecrc.walk(c)[0] for c in chunks)
        best = min(best, time.process_time() - start)
    with capsys.disabled():
        print(f"\npage walk: {size / 2**20:.0f} MiB, {pages} pages, "
              f"{best * 1e3:.1f} ms CPU ({size / best / 1e9:.1f} GB/s) on {os.cpu_count()} cores")
