"""The cache's data types: progress callback, reports, and internal records.

Kept apart from :mod:`ucstage.cache.local` so the cache module holds behaviour only.
They are re-exported from there; import them from ``ucstage.cache.local``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = [
    "CacheStatus",
    "ClearReport",
    "NamespaceStatus",
    "PruneReport",
    "VerifyReport",
    "WarmCallback",
    "WarmReport",
]


class WarmCallback:
    """Progress of :meth:`LocalCache.warm`; every method is a no-op here.

    Subclass and override (the CLI plugs in a rich progress bar). Methods are
    called from worker threads.
    """

    def set_size(self, files: int, nbytes: int) -> None:
        """Called once: how many files and bytes the warm covers."""

    def relative_update(self, nbytes: int) -> None:
        """``nbytes`` more of the total are now in the cache (copied or already valid)."""

    def file_done(self, path: str, status: str, error: str = "") -> None:
        """One file finished: ``status`` is ``fetched``, ``cached`` or ``failed``."""


@dataclass
class WarmReport:
    """What a warm did (docs/json-cache.md#warm)."""

    files: int = 0
    bytes: int = 0
    fetched: int = 0
    fetched_bytes: int = 0
    already_cached: int = 0
    already_cached_bytes: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class NamespaceStatus:
    namespace: str
    source: str
    """The source as it was given (``/Volumes/...``, a URL, a folder)."""
    url: str
    """Where it resolved to when cached (a local path or an fsspec URL)."""
    path: str
    entries: int
    bytes: int
    partial_files: int


@dataclass
class CacheStatus:
    root: str
    entries: int
    bytes: int
    max_bytes: int | None
    free_bytes: int
    namespaces: list[NamespaceStatus]


@dataclass
class VerifyReport:
    checked: int = 0
    ok: int = 0
    missing: int = 0
    stale: list[tuple[str, str]] = field(default_factory=list)
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    removed_partial_files: int = 0
    removed: list[str] = field(default_factory=list)
    """Corrupt entries deleted from the cache (the next fetch or warm copies them again)."""

    @property
    def clean(self) -> bool:
        return not self.stale and not self.corrupt


@dataclass
class ClearReport:
    namespaces: list[str]
    files: int
    bytes: int


@dataclass
class PruneReport:
    max_bytes: int
    bytes_before: int
    bytes_after: int
    files_removed: int
    bytes_removed: int
    bytes_in_use: int
    """Bytes that stayed because they were handed to a reader within the lease."""


@dataclass(frozen=True)
class _Cached:
    atime_ns: int
    size: int
    path: str
    lock: str
    partial: bool = False
    """A copy in flight (or left by a killed run): counted, never evicted."""


class _Ledger:
    """Bytes the cache holds (plus reservations), as a fixed-width number in
    one small file. Rewritten in place: that needs no new disk block (it must
    work on a full disk), and a torn write fails to parse, which makes the next
    reader recount from the tree."""

    def __init__(self, fd: int, recount: Callable[[], int]) -> None:
        self.fd = fd
        self.recount = recount

    def read(self) -> int:
        try:
            return int(os.pread(self.fd, 64, 0).decode("ascii").strip())
        except (OSError, ValueError, UnicodeDecodeError):
            total = self.recount()
            self.write(total)
            return total

    def write(self, value: int) -> None:
        os.pwrite(self.fd, b"%20d\n" % max(0, value), 0)
