"""The columnar manifest: Arrow IPC, memory-mapped, same fingerprint as JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ucstage.errors import InvalidArgument, ManifestError
from ucstage.manifest import ArrowEntries, Manifest, fingerprint, load, save, snapshot
from ucstage.manifest.files import is_manifest_file
from ucstage.volumes import FileEntry


@pytest.fixture
def vol(tmp_path):
    root = tmp_path / "vol"
    (root / "sub").mkdir(parents=True)
    for name, data in {"a.bin": b"a", "sub/b.bin": b"bb", "sub/ü €.bin": b"ccc"}.items():
        (root / name).write_bytes(data)
    return root


def test_both_formats_hold_the_same_files_and_fingerprint(vol, tmp_path):
    m = snapshot(str(vol))
    arrow = load(save(m, tmp_path / "m.manifest.arrow"))
    as_json = load(save(m, tmp_path / "m.manifest.json"))
    assert isinstance(arrow.entries, ArrowEntries)
    assert list(arrow.entries) == list(as_json.entries) == list(m.entries)
    assert arrow.fingerprint == as_json.fingerprint == m.fingerprint
    assert fingerprint(arrow.entries) == m.fingerprint  # computed in Arrow, same definition
    assert (arrow.source, arrow.filters, arrow.created) == (m.source, m.filters, m.created)
    assert arrow.total_bytes == 6 and len(arrow) == 3
    assert arrow.entries[2] == m.entries[2] and arrow.entries[-1] == m.entries[-1]
    assert arrow.take([2, 0]) == [m.entries[2], m.entries[0]]
    assert arrow.paths([1]) == [m.entries[1].path]
    assert arrow.to_json()["files"] == as_json.to_json()["files"]
    # The columnar file is read back as JSON too, and the other way round.
    again = load(save(arrow, tmp_path / "again.manifest.json"))
    assert again.fingerprint == m.fingerprint


def test_format_is_chosen_by_name_or_argument(vol, tmp_path):
    m = snapshot(str(vol))
    with open(save(m, tmp_path / "x.manifest.arrow"), "rb") as fh:
        assert fh.read(6) == b"ARROW1"
    with open(save(m, tmp_path / "x.manifest.json"), "rb") as fh:
        assert json.loads(fh.read())["format"] == "ucstage.manifest"
    with open(save(m, tmp_path / "named.lst", format="arrow"), "rb") as fh:
        assert fh.read(6) == b"ARROW1"
    assert is_manifest_file(str(tmp_path / "named.lst"))  # sniffed by its header
    with pytest.raises(InvalidArgument, match="format must be one of"):
        save(m, tmp_path / "y.manifest.arrow", format="csv")
    with pytest.raises(InvalidArgument, match=r"\.json name"):
        save(m, tmp_path / "y.json", format="arrow")


def test_a_plain_arrow_file_is_not_a_manifest(tmp_path):
    import pyarrow as pa
    import pyarrow.ipc as ipc

    path = tmp_path / "data.arrow"
    table = pa.table({"x": [1, 2]})
    with ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)
    assert not is_manifest_file(str(path))
    with pytest.raises(ManifestError, match="not a ucstage manifest"):
        load(path)


def _rewrite(src, dst, mutate):
    """Copy the Arrow manifest ``src`` to ``dst`` with ``mutate(table, meta)``."""
    import pyarrow.ipc as ipc

    with ipc.open_file(str(src)) as r:
        table = r.read_all()
    meta = dict(table.schema.metadata)
    table, meta = mutate(table, meta)
    table = table.replace_schema_metadata(meta)
    with ipc.new_file(str(dst), table.schema) as w:
        w.write_table(table)


def test_an_edited_file_fails_the_full_check_and_a_header_mismatch_the_cheap_one(vol, tmp_path):
    import pyarrow as pa

    m = snapshot(str(vol))
    good = save(m, tmp_path / "m.manifest.arrow")

    def resize(table, meta):
        sizes = pa.array([9, 9, 9], pa.int64())
        return table.set_column(1, table.schema.field(1), sizes), meta

    _rewrite(good, tmp_path / "edited.manifest.arrow", resize)
    with pytest.raises(ManifestError, match="fingerprint check"):
        load(tmp_path / "edited.manifest.arrow")
    # The cheap check trusts the rows (the main process verified them) ...
    assert load(tmp_path / "edited.manifest.arrow", verify=False).fingerprint == m.fingerprint

    def drop_row(table, meta):
        return table.slice(0, 2), meta

    _rewrite(good, tmp_path / "short.manifest.arrow", drop_row)
    # ... but not a row count that disagrees with the header,
    with pytest.raises(ManifestError, match="header check"):
        load(tmp_path / "short.manifest.arrow", verify=False)
    # nor another fingerprint or size than the one the main process saw.
    with pytest.raises(ManifestError, match="expected"):
        load(good, verify=False, expect_fingerprint="0" * 64)
    with pytest.raises(ManifestError, match="bytes, expected"):
        load(good, verify=False, expect_size=os.path.getsize(good) + 1)
    assert load(good, verify=False, expect_fingerprint=m.fingerprint,
                expect_size=os.path.getsize(good)).fingerprint == m.fingerprint


def test_truncated_arrow_file_is_refused(vol, tmp_path):
    good = save(snapshot(str(vol)), tmp_path / "m.manifest.arrow")
    data = Path(good).read_bytes()
    bad = tmp_path / "cut.manifest.arrow"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ManifestError, match="not a readable Arrow file"):
        load(bad)


def test_arrow_manifest_is_a_source(vol, tmp_path):
    path = save(snapshot(str(vol)), tmp_path / "m.manifest.arrow")
    m = snapshot(path)
    assert isinstance(m.entries, ArrowEntries) and len(m) == 3
    assert m.volume().root.rstrip("/").endswith("vol")


def test_empty_manifest_roundtrips(tmp_path):
    m = Manifest("/x", [], fingerprint([]))
    again = load(save(m, tmp_path / "e.manifest.arrow"))
    assert len(again) == 0 and again.fingerprint == m.fingerprint and again.total_bytes == 0
    assert list(again.entries) == []


def test_many_batches_index_and_fingerprint_like_a_list(tmp_path):
    """More rows than one record batch: global indices cross batch boundaries."""
    entries = [FileEntry(f"f{i:06d}", i, f"v{i}") for i in range(70_000)]
    m = Manifest("/x", entries, fingerprint(entries))
    a = load(save(m, tmp_path / "big.manifest.arrow"))
    assert a.entries.table.column(0).num_chunks > 1
    for i in (0, 65_535, 65_536, 69_999):
        assert a.entries[i] == entries[i]
    assert a.take([69_999, 65_536, 3]) == [entries[69_999], entries[65_536], entries[3]]
    assert a.sizes().tolist()[65_530:65_540] == list(range(65_530, 65_540))
    assert fingerprint(a.entries) == m.fingerprint


def test_take_reads_rows_across_chunks_and_sliced_buffers():
    """Rows are read from the column buffers: several chunks, chunks that are
    slices of a larger buffer (non-zero offset), any order, repeats."""
    import pyarrow as pa

    from ucstage.manifest.columns import ArrowEntries, schema

    rows = [(f"d{i % 7}/f{i:05d}.bin", i * 3, f"v{i}") for i in range(500)]
    whole = pa.Table.from_pylist([dict(zip(("path", "size", "version"), r, strict=True)) for r in rows],
                                 schema=schema())
    # Chunks 0:130, 130:400, 400:500, each a zero-copy slice of the one buffer.
    chunked = pa.concat_tables([whole.slice(0, 130), whole.slice(130, 270), whole.slice(400)])
    assert chunked.column(0).num_chunks == 3
    entries = ArrowEntries(chunked)
    picks = [499, 0, 130, 129, 400, 399, 250, 250, 7]
    assert [tuple(e) for e in entries.take(picks)] == [rows[i] for i in picks]
    assert entries.paths(picks) == [rows[i][0] for i in picks]
    assert [tuple(entries[i]) for i in (-1, 131)] == [rows[-1], rows[131]]
    assert entries.take([]) == []
    with pytest.raises(IndexError):
        entries.take([500])
