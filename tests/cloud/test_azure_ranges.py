"""Azure blobs the store keeps no MD5 for (committed from blocks without
``Content-MD5``), against Azurite through the fault proxy: read in ranges of
at most 4 MiB whose MD5 Azure gives (``x-ms-range-get-content-md5``), so a
flipped byte is caught and only its range read again; a range wrong on every
read fails the file, never cached; a blob with a stored MD5 keeps its one
GET checked against that MD5. The same on the fsspec engine (a DataLoader
worker forked after obstore ran in its parent), whose ranges the SDK's sync
client asks for and checks (``validate_content``).

Azurite (3.37) answers a ranged GET with that header as Azure does: the MD5
of the range served, in ``Content-MD5``; the proxy forwards it and flips a
byte after, as a network would. Where Azurite differs (a range over 4 MiB,
or none, with the header: Azurite serves it without an MD5, Azure refuses
it with 400 ``InvalidHeaderValue``), the proxy answers as Azure does
(tests/common/faults.py), so a read asking for larger ranges fails here as
it would on Azure."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from tests.common.faults import Faults, azurite_behind
from tests.common.parts import unique
from ucstage.cache import LocalCache
from ucstage.cache.inflight import Inflight
from ucstage.engines import azranges, checks, objstore
from ucstage.engines.azranges import RANGE, TRIES
from ucstage.manifest import snapshot

KB = 1024
SMALL = 100 * KB + 7
LARGE = 2 * RANGE + 300 * KB + 11
"""Three ranges: two full ones and a short last one."""


def _ranges(size: int) -> int:
    return -(-size // RANGE)


@pytest.fixture
def proxied(azurite: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """The obstore engine reaching Azurite through the fault proxy."""
    yield from azurite_behind(azurite, monkeypatch, "obstore")


@pytest.fixture
def proxied_fsspec(azurite: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Faults]:
    """The fsspec engine (a DataLoader worker forked after obstore ran in
    its parent) reaching Azurite through the fault proxy."""
    yield from azurite_behind(azurite, monkeypatch, "fsspec")



def _blocks(azurite: Any, prefix: str, files: dict[str, bytes]) -> str:
    """``files`` committed from blocks of at most 3 MiB (no Content-MD5)."""
    step = 3 * 1024 * KB
    for name, data in files.items():
        azurite.put_blocks(f"{azurite.CONTAINER}/{prefix}/{name}",
                           [data[i:i + step] for i in range(0, len(data), step)])
    return f"az://{azurite.CONTAINER}/{prefix}"


def _key(azurite: Any, prefix: str, name: str) -> str:
    """The object GET's key as the proxy sees it."""
    return f"devstoreaccount1/{azurite.CONTAINER}/{prefix}/{name}"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", *args], capture_output=True,
                          text=True, timeout=300)


def test_a_flipped_byte_of_a_blob_without_md5_is_caught_and_its_range_read_again(
        azurite: Any, proxied: Faults) -> None:
    """A small blob (one range) and a large one (three ranges), both without
    a stored MD5, each get one byte flipped on their first GET. No retry of
    the file is allowed (``retries=0``): each copy succeeds only because the
    range that mismatched its MD5 was read again, one GET more than its
    ranges. Every GET asked for its range's MD5, no range over 4 MiB; the
    cached bytes equal the source, and ``cache verify --checksum`` finds a
    copy damaged on disk since by the MD5 recorded."""
    prefix = unique()
    files = {"small.bin": os.urandom(SMALL), "large.bin": os.urandom(LARGE)}
    src = _blocks(azurite, prefix, files)
    m = snapshot(src)
    assert all(";md5=" not in e.version for e in m.entries)  # the store keeps none
    proxied.set("flip", [_key(azurite, prefix, name) for name in files])
    report = LocalCache(retries=0, hedge=False).warm(m.volume(), m.entries)
    assert (report.failed, report.fetched) == ([], 2)
    assert (proxied.done["flip"], report.mismatches) == (2, 2)
    assert report.check_counts() == {"md5": 2, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    for name, data in files.items():
        key = _key(azurite, prefix, name)
        assert proxied.gets[key] == _ranges(len(data)) + 1, name
        asked = [r for r in proxied.ranges if r[0] == key]
        assert len(asked) == proxied.gets[key]
        assert all(md5 and last - first + 1 <= RANGE for _, first, last, md5 in asked)
        # Every byte was asked for (the re-read range twice).
        assert {(first, last) for _, first, last, _ in asked} == \
            {(s, min(len(data), s + RANGE) - 1) for s in range(0, len(data), RANGE)}
    proxied.set("", [])
    cache = LocalCache()
    copies = {e.path: cache.lookup(m.volume(), e) for e in m.entries}
    assert {p: Path(c).read_bytes() for p, c in copies.items() if c} == files
    # The whole copy's MD5 is recorded: verify needs no second read of the source.
    for path, local in copies.items():
        assert checks.recorded(str(local)) == "md5:" + hashlib.md5(files[path]).hexdigest()
    assert _cli("cache", "verify", src, "--checksum").returncode == 0
    local = Path(str(copies["large.bin"]))
    body = bytearray(local.read_bytes())
    body[RANGE + 5] ^= 0xFF
    local.write_bytes(bytes(body))
    verify = _cli("cache", "verify", src, "--checksum", "--json")
    assert verify.returncode == 1, verify.stderr
    corrupt = json.loads(verify.stdout)["sources"][0]["corrupt"]
    assert [(c["path"], "(md5)" in c["reason"]) for c in corrupt] == [("large.bin", True)]


def test_a_range_wrong_on_every_read_fails_the_file_and_nothing_is_cached(
        azurite: Any, proxied: Faults) -> None:
    """A bad replica: the same byte of the second range wrong on every GET.
    The range is read :data:`TRIES` times per attempt of the file, then the
    file fails with the MD5 mismatch; no copy is cached, the other file is."""
    prefix = unique()
    files = {"bad.bin": os.urandom(LARGE), "good.bin": os.urandom(SMALL)}
    src = _blocks(azurite, prefix, files)
    m = snapshot(src)
    bad = _key(azurite, prefix, "bad.bin")
    proxied.set("corrupt", [bad])
    cache = LocalCache(retries=1, backoff=0.01, hedge=False)
    report = cache.warm(m.volume(), m.entries)
    assert [path for path, _ in report.failed] == ["bad.bin"]
    assert "md5 mismatch" in report.failed[0][1]
    # Each of the 2 attempts: the first range TRIES times (every GET is
    # corrupt), then it gives up before any other range.
    assert proxied.gets[bad] == 2 * TRIES
    assert report.mismatches == 2 * TRIES
    entries = {e.path: e for e in m.entries}
    assert cache.lookup(m.volume(), entries["bad.bin"]) is None
    local = cache.lookup(m.volume(), entries["good.bin"])
    assert local is not None and Path(local).read_bytes() == files["good.bin"]


def test_a_blob_with_a_stored_md5_keeps_one_get_checked_against_it(
        azurite: Any, proxied: Faults) -> None:
    """A blob uploaded whole has its Content-MD5: one GET, no range MD5
    asked, a flipped byte caught by the stored MD5 and the file read again."""
    prefix = unique()
    data = os.urandom(LARGE)
    azurite.filesystem().pipe_file(f"{azurite.CONTAINER}/{prefix}/whole.bin", data)
    m = snapshot(f"az://{azurite.CONTAINER}/{prefix}")
    assert ";md5=" in m.entries[0].version
    key = _key(azurite, prefix, "whole.bin")
    proxied.set("flip", [key])
    cache = LocalCache(retries=1, backoff=0.01, hedge=False)
    report = cache.warm(m.volume(), m.entries)
    assert (report.failed, report.mismatches) == ([], 1)
    assert report.check_counts()["md5"] == 1
    assert proxied.gets[key] == 2
    assert not any(md5 for k, _, _, md5 in proxied.ranges if k == key)
    local = cache.lookup(m.volume(), m.entries[0])
    assert local is not None and Path(local).read_bytes() == data


def test_the_fsspec_engine_reads_a_blob_without_md5_in_checked_ranges(
        azurite: Any, proxied_fsspec: Faults) -> None:
    """The fsspec engine's copy (forked DataLoader workers), which adlfs
    would give unchecked: both blobs get one byte flipped on their first
    GET, no retry of the file allowed; each copy succeeds because the SDK
    asked every range for its MD5, found the one that mismatched, and the
    copy read that range again. Counted ``md5``, the whole MD5 recorded."""
    prefix = unique()
    files = {"small.bin": os.urandom(SMALL), "large.bin": os.urandom(LARGE)}
    src = _blocks(azurite, prefix, files)
    m = snapshot(src)
    assert all(";md5=" not in e.version for e in m.entries)
    proxied_fsspec.set("flip", [_key(azurite, prefix, name) for name in files])
    report = LocalCache(retries=0, hedge=False).warm(m.volume(), m.entries)
    assert report.engine == "fsspec"
    assert (report.failed, report.fetched) == ([], 2)
    assert (proxied_fsspec.done["flip"], report.mismatches) == (2, 2)
    assert report.check_counts() == {"md5": 2, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    for name, data in files.items():
        key = _key(azurite, prefix, name)
        assert proxied_fsspec.gets[key] == _ranges(len(data)) + 1, name
        asked = [r for r in proxied_fsspec.ranges if r[0] == key]
        assert len(asked) == proxied_fsspec.gets[key]
        assert all(md5 and last - first + 1 <= RANGE for _, first, last, md5 in asked)
        # Every byte was asked for (the SDK asks a whole first range, which
        # Azure cuts at the blob's end).
        assert {(first, min(last, len(data) - 1)) for _, first, last, _ in asked} == \
            {(s, min(len(data), s + RANGE) - 1) for s in range(0, len(data), RANGE)}
    proxied_fsspec.set("", [])
    cache = LocalCache()
    for e in m.entries:
        local = cache.lookup(m.volume(), e)
        assert local is not None and Path(local).read_bytes() == files[e.path]
        assert checks.recorded(str(local)) == "md5:" + hashlib.md5(files[e.path]).hexdigest()


def test_the_fsspec_engine_fails_a_range_wrong_on_every_read_and_caches_nothing(
        azurite: Any, proxied_fsspec: Faults) -> None:
    """A bad replica on the fsspec engine: the first range is read
    :data:`TRIES` times per attempt of the file, then the file fails with
    the MD5 mismatch and is not cached; the other file is."""
    prefix = unique()
    files = {"bad.bin": os.urandom(LARGE), "good.bin": os.urandom(SMALL)}
    src = _blocks(azurite, prefix, files)
    m = snapshot(src)
    bad = _key(azurite, prefix, "bad.bin")
    proxied_fsspec.set("corrupt", [bad])
    cache = LocalCache(retries=1, backoff=0.01, hedge=False)
    report = cache.warm(m.volume(), m.entries)
    assert report.engine == "fsspec"
    assert [path for path, _ in report.failed] == ["bad.bin"]
    assert "md5 mismatch" in report.failed[0][1]
    assert proxied_fsspec.gets[bad] == 2 * TRIES
    assert report.mismatches == 2 * TRIES
    entries = {e.path: e for e in m.entries}
    assert cache.lookup(m.volume(), entries["bad.bin"]) is None
    local = cache.lookup(m.volume(), entries["good.bin"])
    assert local is not None and Path(local).read_bytes() == files["good.bin"]


def _warm_in_child(root: str, src: str, out: Any) -> None:
    """A forked child's warm (what a DataLoader worker's fetch runs)."""
    try:
        m = snapshot(src)
        report = LocalCache(root, retries=0, hedge=False).warm(m.volume(), m.entries)
        out.send((report.engine, report.failed, report.mismatches, report.check_counts()))
    except BaseException as exc:  # the parent's assertion names it
        out.send(repr(exc))
    finally:
        out.close()


def test_a_worker_forked_after_obstore_ran_checks_a_blob_without_md5(
        azurite: Any, proxied: Faults, tmp_path: Path) -> None:
    """The case the fsspec engine's check is for: the parent read through
    obstore, so a forked child falls back to adlfs, and its copy of a blob
    without a stored MD5, one byte flipped, is still checked range by range
    and cached right."""
    prefix = unique()
    data = os.urandom(LARGE)
    src = _blocks(azurite, prefix, {"large.bin": data})
    m = snapshot(src)
    LocalCache(tmp_path / "parent").warm(m.volume(), m.entries)  # obstore ran here
    assert objstore.forks_fall_back()
    proxied.set("flip", [_key(azurite, prefix, "large.bin")])
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    child = fork.Process(target=_warm_in_child, args=(str(tmp_path / "child"), src, send))
    child.start()
    send.close()
    got = receive.recv() if receive.poll(240) else "no answer"
    child.join(30)
    assert got == ("fsspec", [], 1, {"md5": 1, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}), got
    assert proxied.done["flip"] == 1
    local = LocalCache(tmp_path / "child").lookup(m.volume(), m.entries[0])
    assert local is not None and Path(local).read_bytes() == data


def test_a_blob_replaced_between_ranges_fails_the_sync_copy(azurite: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The fsspec engine's ranges after the first ``If-Match`` its ETag: a
    blob replaced once the first range is written fails the copy (412, an
    ``OSError`` the cache retries) instead of mixing two versions."""
    for k, v in azurite.env().items():
        monkeypatch.setenv(k, v)
    prefix = unique()
    _blocks(azurite, prefix, {"x.bin": os.urandom(LARGE)})
    name = f"{azurite.CONTAINER}/{prefix}/x.bin"

    class ReplacedAfterFirstRange:
        """A job whose check, after the first range is written, replaces the blob."""

        checks = 0

        def check(self) -> None:
            self.checks += 1
            if self.checks == 2:
                azurite.put_blocks(name, [os.urandom(RANGE)] * 3)

    job = ReplacedAfterFirstRange()
    fd = os.open(tmp_path / "copy", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        with pytest.raises(OSError, match="412") as info:
            azranges.copy_into(azurite.CONTAINER, f"{prefix}/x.bin", fd, cast(Inflight, job))
    finally:
        os.close(fd)
    assert not isinstance(info.value, checks.Mismatch)
    assert job.checks == 2
