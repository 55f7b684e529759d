"""List a source deterministically: :func:`list_files` and its :class:`Listing`.

Listing is recursive, sorted by relative POSIX path, and skips names that start
with ``_`` or ``.`` (``_SUCCESS``, ``_delta_log``, ``.crc``) unless asked not to,
as Spark and Hadoop do. Local folders are walked as ``find -L`` walks them
(links to folders inside the volume are followed, loops broken), and a folder
that cannot be read is never dropped silently: it stops the listing
(:class:`UnreadableFolders`) unless ``skip_unreadable``, which records it.
A single file is a source too: its listing is that one file. The walk
itself is the engine's (:mod:`ucstage.engines.engine`, over
:mod:`ucstage.volumes.walk`); resolving the source,
:mod:`ucstage.volumes.location`.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import params
from ..errors import SourceNotFound, SourceUnreadable, UnreadableFolders, UnsafePath
from ..shown import shown
from .entry import CANNOT_HOLD, NAME_MAX, FileEntry, uncacheable, version_of
from .location import (
    Volume,
    kind_of,
    looked_up,
    resolve,
    safe_relpath,
    single_file,
    unreadable_error,
)
from .walk import Walk

__all__ = ["FileEntry", "Listing", "UnreadableFolders", "list_files", "list_volume", "matches",
           "skip_messages"]


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


SKIPS_NAMED = 5
"""Refused entries (and unreadable folders) a listing's warnings name one by one."""


def skip_messages(source: str, refused: Sequence[tuple[str, str]],
                  unreadable: Sequence[tuple[str, str]] = ()) -> list[str]:
    """The warnings about what a listing left out: the lines the CLI prints
    and :class:`ucstage.VolumeDataset` logs, one text for both."""
    # Names come from the source and may hold ESC or CR: shown safe (ucstage.shown).
    lines = [f"skipped {shown(path)}: {shown(reason)}" for path, reason in refused[:SKIPS_NAMED]]
    if len(refused) > SKIPS_NAMED:
        lines.append(f"skipped {len(refused) - SKIPS_NAMED} more entries")
    lines += [f"skipped unreadable folder {shown(source.rstrip('/'))}/{shown(folder)} "
              f"({shown(reason)}): its files are not listed"
              for folder, reason in unreadable[:SKIPS_NAMED]]
    if len(unreadable) > SKIPS_NAMED:
        lines.append(f"skipped {len(unreadable) - SKIPS_NAMED} more unreadable folders")
    return lines


def matches(relpath: str, pattern: str) -> bool:
    """Glob match: a pattern with ``/`` matches the whole relative path, one
    without matches the file name (so ``*.jpg`` finds JPEGs at any depth)."""
    if "/" in pattern:
        return fnmatch.fnmatchcase(relpath, pattern)
    return fnmatch.fnmatchcase(posixpath.basename(relpath), pattern)


def _hidden(relpath: str) -> bool:
    return any(part[:1] in ("_", ".") for part in relpath.split("/"))


def _keep(relpath: str, include: Sequence[str], exclude: Sequence[str], hidden: bool) -> bool:
    if not hidden and _hidden(relpath):
        return False
    if include and not any(matches(relpath, p) for p in include):
        return False
    return not any(matches(relpath, p) for p in exclude)


def _refuse_uncacheable(entries: list[FileEntry], refused: list[tuple[str, str]]
                        ) -> list[FileEntry]:
    """``entries`` without the files the cache can never hold (refused, with
    the reason, here rather than by the cache in the middle of an epoch, and
    alike on every engine): :func:`~ucstage.volumes.entry.uncacheable` names,
    and a file whose path is also a folder of other kept files (``d`` beside
    ``d/e``: one cache path cannot be both; the files below are kept)."""
    paths = [e.path for e in entries]
    # Each name test of the usual listing is one C scan of all its paths at
    # once: names are looked at one by one only when one may be refused.
    joined = "/".join(paths)
    kept = entries
    if not (joined.isprintable() and joined.isascii() and not joined.startswith(".")
            and "/." not in joined and max(map(len, paths), default=0) <= NAME_MAX):
        kept = []
        for entry in entries:
            why = uncacheable(entry.path)
            if why is None:
                kept.append(entry)
            else:
                refused.append((entry.path, why))
        paths = [e.path for e in kept]
    folders: set[str] = set()
    for parent in {p.rpartition("/")[0] for p in paths}:
        while parent and parent not in folders:
            folders.add(parent)
            parent = parent.rpartition("/")[0]
    if not folders:
        return kept
    out = []
    for entry in kept:
        if entry.path in folders:
            refused.append((entry.path, f"{CANNOT_HOLD}: {entry.path} is also the folder of "
                                        "other files (they are listed)"))
        else:
            out.append(entry)
    return out


def _list_one_file(volume: Volume, include: Sequence[str], exclude: Sequence[str]) -> Listing:
    full = volume.full_path(volume.file)
    volume.fs.invalidate_cache(volume.root)
    try:
        info = volume.fs.info(full)
    except FileNotFoundError as exc:
        where = looked_up(volume.source, volume.url)
        raise SourceNotFound(f"source {volume.source} does not exist"
                             + (f" ({where})" if where else "")) from exc
    except Exception as exc:
        raise unreadable_error(volume, exc) from exc
    if volume.is_local:
        real, real_root = os.path.realpath(full), os.path.realpath(volume.root)
        if not real.startswith(real_root.rstrip(os.sep) + os.sep):
            return Listing(volume, [], [(volume.file, f"symlink to {real}, outside its folder")])
    entry = FileEntry(volume.file, int(info.get("size") or 0), version_of(info))
    # Named explicitly, so a hidden name is kept; include/exclude still apply.
    refused: list[tuple[str, str]] = []
    kept = _refuse_uncacheable([entry] if _keep(volume.file, include, exclude, True) else [],
                               refused)
    return Listing(volume, kept, refused)


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
    include: str | Iterable[str] = (),
    exclude: str | Iterable[str] = (),
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
    if isinstance(source, Volume) and not source.file and kind_of(source) == "file":
        volume = single_file(source)
    return list_volume(volume, include=include, exclude=exclude, include_hidden=include_hidden,
                       skip_unreadable=skip_unreadable)


def list_volume(
    volume: Volume,
    *,
    include: str | Iterable[str] = (),
    exclude: str | Iterable[str] = (),
    include_hidden: bool = False,
    skip_unreadable: bool = False,
) -> Listing:
    """:func:`list_files` of a volume that :func:`resolve` returned (the source
    exists, and a single file is resolved as one): nothing is looked up again."""
    # A single str is one glob, never its characters (ucstage/params.py).
    include, exclude = list(params.strings(include, "include")), \
        list(params.strings(exclude, "exclude"))
    if volume.file:
        return _list_one_file(volume, include, exclude)
    # The engine interface (which copies as well as walks: its GETs, checks
    # and paces) loads with the first listing, not with ``import
    # ucstage.volumes``: resolving a SOURCE or reading a frozen listing
    # needs none of it.
    from ..engines import engine

    root = volume.root
    walk = Walk(include_hidden)
    try:
        engine.of(volume).walk(volume, walk)
    except Exception as exc:
        raise unreadable_error(volume, exc) from exc
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
    entries = _refuse_uncacheable(entries, refused)
    entries.sort(key=lambda e: e.path)
    return Listing(volume, entries, sorted(refused), sorted(walk.unreadable))
