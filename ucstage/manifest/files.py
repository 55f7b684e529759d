"""Manifest files: :func:`save`, :func:`load`, and whether a SOURCE is one
(:func:`is_manifest_file`).

A manifest file holds either kind of frozen listing (files, or a table's row
groups). It is a local path, or a ``/Volumes`` path or URL read where
:func:`ucstage.volumes.resolve` maps it; its format (:mod:`ucstage.manifest.formats`)
is chosen by name when saving and by its first bytes when loading.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar, overload

from ..atomic import write_atomic
from ..errors import InvalidArgument, ManifestError, UcstageError
from ..volumes.location import is_mapped, resolve
from . import formats
from .formats import ARROW_MAGIC, ARROW_SUFFIX, not_a_manifest
from .model import FORMAT, Frozen, Manifest

__all__ = ["FORMATS", "is_manifest_file", "load", "save", "write"]

FORMATS = Manifest.formats
"""What :func:`save` writes: the columnar Arrow IPC file, or JSON (a row-group
manifest is Arrow only)."""
K = TypeVar("K", bound=Frozen)


def _format_for(path: str, format: str | None, listing: Frozen) -> str:
    """The format :func:`save` writes: ``format`` if given, else by name
    (``.arrow`` is columnar, anything else JSON where the kind has it)."""
    if format is None:
        if path.lower().endswith(".arrow") or "json" not in listing.formats:
            format = "arrow"
        else:
            return "json"
    if format not in listing.formats:
        raise InvalidArgument(f"format must be one of {listing.formats}, got {format!r}")
    if format == "arrow" and path.lower().endswith(".json"):
        raise InvalidArgument(f"{path}: a .json name is read as a JSON manifest; give an "
                              f"Arrow manifest a name ending in {listing.suffix}")
    return format


def save(manifest: Frozen, path: str | os.PathLike[str], *, format: str | None = None,
         force: bool = False) -> str:
    """Write a manifest (either kind) atomically and durably (:mod:`ucstage.atomic`);
    return its path.

    ``format`` is ``"arrow"`` (the columnar Arrow IPC file) or ``"json"``;
    by default a name ending in ``.arrow`` (``train.manifest.arrow``) is
    written columnar and any other name (``train.manifest.json``) as JSON. A
    row-group manifest is always written columnar.

    Nothing a user wrote is replaced unless ``force``: an existing file that
    is not a ucstage manifest (by its content, whatever its name) is refused.
    A path inside the manifest's own (local) source is refused even with
    ``force``: it would replace a file the manifest lists, or add one to the
    next listing.

    Raises:
        InvalidArgument: ``path`` is a folder, inside the source, or an
            existing file that is not a manifest (without ``force``).
    """
    path = os.fspath(path)
    kind = _format_for(path, format, manifest)
    _check_target(manifest, path, force)
    if os.path.isdir(path):
        raise InvalidArgument(f"{path} is a folder; give the manifest a file name, "
                              f"e.g. {os.path.join(path, 'train' + ARROW_SUFFIX)}")
    return write(manifest, path, format=kind)


def _source_place(manifest: Frozen) -> tuple[str, bool] | None:
    """Where a manifest's source is on this machine (its real path, and
    whether it is a folder), or None when it is not local. Nothing is looked
    up on a store: a loaded manifest's source is resolved without a request."""
    fresh = manifest.__dict__.get("_listed")
    try:
        volume = fresh[1] if fresh is not None else resolve(manifest.source, must_exist=False)
    except UcstageError:
        return None  # no backend for it here: not a local folder either
    if not volume.is_local:
        return None
    if volume.file:
        return os.path.realpath(volume.full_path(volume.file)), False
    # Unlooked-up, a single-file source resolves as a folder: its own path is
    # still the place, and nothing is below it.
    return os.path.realpath(volume.root), True


def _check_target(manifest: Frozen, path: str, force: bool) -> None:
    real = os.path.realpath(path)
    place = _source_place(manifest)
    if place is not None:
        where, folder = place
        if real == where or (folder and real.startswith(where.rstrip(os.sep) + os.sep)):
            raise InvalidArgument(
                f"{path} is inside the source {manifest.source}: the manifest would "
                f"{'replace a file of it' if os.path.lexists(path) else 'be listed as its data'}",
                hint="write it outside the source (by default it goes beside the cache folder)")
    if not force and os.path.isfile(path) and not _replaceable(path):
        raise InvalidArgument(f"{path} exists and is not a ucstage manifest; refusing to "
                              "replace it", hint="choose another name, or pass `force` to "
                                                 "replace it")


def write(manifest: Frozen, path: str, *, format: str = "arrow") -> str:
    """Write ``manifest`` to ``path`` in ``format`` without :func:`save`'s
    checks: for ucstage's own files under the cache root (the listings
    :class:`ucstage.VolumeDataset` and :class:`ucstage.TableDataset` freeze)."""
    kind = format
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise InvalidArgument(f"cannot write manifest {path}: {folder} is not a folder") from exc
    if kind == "arrow":
        write_atomic(path, memoryview(formats.arrow_bytes(manifest)))  # type: ignore[arg-type]
        return path
    assert isinstance(manifest, Manifest)  # only files have a JSON format (Frozen.formats)
    write_atomic(path, formats.json_text(manifest))
    return path


def is_manifest_file(path: str) -> bool:
    """True when the SOURCE ``path`` is read as a ucstage manifest.

    The rule (docs/manifest.md): a name ending in ``.json`` or ``.manifest.arrow``
    always is, wherever it lives (local, ``/Volumes``, URL), so a JSON file
    that is not a manifest is refused by :func:`load`, never staged as a
    one-file dataset; any other local file is when it starts like a manifest
    (JSON with the format marker, or an Arrow file whose schema carries it).
    """
    lower = path.lower()
    if lower.endswith(".json") or lower.endswith(ARROW_SUFFIX):
        return is_mapped(path) or not os.path.isdir(path)
    if is_mapped(path) or not os.path.isfile(path):
        return False
    return _marked(path)


def _marked(path: str, kinds: tuple[type[Frozen], ...] = (Manifest,)) -> bool:
    """Whether the local file ``path`` starts like a manifest of one of
    ``kinds`` (JSON with the format marker, or an Arrow file whose schema
    carries one)."""
    with open(path, "rb") as fh:
        head = fh.read(64)
    if head.startswith(ARROW_MAGIC):
        return formats.arrow_kind(path) in kinds
    return head.lstrip().startswith(b"{") and FORMAT.encode() in head


def _replaceable(path: str) -> bool:
    """A manifest (either kind) :func:`save` may replace without ``force``
    (an unreadable file is not known to be one)."""
    try:
        return _marked(path, formats.KINDS)
    except (OSError, ManifestError):
        return False


def _open(path: str) -> tuple[Any, str | None]:
    """An open binary file for the manifest ``path``, and its local name when
    it is a local file (memory-mapped then). A URL or ``/Volumes`` path is
    resolved once and read where it maps to (a missing one: SourceNotFound
    says where it looked)."""
    if not is_mapped(path):
        return open(path, "rb"), path
    volume = resolve(path)
    where = volume.full_path(volume.file) if volume.file else volume.root
    if volume.is_local:
        return open(where, "rb"), where
    return volume.fs.open(where, "rb"), None


@overload
def load(path: str | os.PathLike[str], *, verify: bool = True,
         expect_fingerprint: str | None = None, expect_size: int | None = None) -> Manifest: ...


@overload
def load(path: str | os.PathLike[str], *, kind: type[K], verify: bool = True,
         expect_fingerprint: str | None = None, expect_size: int | None = None) -> K: ...


def load(path: str | os.PathLike[str], *, kind: type[Frozen] = Manifest, verify: bool = True,
         expect_fingerprint: str | None = None, expect_size: int | None = None) -> Frozen:
    """Load a manifest of ``kind`` (files, columnar or JSON; or
    :class:`~ucstage.manifest.rowgroups.RowGroupManifest`) and check it.

    ``path`` is a local file, or a ``/Volumes`` path or URL read where
    :func:`ucstage.volumes.resolve` maps it. A local columnar manifest is
    memory-mapped: its rows are read from the page cache when accessed, so
    every process of a node shares one copy.

    Args:
        kind: the kind of listing the file must hold.
        verify: recompute the fingerprint from the files (the whole manifest is
            read once, one record batch at a time). ``False`` checks only the
            header of a columnar manifest: format, row count, and
            ``expect_fingerprint`` / ``expect_size`` (the file's byte size) when
            given. For workers of a process that verified the same file; a JSON
            manifest is always verified.

    Raises:
        SourceNotFound: a ``/Volumes`` path or URL that does not exist (the
            message says where it was looked up).
        ManifestError: the file is missing, not a ucstage manifest (not JSON,
            or no ``"format": "ucstage.manifest"``), malformed, its files
            do not hash to its fingerprint, or it does not match what was expected
            (another ``kind`` included).
    """
    path = os.fspath(path)
    try:
        if expect_size is not None and not is_mapped(path) and os.path.getsize(path) != expect_size:
            raise ManifestError(
                f"manifest {path} is {os.path.getsize(path):,} bytes, expected {expect_size:,} "
                "(replaced or truncated since it was frozen)",
                hint="freeze the listing again; every process must read the same manifest")
        fh, local_path = _open(path)
        with fh:
            magic = fh.read(len(ARROW_MAGIC))
            if magic == ARROW_MAGIC:
                fh.seek(0)
                result = formats.read_arrow(path, fh, local_path, kind, verify=verify)
            elif "json" not in kind.formats:
                raise not_a_manifest(path, f"not an Arrow file with the {kind.marker} header")
            else:
                raw = formats.json_bytes(fh)
                if raw is None:
                    raise not_a_manifest(path, f'no "format": "{FORMAT}"')
                result = formats.parse_json(path, raw)
    except FileNotFoundError as exc:
        raise ManifestError(f"manifest {path} does not exist") from exc
    except OSError as exc:
        raise not_a_manifest(path, f"cannot be read: {exc}") from exc
    if expect_fingerprint is not None and result.fingerprint != expect_fingerprint:
        raise ManifestError(
            f"manifest {path} holds fingerprint {result.fingerprint[:12]}, expected "
            f"{expect_fingerprint[:12]} (replaced since it was frozen)",
            hint="freeze the listing again; every process must read the same manifest")
    return result

