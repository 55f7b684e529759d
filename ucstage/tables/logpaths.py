"""Paths a Delta log names (data files, deletion vectors, checkpoint
sidecars), made local and confined to the table's folder: the one rule for
export and :class:`~ucstage.TableDataset`.

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
import re
from urllib.parse import unquote, urlparse

from ..errors import UnsafePath, UnsupportedTable

__all__ = ["TableFolder", "shown"]

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
            where = f", which resolves to {shown(real)}" if real and real != logged else ""
            raise UnsafePath(
                f"table {self.label}: the Delta log names {what} {shown(logged)}{where}, "
                f"outside the table's folder {shown(root)}",
                hint="nothing was read: a table's data and deletion-vector files must lie "
                     "inside its folder (the log may have been edited, or the table is a "
                     "shallow clone of another; copy it whole)")
        if not path.startswith(self._inside):
            # Inside only through another name of the folder (an absolute path
            # through the link the folder was given by, or the reverse): named
            # under the folder as given, so that every file is relative to it.
            path = os.path.join(root, os.path.relpath(real, self._real_root))
        return path

