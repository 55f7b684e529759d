"""Resolve a source (volume path, fsspec URL, local path) and list it deterministically.

Path rules (docs/design.md, "2. Data flow"):

* ``/Volumes/<catalog>/<schema>/<volume>/...`` and ``dbfs:/Volumes/...`` map to
  ``$UCSTAGE_VOLUMES_ROOT/<catalog>/<schema>/<volume>/...`` when that variable
  is set (a local folder or an fsspec URL), else to the literal local path,
  which on the platform is the FUSE mount.
* Anything with ``://`` is an fsspec URL (``s3://``, ``gs://``, ``file://``,
  ``memory://``...).
* Anything else is a local path.

Listing is recursive, sorted by relative POSIX path, and skips names that start
with ``_`` or ``.`` (``_SUCCESS``, ``_delta_log``, ``.crc``) unless asked not to,
as Spark and Hadoop do.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from .errors import (
    InvalidArgument,
    MissingDependency,
    SourceNotFound,
    SourceUnreadable,
    UnsafePath,
)

__all__ = [
    "VOLUMES_ROOT_ENV",
    "FileEntry",
    "Listing",
    "Volume",
    "list_files",
    "matches",
    "resolve",
    "safe_relpath",
]

VOLUMES_ROOT_ENV = "UCSTAGE_VOLUMES_ROOT"

# Keys fsspec backends use for a change marker, best first. An ETag or checksum
# changes with the content; an mtime is what local and FUSE files have.
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "mtime", "LastModified",
                 "last_modified", "updated", "created")


class FileEntry(NamedTuple):
    """One listed file. A NamedTuple keeps a million of them small."""

    path: str
    """Path relative to the source root, POSIX separators."""
    size: int
    """Size in bytes."""
    version: str
    """A change marker: ETag where the store has one, else the mtime."""


@dataclass(frozen=True)
class Volume:
    """A resolved source: a filesystem and the root path inside it."""

    source: str
    """The source as the user wrote it, canonicalised (``dbfs:`` dropped)."""
    fs: Any
    """The fsspec filesystem."""
    root: str
    """Root path inside ``fs`` (no protocol)."""

    @property
    def url(self) -> str:
        """The resolved location: an absolute local path or an fsspec URL."""
        if self.is_local:
            return self.root
        return str(self.fs.unstrip_protocol(self.root))

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def full_path(self, relpath: str) -> str:
        """The path inside ``fs`` of a listed file; refuses paths that leave the root."""
        rel = safe_relpath(relpath)
        if self.is_local:
            return os.path.join(self.root, *rel.split("/"))
        return f"{self.root.rstrip('/')}/{rel}"

    def open(self, relpath: str) -> Any:
        """Open a listed file for binary reading."""
        return self.fs.open(self.full_path(relpath), "rb")


@dataclass
class Listing:
    """The result of listing a source: kept entries in order, and refused ones."""

    volume: Volume
    entries: list[FileEntry]
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) for entries that were not listed because they are unsafe."""


def _strip_dbfs(source: str) -> str:
    if source.startswith("dbfs:"):
        rest = source[len("dbfs:"):]
        return "/" + rest.lstrip("/")
    return source


def _filesystem(url: str) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0]
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        err = known_implementations.get(protocol, {}).get("err")
        if err or isinstance(exc, ImportError):
            raise MissingDependency(
                f"cannot open {url}: no filesystem for {protocol}://",
                hint=err or str(exc),
            ) from exc
        raise InvalidArgument(f"cannot open {url}: {exc}") from exc
    return fs, path


def resolve(source: str, *, must_exist: bool = True) -> Volume:
    """Resolve a user-given source to a :class:`Volume`.

    Args:
        source: ``/Volumes/...``, ``dbfs:/Volumes/...``, an fsspec URL or a local path.
        must_exist: raise :class:`SourceNotFound` when the location is missing.

    Raises:
        SourceNotFound: the location does not exist; the message names both the
            source and where it resolved to.
        MissingDependency: the URL's protocol needs a package that is not installed.
    """
    if not source or not source.strip():
        raise InvalidArgument("the source is empty", hint="pass a volume path, URL or folder")
    canonical = _strip_dbfs(source)
    target = canonical
    via_env = ""
    if canonical == "/Volumes" or canonical.startswith("/Volumes/"):
        env_root = os.environ.get(VOLUMES_ROOT_ENV, "")
        rest = canonical[len("/Volumes"):].lstrip("/")
        if env_root:
            via_env = env_root
            target = env_root.rstrip("/") + ("/" + rest if rest else "")
    if "://" in target and not target.startswith("file://"):
        fs, root = _filesystem(target)
        root = root.rstrip("/") or root
    else:
        local = target[len("file://"):] if target.startswith("file://") else target
        fs = LocalFileSystem()
        root = os.path.abspath(os.path.expanduser(local))
    volume = Volume(source=canonical, fs=fs, root=root)
    if must_exist and not _exists(volume):
        if via_env:
            where = f"{VOLUMES_ROOT_ENV}={via_env}, so it was looked up at {volume.url}"
        elif canonical.startswith("/Volumes"):
            where = f"{VOLUMES_ROOT_ENV} is not set, so it was looked up as a local path"
        else:
            where = f"looked up at {volume.url}"
        raise SourceNotFound(
            f"source {source} does not exist ({where})",
            hint=f"check the path, or set {VOLUMES_ROOT_ENV} to the folder or URL that holds /Volumes",
        )
    return volume


def _unreadable(volume: Volume, exc: Exception) -> SourceUnreadable:
    return SourceUnreadable(
        f"cannot read {volume.url}: {type(exc).__name__}: {exc}",
        hint="check the credentials, endpoint and permissions for this store",
    )


def _exists(volume: Volume) -> bool:
    try:
        return bool(volume.fs.exists(volume.root))
    except FileNotFoundError:
        return False
    except Exception as exc:  # any backend's auth/endpoint error: say which store
        raise _unreadable(volume, exc) from exc


def safe_relpath(relpath: str) -> str:
    """Return ``relpath`` if it is a plain relative POSIX path inside its root.

    Refuses absolute paths, ``..`` and ``.`` segments, empty segments and NUL,
    so that no listed name can point a read or a cache write outside its root.
    """
    if not relpath or relpath.startswith("/") or "\\" in relpath or "\x00" in relpath:
        raise UnsafePath(f"unsafe path {relpath!r}: not a plain relative path")
    for part in relpath.split("/"):
        if part in ("", ".", ".."):
            raise UnsafePath(f"unsafe path {relpath!r}: contains {part or 'an empty'!r} segment")
    return relpath


def matches(relpath: str, pattern: str) -> bool:
    """Glob match: a pattern with ``/`` matches the whole relative path, one
    without matches the file name (so ``*.jpg`` finds JPEGs at any depth)."""
    if "/" in pattern:
        return fnmatch.fnmatchcase(relpath, pattern)
    return fnmatch.fnmatchcase(posixpath.basename(relpath), pattern)


def _hidden(relpath: str) -> bool:
    return any(part[:1] in ("_", ".") for part in relpath.split("/"))


def _version(info: dict[str, Any]) -> str:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):
            return value.isoformat()
        if isinstance(value, float):
            return repr(value)
        return str(value).strip('"')
    return ""


def _keep(relpath: str, include: Sequence[str], exclude: Sequence[str], hidden: bool) -> bool:
    if not hidden and _hidden(relpath):
        return False
    if include and not any(matches(relpath, p) for p in include):
        return False
    return not any(matches(relpath, p) for p in exclude)


class _EscapeCheck:
    """Finds local entries that resolve outside the volume through a symlink.

    realpath() is cached per folder, so the cost is per directory, not per file.
    """

    def __init__(self, root: str) -> None:
        self.real_root = os.path.realpath(root)
        self._dirs: dict[str, bool] = {}

    def _inside(self, real: str) -> bool:
        return real == self.real_root or real.startswith(self.real_root.rstrip(os.sep) + os.sep)

    def reason(self, full: str, info: dict[str, Any]) -> str | None:
        if info.get("islink"):
            real = os.path.realpath(full)
        else:
            parent = os.path.dirname(full)
            ok = self._dirs.get(parent)
            if ok is None:
                ok = self._dirs[parent] = self._inside(os.path.realpath(parent))
            if ok:
                return None
            real = os.path.realpath(full)
        return None if self._inside(real) else f"symlink to {real}, outside the volume"


def list_files(
    source: str | Volume,
    *,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    include_hidden: bool = False,
) -> Listing:
    """List every file under a source, recursively, in relative-path order.

    Args:
        source: a source string (see :func:`resolve`) or a resolved Volume.
        include: keep only files matching any of these globs (none = keep all).
        exclude: drop files matching any of these globs.
        include_hidden: also list names starting with ``_`` or ``.``.

    Returns:
        A :class:`Listing`; unsafe entries (``..`` keys, symlinks leaving the
        volume) are left out and recorded in ``Listing.refused``.
    """
    volume = source if isinstance(source, Volume) else resolve(source)
    include, exclude = list(include), list(exclude)
    fs, root = volume.fs, volume.root
    # fsspec instances are cached per process and some (s3fs) keep listings:
    # a long-lived process must see the store as it is now.
    fs.invalidate_cache(root)
    if fs.isfile(root):
        info = fs.info(root)
        name = posixpath.basename(root.rstrip("/"))
        parent = Volume(volume.source, fs, posixpath.dirname(root.rstrip("/")) if not volume.is_local
                        else os.path.dirname(root))
        single = FileEntry(name, int(info.get("size") or 0), _version(info))
        return Listing(parent, [single] if _keep(name, include, exclude, True) else [])
    try:
        found = fs.find(root, withdirs=False, detail=True)
    except Exception as exc:
        raise _unreadable(volume, exc) from exc
    prefix = root.rstrip("/") + "/"
    escape = _EscapeCheck(root) if volume.is_local else None
    entries: list[FileEntry] = []
    refused: list[tuple[str, str]] = []
    for full, info in found.items():
        if info.get("type") == "directory":
            continue
        name = full.replace(os.sep, "/") if volume.is_local else full
        rel = name[len(prefix):] if name.startswith(prefix) else name
        # Safety before filters: ".." would otherwise pass as a hidden name,
        # silently, and the user should hear about keys that try to escape.
        try:
            safe_relpath(rel)
        except UnsafePath as exc:
            refused.append((rel, str(exc)))
            continue
        if not _keep(rel, include, exclude, include_hidden):
            continue
        if escape is not None:
            reason = escape.reason(full, info)
            if reason:
                refused.append((rel, reason))
                continue
        entries.append(FileEntry(rel, int(info.get("size") or 0), _version(info)))
    entries.sort(key=lambda e: e.path)
    return Listing(volume, entries, refused)
