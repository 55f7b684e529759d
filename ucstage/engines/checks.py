"""What a copy's bytes are checked against, the verdict, and the tally of them.

A copy of an object is committed only after its bytes match what the store
says the object is. A GET works out its expectation once (:func:`expect`,
an :class:`Expect`) from the response's headers and the entry's listed
version, hashes the bytes for it (:func:`hasher`), and gets its verdict once
(:func:`judge`), whatever the store. What a store can say:

* GCS (``md5Hash``, else ``crc32c``: a composite object has only the CRC32C)
  and Azure (``Content-MD5``) say the checksum outright, in the listing
  obstore does not give: so the listing's version carries it
  (:mod:`ucstage.cloudfs`), and it is the expectation while the object the
  GET read is the one listed (the same GCS generation, the same Azure ETag,
  :func:`listed_expect`). An object replaced since it was listed gets the
  size check and is stamped with its new marker, so its copy never passes
  for the entry. An Azure blob the store keeps no checksum for (committed
  from blocks without ``Content-MD5``) is read in ranges checked by the MD5
  Azure gives of each (:mod:`ucstage.engines.azranges`). The store's own
  checksum is no inference: a mismatch is always a bad transfer (or a bad
  replica), never cached, however often it repeats.
* S3 says ``md5`` only as the ETag, when it is a plain MD5 (a single-part
  upload: 32 hex digits, no ``-N`` suffix): an inferred expectation
  (:attr:`Expect.inferred`). The digest is computed while the body streams,
  or, for ranged GETs, over the file once every part is written (it is in
  the page cache then).
* ``size``: the bytes received against the size the response declared, for
  every other ETag (multipart uploads, SSE-C), and for a source found to
  serve ETags that are not MD5s (below).

The stored ``x-amz-checksum-*`` headers would be better still (CRC32C or
CRC64NVME of the whole object), but obstore (0.12.1, the newest) does not
return them: its GET result keeps only the ETag, the size and a few content
attributes.

SSE-KMS objects have ETags of 32 hex digits that are not MD5s, and obstore
does not return the encryption header that would tell (its GET result has no
SSE-KMS or SSE-C header). A mismatch is retried like any transfer error. A
mismatch of an inferred MD5 that repeats with the same digest is either such
an ETag or a bad replica (an object stored corrupt, read the same way every
time), and only the source's other objects can tell them apart (:func:`judge`):

* a source with an object whose bytes matched their MD5 ETag serves MD5
  ETags (a match is remembered in the process and, where the caller keeps
  evidence (:attr:`~ucstage.engines.context.FetchContext.evidence`: a
  cache's ``.ucstage/md5-etags/``), on disk, so a later run that finds only
  the bad object left to fetch knows it too): the repeated mismatch is a
  corrupt object, never cached; its copy fails with :exc:`Mismatch` saying so;
* a source where nothing ever matched is marked as serving ETags that are
  not MD5s once :data:`NOT_MD5_KEYS` of its objects repeated their mismatch,
  or one object gave the same wrong digest :data:`NOT_MD5_READS` times (a
  one-object source; the retries in between give other copies time to match).
  A marked source is warned about once, counted, and gets the size check
  from then on. Until then, every mismatch fails the copy: a doubt never
  caches a copy.

Counts are per process (:data:`TALLY`): a warm reports what its copies did
(:meth:`Tally.since`), and a DataLoader's counters, told of each check
(:attr:`Tally.watchers`), carry them to the epoch's metrics
(:mod:`ucstage.cache.runstats`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .. import cloudfs
from ..shown import shown
from . import reset_after_fork
from .objstore import _etag

__all__ = [
    "CHECKS",
    "NOT_MD5_KEYS",
    "NOT_MD5_READS",
    "SUM_XATTR",
    "TALLY",
    "Evidence",
    "Expect",
    "Mismatch",
    "Tally",
    "Verdict",
    "Watcher",
    "digest_file",
    "expect",
    "expect_md5",
    "file_checksum",
    "forget",
    "hasher",
    "judge",
    "listed_expect",
    "marked",
    "note",
    "record",
    "recorded",
]

log = logging.getLogger("ucstage")

CHECKS = ("md5", "crc32c", "page_crc", "size")
"""What a copy's bytes can be checked against, strongest first (``page_crc``:
a row group's pages against the CRCs they carry, :mod:`ucstage.engines.pagecrc`)."""
_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")
SUM_XATTR = "user.ucstage.sum"
"""The checksum a copy was checked against (``md5:<hex>``), beside its stamp."""


class Mismatch(OSError):
    """The bytes received differ from what the store says the object is:
    retried as a transfer error, never cached."""

    def __init__(self, key: str, check: str, expected: str, got: str,
                 corrupt: bool = False) -> None:
        why = (" on every read: the stored object is corrupt (other objects of the "
               "source match their MD5)") if corrupt else ""
        super().__init__(f"{check} mismatch: the store says {expected}, "
                         f"the bytes received give {got}{why}")
        self.key, self.check, self.expected, self.got = key, check, expected, got
        self.corrupt = corrupt
        """The same wrong bytes on every read from a source whose ETags are MD5s."""


class Watcher(Protocol):
    """What :attr:`Tally.watchers` are told."""

    def checked(self, kind: str, n: int) -> None: ...


class Tally:
    """Checks made by this process's copies, thread-safe."""

    FIELDS = ("md5", "crc32c", "size", "mismatches", "not_md5_sources", "page_crc")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.FIELDS, 0)
        self.watchers: weakref.WeakSet[Watcher] = weakref.WeakSet()
        """Told of each check as it is counted (a training run's counters,
        :class:`ucstage.cache.runstats.Counters`): counting nothing costs
        them nothing."""

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n
        for watcher in list(self.watchers):  # outside the lock: each takes its own
            watcher.checked(name, n)

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
_last_miss: dict[str, tuple[str, int]] = {}
"""source key -> the digest its last mismatching copy gave, and how many reads
in a row gave it (bounded)."""
_LAST_MAX = 4096
_matched: set[str] = set()
"""Sources with an object whose bytes matched their MD5 ETag: their ETags are MD5s."""
_kept: set[str] = set()
"""Evidence files (:data:`Evidence`) this process already wrote."""
_repeated: dict[str, set[str]] = {}
"""source -> keys whose mismatch repeated with the same digest (while none matched)."""
NOT_MD5_KEYS = 3
"""Objects of a source, none matching, whose mismatches repeat, that mark it."""
NOT_MD5_READS = 4
"""Reads of one object giving the same wrong digest that mark its source when
none of the source's objects matched (the cache's default 4 attempts)."""


@reset_after_fork
def _forget_after_fork() -> None:
    global _marks_lock
    _marks_lock = threading.Lock()
    # The parent's run counters are not this process's (a worker opens its own).
    TALLY.watchers.clear()


Evidence = Callable[[str], str]
"""Where a caller keeps the evidence that a source (``kind://bucket``) served
an MD5 ETag: the path of that source's (empty) file, which any process of
the caller may have made. A cache's is under ``.ucstage/md5-etags/``; the
cache passes it in (:attr:`ucstage.engines.context.FetchContext.evidence`)."""


class Expect(NamedTuple):
    """What one GET's bytes are checked against: worked out once per GET."""

    check: str
    """``"md5"``, ``"crc32c"``, or '' for the size check only."""
    want: str
    """The digest (hex) the bytes must have; '' for the size check."""
    stamp: str
    """The version to stamp on the copy: GCS and Azure, the listed one while
    the object is the one listed, else the store's new marker; S3, its ETag."""
    inferred: bool = False
    """The MD5 is S3's ETag, taken for an MD5 (see the module docstring), not
    a checksum the store keeps."""


def expect_md5(source: str, etag: str) -> str:
    """The MD5 to check the copy against ('' for the size check only): the
    ETag when it is a plain MD5 and ``source`` was not found to serve others."""
    value = etag.strip('"').lower()
    if not _PLAIN_MD5.fullmatch(value) or source in _not_md5:
        return ""
    return value


def listed_expect(listed: str, seen: str) -> Expect:
    """The check a copy of the entry listed as ``listed`` gets, the object
    read being at marker ``seen``: the strongest checksum the listing carries
    while the object is the one listed, else the size check."""
    if not listed or cloudfs.marker(listed) != seen:
        return Expect("", "", seen)
    found = cloudfs.sums(listed)
    for check in ("md5", "crc32c"):
        if found.get(check):
            return Expect(check, found[check], listed)
    return Expect("", "", listed)


def expect(source: str, meta: Any, listed: str) -> Expect:
    """What a GET of an object of ``source`` (``kind://bucket``; ``meta``:
    obstore's response metadata) is checked against, given the entry's
    listed version: the checksum GCS and Azure keep while the object is the
    one listed (:func:`listed_expect`), S3's ETag when it is a plain MD5."""
    kind = source.split("://", 1)[0]
    if kind == "gs":
        return listed_expect(listed, str(meta.get("version") or ""))
    if kind == "az":
        return listed_expect(listed, str(meta.get("e_tag") or "").strip('"'))
    etag = _etag(meta.get("e_tag"))
    md5 = expect_md5(source, etag)
    return Expect("md5" if md5 else "", md5, etag, inferred=True)


def hasher(check: str) -> Any:
    """A running digest (``update``, ``hexdigest``) for ``check`` (``md5``,
    ``crc32c``); None for '' (the size check)."""
    if check == "md5":
        return hashlib.md5(usedforsecurity=False)
    if check == "crc32c":
        import crc32c  # C speed; releases the GIL on large buffers
        return crc32c.CRC32CHash()
    return None


def digest_file(fd: int, size: int, check: str = "md5", chunk: int = 8 * 1024 * 1024) -> str:
    """The ``check`` digest (``md5`` or ``crc32c``, hex) of the first
    ``size`` bytes of the open file ``fd`` (which may be open for writing
    only, as the cache's temp files are)."""
    digest = hasher(check)
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


def judge(source: str, key: str, want: Expect, got: str, *,
          evidence: Evidence | None = None) -> Verdict:
    """The verdict on a copy whose bytes' digest is ``got`` ('' when not
    hashed), ``want`` being :func:`expect`'s answer. ``evidence`` (the
    caller's, None for none) keeps which sources matched an inferred MD5
    across processes.

    Raises:
        Mismatch: the digests differ (an inferred MD5: and the source is not
            (yet) known to serve ETags that are not MD5s; see the module
            docstring).
    """
    if not want.check:
        TALLY.add("size")
        return Verdict("size")
    if not want.inferred:
        if got != want.want:
            TALLY.add("mismatches")
            raise Mismatch(key, want.check, want.want, got)
        TALLY.add(want.check)
        return Verdict(want.check, f"{want.check}:{got}")
    return _judge_etag(source, key, want.want, got, evidence)


def _judge_etag(source: str, key: str, expected: str, got: str,
                evidence: Evidence | None) -> Verdict:
    """:func:`judge` of an MD5 inferred from an ETag."""
    name = f"{source}/{key}"
    if got == expected:
        path = evidence(source) if evidence is not None else ""
        with _marks_lock:
            _last_miss.pop(name, None)
            if source not in _matched:
                _matched.add(source)
                _repeated.pop(source, None)
            new = bool(path) and path not in _kept
            _kept.add(path)
        if new:
            _keep_match(path)
        TALLY.add("md5")
        return Verdict("md5", f"md5:{got}")
    if evidence is not None and source not in _matched and os.path.exists(evidence(source)):
        # A copy by another process of the caller matched an MD5 ETag of the source.
        with _marks_lock:
            _matched.add(source)
    with _marks_lock:
        last, reads = _last_miss.get(name, ("", 0))
        reads = reads + 1 if last == got else 1
        if len(_last_miss) >= _LAST_MAX and name not in _last_miss:
            _last_miss.clear()
        _last_miss[name] = (got, reads)
        corrupt = reads > 1 and source in _matched
        mark = False
        if reads > 1 and not corrupt:
            keys = _repeated.setdefault(source, set())
            keys.add(key)
            mark = len(keys) >= NOT_MD5_KEYS or reads >= NOT_MD5_READS
        first = mark and source not in _not_md5
        if mark:
            _not_md5.add(source)
            _last_miss.pop(name, None)
            _repeated.pop(source, None)
    if not mark:
        TALLY.add("mismatches")
        if corrupt:
            raise Mismatch(key, "md5", expected, got, corrupt=True)
        raise Mismatch(key, "md5", expected, got)
    # The same bytes on every read, and no object of the source ever matched:
    # its ETags are not MD5s (SSE-KMS), not a transfer error.
    if first:
        TALLY.add("not_md5_sources")
        log.warning("ucstage: %s serves ETags that are not MD5s of the objects (SSE-KMS?): "
                    "its copies are checked by size only", shown(source))
    TALLY.add("size")
    return Verdict("size")


def _keep_match(path: str) -> None:
    """Write the evidence file ``path`` (:data:`Evidence`)."""
    # Evidence only: a caller that cannot keep it (a link planted at its path
    # included: never followed) still checks every copy.
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


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
    """``kind:<hex>`` of a local file (``md5`` or ``crc32c``; '' for others)."""
    if kind not in ("md5", "crc32c"):
        return ""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return f"{kind}:" + digest_file(fd, os.fstat(fd).st_size, kind)
    finally:
        os.close(fd)


def forget() -> None:
    """Forget which sources were found to serve ETags that are not MD5s (a
    process that points the same bucket name at another store: tests)."""
    with _marks_lock:
        _not_md5.clear()
        _last_miss.clear()
        _matched.clear()
        _repeated.clear()
        _kept.clear()


def marked() -> set[str]:
    """Sources found to serve ETags that are not MD5s (for tests and reports)."""
    with _marks_lock:
        return set(_not_md5)
