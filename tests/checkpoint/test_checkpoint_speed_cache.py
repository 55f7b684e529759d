"""Checkpoint saves that overlap writing, checksums and upload; the
multipart uploads a killed save leaves on S3, listed and aborted; loads
through the local cache (moto S3 behind the fault proxy, which counts GETs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import boto3
import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner

from tests.common import faults as faultkit
from tests.common.faults import Faults
from tests.common.parts import wait_until
from ucstage.checkpoint import Reader, Writer, retention, writer
from ucstage.checkpoint.folder import read_record
from ucstage.cli.app import cli
from ucstage.engines import objput

BUCKET = "ucstage-test"
fault_proxy = faultkit.fault_proxy


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(objput, "PART", 5 * 1024 * 1024)  # S3's smallest part


def _state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3 * 1024 * 1024, generator=g),  # 12 MiB: a multipart upload
            "b": torch.randn(1000, generator=g), "step": seed}


def _empty() -> dict[str, Any]:
    return {"w": torch.zeros(3 * 1024 * 1024), "b": torch.zeros(1000), "step": 0}


def _s3() -> Any:
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def _uploads(prefix: str) -> list[dict[str, Any]]:
    return _s3().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])


def _abandon(key: str) -> str:
    """A multipart upload begun, sent one part, and left: what a killed writer leaves."""
    s3 = _s3()
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    s3.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1,
                   Body=os.urandom(5 * 1024 * 1024))
    return str(upload)


def _cli(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["checkpoint", *args, "--json"])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.stdout))


# -- the save: checksums from the write's own pass, the upload beside it --------

def test_a_save_takes_its_checksums_as_it_writes_and_they_match_the_bytes(
        moto: Any, small_parts: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from ucstage.checkpoint import digests

    reads: list[str] = []
    real = digests.of_file

    def counted(path: str, *args: Any, **kw: Any) -> Any:
        reads.append(os.path.basename(path))
        return real(path, *args, **kw)

    monkeypatch.setattr(digests, "of_file", counted)
    dest = f"s3://{BUCKET}/tee-{uuid.uuid4().hex[:8]}/step-1"
    saved = _state(1)
    dcp.save(saved, storage_writer=Writer(dest))
    assert reads == []  # no second pass over the scratch files
    record = read_record(dest)
    assert record is not None
    # The record's checksums are those of the bytes the store holds.
    key = dest[len("s3://"):].split("/", 1)[1]
    for f in record.files:
        body = _s3().get_object(Bucket=BUCKET, Key=f"{key}/{f.name}")["Body"].read()
        assert digests.of_bytes(body, "crc32c") == f.checksum
        for offset, length, checksum in record.ranges[f.name]:
            assert digests.of_bytes(body[offset:offset + length], "crc32c") == checksum
    loaded = _empty()
    dcp.load(loaded, storage_reader=Reader(dest))
    assert torch.equal(loaded["w"], saved["w"]) and loaded["step"] == 1


# -- unfinished multipart uploads ---------------------------------------------

KILLED = """
import os, sys, time, torch, torch.distributed.checkpoint as dcp
from ucstage.checkpoint import Writer
from ucstage.checkpoint.upload import ObjectDestination
from ucstage.engines import objput

objput.PART = 5 * 1024 * 1024
marker = sys.argv[2]

class Stalling(ObjectDestination):
    sent = 0
    def _go_on(self, n=0):
        Stalling.sent += n
        if Stalling.sent > 12 * 1024 * 1024:  # two parts sent: the upload is begun
            open(marker, "w").write(str(os.getpid()))
            time.sleep(120)
        super()._go_on(n)

class StallingWriter(Writer):
    def destination(self):
        return Stalling(self._at)

g = torch.Generator().manual_seed(0)
dcp.save({"w": torch.randn(8 * 1024 * 1024, generator=g)},
         storage_writer=StallingWriter(sys.argv[1]), no_dist=True)
"""


def test_a_killed_multipart_upload_is_listed_and_pruned_once_stale(
        moto: Any, small_parts: None, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = f"s3://{BUCKET}/killed-{uuid.uuid4().hex[:8]}"
    prefix = parent[len(f"s3://{BUCKET}/"):]
    dcp.save(_state(1), storage_writer=Writer(f"{parent}/step-1"))
    marker = tmp_path / "stalled"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, f"{parent}/step-2", str(marker)],
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (marker.exists() and marker.read_text() != "")
                   or proc.poll() is not None, "the upload to stall", timeout=240)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    left = _uploads(prefix)
    assert [u["Key"] for u in left] == [f"{prefix}/step-2/__0_0.distcp"]

    listed = _cli("list", parent)
    assert [c["name"] for c in listed["checkpoints"]] == ["step-1"]  # nothing of step-2 landed
    (found,) = listed["unfinished_uploads"]
    assert found["path"] == f"{parent}/step-2/__0_0.distcp"
    assert found["upload_id"] == left[0]["UploadId"] and found["stale"] is False

    # Fresh: its writer may be alive, so prune leaves it.
    assert _cli("prune", parent, "--keep", "1")["aborted_uploads"] == []
    assert len(_uploads(prefix)) == 1

    # An hour later (the threshold moved instead of the clock).
    monkeypatch.setattr(retention, "STALE_SECONDS", 0.0)
    assert _cli("list", parent)["unfinished_uploads"][0]["stale"] is True
    dry = _cli("prune", parent, "--keep", "1", "--dry-run")
    assert [u["path"] for u in dry["aborted_uploads"]] == [found["path"]]
    assert len(_uploads(prefix)) == 1  # a dry run aborts nothing
    done = _cli("prune", parent, "--keep", "1")
    assert [u["path"] for u in done["aborted_uploads"]] == [found["path"]]
    assert _uploads(prefix) == []
    assert _cli("list", parent)["unfinished_uploads"] == []
    loaded = _empty()
    dcp.load(loaded, storage_reader=Reader(f"{parent}/step-1"))
    assert torch.equal(loaded["w"], _state(1)["w"])


def test_the_next_save_into_the_folder_aborts_stale_uploads_only(
        moto: Any, small_parts: None, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = f"s3://{BUCKET}/next-{uuid.uuid4().hex[:8]}"
    prefix = parent[len(f"s3://{BUCKET}/"):]
    other = f"other-{uuid.uuid4().hex[:8]}/step-1/__0_0.distcp"  # not under the folder
    _abandon(f"{prefix}/step-1/__1_0.distcp")
    _abandon(other)
    monkeypatch.setattr(writer, "_CHECKED", {})

    # Within the threshold: the save leaves it (its writer may still be at it).
    dcp.save(_state(1), storage_writer=Writer(f"{parent}/step-2"))
    assert len(_uploads(prefix)) == 1

    monkeypatch.setattr(retention, "STALE_SECONDS", 0.0)
    dcp.save(_state(2), storage_writer=Writer(f"{parent}/step-3"))
    assert len(_uploads(prefix)) == 1  # checked once per process and folder per threshold
    monkeypatch.setattr(writer, "_CHECKED", {})  # a restarted job
    dcp.save(_state(3), storage_writer=Writer(f"{parent}/step-4"))
    assert _uploads(prefix) == []
    assert [u["Key"] for u in _uploads(other.split("/")[0])] == [other]
    assert _cli("list", parent)["unfinished_uploads"] == []
    assert [c["name"] for c in _cli("list", parent)["checkpoints"]] == \
        ["step-2", "step-3", "step-4"]


def test_unfinished_uploads_are_none_off_s3(tmp_path: Any) -> None:
    path = tmp_path / "ckpt"
    dcp.save(_state(1), storage_writer=Writer(str(path / "step-1")))
    assert _cli("list", str(path))["unfinished_uploads"] == []
    assert _cli("prune", str(path), "--keep", "1")["aborted_uploads"] == []


# -- loads through the local cache --------------------------------------------

def _gets(faults: Faults, key: str) -> list[tuple[int, int]]:
    return [(lo, hi) for k, lo, hi, _ in faults.ranges if k == key]


def test_a_second_load_reads_its_ranges_from_the_cache_and_a_bad_copy_is_fetched_again(
        fault_proxy: Faults, small_parts: None, tmp_path: Any) -> None:
    dest = f"s3://{BUCKET}/cached-{uuid.uuid4().hex[:8]}/step-1"
    key = dest[len("s3://"):] + "/__0_0.distcp"
    saved = _state(4)
    dcp.save(saved, storage_writer=Writer(dest))
    record = read_record(dest)
    assert record is not None
    items = record.ranges["__0_0.distcp"]
    cache = tmp_path / "cache"

    fault_proxy.ranges.clear()
    first = _empty()
    dcp.load(first, storage_reader=Reader(dest, cache_dir=cache))
    assert torch.equal(first["w"], saved["w"]) and torch.equal(first["b"], saved["b"])
    got = _gets(fault_proxy, key)
    assert sorted(got) == sorted((o, o + n - 1) for o, n, _ in items)  # each item once, ranged

    fault_proxy.ranges.clear()
    second = _empty()
    dcp.load(second, storage_reader=Reader(dest, cache_dir=cache))
    assert _gets(fault_proxy, key) == []  # every range from local disk
    assert torch.equal(second["w"], saved["w"]) and second["step"] == 4

    # A cached copy damaged on disk fails its checksum: dropped and fetched
    # again, never loaded.
    biggest = max(items, key=lambda r: r[1])
    (copy,) = cache.glob(f"**/.ucstage-ranges/**/__0_0.distcp/{biggest[0]}-{biggest[1]}")
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0xFF
    copy.write_bytes(bytes(data))  # rewritten in place, its stamp kept: as a bad disk leaves it
    fault_proxy.ranges.clear()
    third = _empty()
    dcp.load(third, storage_reader=Reader(dest, cache_dir=cache))
    assert _gets(fault_proxy, key) == [(biggest[0], biggest[0] + biggest[1] - 1)]
    assert torch.equal(third["w"], saved["w"])

    # Without the cache, every load GETs its ranges.
    fault_proxy.ranges.clear()
    dcp.load(_empty(), storage_reader=Reader(dest, cache=False, cache_dir=cache))
    assert len(_gets(fault_proxy, key)) == len(items)


def test_a_load_falls_back_to_the_store_when_the_cache_is_unusable(
        fault_proxy: Faults, tmp_path: Any) -> None:
    from ucstage.errors import UcstageError

    dest = f"s3://{BUCKET}/nocache-{uuid.uuid4().hex[:8]}/step-1"
    dcp.save(_state(5), storage_writer=Writer(dest))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    loaded = _empty()
    dcp.load(loaded, storage_reader=Reader(dest, cache_dir=blocker / "cache"))
    assert torch.equal(loaded["w"], _state(5)["w"])
    with pytest.raises(UcstageError):
        Reader(dest, cache=True, cache_dir=blocker / "cache")


# -- the scratch file's tee -----------------------------------------------------

def test_the_tee_hashes_each_span_and_a_reader_follows_the_file_as_it_grows(
        tmp_path: Any) -> None:
    import threading

    from ucstage.checkpoint import digests
    from ucstage.checkpoint.tee import NOTIFY, Growing, TeeFileSystem

    opened: list[Growing] = []
    fs = TeeFileSystem("crc32c", opened.append)
    path = tmp_path / "__0_0.distcp"
    first, second = os.urandom(3 * NOTIFY), os.urandom(1000)
    seen: list[int] = []
    with fs.create_stream(str(path), "wb") as stream:
        (growing,) = opened
        follower = threading.Thread(target=lambda: seen.append(growing.wait(2 * NOTIFY)))
        follower.start()
        assert stream.tell() == 0
        stream.write(first)
        follower.join(30)
        # The follower woke as soon as the bytes it waited for were written,
        # before the file was complete, and they were on disk to read.
        assert seen and seen[0] >= 2 * NOTIFY and not growing.done
        assert path.read_bytes()[:seen[0]] == first[:seen[0]]
        assert stream.tell() == len(first)
        stream.write(second)
        assert stream.tell() == len(first) + len(second)
    assert growing.done and growing.wait(10**12) == len(first) + len(second)
    assert growing.checksum() == (len(first) + len(second),
                                  digests.of_bytes(first + second, "crc32c"))
    spans = [(0, len(first)), (len(first), len(second)), (10, 20)]  # the last: no span of its own
    assert growing.range_checksums(spans) == [
        digests.of_bytes(first, "crc32c"), digests.of_bytes(second, "crc32c"),
        digests.of_bytes(first[10:30], "crc32c")]


def test_a_writer_that_seeks_back_gets_checksums_of_the_final_bytes(tmp_path: Any) -> None:
    from ucstage.checkpoint import digests
    from ucstage.checkpoint.tee import Growing, TeeFileSystem

    opened: list[Growing] = []
    fs = TeeFileSystem("crc32c", opened.append)
    path = tmp_path / "__0_0.distcp"
    with fs.create_stream(str(path), "wb") as stream:
        stream.tell()
        stream.write(b"a" * 100)
        stream.tell()
        stream.seek(10)
        stream.write(b"B" * 5)  # rewrites bytes an upload may have sent already
        stream.seek(100)
    (growing,) = opened
    final = path.read_bytes()
    assert final == b"a" * 10 + b"B" * 5 + b"a" * 85
    assert growing.rewritten
    assert growing.checksum() == (100, digests.of_bytes(final, "crc32c"))
    assert growing.range_checksums([(0, 100)]) == [digests.of_bytes(final, "crc32c")]


def test_a_stopped_tee_sends_torchs_writes_nowhere_and_refuses_new_files(tmp_path: Any) -> None:
    from ucstage.checkpoint.tee import Growing, TeeFileSystem, WriteFailed

    opened: list[Growing] = []
    fs = TeeFileSystem("crc32c", opened.append)
    first = tmp_path / "__0_0.distcp"
    with fs.create_stream(str(first), "wb") as stream:
        stream.write(b"x" * 10)
        # Another thread stops the save (Ctrl-C): this writer thread goes on
        # quietly, and what it writes from now on goes nowhere.
        assert not fs.stop("the save stopped", 0.1)  # still open: not closed in time
        assert stream.write(b"y" * 5) == 5
    assert first.read_bytes() == b"x" * 10
    (growing,) = opened
    assert not growing.done
    with pytest.raises(WriteFailed, match="the save stopped"):
        growing.wait(100)  # the upload following it stops
    second = tmp_path / "__0_1.distcp"
    with pytest.raises(WriteFailed), fs.create_stream(str(second), "wb"):
        pass  # a file torch starts after the stop is refused
    assert not second.exists()
    assert fs.stop("again", 0.1)  # nothing open now
