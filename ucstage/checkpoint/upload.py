"""Where a save's files go: the small interface a checkpoint is uploaded
through, and its implementation for a local or mounted folder.

A save writes each rank's files to local scratch first, then hands them to a
:class:`Destination` one at a time (several at once, from threads). The
destination reports what landed (size and checksum of the bytes it holds
now), and the writer compares that with what it wrote. An object store
plugs in behind the same methods (:class:`ObjectDestination`: a multipart
PUT and the checksum the store reports; a PUT of a small object; a listing;
a flag its parts check).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..atomic import fsync_dir, write_atomic
from ..errors import CheckpointUnsafe
from . import digests
from .place import StorePlace

if TYPE_CHECKING:  # the tee imports torch; the upload is typed by it only
    from .tee import Growing


class Cancelled(Exception):
    """A put stopped by :meth:`Destination.cancel` (the save is stopping)."""


@dataclass(frozen=True)
class Landed:
    """What a destination holds under a name after a put."""

    size: int
    checksum: str
    """``kind:<hex>`` of the bytes read back from the destination."""


class Destination(Protocol):
    """A checkpoint folder's home: where files are put and published."""

    where: str
    """The folder or URL, for messages."""
    writing: dict[str, Growing]
    """Scratch files still being written, by local path: a put of one reads
    it as it grows (:meth:`Growing.wait`), so the upload overlaps the write."""

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        """Copy the local file to ``name`` (its final name: no rename after)
        and return the size and ``kind`` checksum of what landed."""
        ...

    def write_small(self, name: str, data: bytes) -> None:
        """Write a small file whole, so a reader sees all of it or nothing
        (the record, and ``.metadata`` last of all)."""
        ...

    def size(self, name: str) -> int | None:
        """The size of ``name``, or None when it is not there."""
        ...

    def cancel(self) -> None:
        """Make the puts running now stop soon (they raise), and later ones fail."""
        ...


class FolderDestination:
    """A local folder, or a mounted one (``/Volumes/...`` on the platform).

    Data files are written straight to their final names: on a volume's FUSE
    mount a rename is a server-side copy of the whole file, so only the
    small files published whole are renamed into place.
    """

    def __init__(self, root: str) -> None:
        self.root = root
        self.where = root
        self.writing: dict[str, Growing] = {}
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def _go_on(self, _done: int = 0) -> None:
        if self._cancelled.is_set():
            raise Cancelled(f"the upload to {self.where} was stopped")

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        target = self._path(name)
        self._go_on()
        growing = self.writing.get(local_path)
        copied = 0
        # Never through a link at the final name (a neighbour's or a hostile
        # folder's): O_NOFOLLOW makes one an error, not a write elsewhere.
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise CheckpointUnsafe(
                f"{name} in {self.where} is a symbolic link: the save does not write through it",
                hint="remove the link (someone else may have planted it), or save to a new "
                     "folder") from None
        with open(local_path, "rb", buffering=0) as src, os.fdopen(fd, "wb", buffering=0) as dst:
            while True:
                self._go_on()
                if growing is not None:
                    growing.wait(copied + digests.CHUNK, self._go_on)
                block = src.read(digests.CHUNK)
                copied += len(block)
                if not block:
                    break
                view = memoryview(block)
                while view:
                    written = dst.write(view)
                    view = view[written or 0:]
            with contextlib.suppress(OSError):
                os.fsync(dst.fileno())  # a FUSE mount may refuse; the read-back still checks
        # Read back what the folder now serves (through the mount, for a
        # mounted volume): the check is of what landed, not of what was sent.
        size, checksum, _ = digests.of_file(target, kind, progress=self._go_on)
        return Landed(size, checksum)

    def write_small(self, name: str, data: bytes) -> None:
        write_atomic(self._path(name), data)
        fsync_dir(self.root)

    def size(self, name: str) -> int | None:
        try:
            return os.stat(self._path(name)).st_size
        except FileNotFoundError:
            return None


class ObjectDestination:
    """A key prefix of an object store (``s3://``, ``gs://``, ``az://``).

    Each file is PUT by the engines (:func:`ucstage.engines.objput.put_file`:
    multipart above 16 MiB, parts in parallel) straight to its final key, and
    checked against what the store reports (S3's ETag, GCS's CRC32C; a
    read-back on Azure, which keeps no checksum of a blob made of blocks).
    A PUT is atomic on every store: the record and ``.metadata`` need no rename.
    """

    def __init__(self, at: StorePlace) -> None:
        self.at = at
        self.where = at.path
        self.writing: dict[str, Growing] = {}
        self._cancelled = threading.Event()
        self._listed: dict[str, tuple[int, float]] | None = None

    def cancel(self) -> None:
        self._cancelled.set()

    def _go_on(self, _done: int = 0) -> None:
        if self._cancelled.is_set():
            raise Cancelled(f"the upload to {self.where} was stopped")

    def put(self, local_path: str, name: str, kind: str) -> Landed:
        from ..engines import objput

        self._go_on()
        growing = self.writing.get(local_path)
        follow = {} if growing is None else {"grown": lambda n: growing.wait(n, self._go_on)}
        put = objput.put_file(self.at.kind, self.at.bucket, self.at._at(name), local_path, kind,
                              self._go_on, **follow)
        return Landed(put.size, put.checksum)

    def write_small(self, name: str, data: bytes) -> None:
        from ..engines import objput

        objput.put_bytes(self.at.kind, self.at.bucket, self.at._at(name), data)

    def size(self, name: str) -> int | None:
        # One listing for all of a publish's checks (a request each would
        # cost a round trip per file): the puts are done by then.
        if self._listed is None:
            self._listed = self.at.files() or {}
        found = self._listed
        return found[name][0] if name in found else None
