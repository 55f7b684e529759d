"""gs:// and az:// against running servers: fake-gcs-server and Azurite
(tests/common/cloud.py), read by the obstore engine and, in forked workers,
by the fsspec fallback (gcsfs, adlfs) from the same settings. The same
guarantees as on S3: byte-identical warms, rewarms that copy nothing, a
changed object re-fetched, ranged GETs with If-Match, lazy caching, bench,
a shuffled DataLoader over epochs, faults through the fault proxy, and the
store's own MD5 checked on every copy."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.common.faults import Faults, faulty
from tests.common.parts import unique
from tests.common.throttle import Throttle, throttled
from ucstage.cache import LocalCache
from ucstage.engines import checks, objstore
from ucstage.engines.objget import PART, SPLIT_AT
from ucstage.manifest import snapshot

KB = 1024

# Nested folders, a name with a space and a unicode name, as a user's tree has.
NAMES = ["a.bin", "d1/b.bin", "d1/d2/c.bin", "d1/with space.bin", "d3/ünï.bin", "d3/e.bin"]


@dataclass
class Store:
    """One emulated store: where a test writes and the URL a user passes."""

    kind: str
    server: Any
    fs: Any
    """The store's fsspec backend, writing as an uploader would."""
    bucket: str

    def url(self, prefix: str) -> str:
        return f"{self.kind}://{self.bucket}/{prefix}"

    def write(self, prefix: str, files: dict[str, bytes]) -> str:
        for rel, data in files.items():
            self.fs.pipe_file(f"{self.bucket}/{prefix}/{rel}", data)
        return self.url(prefix)

    def env(self, endpoint: str) -> dict[str, str]:
        return dict(self.server.env(endpoint))

    def get_path(self, prefix: str, engine: str) -> str:
        """The path of the object GETs under ``prefix`` as the proxy sees them
        (obstore reads GCS by its XML API, gcsfs by the JSON API's download)."""
        if self.kind == "az":
            return f"devstoreaccount1/{self.bucket}/{prefix}/"
        api = "download/storage/v1/b/" if engine == "fsspec" else ""
        sep = "/o/" if engine == "fsspec" else "/"
        return f"{api}{self.bucket}{sep}{prefix}/"


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    if request.param == "gs":
        server = request.getfixturevalue("gcs")
        return Store("gs", server, server.filesystem(), server.BUCKET)
    server = request.getfixturevalue("azurite")
    return Store("az", server, server.filesystem(), server.CONTAINER)


def _tree(n: int = len(NAMES)) -> dict[str, bytes]:
    return {name: os.urandom(2 * KB + i) for i, name in enumerate(NAMES[:n])}


def _cached(cache: LocalCache, src: str) -> dict[str, bytes]:
    m = snapshot(src)
    return {e.path: Path(cache.fetch(m.volume(), e)).read_bytes() for e in m.entries}


def test_warm_is_byte_identical_and_a_rewarm_copies_nothing(store: Store) -> None:
    files = _tree()
    src = store.write(unique(), files)
    m = snapshot(src)
    assert sorted(e.path for e in m.entries) == sorted(files)
    cache = LocalCache()
    report = cache.warm(m.volume(), m.entries)
    assert (report.engine, report.fetched, report.failed) == ("obstore", len(files), [])
    # Every copy was checked against the MD5 the store keeps, none by size only.
    assert report.check_counts() == {"md5": len(files), "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    assert _cached(cache, src) == files
    again = cache.warm(snapshot(src).volume(), snapshot(src).entries)
    assert (again.fetched, again.already_cached) == (0, len(files))


def test_the_version_is_the_same_whichever_engine_lists(store: Store,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GCS: the generation (with the MD5); Azure: the ETag (with the MD5).
    A copy made through one engine is valid for the other."""
    src = store.write(unique(), _tree(3))
    by_obstore = snapshot(src)
    monkeypatch.setenv("UCSTAGE_ENGINE", "fsspec")
    by_fsspec = snapshot(src)
    assert by_obstore.entries == by_fsspec.entries
    assert by_obstore.fingerprint == by_fsspec.fingerprint
    for e in by_obstore.entries:
        assert ";md5=" in e.version
        if store.kind == "gs":
            assert e.version.split(";")[0].isdigit()  # the generation
    cache = LocalCache()
    assert cache.warm(by_fsspec.volume(), by_fsspec.entries).fetched == 3
    monkeypatch.setenv("UCSTAGE_ENGINE", "obstore")
    again = snapshot(src)
    report = cache.warm(again.volume(), again.entries)
    assert (report.engine, report.already_cached) == ("obstore", 3)


def test_a_changed_object_of_the_same_size_is_fetched_again(store: Store) -> None:
    prefix = unique()
    src = store.write(prefix, {"x.bin": b"a" * 500, "y.bin": b"y" * 10})
    cache = LocalCache()
    m = snapshot(src)
    cache.warm(m.volume(), m.entries)
    store.write(prefix, {"x.bin": b"b" * 500})
    m2 = snapshot(src)
    old = {e.path: e.version for e in m.entries}
    assert [e.path for e in m2.entries if e.version != old[e.path]] == ["x.bin"]
    assert cache.lookup(m2.volume(), m2.entries[0]) is None  # stale
    report = cache.warm(m2.volume(), m2.entries)
    assert (report.fetched, report.already_cached) == (1, 1)
    assert Path(cache.fetch(m2.volume(), m2.entries[0])).read_bytes() == b"b" * 500


@pytest.fixture
def through_throttle(store: Store, monkeypatch: pytest.MonkeyPatch) -> Iterator[Throttle]:
    with throttled(store.server.endpoint) as (url, proxy):
        for k, v in store.env(url).items():
            monkeypatch.setenv(k, v)
        yield proxy


def test_a_large_object_is_read_as_ranged_gets_with_if_match(store: Store,
                                                             through_throttle: Throttle) -> None:
    data = os.urandom(SPLIT_AT + 12345)
    src = store.write(unique(), {"big.bin": data})
    cache = LocalCache()
    m = snapshot(src)
    report = cache.warm(m.volume(), m.entries)
    assert report.fetched == 1 and report.check_counts()["md5"] == 1
    assert Path(cache.fetch(m.volume(), m.entries[0])).read_bytes() == data
    starts = sorted(int(r.split("=")[1].split("-")[0]) for r in through_throttle.ranges)
    assert starts == [i * PART for i in range(3)]
    # Every part after the first asks for the first one's ETag.
    assert len(through_throttle.if_match) == 2 and len(set(through_throttle.if_match)) == 1


def test_if_match_on_a_replaced_object(store: Store) -> None:
    """What the ranged parts rely on: a part asking the old ETag of a
    replaced object fails. Azurite enforces it; fake-gcs-server ignores
    If-Match (a limit of the emulator, not of GCS), so there the part is
    served and only the whole-object MD5 stands between it and the cache."""
    import obstore

    prefix = unique()
    store.write(prefix, {"o.bin": b"1" * 100})
    client = objstore.store(store.kind, store.bucket)
    old = obstore.head(client, f"{prefix}/o.bin")["e_tag"]
    store.write(prefix, {"o.bin": b"2" * 100})
    if store.kind == "az":
        with pytest.raises(Exception, match=r"(?i)precondition|412|condition"):
            obstore.get(client, f"{prefix}/o.bin", options={"if_match": old,
                                                             "range": (0, 10)}).bytes()
    else:
        got = obstore.get(client, f"{prefix}/o.bin", options={"if_match": old,
                                                               "range": (0, 10)}).bytes()
        assert bytes(got) == b"2" * 10  # ignored by the emulator


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                          text=True, timeout=300)


def test_cache_lazy_and_bench(store: Store, tmp_path: Path) -> None:
    import json

    files = _tree(4)
    src = store.write(unique(), files)
    out = str(tmp_path / "m.manifest.arrow")
    lazy = _cli("cache", "lazy", src, "-o", out, "--json")
    assert lazy.returncode == 0, lazy.stderr
    # Nothing copied up front; a read fetches.
    from ucstage.manifest import load

    m = load(out)
    cache = LocalCache()
    assert all(cache.lookup(m.volume(), e) is None for e in m.entries)
    assert _cached(cache, src) == files
    bench = _cli("bench", src, "--files", "4", "--workers", "1", "--max-seconds", "30", "--json")
    assert bench.returncode == 0, bench.stderr
    doc = json.loads(bench.stdout)
    assert doc["engine"] == "obstore" and doc["sample"]["files"] == 4
    # Every mode read the whole sample (direct, through a cold and a warm cache).
    assert {r["mode"]: (r["files"], r["bytes"], r["complete"]) for r in doc["results"]} == \
        dict.fromkeys(("direct", "cold", "warm"), (4, sum(map(len, files.values())), True))


FAULT_KINDS = ["flip", "reset", "stall"]


def _fault(faults: Faults, kind: str, keys: list[str], prefix: str) -> None:
    """Fault each of ``keys`` (names under ``prefix``) on its first GET."""
    faults.set(kind, keys, prefix=prefix)


# Stalls only on obstore: the fsspec engine has no per-request deadline of
# ucstage's (gcsfs and adlfs keep their own, of minutes).
@pytest.mark.parametrize(("engine", "kind"), [("obstore", k) for k in FAULT_KINDS] +
                         [("fsspec", "flip"), ("fsspec", "reset")])
def test_faults_are_retried_and_no_wrong_byte_is_cached(store: Store, kind: str, engine: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A flipped byte is caught by the store's MD5 on both engines (the
    fsspec one is what forked workers read with), resets and stalls are
    retried; every copy ends with the right bytes."""
    monkeypatch.setenv("UCSTAGE_ENGINE", engine)
    prefix = unique()
    files = {f"f{i}.bin": os.urandom(4 * KB + i) for i in range(6)}
    src = store.write(prefix, files)
    with faulty(store.server.endpoint) as (url, faults):
        for k, v in store.env(url).items():
            monkeypatch.setenv(k, v)
        # A stall ends by the engine's hedge or deadline, or at the latest when
        # the proxy drops it: either way the copy is retried.
        faults.max_stall = 5
        m = snapshot(src)
        _fault(faults, kind, ["f1.bin", "f4.bin"], store.get_path(prefix, engine))
        cache = LocalCache(retries=4, backoff=0.01)
        report = cache.warm(m.volume(), m.entries)
        assert report.failed == []
        assert faults.done[kind] == 2
        if kind == "flip":
            assert report.mismatches == 2
        assert report.check_counts()["md5"] == len(files)
        faults.set("", [])
        assert _cached(cache, src) == files
    checks.forget()


@pytest.mark.parametrize("engine", ["obstore", "fsspec"])
def test_a_composite_gcs_object_is_checked_by_its_crc32c(gcs: Any, engine: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """GCS keeps no MD5 of a composite object, only its CRC32C: a flipped
    byte is caught by the CRC32C on both engines, never cached, and
    ``cache verify --checksum`` checks the copies against it. fake-gcs-server
    gives composed objects an MD5, which GCS never does: the proxy answers the
    metadata as GCS would (``composite=True``), over the real server."""
    store = Store("gs", gcs, gcs.filesystem(), gcs.BUCKET)
    monkeypatch.setenv("UCSTAGE_ENGINE", engine)
    prefix = unique()
    files = {f"f{i}.bin": os.urandom(4 * KB + i) for i in range(5)}
    src = store.write(prefix, files)
    with faulty(gcs.endpoint) as (url, faults):
        for k, v in store.env(url).items():
            monkeypatch.setenv(k, v)
        faults.composite = True
        m = snapshot(src)
        assert all(";crc32c=" in e.version and ";md5=" not in e.version for e in m.entries)
        _fault(faults, "flip", ["f2.bin"], store.get_path(prefix, engine))
        cache = LocalCache(retries=3, backoff=0.01)
        report = cache.warm(m.volume(), m.entries)
        assert (report.failed, faults.done["flip"], report.mismatches) == ([], 1, 1)
        assert report.check_counts() == {"md5": 0, "crc32c": len(files), "page_crc": 0, "size": 0, "none": 0}
        faults.set("", [])
        assert _cached(cache, src) == files
        # A copy damaged on disk since is found by its recorded CRC32C.
        local = Path(cache.fetch(m.volume(), m.entries[0]))
        body = bytearray(local.read_bytes())
        body[0] ^= 0xFF
        local.write_bytes(bytes(body))
        verify = _cli("cache", "verify", src, "--checksum", "--json")
        assert verify.returncode == 1, verify.stderr
        assert "crc32c" in verify.stdout
    checks.forget()


@pytest.mark.parametrize("context", ["forkserver", "fork"])
def test_a_shuffled_loader_reads_every_file_once_per_epoch(store: Store, context: str,
                                                           tmp_path: Path) -> None:
    """Two workers, two epochs: every file once per epoch with its bytes.
    Forked workers (after the parent used obstore) read through gcsfs/adlfs
    with the engine's settings; forkserver workers keep obstore."""
    pytest.importorskip("torch")
    from tests.workers.cloud_dataset import ReadAll
    from ucstage import DataLoader, VolumeDataset

    files = {f"s{i}/f{i}.bin": os.urandom(1 * KB + i) for i in range(8)}
    src = store.write(unique(), files)
    cache = LocalCache(tmp_path / "parent")
    m = snapshot(src)
    cache.fetch(m.volume(), m.entries[0])  # obstore used here: forks fall back
    assert objstore.forks_fall_back()
    paths = VolumeDataset(src, shuffle=True, seed=3, cache_dir=str(tmp_path / "cache"))
    # forkserver: ucstage's own choice once obstore was used here (it then
    # hands the workers this process's environment).
    loader = DataLoader(ReadAll(paths), batch_size=None, num_workers=2, log_mlflow=False,
                        multiprocessing_context="fork" if context == "fork" else None)
    for epoch in range(2):
        paths.set_epoch(epoch)
        got = list(loader)
        # Every file once (the contents are distinct), with its bytes.
        assert sorted(data for _, data, _ in got) == sorted(files.values())
        # fork: the fallback (fsspec); forkserver: obstore in every worker.
        assert {engine for _, _, engine in got} == {context == "forkserver"}
    assert loader.multiprocessing_context is not None
    assert loader.multiprocessing_context.get_start_method() == context


@pytest.mark.parametrize("engine", ["obstore", "fsspec"])
def test_byte_ranges_of_a_listed_object_and_of_a_replaced_one(store: Store, engine: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranged reads a table's row groups use: pinned to the listed object
    (GCS by its generation, Azure by its ETag; the version's MD5 suffix is
    not part of the pin), and a replaced object is reported as changed."""
    from ucstage.engines.engine import read_ranges
    from ucstage.engines.ranges import RangeChanged

    monkeypatch.setenv("UCSTAGE_ENGINE", engine)
    prefix = unique()
    data = os.urandom(3000)
    src = store.write(prefix, {"t.parquet": data})
    m = snapshot(src)
    entry = m.entries[0]
    blobs, seen = read_ranges(m.volume(), entry.path, [(10, 5), (2000, 100)],
                              version=entry.version)
    assert blobs == [data[10:15], data[2000:2100]] and seen == entry.version
    store.write(prefix, {"t.parquet": os.urandom(3000)})
    with pytest.raises(RangeChanged):
        read_ranges(m.volume(), entry.path, [(0, 10)], version=entry.version)
