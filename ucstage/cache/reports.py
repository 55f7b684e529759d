"""What the cache's operations return: one report type per operation.

Kept apart from behaviour so :mod:`ucstage.cache.local`,
:mod:`ucstage.cache.warm` and the CLI import them without a cycle. Each report's
``to_json()`` builds the document ``ucstage cache <command> --json`` prints,
with the keys, types and nesting docs/json-cache.md documents.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..engines.checks import CHECKS
from .runstats import RunStats

T = TypeVar("T")


class _FieldsDocument:
    """A report whose JSON document (docs/json-cache.md) is its fields, in order."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


if TYPE_CHECKING:
    from ..sharding import Layout, ReadOrder

__all__ = [
    "CacheStatus",
    "ClearReport",
    "EvictedSource",
    "NamespaceStatus",
    "PruneReport",
    "RankSlice",
    "SourceCheck",
    "VerifyReport",
    "WarmReport",
    "show_version",
]


def _pairs(items: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"path": p, "reason": r} for p, r in items]


@dataclass(frozen=True)
class RankSlice:
    """The ranks a warm covered and the job shape that chose their files
    (the arguments :func:`ucstage.sharding.rank_entries` was called with)."""

    ranks: list[int]
    layout: Layout
    order: ReadOrder
    nodes: list[int] | None = None
    """The nodes whose whole share was warmed (the node scope with shuffle:
    the same files every epoch), or None: the ranks' files of the order's epoch."""

    def to_json(self) -> dict[str, Any]:
        """The ``slice`` object of docs/json-cache.md#warm."""
        layout, order = self.layout, self.order
        return {"ranks": list(self.ranks), "world_size": layout.world_size,
                "num_workers": layout.num_workers, "shuffle": order.shuffle, "seed": order.seed,
                "epoch": order.epoch,
                "shuffle_scope": order.shuffle_scope, "nproc_per_node": layout.nproc_per_node,
                "node_share": self.nodes is not None, "nodes": self.nodes}


@dataclass(frozen=True)
class EvictedSource:
    """Files of one cached source that a warm evicted to stay under the byte cap."""

    namespace: str
    """The namespace folder's name."""
    source: str
    """The source as it was given when it was cached ('' when its record is gone)."""
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        """One object of the ``evicted_sources`` list of docs/json-cache.md#warm."""
        return {"source": self.source, "namespace": self.namespace, "files": self.files,
                "bytes": self.bytes}


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
    """(path, reason) of every file that could not be copied."""
    retryable: set[str] = field(default_factory=set)
    """The paths in ``failed`` whose error was transient (retries ran out): a
    rerun may copy them. The others (not found, permission denied, not a
    file, unsafe) fail the same way until the source changes."""
    seconds: float = 0.0
    source: str = ""
    """The volume's source as given."""
    cache_dir: str = ""
    """The cache root."""
    namespace: str = ""
    """The folder holding this source's files."""
    evicted: list[EvictedSource] = field(default_factory=list)
    """What this warm's copies evicted to stay under the byte cap, per source
    (this source included: files it cached earlier count too)."""
    engine: str = "fsspec"
    """The engine that read the source: ``obstore`` or ``fsspec``."""
    jobs: int = 0
    """Copies in flight: the value ``jobs="auto"`` settled on, or the one given."""
    jobs_auto: bool = False
    """Whether ``jobs`` was tuned (``"auto"``) rather than given."""
    checks: dict[str, int] = field(default_factory=dict)
    """Copies whose bytes passed each check (:data:`ucstage.engines.checks.CHECKS`):
    ``md5`` (the ETag, or GCS and Azure's stored MD5; Azure's MD5 of each
    range), ``crc32c`` (GCS, an object with no MD5), ``page_crc`` (a row
    group whose every page carried a CRC32), ``size`` only; ``none``: copies the engine did not
    check (the fsspec engine, local and FUSE sources)."""
    mismatches: int = 0
    """Copies whose bytes differed from the store's checksum: retried, never cached."""
    etags_not_md5: bool = False
    """This warm found that the source's ETags are not MD5s (SSE-KMS): size only."""
    hedged: int = 0
    """GETs that were late and got a second, hedged request (:mod:`ucstage.engines.objget`)."""
    timeouts: int = 0
    """Requests dropped at the deadline (each retried)."""

    @property
    def evicted_files(self) -> int:
        """Cached files this warm evicted, all sources together."""
        return sum(e.files for e in self.evicted)

    @property
    def evicted_bytes(self) -> int:
        """Bytes of the files this warm evicted."""
        return sum(e.bytes for e in self.evicted)

    @property
    def mb_per_s(self) -> float:
        """Copy rate of the fetched bytes, in MB/s (0 when no time passed)."""
        return round(self.fetched_bytes / 1e6 / self.seconds, 2) if self.seconds else 0

    def to_json(self, *, rank_slice: RankSlice | None = None,
                refused: Sequence[tuple[str, str]] = (),
                unreadable: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        """The document of ``cache warm --json``.

        Args:
            rank_slice: the ranks the entries were chosen for, if they were.
            refused: unsafe entries the listing left out, with the reason
                (:attr:`ucstage.manifest.Manifest.refused`).
            unreadable: folders ``skip_unreadable`` left out, with the reason
                (:attr:`ucstage.manifest.Manifest.unreadable`).
        """
        return {
            "source": self.source,
            "cache_dir": self.cache_dir,
            "namespace": self.namespace,
            "slice": rank_slice.to_json() if rank_slice is not None else None,
            "files": self.files,
            "bytes": self.bytes,
            "fetched": self.fetched,
            "fetched_bytes": self.fetched_bytes,
            "already_cached": self.already_cached,
            "already_cached_bytes": self.already_cached_bytes,
            "failed": [{"path": p, "reason": r, "retryable": p in self.retryable}
                       for p, r in self.failed],
            "refused": _pairs(refused),
            "unreadable": _pairs(unreadable),
            "seconds": round(self.seconds, 3),
            "engine": self.engine,
            "jobs": self.jobs,
            "jobs_auto": self.jobs_auto,
            "mb_per_s": self.mb_per_s,
            "evicted_files": self.evicted_files,
            "evicted_bytes": self.evicted_bytes,
            "evicted_sources": [e.to_json() for e in self.evicted],
            "checks": self.check_counts(),
            "checksum_mismatches": self.mismatches,
            "etags_not_md5": self.etags_not_md5,
            "hedged": self.hedged,
            "timeouts": self.timeouts,
        }

    def check_counts(self) -> dict[str, int]:
        """``checks`` with every kind present, ``none`` being the fetched
        copies no check vouched for."""
        counts = {name: self.checks.get(name, 0) for name in CHECKS}
        counts["none"] = max(0, self.fetched - sum(counts.values()))
        return counts


@dataclass
class NamespaceStatus(_FieldsDocument):
    """One cached source in a :class:`CacheStatus`."""

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
    """What the cache holds (docs/json-cache.md#status)."""

    root: str
    entries: int
    bytes: int
    max_bytes: int | None
    free_bytes: int
    namespaces: list[NamespaceStatus]
    last_run: RunStats | None = None
    """Hits, misses and evictions of the last training run that read through
    this cache (None when none did)."""
    unusable: str = ""
    """Why nothing can be cached under the root (:class:`ucstage.errors.CacheUnusable`'s
    message), when it cannot; what it holds is then counted without writing."""

    def to_json(self) -> dict[str, Any]:
        """The document of ``cache status --json``."""
        return {"cache_dir": self.root, "entries": self.entries, "bytes": self.bytes,
                "max_bytes": self.max_bytes, "free_bytes": self.free_bytes,
                "namespaces": [n.to_json() for n in self.namespaces],
                "last_run": self.last_run.to_json() if self.last_run is not None else None,
                "unusable": self.unusable or None}


def show_version(version: str) -> str:
    """A file version for people: a local file's version is its mtime in
    seconds (``1796151838.235907``), shown as the UTC time it names; an
    object store's (an ETag) as it is."""
    if not version:
        return "no version"
    try:
        seconds = float(version)
    except ValueError:
        return f"version {version!r}"
    if not 0 <= seconds < 1e11:  # not an mtime after all
        return f"version {version!r}"
    when = datetime.fromtimestamp(seconds, timezone.utc)
    return f"modified {when:%Y-%m-%d %H:%M:%S}.{when.microsecond:06d} UTC"


@dataclass
class SourceCheck:
    """What verify found for one source."""

    source: str = ""
    """The source as given (for every cached source: as given when first cached)."""
    checked: int = 0
    ok: int = 0
    missing: int = 0
    stale: list[tuple[str, str]] = field(default_factory=list)
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    removed_partial_files: int = 0
    removed: list[str] = field(default_factory=list)
    """Corrupt entries deleted from the cache (the next fetch or warm copies them again)."""
    ranges_checked: int = 0
    """Cached row-group copies (byte ranges of a table's files) checked; ``checked``,
    ``ok`` and ``missing`` count whole files only."""
    ranges_ok: int = 0
    orphans: list[str] = field(default_factory=list)
    """Cached files whose source file is gone (only against a complete listing)."""
    orphans_removed: list[str] = field(default_factory=list)
    """Orphans deleted (``verify --fix``)."""
    vanished: str = ""
    """Why the source could not be listed (it no longer exists); nothing else was checked."""

    @property
    def clean(self) -> bool:
        return not self.stale and not self.corrupt and not self.vanished

    def to_json(self) -> dict[str, Any]:
        """One object of the ``sources`` list of docs/json-cache.md#verify."""
        return {"source": self.source, "checked": self.checked, "ok": self.ok,
                "missing": self.missing, "ranges_checked": self.ranges_checked,
                "ranges_ok": self.ranges_ok, "stale": _pairs(self.stale),
                "corrupt": _pairs(self.corrupt),
                "removed_partial_files": self.removed_partial_files,
                "removed": list(self.removed), "orphans": list(self.orphans),
                "orphans_removed": list(self.orphans_removed),
                "vanished": self.vanished or None}


class _OverSources(Generic[T]):
    """A :class:`VerifyReport` figure that adds up the same field of each of
    its sources (:class:`SourceCheck`): a count's sum, a list's concatenation
    (``empty`` the figure of no source). Read each time: sources are added
    as they are checked."""

    def __init__(self, empty: T) -> None:
        self.empty = empty
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, report: VerifyReport, owner: type | None = None) -> T:
        total = copy.copy(self.empty)
        for source in report.sources:
            total += getattr(source, self.name)
        return total


@dataclass
class VerifyReport:
    """What verify found, one :class:`SourceCheck` per source checked
    (docs/json-cache.md#verify).

    The counts and lists below add up every source; with one source they are
    that source's.
    """

    sources: list[SourceCheck] = field(default_factory=list)
    checksum: bool = False
    """Whether bytes were compared with the source's (SHA-256)."""

    @property
    def clean(self) -> bool:
        """Nothing stale and nothing corrupt, in any source."""
        return all(s.clean for s in self.sources)

    checked = _OverSources(0)
    ok = _OverSources(0)
    missing = _OverSources(0)
    removed_partial_files = _OverSources(0)
    stale = _OverSources[list[tuple[str, str]]]([])
    corrupt = _OverSources[list[tuple[str, str]]]([])
    removed = _OverSources[list[str]]([])
    orphans = _OverSources[list[str]]([])

    @property
    def vanished(self) -> list[str]:
        """The sources that no longer exist."""
        return [s.source for s in self.sources if s.vanished]

    def to_json(self) -> dict[str, Any]:
        """The document of ``cache verify --json``."""
        return {"clean": self.clean, "checksum": self.checksum,
                "sources": [s.to_json() for s in self.sources]}


@dataclass
class ClearReport(_FieldsDocument):
    """What clear removed (docs/json-cache.md#clear)."""

    namespaces: list[str]
    files: int
    bytes: int



@dataclass
class PruneReport(_FieldsDocument):
    """What prune evicted (docs/json-cache.md#prune)."""

    max_bytes: int
    bytes_before: int
    bytes_after: int
    files_removed: int
    bytes_removed: int
    bytes_in_use: int
    """Bytes that stayed because they were handed to a reader within the lease."""

