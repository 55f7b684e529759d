"""A frozen listing: the files, sizes and versions of a source at one moment.

Every rank of a job can shard the same manifest while the volume changes
underneath. The on-disk format (documented in docs/manifest.md) is JSON::

    {"format": "ucstage.manifest", "format_version": 1,
     "source": "/Volumes/main/ml/train", "created": "2026-11-29T08:00:00+00:00",
     "filters": {"include": [], "exclude": [], "include_hidden": false},
     "fingerprint": "<sha256 hex>", "files_count": 2, "bytes": 300,
     "files": [["a.jpg", 100, "1764403200.0"], ["b.jpg", 200, "..."]]}

The fingerprint is the SHA-256 of the canonical listing (one
``path NUL size NUL version LF`` record per file, in listing order); it does
not depend on where the source is mounted, so ranks on different nodes agree.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .atomic import write_atomic
from .errors import EmptySource, InvalidArgument, ManifestError
from .volumes import FileEntry, Listing, Volume, list_files, resolve

__all__ = ["FORMAT", "MANIFEST_SUFFIX", "Manifest", "fingerprint", "is_manifest_file", "load", "save", "snapshot"]

FORMAT = "ucstage.manifest"
FORMAT_VERSION = 1


def fingerprint(entries: Iterable[FileEntry]) -> str:
    """SHA-256 hex digest of the canonical form of a listing."""
    digest = hashlib.sha256()
    for path, size, version in entries:
        digest.update(f"{path}\0{size}\0{version}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A frozen, fingerprinted listing of a source."""

    source: str
    """Where the files live: a ``/Volumes/...`` path (re-resolved on each node)
    or an absolute path or URL."""
    entries: Sequence[FileEntry]
    fingerprint: str
    created: str = ""
    filters: dict[str, Any] = field(default_factory=dict)
    path: str | None = None
    """The manifest file this was loaded from, if any."""
    refused: Sequence[tuple[str, str]] = ()
    """(path, reason) of unsafe entries left out of a fresh listing."""
    unreadable: Sequence[tuple[str, str]] = ()
    """(folder, reason) of folders a fresh listing skipped because they could
    not be read (only with ``skip_unreadable``); paths relative to the source."""

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def volume(self) -> Volume:
        """Resolve the source for reading (on this node, with this node's env)."""
        return resolve(self.source)

    @classmethod
    def from_listing(cls, listing: Listing, filters: dict[str, Any] | None = None) -> Manifest:
        vol = listing.volume
        source = vol.source if vol.source.startswith("/Volumes") else vol.url
        return cls(
            source=source,
            entries=listing.entries,
            fingerprint=fingerprint(listing.entries),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            filters=dict(filters or {}),
            refused=list(listing.refused),
            unreadable=list(listing.unreadable),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "source": self.source,
            "created": self.created,
            "filters": self.filters,
            "fingerprint": self.fingerprint,
            "files_count": len(self.entries),
            "bytes": self.total_bytes,
            "files": [list(e) for e in self.entries],
        }


def save(manifest: Manifest, path: str | os.PathLike[str]) -> str:
    """Write a manifest atomically and durably (:mod:`ucstage.atomic`); return its path."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InvalidArgument(f"{path} is a folder; give the manifest a file name, "
                              f"e.g. {os.path.join(path, 'train.manifest.json')}")
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise InvalidArgument(f"cannot write manifest {path}: {folder} is not a folder") from exc
    # One dumps() + write is several times faster than dump()'s many small writes.
    write_atomic(path, json.dumps(manifest.to_json(), ensure_ascii=False, separators=(",", ":")))
    return path


MANIFEST_SUFFIX = ".manifest.json"

# How much of each end of a file is searched for the format marker before a
# ``.json`` file is parsed: a manifest written by ucstage starts with it, one
# re-serialised with sorted keys ends near it, and a large JSON data file is
# then refused without being parsed whole.
_SNIFF = 64 * 1024


def _mapped(path: str) -> bool:
    """Whether ``path`` is read through :func:`ucstage.volumes.resolve` (a URL or
    a ``/Volumes`` path) rather than opened as written."""
    return ("://" in path or path.startswith("dbfs:")
            or path == "/Volumes" or path.startswith("/Volumes/"))


def is_manifest_file(path: str) -> bool:
    """True when the SOURCE ``path`` is read as a ucstage manifest.

    The rule (docs/manifest.md): a name ending in ``.json`` always is, wherever
    it lives (local, ``/Volumes``, URL), so a JSON file that is not a manifest
    is refused by :func:`load`, never staged as a one-file dataset; any other
    local file is when it starts like a manifest.
    """
    if path.lower().endswith(".json"):
        return _mapped(path) or not os.path.isdir(path)
    if _mapped(path) or not os.path.isfile(path):
        return False
    with open(path, "rb") as fh:
        head = fh.read(64)
    return head.lstrip().startswith(b"{") and FORMAT.encode() in head


def _not_a_manifest(path: str, why: str) -> ManifestError:
    split = posixpath.split if _mapped(path) else os.path.split
    folder, name = split(path if _mapped(path) else os.path.abspath(path))
    if name.endswith(MANIFEST_SUFFIX):
        hint = "recreate it with `ucstage cache lazy SOURCE` or manifest.save()"
    else:
        hint = ("a .json SOURCE is read as a manifest (`ucstage cache lazy` writes one); to "
                f"stage a JSON data file, give its folder {folder} with `include` {name}")
    return ManifestError(f"{path} is not a ucstage manifest ({why})", hint=hint)


def _read(path: str) -> bytes | None:
    """The manifest file's bytes; None when a large file lacks the format
    marker near either end (a data file: refused without reading it whole).
    URLs and ``/Volumes`` paths are read where they resolve to."""
    opener: Any = open
    where = path
    if _mapped(path):
        volume = resolve(path)  # a missing file: SourceNotFound says where it looked
        where = volume.full_path(volume.file) if volume.file else volume.root
        opener = open if volume.is_local else volume.fs.open
    with opener(where, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size > 2 * _SNIFF:
            fh.seek(0)
            head = fh.read(_SNIFF)
            fh.seek(size - _SNIFF)
            if FORMAT.encode() not in head and FORMAT.encode() not in fh.read(_SNIFF):
                return None
        fh.seek(0)
        return bytes(fh.read())


def load(path: str | os.PathLike[str]) -> Manifest:
    """Load a manifest and check its fingerprint.

    ``path`` is a local file, or a ``/Volumes`` path or URL read where
    :func:`ucstage.volumes.resolve` maps it.

    Raises:
        SourceNotFound: a ``/Volumes`` path or URL that does not exist (the
            message says where it was looked up).
        ManifestError: the file is missing, not a ucstage manifest (not JSON,
            or no ``"format": "ucstage.manifest"``), malformed, or its files
            do not hash to its fingerprint.
    """
    path = os.fspath(path)
    try:
        raw = _read(path)
        if raw is None:
            raise _not_a_manifest(path, f'no "format": "{FORMAT}"')
        data = json.loads(raw)
    except FileNotFoundError as exc:
        raise ManifestError(f"manifest {path} does not exist") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _not_a_manifest(path, f"not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise _not_a_manifest(path, f'no "format": "{FORMAT}"')
    if data.get("format_version") != FORMAT_VERSION:
        raise ManifestError(
            f"manifest {path} has format_version {data.get('format_version')!r}; "
            f"this ucstage reads version {FORMAT_VERSION}"
        )
    try:
        entries = [FileEntry(p, s, v) for p, s, v in data["files"]]
        if not all(type(p) is str and type(s) is int and type(v) is str for p, s, v in entries):
            raise TypeError("every file must be [path, size, version]")
        source = str(data["source"])
        expected = str(data["fingerprint"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestError(f"manifest {path} is malformed: {exc!r}") from exc
    actual = fingerprint(entries)
    if actual != expected:
        raise ManifestError(
            f"manifest {path} fails its fingerprint check (file edited or truncated)",
            hint="recreate it from the source",
        )
    return Manifest(
        source=source,
        entries=entries,
        fingerprint=expected,
        created=str(data.get("created", "")),
        filters=dict(data.get("filters") or {}),
        path=path,
    )


def snapshot(
    source: str | None = None,
    *,
    manifest: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include_hidden: bool = False,
    allow_empty: bool = False,
    skip_unreadable: bool = False,
) -> Manifest:
    """The one way commands get their file list: a saved manifest, or a fresh listing.

    ``source`` may itself be a manifest file (:func:`is_manifest_file`).
    Filters and ``skip_unreadable`` apply to fresh listings only (see
    :func:`ucstage.volumes.list_files`); a manifest is used as frozen.

    Raises:
        EmptySource: nothing is left to read (unless ``allow_empty``).
        UnreadableFolders: folders inside the source cannot be read (unless
            ``skip_unreadable``, which records them in ``Manifest.unreadable``).
    """
    if manifest is None and source is not None and is_manifest_file(source):
        manifest = source
    if manifest is not None:
        result = load(manifest)
    else:
        if source is None:
            raise ManifestError("give a `source` or a `manifest` file")
        filters = {"include": list(include), "exclude": list(exclude),
                   "include_hidden": include_hidden}
        listing = list_files(source, include=include, exclude=exclude,
                             include_hidden=include_hidden, skip_unreadable=skip_unreadable)
        result = Manifest.from_listing(listing, filters)
    if not result.entries and not allow_empty:
        where = result.path or result.source
        raise EmptySource(
            f"{where} has no files to read",
            hint="names starting with _ or . are skipped unless include_hidden; "
                 "check `include`/`exclude`",
        )
    return result
