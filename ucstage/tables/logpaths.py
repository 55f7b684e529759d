"""Paths a Delta log names (data files, deletion vectors, checkpoint
sidecars), made local and confined to the table's folder: the one rule for
export and :class:`~ucstage.TableDataset`. A table on an object store
(:class:`StoreFolder`) is confined the same way, by URL: same store, same
bucket (container and account), under the table's prefix.

The log is input, not trust: an ``add`` may say ``../../secret/x.parquet``,
``file:///elsewhere/x.parquet`` or ``/elsewhere/x.parquet``, and a deletion
vector's ``u`` prefix or ``p`` path may point anywhere. Spark, pyarrow and
the vector reader open whatever they are handed, so each path is checked
here before anything is read or Spark is asked: decoded (percent-encoding,
``file:`` URIs) and resolved (``..``, symlinks), it must lie inside the
table's folder, resolved the same way. The protocol allows absolute paths;
those inside the table keep working, the rest are refused by name.
"""

from __future__ import annotations

import os
import posixpath
import re
from urllib.parse import unquote, urlparse

from .. import cloudfs
from ..errors import UnsafePath, UnsupportedTable

__all__ = ["Folder", "StoreFolder", "TableFolder", "shown"]

# A URI with a scheme: ``file:///x``, ``file:/x`` (Hadoop's form), ``s3://b/x``.
# A relative path with a colon in its first segment is not a URI reference
# Delta writes (it percent-encodes the colon), so it stays a path.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/")


def shown(text: str) -> str:
    """``text`` for a message: as is, or escaped (``repr``) when it holds
    control characters, which would otherwise move a terminal's cursor."""
    return text if text.isprintable() else repr(text)


def _located(logged: str, base: str, encoded: bool, label: str, what: str) -> str:
    """The local path ``logged`` names, not yet checked."""
    if _URI.match(logged):
        parsed = urlparse(logged)
        if parsed.scheme.lower() != "file" or parsed.netloc not in ("", "localhost"):
            raise UnsupportedTable(f"table {label}: {what} {shown(logged)} is not on a local "
                                   "or mounted filesystem",
                                   hint="read the table from a local or mounted path")
        return unquote(parsed.path)
    text = unquote(logged) if encoded else logged
    return text if text.startswith("/") else os.path.join(base, *text.split("/"))


def _outside(label: str, what: str, logged: str, real: str, root: str) -> UnsafePath:
    where = f", which resolves to {shown(real)}" if real and real != logged else ""
    return UnsafePath(
        f"table {label}: the Delta log names {what} {shown(logged)}{where}, "
        f"outside the table's folder {shown(root)}",
        hint="nothing was read: a table's data and deletion-vector files must lie "
             "inside its folder (the log may have been edited, or the table is a "
             "shallow clone of another; copy it whole)")


class TableFolder:
    """A table's folder, to confine the paths its log names (:meth:`path`).

    Each folder a file sits in is resolved once (a table's files share a
    few folders): resolving every file's path in full costs several times
    what checking that the file exists does, on a table of 100,000 files.
    """

    def __init__(self, root: str, label: str) -> None:
        self.root = os.path.abspath(root)
        self.label = label
        self._real_root = os.path.realpath(self.root)
        # Prefixes: a path inside starts with one (the folder itself does not).
        self._inside = self.root.rstrip(os.sep) + os.sep
        self._real_inside = self._real_root.rstrip(os.sep) + os.sep
        self._folders: dict[str, str] = {}

    def _real(self, path: str) -> str:
        """``os.path.realpath(path)`` of a normalised absolute path."""
        folder, name = os.path.split(path)
        real = self._folders.get(folder)
        if real is None:
            real = self._folders[folder] = os.path.realpath(folder)
        real = os.path.join(real, name)
        # A link's target is relative to the folder holding it, now resolved.
        return os.path.realpath(real) if os.path.islink(real) else real

    def path(self, logged: str, what: str, *, base: str | None = None,
             encoded: bool = True) -> str:
        """The local path of ``logged`` (a path as the log stores it), under
        the folder as given.

        ``logged`` is a URI reference (percent-encoded unless ``encoded`` is
        False), relative to ``base`` (default the folder), or absolute (a
        ``file:`` URI or a path). ``what`` names it in messages (``data file``...).

        Raises:
            UnsafePath: it is not inside the folder once ``..`` and symlinks
                are resolved (or holds a NUL).
            UnsupportedTable: a URI on another filesystem (``s3://``...).
        """
        root = self.root
        path = os.path.normpath(_located(logged, base or root, encoded, self.label, what))
        real = self._real(path) if "\0" not in path else ""
        if not real.startswith(self._real_inside):
            raise _outside(self.label, what, logged, real, root)
        if not path.startswith(self._inside):
            # Inside only through another name of the folder (an absolute path
            # through the link the folder was given by, or the reverse): named
            # under the folder as given, so that every file is relative to it.
            path = os.path.join(root, os.path.relpath(real, self._real_root))
        return path



def _on_store(url: str) -> tuple[str, str, str, str] | None:
    """``(kind, bucket, account, key)`` of an object-store URL in any form
    ucstage reads (:func:`ucstage.cloudfs.parse`; ``s3://``, ``s3a://``),
    the key not decoded; None for any other URL."""
    parsed = cloudfs.parse(url)
    if parsed is not None:
        kind, rest = parsed[1], parsed[2]
    else:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("s3", "s3a"):
            return None
        kind = "s3"
    first, _, key = rest.partition("/")
    bucket, account = cloudfs.split_account(first)
    return kind, bucket, account, key


class StoreFolder:
    """A table's folder on an object store (its URL), to confine the paths its
    log names (:meth:`path`), as :class:`TableFolder` does a local one.

    A path is inside when, decoded and with ``.``/``..`` resolved, it lies
    under the table's prefix in the same bucket (GCS) or container (Azure,
    and the same account when both name one) of the same store. There are no
    links to follow on a store.
    """

    def __init__(self, root: str, label: str) -> None:
        self.root = root.rstrip("/")
        """The table's URL as given (a :class:`ucstage.volumes.Volume`'s ``url``)."""
        self.label = label
        where = _on_store(self.root)
        if where is None:
            raise ValueError(f"{root} is not an object-store URL")
        self._kind, self._bucket, self._account, key = where
        self._key = posixpath.normpath(unquote(key)).strip("/") if key.strip("/") else ""

    def relative(self, path: str) -> str:
        """The path, relative to the table, of a URL :meth:`path` returned."""
        return path[len(self.root) + 1:]

    def _inside(self, key: str) -> bool:
        if not self._key:
            return key not in ("", ".", "..") and not key.startswith(("../", "/"))
        return key.startswith(self._key + "/")

    def path(self, logged: str, what: str, *, base: str | None = None,
             encoded: bool = True) -> str:
        """The URL of ``logged`` (a path as the log stores it: a URI
        reference, percent-encoded unless ``encoded`` is False, relative to
        ``base``, a URL inside the table, default the table), under the
        table's URL as given.

        Raises:
            UnsafePath: not inside the table (another store, bucket,
                container or account; a ``..`` out of the prefix; a local
                path), or it holds a NUL.
        """
        key = ""
        if "\0" not in logged:
            if _URI.match(logged):
                where = _on_store(logged)
                if where is not None and where[:2] == (self._kind, self._bucket) and \
                        (not where[2] or not self._account or where[2] == self._account):
                    key = posixpath.normpath(unquote(where[3]))
            else:
                text = unquote(logged) if encoded else logged
                start = self._key if base is None else \
                    posixpath.join(self._key, self.relative(base.rstrip("/")))
                if not text.startswith("/"):
                    key = posixpath.normpath(posixpath.join(start, text))
        if not key or not self._inside(key):
            raise _outside(self.label, what, logged, "", self.root)
        return f"{self.root}/{key[len(self._key) + 1:] if self._key else key}"


Folder = TableFolder | StoreFolder
"""A table's folder, local or on an object store."""
