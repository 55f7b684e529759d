"""Where a checkpoint folder lives: a local or mounted folder, or a prefix of
an object store (``s3://``, ``gs://``, ``az://``/``abfss://``, and
``/Volumes/...`` mapped to one by ``$UCSTAGE_VOLUMES_ROOT``), resolved as
the datasets resolve a source (:func:`ucstage.volumes.location.resolve`,
with the same environment credentials).

A :class:`Place` offers the few operations the checkpoint rules need
(:mod:`.folder`, :mod:`.retention`): one level of listing, a small file
read whole, a byte range, a file's checksum, a removal. The rules are
written once over it. On a store a "folder" is a key prefix: it exists when
some key is under it, and needs no making or removing.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Callable
from typing import Protocol

from ..engines import objput, objstore
from ..errors import InvalidArgument, UcstageError
from ..volumes.location import Volume, resolve, unreadable_error
from . import digests


class Place(Protocol):
    path: str
    """The folder or URL, as shown and compared (no trailing ``/``)."""
    is_local: bool

    def files(self) -> dict[str, tuple[int, float]] | None:
        """The regular files directly inside, ``{name: (size, mtime)}``; None
        when there is no folder here."""
        ...

    def folders(self) -> list[Place]:
        """The folders directly inside, by name."""
        ...

    def child(self, name: str) -> Place: ...

    def parent(self) -> Place: ...

    def read(self, name: str) -> bytes | None:
        """A small file whole, None when it is missing."""
        ...

    def checksum(self, name: str, kind: str,
                 progress: Callable[[int], None] | None = None) -> tuple[int, str]:
        """``(size, kind:<hex>)`` of a file, read whole."""
        ...

    def remove(self, name: str) -> None:
        """Remove a file; one already gone is no error."""
        ...

    def remove_if_empty(self) -> list[str]:
        """Remove the folder when nothing is left in it; else the names left."""
        ...


class LocalPlace:
    is_local = True

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)

    def files(self) -> dict[str, tuple[int, float]] | None:
        try:
            entries = list(os.scandir(self.path))
        except (FileNotFoundError, NotADirectoryError):
            return None
        found = {}
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed while we looked
            if stat.S_ISREG(st.st_mode):
                found[entry.name] = (st.st_size, st.st_mtime)
        return found

    def folders(self) -> list[Place]:
        try:
            entries = sorted(os.scandir(self.path), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [LocalPlace(e.path) for e in entries if e.is_dir(follow_symlinks=False)]

    def child(self, name: str) -> Place:
        return LocalPlace(os.path.join(self.path, name))

    def parent(self) -> Place:
        return LocalPlace(os.path.dirname(self.path.rstrip(os.sep)) or os.sep)

    def read(self, name: str) -> bytes | None:
        try:
            with open(os.path.join(self.path, name), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def checksum(self, name: str, kind: str,
                 progress: Callable[[int], None] | None = None) -> tuple[int, str]:
        size, checksum, _ = digests.of_file(os.path.join(self.path, name), kind,
                                            progress=progress)
        return size, checksum

    def remove(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.path, name))

    def remove_if_empty(self) -> list[str]:
        try:
            left = sorted(os.listdir(self.path))
        except FileNotFoundError:
            return []
        if not left:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)
        return left


class StorePlace:
    """A key prefix of an object store, read and written through the engines."""

    is_local = False

    def __init__(self, volume: Volume) -> None:
        self.volume = volume
        self.kind, self.bucket, self.key = objstore.location(volume, volume.root)
        self.key = self.key.strip("/")
        self.path = volume.url.rstrip("/")

    def _at(self, name: str) -> str:
        return f"{self.key}/{name}" if self.key else name

    def _list(self) -> tuple[dict[str, tuple[int, float]], list[str]]:
        try:
            return objput.list_folder(self.kind, self.bucket, self.key)
        except UcstageError:
            raise
        except Exception as exc:  # credentials, endpoint, permissions: say which store
            raise unreadable_error(self.volume, exc) from exc

    def files(self) -> dict[str, tuple[int, float]] | None:
        found, folders = self._list()
        return found if (found or folders) else None

    def folders(self) -> list[Place]:
        return [self.child(n) for n in self._list()[1]]

    def _sibling(self, root: str) -> StorePlace:
        return StorePlace(Volume(self.volume.source, self.volume.fs, root))

    def child(self, name: str) -> Place:
        return self._sibling(f"{self.volume.root.rstrip('/')}/{name}")

    def parent(self) -> Place:
        root = self.volume.root.rstrip("/")
        up = posixpath.dirname(root)
        return self._sibling(up if "/" in root else root)

    def read(self, name: str) -> bytes | None:
        return objput.get_bytes(self.kind, self.bucket, self._at(name))

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """One ranged GET through the engine (throttling retried, bounded)."""
        from ..engines.engine import read_ranges

        blobs, _ = objput.retried(
            lambda: read_ranges(self.volume, name, [(offset, length)]))
        return blobs[0]

    def checksum(self, name: str, kind: str,
                 progress: Callable[[int], None] | None = None) -> tuple[int, str]:
        return objput.read_back(self.kind, self.bucket, self._at(name), kind,
                                progress or (lambda _n: None))

    def remove(self, name: str) -> None:
        objput.delete(self.kind, self.bucket, self._at(name))

    def remove_if_empty(self) -> list[str]:
        found, folders = self._list()
        return sorted([*found, *folders])  # a prefix goes with its last key

    def unfinished_uploads(self) -> list[objput.Unfinished]:
        """The multipart uploads under this prefix never completed or aborted
        (a writer killed mid-upload): S3 only (:func:`objput.unfinished_uploads`)."""
        try:
            return objput.unfinished_uploads(self.kind, self.bucket,
                                             f"{self.key}/" if self.key else "")
        except (UcstageError, ImportError):
            raise
        except Exception as exc:  # credentials, endpoint, permissions: say which store
            raise unreadable_error(self.volume, exc) from exc

    def abort_upload(self, upload: objput.Unfinished) -> None:
        objput.abort_upload(self.kind, self.bucket, upload)

    def shown(self, key: str) -> str:
        """A key under this prefix, shown as this place's path and the rest."""
        return f"{self.path}/{key[len(self.key):].lstrip('/')}" if self.key else \
            f"{self.path}/{key}"


def place(path: str | os.PathLike[str]) -> Place:
    """The place a checkpoint path names: a local folder, ``/Volumes/...``
    through ``$UCSTAGE_VOLUMES_ROOT`` (else the platform's mount), or an
    object-store URL.

    Raises:
        InvalidArgument: an empty path, or a URL of a protocol no store serves.
    """
    volume = resolve(os.fspath(path), must_exist=False)
    if volume.is_local:
        return LocalPlace(str(volume.root))
    if not isinstance(volume.fs, objstore.ObjectFS):
        raise InvalidArgument(
            f"cannot keep checkpoints at {volume.url}: checkpoints go to a local or mounted "
            "folder or to s3://, gs:// or az:// (abfss://)",
            hint="pick one of those (obstore must be installed for object stores)")
    return StorePlace(volume)
