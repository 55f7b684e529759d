"""ucstage export of Delta tables that live on object stores (moto,
fake-gcs-server, Azurite), on the embedded Spark Connect server, which has no
s3a/gcs/abfs connector: the live files are staged through ucstage's cache and
held there while Spark reads them.

The table is tests/common/deltastore.py's: column mapping, a typed partition
column, deletion vectors of every storage kind, a checkpoint. The reference
rows are deltalake's engine's (``QueryBuilder``), read from the store. Each
Spark export costs seconds: one per store, the rest refused before Spark.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.deltastore import ROWS, build, upload
from tests.common.faults import Faults
from tests.common.parts import free_port, unique
from tests.common.spark import beside_dest, exported_table
from tests.data.test_delta_stores import (
    DELETED,
    Place,
    _place,
    _repoint,
    deltalake_rows,
    fault_proxy,  # noqa: F401  (fixture)
    stored,
)
from ucstage.cache import LocalCache
from ucstage.cli.app import cli
from ucstage.engines import objstore
from ucstage.errors import CacheFull
from ucstage.export import export_table, read_record
from ucstage.progress import Callback
from ucstage.volumes import resolve
from ucstage.volumes.entry import PART_SUFFIX

pytestmark = pytest.mark.spark


def by_id(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: r["id"])


def data_keys(faults: Faults) -> list[str]:
    """Objects GET through the proxy other than the log's: data files, vectors."""
    return [k for k in faults.gets if "/_delta_log/" not in k]


def cached_parquet(root: str) -> list[str]:
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                  if f.endswith(".parquet") and "_delta_log" not in d)


class PruneWhileWriting(Callback):
    """When Spark is about to write (and so to read the staged files), prune
    the cache to nothing with no time lease: only the export's holds keep
    its files."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.steps: list[str] = []
        self.pruned: Any = None
        self.sized: list[tuple[int, int | None]] = []

    def set_description(self, text: str) -> None:
        self.steps.append(text)
        if text.startswith("writing"):
            self.pruned = LocalCache(self.root, lease_seconds=0).prune(0)

    def set_size(self, size: int, items: int | None = None) -> None:
        self.sized.append((size, items))


def test_a_table_on_s3_exports_the_rows_deltalake_reads_and_a_rerun_fetches_nothing(
        fault_proxy: Faults, moto: Any, spark_session: Any, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    place = Place("s3", moto.filesystem(), "ucstage-test")
    table = stored(place, tmp_path)
    with monkeypatch.context() as direct:  # DataFusion's suffix-range GETs fail through the proxy
        direct.setenv("AWS_ENDPOINT_URL", moto.endpoint)
        want = by_id(deltalake_rows(table.url))
    assert len(want) == ROWS - DELETED
    cache = LocalCache(str(tmp_path / "cache"))
    dest = str(tmp_path / "out")
    steps = PruneWhileWriting(cache.root)
    result = export_table(table.url, dest, cache=cache, callback=steps)
    assert not result.skipped_unchanged
    assert by_id(exported_table(dest).to_pylist()) == want
    record = read_record(dest)
    assert record is not None
    assert (record.table, record.source_kind, record.delta_version) == (table.url, "delta", 3)
    assert record.source_location == resolve(table.url).url
    assert record.row_count == len(want) == sum(f["rows"] for f in record.files)
    # The live files were copied into the cache, once each, and were held
    # there while Spark read them: the prune kept every one of them.
    staged = cached_parquet(cache.root)
    live = [k for k in fault_proxy.gets if k.endswith(".parquet") and "/_delta_log/" not in k]
    assert len(staged) == len(live) and all(fault_proxy.gets[k] == 1 for k in live)
    staged_bytes = sum(os.path.getsize(p) for p in staged)
    assert steps.sized == [(staged_bytes, len(staged))]  # the fetch's progress
    assert steps.pruned is not None and steps.pruned.bytes_in_use >= staged_bytes
    assert cached_parquet(cache.root) == staged
    # A rerun reads the log, finds the record names this version, and fetches nothing.
    fault_proxy.set("", [])
    again = export_table(table.url, dest, cache=cache)
    assert again.skipped_unchanged and again.record == record
    assert data_keys(fault_proxy) == []


@pytest.mark.parametrize("kind", ["gs", "az"])
def test_a_table_on_gcs_and_azure_exports_the_rows_deltalake_reads(
        kind: str, spark_session: Any, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The Azure table is named by a /Volumes path that $UCSTAGE_VOLUMES_ROOT maps there."""
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    place = _place(kind, request)
    table = stored(place, tmp_path)
    want = by_id(deltalake_rows(table.url))
    name = table.url
    if kind == "az":
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", f"az://{place.bucket}")
        name = "/Volumes/" + table.url.rsplit("/", 1)[1]
    dest = str(tmp_path / "out")
    export_table(name, dest, cache=LocalCache(str(tmp_path / "cache")))
    assert by_id(exported_table(dest).to_pylist()) == want
    record = read_record(dest)
    assert record is not None and record.row_count == len(want) == ROWS - DELETED
    assert (record.table, record.source_location) == (name, resolve(table.url).url)


def test_a_cap_too_small_is_refused_before_spark_and_before_any_fetch(
        fault_proxy: Faults, moto: Any, tmp_path: Path) -> None:  # noqa: F811
    table = stored(Place("s3", moto.filesystem(), "ucstage-test"), tmp_path)
    where = table.url[len("s3://"):]
    fs = moto.filesystem()
    live = sum(int(fs.info(p)["size"]) for p in fs.find(where)
               if p.endswith(".parquet") and "/_delta_log/" not in p)
    cache = LocalCache(str(tmp_path / "cache"), max_bytes=live // 2)
    dest = str(tmp_path / "out")
    fault_proxy.set("", [])
    # No server listens there: reaching Spark would fail another way.
    with pytest.raises(CacheFull, match=r"live data files total .* more than the cache cap") \
            as info:
        export_table(table.url, dest, cache=cache, remote=f"sc://127.0.0.1:{free_port()}")
    assert "UCSTAGE_CACHE_MAX_BYTES" in info.value.hint and "\n" not in str(info.value)
    assert data_keys(fault_proxy) == []
    assert not os.path.exists(dest) and beside_dest(dest) == []
    assert cached_parquet(cache.root) == []


def test_a_log_naming_a_file_outside_the_table_is_refused_by_the_cli_before_any_fetch(
        fault_proxy: Faults, moto: Any, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objstore, "_used_in", objstore._used_in)  # the CLI claims obstore
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    place = Place("s3", moto.filesystem(), "ucstage-test")
    key = unique("delta")
    url = f"s3://ucstage-test/{key}"
    table = build(str(tmp_path / "built"), url)
    log = Path(table.local) / "_delta_log"
    outside = f"s3://ucstage-test/{key}-x/{table.vectors['p']}"
    _repoint(log, 3, "path", outside)
    os.remove(log / f"{2:020d}.checkpoint.parquet")
    os.remove(log / "_last_checkpoint")
    upload(place.fs, table.local, f"ucstage-test/{key}")
    place.fs.pipe_file(f"ucstage-test/{key}-x/{table.vectors['p']}", b"PAR1 not this table's")
    fault_proxy.set("", [])
    dest = str(tmp_path / "out")
    result = CliRunner().invoke(cli, ["export", url, dest], catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"error: table {url}: the Delta log names data file {outside}")
    assert lines[0].endswith("outside the table's folder " + url) and len(lines) == 2
    assert lines[1].startswith("hint: nothing was read")
    assert data_keys(fault_proxy) == []
    assert not os.path.exists(dest) and beside_dest(dest) == []


def test_ctrl_c_while_fetching_stops_the_fetch_and_writes_nothing(
        fault_proxy: Faults, moto: Any, tmp_path: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``python -m ucstage export`` as a user runs it, its data files' GETs
    stalled by the proxy (which holds them 30 s unless the client drops them)."""
    import signal
    import time

    from tests.common.spark import export_process, server_folders

    place = Place("s3", moto.filesystem(), "ucstage-test")
    table = stored(place, tmp_path)
    where = table.url[len("s3://"):]
    data = [p for p in place.fs.find(where) if p.endswith(".parquet") and "/_delta_log/" not in p]
    cache = tmp_path / "cache"
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(cache))
    fault_proxy.set("stall", data, attempts=100)
    dest, tmpdir = str(tmp_path / "out"), str(tmp_path / "tmp")
    proc = export_process(table.url, dest, tmpdir)
    try:
        deadline = time.monotonic() + 120
        while not fault_proxy.stalled_now and proc.poll() is None and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        assert fault_proxy.stalled_now, "no data file's GET was under way"
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "export: fetching the table's" in err  # off a terminal, the step is a line
    assert f"stopped: nothing was written: {dest} is as it was" in err, err
    assert err.rstrip().endswith("interrupted")
    assert fault_proxy.dropped() >= 1  # the stalled copies were given up, not waited for
    assert not os.path.exists(dest) and beside_dest(dest) == []
    assert server_folders(tmpdir) == []  # Spark never started
    # No temp file of a copy in flight is left.
    assert [n for _, _, fs in os.walk(cache) for n in fs if n.endswith(PART_SUFFIX)] == []


def test_a_store_folder_without_a_delta_log_is_not_found_before_spark(
        moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    monkeypatch.setenv("UCSTAGE_CACHE_DIR", str(tmp_path / "cache"))
    from ucstage.errors import TableNotFound

    fs = moto.filesystem()
    key = unique("plain")
    fs.pipe_file(f"ucstage-test/{key}/part-0.parquet", b"PAR1 not read")
    url = f"s3://ucstage-test/{key}"
    dest = str(tmp_path / "out")
    with pytest.raises(TableNotFound, match=rf"table {url} not found: no Delta log at {url}"):
        export_table(url, dest, remote=f"sc://127.0.0.1:{free_port()}")
    assert not os.path.exists(dest) and not os.path.exists(tmp_path / "cache")  # no cache made
