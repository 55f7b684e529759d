"""The cache's retry rule: throttling backs off from the first retry, any
other transient error (a reset, a truncated body, a checksum mismatch, a
timeout) is retried at once the first time; ``--jobs auto`` hears only
throttling and timeouts."""

from __future__ import annotations

from pathlib import Path

import pytest

from ucstage.cache import Inflight, LocalCache, fetch
from ucstage.cache.fetch import retry_pause, slows_down, throttled
from ucstage.engines.checks import Mismatch
from ucstage.errors import FetchFailed
from ucstage.volumes import FileEntry, resolve

SLOW_DOWN = OSError("Generic S3 error: status code: 503 Service Unavailable: SlowDown "
                    "Please reduce your request rate.")
RESET = ConnectionResetError(104, "Connection reset by peer")
SHORT = OSError("short read: 100 of 200 bytes")
MISMATCH = Mismatch("k", "md5", "a" * 32, "b" * 32)
TIMEOUT = TimeoutError("no complete response within the 30 s deadline")


@pytest.mark.parametrize("exc", [RESET, SHORT, MISMATCH, TIMEOUT], ids=str)
def test_a_transfer_error_is_retried_at_once_then_backs_off(exc: Exception,
                                                            tmp_path: Path) -> None:
    retries = LocalCache(tmp_path / "c", backoff=0.2).retries
    entry = FileEntry("a.bin", 1, "v")
    assert retry_pause(exc, entry, 0, 0.2, retries) == 0.0
    assert 0.2 <= retry_pause(exc, entry, 1, 0.2, retries) <= 0.25
    assert not throttled(exc)


def test_throttling_backs_off_from_the_first_retry(tmp_path: Path) -> None:
    retries = LocalCache(tmp_path / "c", backoff=0.2).retries
    entry = FileEntry("a.bin", 1, "v")
    assert throttled(SLOW_DOWN) and throttled(OSError("HTTP 429 Too Many Requests"))
    assert throttled(OSError("status code: 503, reason: none"))
    assert not throttled(OSError("short read: 503 of 1000 bytes"))
    assert 0.2 <= retry_pause(SLOW_DOWN, entry, 0, 0.2, retries) <= 0.25


@pytest.mark.parametrize(("exc", "slows"), [(SLOW_DOWN, True), (TIMEOUT, True),
                                            (OSError("operation timed out"), True),
                                            (RESET, False), (SHORT, False),
                                            (MISMATCH, False)], ids=str)
def test_only_throttling_and_timeouts_slow_jobs_auto_down(exc: Exception, slows: bool,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy failing twice with ``exc``, then succeeding: the job's tuner
    hears of the retries only when they were throttling or timeouts."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x")
    volume = resolve(str(tmp_path / "src"))
    cache = LocalCache(tmp_path / "c", backoff=0.01)
    heard: list[int] = []
    inflight = Inflight(on_retry=lambda: heard.append(1))
    real = fetch.fetch_once
    calls = []

    def flaky(*args: object, **kwargs: object) -> tuple[str, bool]:
        calls.append(1)
        if len(calls) <= 2:
            raise exc
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(fetch, "fetch_once", flaky)
    pauses: list[float] = []
    real_sleep = inflight.sleep

    def sleep(seconds: float, *, slow_down: bool = True) -> None:
        pauses.append(seconds)
        real_sleep(seconds, slow_down=slow_down)

    monkeypatch.setattr(inflight, "sleep", sleep)
    path, copied = fetch.fetch_retrying(cache.at(volume), FileEntry("a.bin", 1, "v"), inflight)
    assert copied and Path(path).read_bytes() == b"x"
    assert len(heard) == (2 if slows else 0)
    assert slows_down(exc) is slows
    # The retries waited the cache's 0.01 s backoff (doubling, jittered by at
    # most a quarter), throttling from the first retry, other errors from the
    # second: counted from the pauses asked for, not timed.
    first, second = pauses
    if throttled(exc):
        assert 0.01 <= first <= 0.0125 and 0.02 <= second <= 0.025, pauses
    else:
        assert first == 0.0 and 0.01 <= second <= 0.0125, pauses


def test_a_mismatch_on_every_attempt_fails_naming_the_file(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.bin").write_bytes(b"x")
    volume = resolve(str(tmp_path / "src"))
    at = LocalCache(tmp_path / "c", backoff=0.001).at(volume)

    def bad(*_: object, **__: object) -> tuple[str, bool]:
        raise MISMATCH

    monkeypatch.setattr(fetch, "fetch_once", bad)
    with pytest.raises(FetchFailed, match=r"cannot copy a.bin after 4 attempts: .*md5 mismatch"):
        fetch.fetch_retrying(at, FileEntry("a.bin", 1, "v"))
