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
as Spark and Hadoop do. Local folders are walked as ``find -L`` walks them
(links to folders inside the volume are followed, loops broken), and a folder
that cannot be read is never dropped silently: it stops the listing
(:class:`UnreadableFolders`) unless ``skip_unreadable``, which records it.
A single file is a source too: its listing is that one file.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import posixpath
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import fsspec
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations
from fsspec.spec import AbstractFileSystem

from . import objstore
from .errors import (
    InvalidArgument,
    MissingDependency,
    SourceNotFound,
    SourceUnreadable,
    UcstageError,
    UnreadableFolders,
    UnsafePath,
)

__all__ = [
    "VOLUMES_ROOT_ENV",
    "FileEntry",
    "Listing",
    "UnreadableFolders",
    "Volume",
    "list_files",
    "matches",
    "resolve",
    "safe_relpath",
    "version_of",
]

VOLUMES_ROOT_ENV = "UCSTAGE_VOLUMES_ROOT"
LIST_THREADS = 32
"""Folders listed at once by a walk. On a mount or store each folder costs a
round trip; a bounded pool overlaps them (the result does not depend on it)."""

# Keys fsspec backends use for a change marker, best first. An ETag or checksum
# changes with the content; an mtime is what local and FUSE files have.
_VERSION_KEYS = ("ETag", "etag", "md5Hash", "md5", "crc32c", "mtime", "LastModified",
                 "last_modified", "updated", "created")

# The pip line that adds a backend: an extra of ucstage where pyproject.toml
# has one, else the backend's own package.
_EXTRAS = {"s3": "ucstage[s3]", "s3a": "ucstage[s3]"}


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
    """A resolved source: a filesystem and the root path inside it.

    A single-file source has ``root`` set to the file's folder and ``file`` to
    its name, so entries are read exactly as a folder's; its :attr:`url` is
    the file's own, which makes the file (not its folder) the cache namespace.
    """

    source: str
    """The source as the user wrote it, canonicalised (``dbfs:`` dropped)."""
    fs: Any
    """The fsspec filesystem."""
    root: str
    """Root path inside ``fs`` (no protocol): the folder that listed paths are relative to."""
    file: str = ""
    """For a single-file source, the file's name in ``root``; else empty."""

    @property
    def url(self) -> str:
        """The resolved location: an absolute local path or an fsspec URL
        (for a single-file source, the file's)."""
        where = self.full_path(self.file) if self.file else self.root
        if self.is_local:
            return where
        return str(self.fs.unstrip_protocol(where))

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
    """(path, reason) for entries that were not listed because they are unsafe
    (or a folder link that loops back or leaves the volume)."""
    unreadable: list[tuple[str, str]] = field(default_factory=list)
    """(folder, reason) for folders skipped because they could not be read;
    only ever non-empty with ``skip_unreadable``. Paths relative to the root."""


def _strip_dbfs(source: str) -> str:
    if source.startswith("dbfs:"):
        rest = source[len("dbfs:"):]
        return "/" + rest.lstrip("/")
    return source


def _install_hint(protocol: str, err: str) -> str:
    extra = _EXTRAS.get(protocol)
    if extra:
        return f"pip install '{extra}'"
    package = str(known_implementations.get(protocol, {}).get("class", "")).split(".")[0]
    if package and package != "fsspec":
        return f"pip install {package}"
    return err  # a backend inside fsspec whose own dependency is missing: it names it


def _filesystem(url: str) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0]
    if objstore.serves(url):
        return objstore.ObjectFS(protocol), url.split("://", 1)[1]
    try:
        fs, path = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        err = known_implementations.get(protocol, {}).get("err")
        if err or isinstance(exc, ImportError):
            raise MissingDependency(
                f"cannot open {url}: no filesystem for {protocol}:// is installed",
                hint=_install_hint(protocol, err or str(exc)),
            ) from exc
        raise InvalidArgument(f"cannot open {url}: {exc}") from exc
    return fs, path


def resolve(source: str, *, must_exist: bool = True) -> Volume:
    """Resolve a user-given source to a :class:`Volume`.

    Args:
        source: ``/Volumes/...``, ``dbfs:/Volumes/...``, an fsspec URL or a
            local path; a folder (prefix) or a single file.
        must_exist: raise :class:`SourceNotFound` when the location is missing.
            Without it nothing is looked up, so a file is resolved as a folder
            would be; its :attr:`Volume.url` (the cache namespace) is the same.

    Raises:
        SourceNotFound: the location does not exist; the message names both the
            source and where it resolved to.
        SourceUnreadable: the store refused to say (credentials, permissions).
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
    if not must_exist:
        return volume
    kind = _kind(volume)
    if kind is None:
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
    return volume if kind == "directory" else _single_file(volume)


def _single_file(volume: Volume) -> Volume:
    """The same location as a one-file source: its folder as root, its name as file."""
    split = os.path.split if volume.is_local else posixpath.split
    parent, name = split(volume.root.rstrip("/") if not volume.is_local else volume.root)
    return Volume(volume.source, volume.fs, parent, name)


def _unreadable(volume: Volume, exc: Exception) -> SourceUnreadable:
    return SourceUnreadable(
        f"cannot read {volume.url}: {type(exc).__name__}: {exc}",
        hint="check the credentials, endpoint and permissions for this store",
    )


def _kind(volume: Volume) -> str | None:
    """``"directory"``, ``"file"`` or None (missing), in one stat or info call."""
    try:
        if volume.is_local:
            st = os.stat(volume.root)
            return "directory" if stat.S_ISDIR(st.st_mode) else "file"
        info = volume.fs.info(volume.root)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except UcstageError:
        raise  # already says what is wrong (a missing credential, a bad setting)
    except Exception as exc:  # any backend's auth/endpoint error: say which store
        raise _unreadable(volume, exc) from exc
    return "directory" if info.get("type") == "directory" else "file"


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


def version_of(info: dict[str, Any]) -> str:
    """A file's change marker from an fsspec ``info`` dict: the first of
    :data:`_VERSION_KEYS` present (ETag or hash on object stores, the mtime on
    local folders and mounts), as a string; ``""`` when there is none. The
    listing and the cache's copy both use it, so a copied file's stamp and its
    listing entry always agree."""
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


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}"


class _Walk:
    """What a walk found: files (relative path -> size and version, or an
    fsspec info dict), refused entries and unreadable folders ("" = the root).

    Folders are visited by several threads at once; each visit collects into
    a :class:`_Walk` of its own and :meth:`merge` adds it here under a lock.
    Every result is sorted afterwards, so the visiting order never shows."""

    def __init__(self, include_hidden: bool) -> None:
        self.include_hidden = include_hidden
        self.entries: list[FileEntry] = []
        self.found: dict[str, dict[str, Any]] = {}
        self.refused: list[tuple[str, str]] = []
        self.unreadable: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def part(self) -> _Walk:
        """An empty walk for one folder's findings, to :meth:`merge` later."""
        return _Walk(self.include_hidden)

    def merge(self, part: _Walk) -> None:
        with self._lock:
            self.entries.extend(part.entries)
            self.found.update(part.found)
            self.refused.extend(part.refused)
            self.unreadable.extend(part.unreadable)

    def enter(self, rel: str, name: str) -> bool:
        """Whether to look at a child at all: refuse unsafe names (before the
        hidden filter, so an escaping name is reported, not hidden) and prune
        hidden ones (so an unreadable ``_delta_log`` never stops a listing)."""
        try:
            safe_relpath(rel)
        except UnsafePath as exc:
            self.refused.append((rel, str(exc)))
            return False
        return self.include_hidden or name[:1] not in ("_", ".")


_Folder = Any
"""A folder to visit, as the walk that queued it describes it."""


def _walk_folders(top: _Folder, visit: Callable[[_Folder], list[_Folder]],
                  threads: int | None = None) -> None:
    """Visit ``top`` and every folder ``visit`` returns, ``threads`` (default
    :data:`LIST_THREADS`) at a time.

    ``visit(folder)`` lists one folder, records what it found, and returns the
    folders to visit below it. Threads start only as folders queue up (a flat
    folder needs none but the first) and are daemons, so a read hung on a dead
    mount never holds up the interpreter's exit after Ctrl-C. The first
    exception a visit raises stops the walk and is raised here.
    """
    threads = max(1, threads or LIST_THREADS)
    cond = threading.Condition()
    queue: list[_Folder] = [top]
    state = {"busy": 0, "idle": 0, "threads": 0}
    failed: list[BaseException] = []

    def work() -> None:
        while True:
            with cond:
                state["idle"] += 1
                while not queue and state["busy"] and not failed:
                    cond.wait()
                state["idle"] -= 1
                if not queue or failed:
                    cond.notify_all()  # the walk is over: wake the others and the caller
                    return
                folder = queue.pop()
                state["busy"] += 1
            try:
                below = visit(folder)
            except BaseException as exc:
                below = []
                with cond:
                    failed.append(exc)
            with cond:
                state["busy"] -= 1
                queue.extend(below)
                # Enough threads for what is queued (this one takes the next),
                # up to the bound.
                for _ in range(min(len(queue) - state["idle"] - 1, threads - state["threads"])):
                    state["threads"] += 1
                    threading.Thread(target=work, name="ucstage-list", daemon=True).start()
                cond.notify_all()

    with cond:
        state["threads"] = 1
    threading.Thread(target=work, name="ucstage-list", daemon=True).start()
    try:
        with cond:
            while (queue or state["busy"]) and not failed:
                cond.wait()
    except BaseException as exc:  # Ctrl-C: the threads start no other folder
        with cond:
            failed.append(exc)
            queue.clear()
            cond.notify_all()
        raise
    if failed:
        raise failed[0]


def _walk_local(root: str, walk: _Walk) -> None:
    """``find -L`` over a local folder (FUSE mounts included), folders in parallel.

    Links are followed: a link to a folder inside the volume lists the files
    under the link's path, so each path is listed once and the same file may
    appear under two paths, as with ``find -L``. A folder reached again below
    itself (a loop) is not entered; a link resolving outside the volume, a
    broken link and anything that is neither a file nor a folder are refused.
    A folder that cannot be read is recorded in ``walk.unreadable``.
    """
    real_root = os.path.realpath(root)
    inside = real_root.rstrip(os.sep) + os.sep
    top = os.stat(root)

    def visit(task: tuple[str, str, frozenset[tuple[int, int]]]) -> list[_Folder]:
        folder, prefix, above = task
        found = walk.part()
        below: list[_Folder] = []
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except FileNotFoundError:
            return below  # removed while we listed: it holds nothing now
        except OSError as exc:
            found.unreadable.append((prefix.rstrip("/"), _reason(exc)))
            walk.merge(found)
            return below
        blocked = False
        for item in items:
            rel = prefix + item.name
            if not found.enter(rel, item.name):
                continue
            try:
                st = item.stat()  # through links, as find -L
            except OSError as exc:
                if exc.errno == errno.ENOENT and item.is_symlink():
                    found.refused.append((rel, f"broken symlink to {os.readlink(item.path)}"))
                elif exc.errno == errno.ELOOP:
                    found.refused.append((rel, "symlink loop"))
                elif exc.errno != errno.ENOENT and not blocked:
                    # Names readable, entries not (a folder without x): the
                    # folder's content is unknown, as if it could not be read.
                    blocked = True
                    found.unreadable.append((prefix.rstrip("/"), _reason(exc)))
                continue
            real = ""
            if item.is_symlink():
                real = os.path.realpath(item.path)
                if real != real_root and not real.startswith(inside):
                    found.refused.append((rel, f"symlink to {real}, outside the volume"))
                    continue
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key in above:
                    found.refused.append(
                        (rel, f"symlink loop: {real or item.path} is a folder above it"))
                    continue
                below.append((item.path, rel + "/", above | {key}))
            elif stat.S_ISREG(st.st_mode):
                found.entries.append(FileEntry(rel, st.st_size, version_of({"mtime": st.st_mtime})))
            else:
                found.refused.append((rel, "not a regular file"))
        walk.merge(found)
        return below

    _walk_folders((root, "", frozenset({(top.st_dev, top.st_ino)})), visit)


def _walks_by_ls(fs: Any) -> bool:
    """Whether ``fs.find`` is fsspec's own walk over ``ls``, which drops every
    folder it fails to list (``on_error="omit"``). Backends with their own
    ``find`` list an object store flat in one request, and raise."""
    cls = type(fs)
    if cls.find is not AbstractFileSystem.find:
        return False
    return not isinstance(fs, AsyncFileSystem) or cls._find is AsyncFileSystem._find


def _walk_fsspec(fs: Any, root: str, walk: _Walk) -> None:
    """fsspec's walk done here, folders in parallel, so that a folder ``ls``
    fails on is recorded."""
    base = root.rstrip("/")

    def visit(folder: str) -> list[_Folder]:
        found = walk.part()
        below: list[_Folder] = []
        try:
            infos = fs.ls(folder, detail=True)
        except FileNotFoundError:
            if folder == root:
                raise
            return below  # removed while we listed
        except Exception as exc:
            if folder == root:
                raise
            found.unreadable.append((folder[len(base) + 1:], _reason(exc)))
            walk.merge(found)
            return below
        for info in infos:
            name = str(info["name"]).rstrip("/")
            if name == folder.rstrip("/"):
                if info.get("type") != "directory":
                    found.found[name] = info
                continue
            if info.get("type") != "directory":
                found.found[name] = info
                continue
            rel = name[len(base) + 1:] if name.startswith(base + "/") else name
            if found.enter(rel, posixpath.basename(name)):
                below.append(name)
        walk.merge(found)
        return below

    _walk_folders(root, visit)


def _find_flat(fs: Any, root: str, volume: Volume | None) -> dict[str, dict[str, Any]]:
    """A flat listing of an object store: through obstore when ``volume`` is
    given (its engine), else fsspec's ``find``; both give the same entries."""
    if volume is not None:
        try:
            return objstore.list_objects(volume, root)
        except objstore.Unparsable:
            pass  # keys with "." or ".." segments: fsspec lists them, and we refuse them
        if isinstance(fs, objstore.ObjectFS):
            fs = fs.fsspec()
    return dict(fs.find(root, withdirs=False, detail=True))


def _list_one_file(volume: Volume, include: Sequence[str], exclude: Sequence[str]) -> Listing:
    full = volume.full_path(volume.file)
    volume.fs.invalidate_cache(volume.root)
    try:
        info = volume.fs.info(full)
    except FileNotFoundError as exc:
        raise SourceNotFound(f"source {volume.source} does not exist (looked up at "
                             f"{volume.url})") from exc
    except Exception as exc:
        raise _unreadable(volume, exc) from exc
    if volume.is_local:
        real, real_root = os.path.realpath(full), os.path.realpath(volume.root)
        if not real.startswith(real_root.rstrip(os.sep) + os.sep):
            return Listing(volume, [], [(volume.file, f"symlink to {real}, outside its folder")])
    entry = FileEntry(volume.file, int(info.get("size") or 0), version_of(info))
    # Named explicitly, so a hidden name is kept; include/exclude still apply.
    return Listing(volume, [entry] if _keep(volume.file, include, exclude, True) else [])


def _folder_message(volume: Volume, unreadable: Sequence[tuple[str, str]]) -> UnreadableFolders:
    folders = [(volume.full_path(rel) if volume.is_local else
                volume.fs.unstrip_protocol(volume.full_path(rel)), why) for rel, why in unreadable]
    names = ", ".join(f"{path} ({why})" for path, why in folders[:3])
    more = f" and {len(folders) - 3:,} more" if len(folders) > 3 else ""
    count = f"{len(folders):,} folder{'s' if len(folders) != 1 else ''}"
    return UnreadableFolders(
        f"cannot read {count} of {volume.url}: {names}{more}; the listing would miss "
        "their files",
        hint="fix their permissions, or pass `skip_unreadable` to list the rest without them",
        folders=folders,
    )


def list_files(
    source: str | Volume,
    *,
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    include_hidden: bool = False,
    skip_unreadable: bool = False,
) -> Listing:
    """List every file under a source, recursively, in relative-path order.

    Args:
        source: a source string (see :func:`resolve`) or a resolved Volume.
            A single file lists as itself.
        include: keep only files matching any of these globs (none = keep all).
        exclude: drop files matching any of these globs.
        include_hidden: also list names starting with ``_`` or ``.``.
        skip_unreadable: list what can be read when folders inside the source
            cannot be; they are recorded in ``Listing.unreadable``.

    Returns:
        A :class:`Listing`; unsafe entries (``..`` keys, symlinks leaving the
        volume, folder links that loop) are left out and recorded in
        ``Listing.refused``.

    Raises:
        UnreadableFolders: folders inside the source cannot be listed (exit 1),
            unless ``skip_unreadable``.
        SourceUnreadable: the source itself cannot be listed.
    """
    volume = source if isinstance(source, Volume) else resolve(source)
    if isinstance(source, Volume) and not source.file and _kind(source) == "file":
        volume = _single_file(source)
    include, exclude = list(include), list(exclude)
    if volume.file:
        return _list_one_file(volume, include, exclude)
    fs, root = volume.fs, volume.root
    walk = _Walk(include_hidden)
    engine = objstore.engine(volume)
    try:
        if volume.is_local:
            _walk_local(root, walk)
        else:
            # fsspec instances are cached per process and some (s3fs) keep
            # listings: a long-lived process must see the store as it is now.
            fs.invalidate_cache(root)
            if _walks_by_ls(fs):
                _walk_fsspec(fs, root, walk)
            else:
                walk.found = _find_flat(fs, root, volume if engine == "obstore" else None)
    except Exception as exc:
        raise _unreadable(volume, exc) from exc
    if any(not rel for rel, _ in walk.unreadable):
        why = next(w for rel, w in walk.unreadable if not rel)
        raise SourceUnreadable(f"cannot read {volume.url}: {why}",
                               hint="check its permissions, or the credentials for this store")
    if walk.unreadable and not skip_unreadable:
        raise _folder_message(volume, sorted(walk.unreadable))
    prefix = root.rstrip("/") + "/"
    entries: list[FileEntry] = []
    refused = walk.refused
    for full, info in walk.found.items():
        if info.get("type") == "directory":
            continue
        rel = full[len(prefix):] if full.startswith(prefix) else full
        # Safety before filters: ".." would otherwise pass as a hidden name,
        # silently, and the user should hear about keys that try to escape.
        try:
            safe_relpath(rel)
        except UnsafePath as exc:
            refused.append((rel, str(exc)))
            continue
        if _keep(rel, include, exclude, include_hidden):
            entries.append(FileEntry(rel, int(info.get("size") or 0), version_of(info)))
    entries.extend(e for e in walk.entries if _keep(e.path, include, exclude, include_hidden))
    entries.sort(key=lambda e: e.path)
    return Listing(volume, entries, sorted(refused), sorted(walk.unreadable))
