"""Resolve a source (volume path, fsspec URL, local path) to a :class:`Volume`.

Path rules (docs/design.md, "Resolution"):

* ``/Volumes/<catalog>/<schema>/<volume>/...`` and ``dbfs:/Volumes/...`` map to
  ``$UCSTAGE_VOLUMES_ROOT/<catalog>/<schema>/<volume>/...`` when that variable
  is set (a local folder or an fsspec URL), else to the literal local path,
  which on the platform is the FUSE mount.
* Anything with ``://`` is an fsspec URL (``s3://``, ``gs://``, ``file://``,
  ``memory://``...).
* Anything else is a local path.

A single file is a source too: it resolves to its folder and its name.
Listing a volume is :mod:`ucstage.volumes.listing`.
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import cloudfs
from ..engines import objstore
from ..errors import (
    InvalidArgument,
    MissingDependency,
    SourceNotFound,
    SourceUnreadable,
    UcstageError,
    UnsafePath,
)
from .entry import PLAIN, FileEntry

__all__ = ["VOLUMES_ROOT_ENV", "Fetch", "Volume", "entry_name_problem", "is_mapped",
           "is_volumes_path", "kind_of",
           "looked_up", "remember", "resolve", "resolved", "safe_relpath", "single_file",
           "unreadable_error"]

VOLUMES_ROOT_ENV = "UCSTAGE_VOLUMES_ROOT"

# The pip line that adds a backend: an extra of ucstage where pyproject.toml
# has one, else the backend's own package.
_EXTRAS = {"s3": "ucstage[s3]", "s3a": "ucstage[s3]"}


def is_volumes_path(path: str) -> bool:
    """Whether ``path`` is a Unity Catalog volume path: ``/Volumes`` or below it.

    Such a path names different places under different settings of
    ``$UCSTAGE_VOLUMES_ROOT`` (see :func:`resolve`); ``dbfs:`` is not stripped
    here, pass the canonical form (:attr:`Volume.source`)."""
    return path == "/Volumes" or path.startswith("/Volumes/")


def is_mapped(path: str) -> bool:
    """Whether ``path`` is read where :func:`resolve` maps it (a URL, a
    ``dbfs:`` or ``/Volumes`` path) rather than opened as written."""
    return "://" in path or path.startswith("dbfs:") or is_volumes_path(path)


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
    is_local: bool = field(init=False, repr=False, compare=False)
    """Whether ``fs`` is the local file system (a folder or a mount)."""
    url: str = field(init=False, repr=False, compare=False)
    """The resolved location: an absolute local path or an fsspec URL
    (for a single-file source, the file's)."""

    def __post_init__(self) -> None:
        # Worked out once per volume: every copy asks whether it is local,
        # and every binding of a cache to it asks for its URL.
        # Looked up, not imported: a volume's local filesystem was made by
        # resolve(), which imported fsspec's; an object store read through
        # obstore never needs fsspec (a third of the CLI's start-up).
        local = sys.modules.get("fsspec.implementations.local")
        is_local = local is not None and isinstance(self.fs, local.LocalFileSystem)
        object.__setattr__(self, "is_local", is_local)
        where = self.full_path(self.file) if self.file else self.root
        object.__setattr__(self, "url", where if is_local else
                           str(self.fs.unstrip_protocol(where)))

    def full_path(self, relpath: str) -> str:
        """The path inside ``fs`` of a listed file; refuses paths that leave the root."""
        rel = relpath if PLAIN.fullmatch(relpath) else safe_relpath(relpath)
        if self.is_local:
            return os.path.join(self.root, *rel.split("/"))
        return f"{self.root.rstrip('/')}/{rel}"

    def open(self, relpath: str) -> Any:
        """Open a listed file for binary reading."""
        return self.fs.open(self.full_path(relpath), "rb")



def _strip_dbfs(source: str) -> str:
    if source.startswith("dbfs:"):
        rest = source[len("dbfs:"):]
        return "/" + rest.lstrip("/")
    return source


def _install_hint(protocol: str, err: str) -> str:
    extra = _EXTRAS.get(protocol)
    if extra:
        return f"pip install '{extra}'"
    from fsspec.registry import known_implementations

    package = str(known_implementations.get(protocol, {}).get("class", "")).split(".")[0]
    if package and package != "fsspec":
        return f"pip install {package}"
    return err  # a backend inside fsspec whose own dependency is missing: it names it


def _filesystem(url: str) -> tuple[Any, str]:
    protocol = url.split("://", 1)[0]
    cloud = cloudfs.parse(url)
    if cloud is not None:
        # Every GCS and Azure URL form (container@account kept), on either
        # engine: both list through gcsfs/adlfs, so their entries, versions
        # and cache namespace are the same.
        return objstore.ObjectFS(cloud[0], cloud[1]), cloud[2]
    if objstore.serves(url):
        return objstore.ObjectFS(protocol), url.split("://", 1)[1]
    # fsspec is imported here, not at the top, and only for the URLs obstore
    # does not read: reading a local manifest (`shard-plan MANIFEST --slot`)
    # or warming s3:// never needs it, and it is a third of the CLI's own
    # start-up (asyncio, ssl, its registry, importlib.metadata).
    import fsspec.core
    from fsspec.registry import known_implementations

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
    if is_volumes_path(canonical):
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
        from fsspec.implementations.local import LocalFileSystem

        fs = LocalFileSystem()
        root = os.path.abspath(os.path.expanduser(local))
    volume = Volume(source=canonical, fs=fs, root=root)
    if not must_exist:
        return volume
    kind = kind_of(volume)
    if kind is None:
        if via_env:
            where = f"{VOLUMES_ROOT_ENV}={via_env}, so it was looked up at {volume.url}"
        elif is_volumes_path(canonical):
            where = f"{VOLUMES_ROOT_ENV} is not set, so it was looked up as a local path"
        else:
            where = looked_up(source, volume.url)
        # The variable only maps /Volumes paths: for any other it is no help.
        hint = (f"check the path, or set {VOLUMES_ROOT_ENV} to the folder or URL that holds "
                "/Volumes") if is_volumes_path(canonical) else "check the path"
        raise SourceNotFound(f"source {source} does not exist" + (f" ({where})" if where else ""),
                             hint=hint)
    return volume if kind == "directory" else single_file(volume)


Fetch = Callable[[Volume, FileEntry], str]
"""``(volume, entry)`` -> a local path holding the entry's bytes: how a
core step that needs a whole file (a shard to index, a table's deletion
vector) gets it, given by its caller (a dataset its cache's ``fetch``), so
the core never imports the cache."""

_RESOLVED: dict[str, Volume] = {}
"""This process's volumes by URL (:func:`resolved`)."""
_RESOLVED_MAX = 16


def resolved(url: str) -> Volume:
    """``resolve(url)``, once per URL in this process: a frozen listing names
    its volume by URL, and every reader of it asks for that volume (a HEAD
    and a LIST on an object store each time it is resolved)."""
    volume = _RESOLVED.get(url)
    if volume is None:
        volume = resolve(url)
        remember(volume)
    return volume


def remember(volume: Volume) -> None:
    """Keep ``volume`` for :func:`resolved` of its URL: a listing that has
    just resolved it spares the frozen listing a second resolve."""
    if len(_RESOLVED) >= _RESOLVED_MAX:
        _RESOLVED.clear()  # a process reads a few sources; a bound, not a policy
    _RESOLVED[volume.url] = volume


def looked_up(source: str, url: str) -> str:
    """"looked up at URL" for a not-found message, or "" when the URL is the
    source as given (saying it twice tells nothing)."""
    return "" if url.rstrip("/") == source.rstrip("/") else f"looked up at {url}"


def single_file(volume: Volume) -> Volume:
    """The same location as a one-file source: its folder as root, its name as file."""
    split = os.path.split if volume.is_local else posixpath.split
    parent, name = split(volume.root.rstrip("/") if not volume.is_local else volume.root)
    return Volume(volume.source, volume.fs, parent, name)


def unreadable_error(volume: Volume, exc: Exception) -> SourceUnreadable:
    """The error for a store that refused to list or describe ``volume``."""
    return SourceUnreadable(
        f"cannot read {volume.url}: {type(exc).__name__}: {exc}",
        hint="check the credentials, endpoint and permissions for this store",
    )


def kind_of(volume: Volume) -> str | None:
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
        raise unreadable_error(volume, exc) from exc
    return "directory" if info.get("type") == "directory" else "file"


def entry_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name one entry directly inside a folder, or None
    when it can. The rule for every name ucstage joins to a folder it was
    given: a segment of a listed path (:func:`safe_relpath`), a part of a
    table name (a folder of the warehouse), a file a checkpoint's record
    names. An empty name, ``.`` or ``..``, or one holding ``/`` or NUL would
    name the folder itself, another folder, or a path the OS cuts short.
    """
    if name in ("", ".", ".."):
        return f"{name!r} names a folder, not an entry in it" if name else "it is empty"
    if "/" in name:
        return "it holds a /: it is a path, not one name"
    if "\x00" in name:
        return "it holds a NUL byte"
    return None


def safe_relpath(relpath: str) -> str:
    """Return ``relpath`` if it is a plain relative POSIX path inside its root.

    Refuses absolute paths, ``..`` and ``.`` segments, empty segments and NUL,
    so that no listed name can point a read or a cache write outside its root.
    """
    if not relpath or relpath.startswith("/") or "\\" in relpath or "\x00" in relpath:
        raise UnsafePath(f"unsafe path {relpath!r}: not a plain relative path")
    for part in relpath.split("/"):
        if entry_name_problem(part) is not None:
            raise UnsafePath(f"unsafe path {relpath!r}: contains {part or 'an empty'!r} segment")
    return relpath


