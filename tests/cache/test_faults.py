"""Network faults on the object-store engine, against real moto behind the
fault proxy of tests/common/faults.py: a reset, a stalled or a corrupted
response never leaves a wrong byte in the cache, and the checks each copy got
are reported."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.common import faults as faultkit
from tests.common.backends import make_source
from tests.common.faults import Faults
from ucstage.cache import LocalCache
from ucstage.cli.app import cli
from ucstage.engines import checks
from ucstage.errors import InvalidArgument
from ucstage.manifest import snapshot

KB = 1024
MB = 1024 * KB

fault_proxy = faultkit.fault_proxy


def _files(n: int, size: int = 64 * KB) -> dict[str, bytes]:
    return {f"d{i % 4}/f{i:04d}.bin": os.urandom(size) for i in range(n)}


def _wrong(cache: LocalCache, src: str, files: dict[str, bytes]) -> list[str]:
    """Cached files whose bytes differ from the source's (missing ones too)."""
    m = snapshot(src)
    wrong = []
    for e in m.entries:
        path = cache.lookup(m.volume(), e)
        if path is None or Path(path).read_bytes() != files[e.path]:
            wrong.append(e.path)
    return wrong


def _warm_json(src: str, *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(cli, ["cache", "warm", src, "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


def _prefix(src: str) -> str:
    return src[len("s3://"):]


def test_corrupted_responses_are_retried_and_never_cached(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(80)
    src = make_source("s3", "", files)
    # No hedges: a hedged GET that won against a flipped response would
    # leave its mismatch unseen, and the count below is exact.
    monkeypatch.setenv("UCSTAGE_HEDGE", "0")
    fault_proxy.set("flip", faultkit.every(files, 20), prefix=_prefix(src))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert fault_proxy.done["flip"] == 4  # the first GET of every 20th file
    assert _wrong(LocalCache(), src, files) == []
    assert doc["fetched"] == 80 and doc["failed"] == []
    assert doc["checks"] == {"md5": 80, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    assert doc["checksum_mismatches"] == 4
    assert doc["etags_not_md5"] is False


def test_a_mismatch_on_every_attempt_fails_the_file_with_exit_1(fault_proxy: Faults) -> None:
    files = _files(3)
    src = make_source("s3", "", files)
    # Every GET flipped (each a different byte is not needed: the ETag differs).
    fault_proxy.set("flip", files, prefix=_prefix(src), attempts=100)
    code, doc = _warm_json(src)
    assert code == 1
    assert sorted(f["path"] for f in doc["failed"]) == sorted(files)
    assert all("md5 mismatch" in f["reason"] and f["retryable"] for f in doc["failed"])
    assert doc["fetched"] == 0
    assert fault_proxy.done["flip"] == 3 * 4  # every attempt of every file
    assert _wrong(LocalCache(), src, files) == sorted(files)  # nothing cached


def test_resets_mid_body_leave_every_file_correct(fault_proxy: Faults) -> None:
    files = _files(80)
    src = make_source("s3", "", files)
    fault_proxy.set("reset", faultkit.every(files, 20), prefix=_prefix(src))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert fault_proxy.done["reset"] == 4
    assert doc["fetched"] == 80
    assert _wrong(LocalCache(), src, files) == []


def test_multipart_etags_get_the_size_check_and_the_json_says_so(fault_proxy: Faults) -> None:
    import s3fs

    files = _files(4)
    src = make_source("s3", "", files)
    # A multipart upload: its ETag is "<hash>-<parts>", not an MD5.
    with s3fs.S3FileSystem(skip_instance_cache=True).open(f"{_prefix(src)}/multi.bin", "wb",
                                                          block_size=5 * MB) as fh:
        fh.write(b"m" * (11 * MB))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert doc["checks"] == {"md5": 4, "crc32c": 0, "page_crc": 0, "size": 1, "none": 0}
    assert doc["etags_not_md5"] is False


def test_etags_that_are_not_md5s_mark_the_source_once(fault_proxy: Faults,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """SSE-KMS ETags: 32 hex digits that are not the body's MD5. The first
    copies mismatch, their retries repeat the same digest: the source is
    marked (one warning), every copy is checked by size, and the bytes are
    right."""
    files = _files(12)
    src = make_source("s3", "", files)
    fault_proxy.etags = "kms"
    cache = LocalCache()
    m = snapshot(src)
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        # One copy at a time, so the count of mismatches is exact.
        report = cache.warm(m.volume(), m.entries, jobs=1)
    assert report.failed == []
    assert report.etags_not_md5
    assert report.check_counts() == {"md5": 0, "crc32c": 0, "page_crc": 0, "size": 12, "none": 0}
    # The first copy's reads give the same wrong digest, and no object ever
    # matched: its 4th read marks the source (3 mismatches before), and
    # every copy after it is checked by size.
    assert report.mismatches == checks.NOT_MD5_READS - 1
    assert len([r for r in caplog.records if "not MD5s" in r.getMessage()]) == 1
    assert _wrong(cache, src, files) == []
    assert checks.marked() == {"s3://ucstage-test"}


def test_etags_that_are_not_md5s_mark_the_source_from_several_objects_at_once(
        fault_proxy: Faults) -> None:
    """Copies in flight together: three objects that repeat their mismatch,
    none matching, mark the source without waiting out the retries."""
    files = _files(12)
    src = make_source("s3", "", files)
    fault_proxy.etags = "kms"
    code, doc = _warm_json(src, "--jobs", "12")
    assert code == 0, doc
    assert doc["etags_not_md5"] is True and doc["failed"] == []
    assert doc["checks"] == {"md5": 0, "crc32c": 0, "page_crc": 0, "size": 12, "none": 0}
    assert _wrong(LocalCache(), src, files) == []


def test_one_corrupt_object_is_named_never_cached_and_md5_stays_on(
        fault_proxy: Faults, caplog: pytest.LogCaptureFixture) -> None:
    """A bad replica: one object's bytes come back with the same byte wrong
    on every GET, while the source's other objects match their MD5 ETags.
    The identical mismatch is a corruption, not ETags that are not MD5s."""
    files = _files(12)
    bad = sorted(files)[-1]
    src = make_source("s3", "", files)
    fault_proxy.set("corrupt", [bad], prefix=_prefix(src))
    with caplog.at_level(logging.WARNING, logger="ucstage"):
        code, doc = _warm_json(src)
    assert code == 1, doc
    [failed] = doc["failed"]
    assert failed["path"] == bad and "corrupt" in failed["reason"], failed
    assert doc["fetched"] == 11
    assert doc["checks"] == {"md5": 11, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}
    assert doc["etags_not_md5"] is False and checks.marked() == set()
    assert not [r for r in caplog.records if "not MD5s" in r.getMessage()]
    # Every GET of it was corrupted the same way (hedges included), and one
    # per attempt at least.
    key = f"{_prefix(src)}/{bad}"
    assert fault_proxy.done["corrupt"] == fault_proxy.gets[key] >= 4
    assert _wrong(LocalCache(), src, files) == [bad]  # never cached
    # The next warm, in a process that has not seen the others match (the
    # cache remembers they did), checks MD5s still and still refuses it.
    checks.forget()
    code, doc = _warm_json(src)
    assert code == 1 and [f["path"] for f in doc["failed"]] == [bad]
    assert doc["checks"] == {"md5": 0, "crc32c": 0, "page_crc": 0, "size": 0, "none": 0}


def test_verify_checksum_uses_the_recorded_md5_without_reading_the_source(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    from ucstage.cache import local

    files = _files(6)
    src = make_source("s3", "", files)
    cache = LocalCache()
    m = snapshot(src)
    assert cache.warm(m.volume(), m.entries).fetched == 6
    victim = cache.lookup(m.volume(), m.entries[2])
    assert victim is not None and checks.recorded(victim).startswith("md5:")
    with open(victim, "r+b") as fh:  # same size, same stamp: only the bytes say
        fh.seek(100)
        fh.write(b"\0")

    def no_source(*_: object) -> str:
        raise AssertionError("the source was read again")

    monkeypatch.setattr(local, "_digest_source", no_source)
    report = cache.verify(m.volume(), m.entries, checksum=True)
    [check] = report.sources
    assert check.ok == 5
    assert [p for p, _ in check.corrupt] == [m.entries[2].path]
    assert "checksum recorded" in check.corrupt[0][1]


def test_a_corrupted_ranged_part_fails_the_md5_of_the_whole_object(fault_proxy: Faults) -> None:
    """A large single-part object is read as parallel ranged GETs and hashed
    once every part is written: a flipped byte in one part is caught."""
    from ucstage.engines.objget import PART

    data = os.urandom(2 * PART + 12345)
    src = make_source("s3", "", {"big.bin": data})
    fault_proxy.set("flip", ["big.bin"], prefix=_prefix(src))  # its first GET only
    cache = LocalCache()
    m = snapshot(src)
    report = cache.warm(m.volume(), m.entries)
    assert report.failed == [] and report.fetched == 1
    assert fault_proxy.done["flip"] == 1
    assert report.mismatches == 1 and report.check_counts()["md5"] == 1
    assert _wrong(cache, src, {"big.bin": data}) == []


def test_stalled_responses_are_hedged_well_before_the_deadline(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    """A response that stops mid-body with the connection open: the late
    request gets a hedged ranged GET, which wins; the stalled connection is
    closed long before the deadline, and every file is right."""
    # The hedge fires at 4x the p95 of this warm's own latencies; two CI runs
    # beside 4 busy processes (load 13) pushed that and the hedge's own GET
    # past an 8 s deadline. 20 s keeps the deadline far behind a hedge on a
    # loaded machine and still under the proxy's 30 s stall limit.
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", "20")
    files = _files(150)
    src = make_source("s3", "", files)
    fault_proxy.set("stall", faultkit.every(files, 50), prefix=_prefix(src))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert fault_proxy.done["stall"] == 3
    assert doc["fetched"] == 150 and doc["timeouts"] == 0
    assert doc["hedged"] >= 3
    # Every stall ended by the client dropping it (the hedge won), none at
    # the proxy's own limit.
    assert fault_proxy.dropped() == 3
    assert _wrong(LocalCache(), src, files) == []


def test_without_hedging_a_stall_ends_at_the_deadline_and_is_retried(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_HEDGE", "0")
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", "1.5")
    files = _files(40)
    src = make_source("s3", "", files)
    fault_proxy.set("stall", faultkit.every(files, 20), prefix=_prefix(src))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert fault_proxy.done["stall"] == 2
    # Both stalls ended by the client dropping them at its deadline (a
    # timeout, no hedge), not at the proxy's own limit; a GET that a loaded
    # machine made slow may time out too, hence at least.
    assert doc["hedged"] == 0 and doc["timeouts"] >= 2
    assert fault_proxy.dropped() == 2
    assert _wrong(LocalCache(), src, files) == []


def test_a_bad_deadline_is_refused_naming_the_variable(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", "soon")
    src = make_source("s3", "", _files(1))
    result = CliRunner().invoke(cli, ["cache", "warm", src])
    assert result.exit_code != 0
    assert "UCSTAGE_REQUEST_DEADLINE='soon'" in result.output


def test_no_hedge_and_deadline_flags_apply_to_the_warm_only(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UCSTAGE_HEDGE", raising=False)
    monkeypatch.delenv("UCSTAGE_REQUEST_DEADLINE", raising=False)
    files = _files(40)
    src = make_source("s3", "", files)
    fault_proxy.set("stall", faultkit.every(files, 20), prefix=_prefix(src))
    code, doc = _warm_json(src, "--no-hedge", "--deadline", "1.5")
    assert code == 0, doc
    assert fault_proxy.done["stall"] == 2 and fault_proxy.dropped() == 2
    assert doc["hedged"] == 0 and doc["timeouts"] >= 2
    assert "UCSTAGE_HEDGE" not in os.environ and "UCSTAGE_REQUEST_DEADLINE" not in os.environ
    assert _wrong(LocalCache(), src, files) == []


def test_hedging_and_the_deadline_are_the_caches_parameters(
        fault_proxy: Faults, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 28: the CLI wrote --no-hedge/--deadline into os.environ; they are
    LocalCache's parameters now, the variables only their defaults. The
    environment here says the opposite (hedge on, a deadline far away) and is
    never changed."""
    monkeypatch.setenv("UCSTAGE_HEDGE", "1")
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", "60")
    files = _files(40)
    src = make_source("s3", "", files)
    fault_proxy.set("stall", faultkit.every(files, 20), prefix=_prefix(src))
    cache = LocalCache(str(tmp_path / "cache"), hedge=False, request_deadline=1.5)
    m = snapshot(src)
    report = cache.warm(m.volume(), m.entries)
    # Both stalls dropped at the 1.5 s deadline, not hedged; a GET a loaded
    # machine made slow may time out too, hence at least.
    assert report.failed == [] and report.hedged == 0 and report.timeouts >= 2
    assert fault_proxy.done["stall"] == 2 and fault_proxy.dropped() == 2
    assert os.environ["UCSTAGE_HEDGE"] == "1"
    assert os.environ["UCSTAGE_REQUEST_DEADLINE"] == "60"
    assert _wrong(cache, src, files) == []
    assert LocalCache(str(tmp_path / "cache")).requests.deadline == 60.0  # the default


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
def test_a_non_finite_or_non_positive_deadline_is_refused_naming_the_flag(value: str) -> None:
    result = CliRunner().invoke(cli, ["cache", "warm", "/nonexistent", "--deadline", value])
    assert result.exit_code == 2, result.output
    assert "--deadline" in result.output and "UCSTAGE_REQUEST_DEADLINE" not in result.output
    with pytest.raises(InvalidArgument, match="request_deadline must be a positive, finite"):
        LocalCache(request_deadline=float(value))


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_a_bad_deadline_variable_is_refused_when_the_cache_is_made(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Once, up front (inf used to overflow the client's timeout on every copy).
    monkeypatch.setenv("UCSTAGE_REQUEST_DEADLINE", value)
    with pytest.raises(InvalidArgument, match=f"UCSTAGE_REQUEST_DEADLINE='{value}' is not a "
                                              "positive, finite number"):
        LocalCache()
    assert LocalCache(request_deadline=5).requests.deadline == 5.0  # the parameter wins


@pytest.mark.parametrize(("args", "flag"), [
    (["bench", "/nonexistent", "--max-seconds", "nan"], "--max-seconds"),
    (["cache", "prune", "--max-bytes", "1G", "--lease", "inf"], "--lease"),
])
def test_other_seconds_options_refuse_nan_and_inf(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert flag in result.output


def test_the_summary_says_what_the_network_did(fault_proxy: Faults,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCSTAGE_HEDGE", "0")  # a hedge may win against a flip
    files = _files(40)
    src = make_source("s3", "", files)
    fault_proxy.set("flip", faultkit.every(files, 20), prefix=_prefix(src))
    result = CliRunner().invoke(cli, ["cache", "warm", src])
    assert result.exit_code == 0, result.output
    assert "network: 2 checksum mismatches retried" in result.output


def test_counters_written_before_the_check_counts_still_read(tmp_path: Path) -> None:
    """A run's counter file of the eight fields before the check counts."""
    import struct

    from ucstage.cache import runstats

    folder = tmp_path / ".ucstage" / "runs" / "old-run"
    folder.mkdir(parents=True)
    (folder / "r0-1.counters").write_bytes(struct.pack("<8q", 3, 1, 30, 10, 0, 0, 0, 0))
    stats = runstats.read_run(str(tmp_path), "old-run")
    assert (stats.hits, stats.misses, stats.processes) == (3, 1, 1)
    assert (stats.checked_md5, stats.checked_size, stats.mismatches) == (0, 0, 0)
    # Twelve fields: written before the page CRC count.
    (folder / "r0-2.counters").write_bytes(struct.pack("<12q", 1, 0, 5, 0, 0, 0, 0, 0,
                                                       7, 2, 1, 3))
    stats = runstats.read_run(str(tmp_path), "old-run")
    assert (stats.hits, stats.processes, stats.checked_md5, stats.checked_crc32c) == (4, 2, 7, 3)
    assert stats.checked_page_crc == 0


def test_a_rate_limited_store_is_warmed_at_its_rate_and_every_file_is_right(
        fault_proxy: Faults) -> None:
    """A store that allows RATE object GETs per second and answers 503
    SlowDown above it (a token bucket, as S3 throttles a prefix): the warm's
    pace converges on the rate, so few GETs are throttled, none fails for
    it, and every file is right. (How long it takes against N / RATE is
    measured by `python -m benchmarks.faults throttle`, not asserted.)"""
    files = _files(200, 16 * KB)
    src = make_source("s3", "", files)
    fault_proxy.limit(50, prefix=_prefix(src))
    code, doc = _warm_json(src)
    assert code == 0, doc
    assert doc["fetched"] == 200 and doc["failed"] == []
    assert _wrong(LocalCache(), src, files) == []
    from ucstage.engines import pace

    # The first burst (the copies in flight at the start, unpaced) is
    # throttled, then the pace's cuts bring the rate down: fewer than one
    # throttle per file, and the pace was cut (with the pace never cut, the
    # warm fails files: their retries run out). How many of the
    # first burst are throttled depends on how fast this machine sends it
    # (48 to 104 seen at load 12-16), so the bound leaves room for that.
    assert 0 < fault_proxy.done["throttled"] < 200
    assert pace.pace("s3://ucstage-test").cuts >= 1


def test_time_waiting_for_the_pace_is_not_counted_as_store_latency(
        fault_proxy: Faults) -> None:
    """Requests queued behind a source's pace (2 per second here, as after a
    throttle) wait seconds inside ucstage before they are sent. That wait is
    neither a late response (no hedge fires for it) nor part of the time to
    first byte the hedge estimate learns: the six samples are loopback GETs,
    far under the 0.5 + 1.0 + 1.5 s the first three requests waited alone."""
    import time

    from ucstage.engines import objget, pace

    files = _files(6, 4 * KB)
    src = make_source("s3", "", files)
    paced = pace.pace("s3://ucstage-test")
    paced.rate, paced.peak, paced.cut_at = 2.0, 2.0, time.monotonic()
    samples = objget.latency("s3://ucstage-test").first_byte.values
    samples.clear()  # too few samples now: a step is late after 2 s
    code, doc = _warm_json(src, "--jobs", "6")
    assert code == 0, doc
    assert doc["hedged"] == 0  # the last three waited 2 s and more
    assert len(samples) == 6
    assert sum(samples) < 3.0, samples
    assert _wrong(LocalCache(), src, files) == []


@pytest.mark.parametrize("check", ["md5", "crc32c"])
def test_a_file_digest_is_the_digest_of_its_bytes(check: str, tmp_path: Path) -> None:
    """The digest a ranged copy is checked with (hashed after its parts are
    written) and ``cache verify --checksum`` recomputes: the reference
    libraries' digest of the same bytes, for each checksum a store keeps."""
    import hashlib

    import crc32c

    data = os.urandom(3 * 1024 * 1024 + 17)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    want = hashlib.md5(data).hexdigest() if check == "md5" else f"{crc32c.crc32c(data):08x}"
    fd = os.open(path, os.O_WRONLY)  # the cache's temp files are open for writing only
    try:
        assert checks.digest_file(fd, len(data), check, chunk=1024 * 1024) == want
    finally:
        os.close(fd)
    assert checks.file_checksum(str(path), check) == f"{check}:{want}"
