"""A SOURCE, decided once: a volume to list, or a frozen manifest.

Commands and :class:`ucstage.VolumeDataset` take a SOURCE string: a volume
path, URL or folder, or a manifest file (:func:`ucstage.manifest.files.is_manifest_file`,
or ``--manifest FILE``). :func:`open_source` decides which, once, and returns
one typed value:

* :class:`VolumeSource`: files to list; it resolves its volume once, and
  :meth:`VolumeSource.snapshot` lists it into a fresh manifest that keeps that
  volume (:meth:`ucstage.manifest.Manifest.volume`);
* :class:`ManifestSource`: a manifest file, loaded once, used as frozen; its
  volume is its source resolved on first use (``shard-plan`` of a manifest
  made on another machine never needs it).

After that no module asks again what the SOURCE is. :func:`snapshot` is the
two steps in one call.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from .errors import EmptySource, ManifestError
from .manifest.files import is_manifest_file, load
from .manifest.model import Manifest
from .volumes.listing import list_volume
from .volumes.location import Volume, resolve

__all__ = ["ManifestSource", "Source", "VolumeSource", "open_source", "snapshot"]


@dataclass(frozen=True)
class VolumeSource:
    """A SOURCE that names files to list: a volume path, URL or folder (or one file)."""

    text: str
    """The SOURCE as given."""
    frozen: ClassVar[bool] = False
    """Whether the file list is frozen already (it is listed on :meth:`snapshot`)."""

    @functools.cached_property
    def _volume(self) -> Volume:
        return resolve(self.text)

    def volume(self) -> Volume:
        """The volume the SOURCE resolves to (on first call; then the same one).

        Its ``source`` is the SOURCE as given; the manifest :meth:`snapshot`
        makes keeps the same volume named as the manifest names its source
        (a ``/Volumes`` path as given, anything else by where it resolved).

        Raises:
            SourceNotFound: the location does not exist.
        """
        return self._volume

    def snapshot(self, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 include_hidden: bool = False, skip_unreadable: bool = False,
                 allow_empty: bool = False) -> Manifest:
        """List the volume now (:func:`ucstage.volumes.list_files`) into a fresh manifest."""
        filters = {"include": list(include), "exclude": list(exclude),
                   "include_hidden": include_hidden}
        listing = list_volume(self.volume(), include=include, exclude=exclude,
                              include_hidden=include_hidden, skip_unreadable=skip_unreadable)
        return _nonempty(Manifest.from_listing(listing, filters), allow_empty)


@dataclass(frozen=True)
class ManifestSource:
    """A SOURCE that names a manifest file: a frozen listing and its volume."""

    path: str
    """The manifest file as given: a local path, a ``/Volumes`` path or a URL."""
    frozen: ClassVar[bool] = True

    @functools.cached_property
    def manifest(self) -> Manifest:
        """The manifest, loaded and verified on first use (:func:`ucstage.manifest.load`)."""
        return load(self.path)

    @functools.cached_property
    def _volume(self) -> Volume:
        return self.manifest.volume()

    def volume(self) -> Volume:
        """The volume the manifest's files are read from: its source, resolved
        on this node on first call."""
        return self._volume

    def snapshot(self, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
                 include_hidden: bool = False, skip_unreadable: bool = False,
                 allow_empty: bool = False) -> Manifest:
        """The manifest, used as frozen: filters apply to fresh listings only
        and are ignored here (filter when the manifest is made)."""
        return _nonempty(self.manifest, allow_empty)


Source = VolumeSource | ManifestSource
"""What a SOURCE names, as :func:`open_source` decided it."""


def open_source(source: str | os.PathLike[str] | None = None, *,
                manifest: str | os.PathLike[str] | None = None) -> Source:
    """Decide what a SOURCE names: a manifest file or files to list.

    Nothing is read or resolved yet beyond what telling them apart takes (a
    name, or the first bytes of a local file): each value loads or resolves
    what it names on first use, once.

    Args:
        source: a volume path, URL, local path, or a manifest file.
        manifest: a manifest file given as such (``--manifest FILE``); it wins
            over ``source``.

    Raises:
        ManifestError: neither was given.
    """
    if manifest is not None:
        return ManifestSource(os.fspath(manifest))
    if source is None:
        raise ManifestError("give a `source` or a `manifest` file")
    text = os.fspath(source)
    return ManifestSource(text) if is_manifest_file(text) else VolumeSource(text)


def snapshot(
    source: str | os.PathLike[str] | Source | None = None,
    *,
    manifest: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include_hidden: bool = False,
    allow_empty: bool = False,
    skip_unreadable: bool = False,
) -> Manifest:
    """The one way commands get their file list: a saved manifest, or a fresh listing.

    ``source`` may itself be a manifest file (:func:`ucstage.manifest.files.is_manifest_file`),
    or what :func:`open_source` returned. Filters and ``skip_unreadable`` apply
    to fresh listings only (see :func:`ucstage.volumes.list_files`); a
    manifest is used as frozen.

    Raises:
        EmptySource: nothing is left to read (unless ``allow_empty``).
        UnreadableFolders: folders inside the source cannot be read (unless
            ``skip_unreadable``, which records them in ``Manifest.unreadable``).
    """
    opened = (source if isinstance(source, (VolumeSource, ManifestSource))
              else open_source(source, manifest=manifest))
    return opened.snapshot(include=include, exclude=exclude, include_hidden=include_hidden,
                           skip_unreadable=skip_unreadable, allow_empty=allow_empty)


def _nonempty(result: Manifest, allow_empty: bool) -> Manifest:
    if not result.entries and not allow_empty:
        where = result.path or result.source
        raise EmptySource(
            f"{where} has no files to read",
            hint="names starting with _ or . are skipped unless include_hidden; "
                 "check `include`/`exclude`",
        )
    return result
