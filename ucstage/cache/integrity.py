"""Which check a copy's bytes get before they are committed, and the tally of them.

A copy of an object is committed only after its bytes match what the store
says the object is. What it can say on the object-store engine:

* ``md5``: the ETag, when it is a plain MD5 (a single-part upload: 32 hex
  digits, no ``-N`` suffix). The digest is computed while the body streams,
  or, for ranged GETs, over the file once every part is written (it is in the
  page cache then).
* ``size``: the bytes received against the size the response declared, for
  every other ETag (multipart uploads, SSE-C), and for a source found to
  serve ETags that are not MD5s (below).

The stored ``x-amz-checksum-*`` headers would be better still (CRC32C or
CRC64NVME of the whole object), but obstore (0.12.1, the newest) does not
return them: its GET result keeps only the ETag, the size and a few content
attributes.

SSE-KMS objects have ETags of 32 hex digits that are not MD5s, and obstore
does not return the encryption header that would tell. So a mismatch is
retried like any transfer error, and a mismatch of the same key that repeats
with the same digest means the ETag is not an MD5: that source (bucket) is
marked, warned about once, counted, and gets the size check from then on.

Counts are per process (:data:`TALLY`): a warm reports what its copies did
(:meth:`Tally.since`), and a DataLoader's counters carry them to the epoch's
metrics (:mod:`ucstage.cache.runstats`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
from typing import Any

__all__ = ["CHECKS", "SUM_XATTR", "TALLY", "Mismatch", "Tally", "Verdict", "digest_file",
           "expect_md5", "file_checksum", "forget", "judge", "marked", "note", "record", "recorded"]

log = logging.getLogger("ucstage")

CHECKS = ("md5", "size")
"""What a copy's bytes can be checked against, strongest first."""
_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")
SUM_XATTR = "user.ucstage.sum"
"""The checksum a copy was checked against (``md5:<hex>``), beside its stamp."""


class Mismatch(OSError):
    """The bytes received differ from what the store says the object is:
    retried as a transfer error, never cached."""

    def __init__(self, key: str, check: str, expected: str, got: str) -> None:
        super().__init__(f"{check} mismatch: the store says {expected}, "
                         f"the bytes received give {got}")
        self.key, self.check, self.expected, self.got = key, check, expected, got


class Tally:
    """Checks made by this process's copies, thread-safe."""

    FIELDS = ("md5", "size", "mismatches", "not_md5_sources")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def since(self, before: dict[str, int]) -> dict[str, int]:
        """What was counted since ``before`` (a :meth:`snapshot`)."""
        now = self.snapshot()
        return {k: now[k] - before.get(k, 0) for k in self.FIELDS}


TALLY = Tally()
_marks_lock = threading.Lock()
_not_md5: set[str] = set()
"""Sources (``kind://bucket``) whose ETags proved not to be MD5s."""
_last_miss: dict[str, str] = {}
"""source key -> the digest its last mismatching copy gave (bounded)."""
_LAST_MAX = 4096


def _forget_after_fork() -> None:
    global _marks_lock
    _marks_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def expect_md5(source: str, etag: str) -> str:
    """The MD5 to check the copy against ('' for the size check only): the
    ETag when it is a plain MD5 and ``source`` was not found to serve others."""
    value = etag.strip('"').lower()
    if not _PLAIN_MD5.fullmatch(value) or source in _not_md5:
        return ""
    return value


def digest_file(fd: int, size: int, chunk: int = 8 * 1024 * 1024) -> str:
    """The MD5 of the first ``size`` bytes of the open file ``fd`` (which
    may be open for writing only, as the cache's temp files are)."""
    digest = hashlib.md5(usedforsecurity=False)
    # A second descriptor of the same open file, for reading (Linux).
    reader = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        offset = 0
        while offset < size:
            block = os.pread(reader, min(chunk, size - offset), offset)
            if not block:
                break
            digest.update(block)
            offset += len(block)
    finally:
        os.close(reader)
    return digest.hexdigest()


class Verdict:
    """The check one copy got, and its checksum to record ('' for size only)."""

    __slots__ = ("check", "checksum")

    def __init__(self, check: str, checksum: str = "") -> None:
        self.check, self.checksum = check, checksum


def judge(source: str, key: str, expected: str, got: str) -> Verdict:
    """The verdict on a copy whose bytes' MD5 is ``got``, ``expected`` being
    :func:`expect_md5`'s answer ('' : size only, already checked).

    Raises:
        Mismatch: the digests differ (the first time for these bytes).
    """
    if not expected:
        TALLY.add("size")
        return Verdict("size")
    name = f"{source}/{key}"
    if got == expected:
        with _marks_lock:
            _last_miss.pop(name, None)
        TALLY.add("md5")
        return Verdict("md5", f"md5:{got}")
    with _marks_lock:
        repeated = _last_miss.get(name) == got
        if repeated:
            _last_miss.pop(name, None)
            first = source not in _not_md5
            _not_md5.add(source)
        else:
            if len(_last_miss) >= _LAST_MAX:
                _last_miss.clear()
            _last_miss[name] = got
    if not repeated:
        TALLY.add("mismatches")
        raise Mismatch(key, "md5", expected, got)
    # The same bytes twice, both unlike the ETag: the ETag is not their MD5
    # (SSE-KMS), not a transfer error.
    if first:
        TALLY.add("not_md5_sources")
        log.warning("ucstage: %s serves ETags that are not MD5s of the objects (SSE-KMS?): "
                    "its copies are checked by size only", source)
    TALLY.add("size")
    return Verdict("size")


def note(report: Any, before: dict[str, int], url: str) -> None:
    """Put what this process's copies checked since ``before`` on the report
    of a warm of ``url`` (a :class:`~ucstage.cache.reports.WarmReport`)."""
    done = TALLY.since(before)
    report.checks = {name: done[name] for name in CHECKS}
    report.mismatches = done["mismatches"]
    report.etags_not_md5 = done["not_md5_sources"] > 0 or \
        any(url == source or url.startswith(source + "/") for source in marked())


def record(fd: int, verdict: Verdict) -> None:
    """Record the checksum a copy was checked against on its (temp) file, so
    ``cache verify --checksum`` can compare without reading the source. The
    file is renamed with it, so checksum, stamp and data appear together."""
    if verdict.checksum:
        # A filesystem without xattrs: the stamp, written next, says so.
        with contextlib.suppress(OSError):
            os.setxattr(fd, SUM_XATTR, verdict.checksum.encode())


def recorded(path: str) -> str:
    """The checksum recorded on a cached file ('' when none)."""
    try:
        return os.getxattr(path, SUM_XATTR).decode("ascii", "replace")
    except OSError:
        return ""


def file_checksum(path: str, kind: str) -> str:
    """``kind:<hex>`` of a local file (``md5`` only)."""
    if kind != "md5":
        return ""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return "md5:" + digest_file(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def forget() -> None:
    """Forget which sources were found to serve ETags that are not MD5s (a
    process that points the same bucket name at another store: tests)."""
    with _marks_lock:
        _not_md5.clear()
        _last_miss.clear()


def marked() -> set[str]:
    """Sources found to serve ETags that are not MD5s (for tests and reports)."""
    with _marks_lock:
        return set(_not_md5)
