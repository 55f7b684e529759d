"""TableDataset on Delta tables that live on object stores: moto (S3),
fake-gcs-server (GCS) and Azurite (Azure), each read by the obstore engine
(and by its fsspec fallback in forked DataLoader workers).

The table (tests/common/deltastore.py) has column mapping, a typed partition
column, deletion vectors of every storage kind (the absolute one naming the
store URL), a checkpoint and a commit after it; it is built in a local folder
and uploaded whole. The reference rows are deltalake's, read from the store
with the storage options ucstage derives (:func:`ucstage.engines.objstore.delta_location`).
A flipped byte in a vector file is never cached, a rerun fetches nothing,
and a log that names a file outside the table is refused before any of it
is fetched."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tests.common import faults as faultkit
from tests.common.deltastore import ROWS, StoreTable, build, upload
from tests.common.faults import Faults
from tests.common.parts import unique
from tests.data.test_delta_reader import multiset, over_layout
from ucstage import DataLoader, TableDataset
from ucstage.cache import LocalCache
from ucstage.engines.objstore import delta_location
from ucstage.errors import MissingDataFiles, UnsafePath
from ucstage.tables import row_groups
from ucstage.volumes import resolve

fault_proxy = faultkit.fault_proxy
DELETED = 4 + 5 + 9
"""Rows the table's three vectors delete (tests/common/deltastore.py)."""


@dataclass
class Place:
    kind: str
    fs: Any
    """The store's fsspec backend, writing as an uploader would."""
    bucket: str


def _place(kind: str, request: pytest.FixtureRequest) -> Place:
    if kind == "s3":
        server = request.getfixturevalue("moto")
        return Place("s3", server.filesystem(), "ucstage-test")
    if kind == "gs":
        server = request.getfixturevalue("gcs")
        return Place("gs", server.filesystem(), server.BUCKET)
    server = request.getfixturevalue("azurite")
    return Place("az", server.filesystem(), server.CONTAINER)


@pytest.fixture(params=["s3", "gs", "az"])
def place(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Place:
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    return _place(str(request.param), request)


def stored(place: Place, tmp_path: Path) -> StoreTable:
    key = unique("delta")
    table = build(str(tmp_path / "built"), f"{place.kind}://{place.bucket}/{key}")
    upload(place.fs, table.local, f"{place.bucket}/{key}")
    return table


def deltalake_rows(url: str, version: int | None = None) -> list[dict[str, Any]]:
    """The table's rows as deltalake reads them from the store (its vectors applied)."""
    from deltalake import DeltaTable, QueryBuilder

    where, options = delta_location(resolve(url))
    dt = DeltaTable(where, version=version, storage_options=options)
    return pa.table(QueryBuilder().register("t", dt).execute("select * from t")
                    .read_all()).to_pylist()


def test_a_table_on_each_store_reads_the_rows_deltalake_reads(place: Place,
                                                              tmp_path: Path) -> None:
    table = stored(place, tmp_path)
    reference = deltalake_rows(table.url)
    assert len(reference) == ROWS - DELETED
    cache = tmp_path / "cache"
    m = row_groups(table.url, fetch=LocalCache(str(cache)).fetch)
    assert (m.kind, m.table_version, m.rows) == ("delta", 3, len(reference))
    assert m.volume_url.rstrip("/") == table.url
    assert m.schema.field("p").type == pa.int32()  # the partition's type is the log's
    assert m.schema.names == ["id", "p", "st"]  # logical names (column mapping)
    # Each file-stored vector was fetched through the cache and checked, then inlined.
    assert sorted(v["storageType"] for v in m.deletion_vectors if v) == ["i", "i", "i"]
    assert 0 in m.rows_per_group.tolist()  # a row group the absolute vector deletes whole
    # Without a cache (the public row_groups(), shard-plan) the vectors are read
    # from the store, checked the same way, and the listing is the same.
    plain = row_groups(table.url)
    assert plain.fingerprint == m.fingerprint and plain.deletion_vectors == m.deletion_vectors
    got = over_layout(table.url, cache, world=2, workers=2, batch_rows=5)
    assert multiset(got) == multiset(reference)
    alone = over_layout(table.url, cache, world=1, workers=0, columns=["st", "id"])
    assert multiset(alone) == multiset([{"st": r["st"], "id": r["id"]} for r in reference])
    # Time travel: version 1, before the vectors, read from its own files.
    old = [r for b in TableDataset(table.url, version=1, cache_dir=str(cache))
           for r in b.to_pylist()]
    assert len(old) == 80 and multiset(old) == multiset(deltalake_rows(table.url, 1))


def test_vacuumed_files_on_a_store_are_named_at_freeze(moto: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    place = Place("s3", moto.filesystem(), "ucstage-test")
    table = stored(place, tmp_path)
    where = table.url[len("s3://"):]
    vector = next(p for p in place.fs.find(f"{where}/q1"))
    place.fs.rm(vector)
    with pytest.raises(MissingDataFiles, match=rf"deletion vector of {table.vectors['u']} "
                                               r"is missing: s3://.*/q1/deletion_vector_"):
        row_groups(table.url, fetch=LocalCache(str(tmp_path / "c")).fetch)
    place.fs.rm(f"{where}/{table.vectors['i']}")
    with pytest.raises(MissingDataFiles, match=r"1 data file.* missing, e\.g\. ") as info:
        TableDataset(table.url, cache_dir=str(tmp_path / "c")).freeze()
    assert table.vectors["i"] in str(info.value) and "vacuumed" in info.value.hint


def test_a_flipped_byte_is_never_cached_and_a_rerun_fetches_nothing(
        fault_proxy: Faults, moto: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No hedges: a hedged GET that won against the flipped response would
    # leave the flip unseen, and the count below is exact.
    monkeypatch.setenv("UCSTAGE_HEDGE", "0")
    place = Place("s3", moto.filesystem(), "ucstage-test")
    table = stored(place, tmp_path)
    where = table.url[len("s3://"):]
    vector = next(p for p in place.fs.find(f"{where}/q1"))
    with monkeypatch.context() as direct:  # DataFusion's suffix-range GETs fail through the proxy
        direct.setenv("AWS_ENDPOINT_URL", moto.endpoint)
        reference = deltalake_rows(table.url)
    fault_proxy.set("flip", [vector])
    cache = LocalCache(str(tmp_path / "cache"))

    def epoch() -> tuple[list[dict[str, Any]], Any]:
        ds = TableDataset(table.url, cache=cache, batch_rows=7)
        loader = DataLoader(ds, batch_size=None, num_workers=0, log_mlflow=False)
        rows = [r for b in loader for r in b.to_pylist()]
        return rows, loader.epoch_stats[-1]

    rows, first = epoch()
    assert multiset(rows) == multiset(reference)
    assert fault_proxy.done["flip"] == 1 and fault_proxy.gets[vector] == 2  # read again
    copies = [os.path.join(d, f) for d, _, fs in os.walk(cache.root) for f in fs
              if f.startswith("deletion_vector_") and "/q1" in d]
    assert len(copies) == 1
    with open(copies[0], "rb") as f:
        assert f.read() == place.fs.cat_file(vector)  # the right bytes, not the flipped ones
    assert first.cache_hit_rate == 0.0
    fault_proxy.set("", [])  # counts restart
    rows, again = epoch()
    assert multiset(rows) == multiset(reference)
    assert again.cache_hit_rate == 1.0  # every row group from the cache
    sizes = {p: int(place.fs.info(p)["size"]) for p in place.fs.find(where)}
    data_gets = [r for r in fault_proxy.ranges if r[0].endswith(".parquet")
                 and "/_delta_log/" not in r[0]]
    assert data_gets  # the footers were read again at freeze...
    assert all(last == sizes[key] - 1 for key, _, last, _ in data_gets)  # ...and nothing else
    assert fault_proxy.gets[vector] == 0  # the vector neither


@pytest.mark.torchrun
def test_a_table_on_s3_under_torchrun_two_ranks_two_workers(moto: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """2 ranks on gloo x 2 DataLoader workers each (tests/workers/table_worker.py):
    every live row once, as deltalake reads the table."""
    from tests.data.test_table_torchrun import results, torchrun

    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    table = stored(Place("s3", moto.filesystem(), "ucstage-test"), tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    proc = torchrun("rows", table.url, str(out))
    assert proc.returncode == 0, proc.stderr[-6000:]
    ranks = results(str(out))
    got = [r for rank in ranks for r in rank["rows"]]
    want = [json.dumps(r, sort_keys=True, default=str) for r in deltalake_rows(table.url)]
    assert sorted(got) == sorted(want)  # every live row exactly once
    assert all(rank["batches"] == rank["len"] for rank in ranks)


def _repoint(log: Path, version: int, field: str, value: Any, data: str = "") -> None:
    """Commit ``version``'s add (of ``data``, else its first) names ``value``
    as its ``path`` or its ``deletionVector``'s."""
    path = log / f"{version:020d}.json"
    actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    add = next(a["add"] for a in actions if "add" in a and a["add"]["path"] == (data or
                                                                                a["add"]["path"]))
    if field == "deletionVector":
        add["deletionVector"]["pathOrInlineDv"] = value
    else:
        add["path"] = value
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))


@pytest.mark.parametrize("how", ["other-bucket", "sibling-prefix", "dotdot", "local-path",
                                 "vector-elsewhere"])
def test_a_log_naming_a_file_outside_the_table_is_refused_before_any_fetch(
        fault_proxy: Faults, moto: Any, tmp_path: Path, how: str) -> None:
    """The file outside is a real object (a Parquet file of other rows, a
    vector file) that a reader following the path would read."""
    place = Place("s3", moto.filesystem(), "ucstage-test")
    key = unique("delta")
    url = f"s3://ucstage-test/{key}"
    table = build(str(tmp_path / "built"), url)
    log = Path(table.local) / "_delta_log"
    data = table.vectors["p"]
    outside = {"other-bucket": f"s3://ucstage-other/{key}/{data}",
               "sibling-prefix": f"s3://ucstage-test/{key}-x/{data}",
               "dotdot": f"../{key}-x/{data}", "local-path": f"/{key}-x/{data}",
               "vector-elsewhere": f"s3://ucstage-test/{key}-x/abs/dv.bin"}[how]
    if how == "vector-elsewhere":
        _repoint(log, 2, "deletionVector", outside, data)
    else:
        _repoint(log, 3, "path", outside)
    os.remove(log / f"{2:020d}.checkpoint.parquet")  # the log alone says where files are
    os.remove(log / "_last_checkpoint")
    upload(place.fs, table.local, f"ucstage-test/{key}")
    place.fs.pipe_file(f"ucstage-test/{key}-x/{data}", b"PAR1 not this table's")
    place.fs.pipe_file(f"ucstage-test/{key}-x/abs/dv.bin", b"\x01 not this table's")
    fault_proxy.set("", [])
    with pytest.raises(UnsafePath, match="outside the table's folder") as info:
        TableDataset(url, cache_dir=str(tmp_path / "c")).freeze()
    assert outside in str(info.value) and info.value.exit_code == 2
    assert not [k for k in fault_proxy.gets if f"{key}-x" in k]  # nothing of it fetched
    assert not [k for k in fault_proxy.gets if k.endswith(".parquet")]  # nor any data file
