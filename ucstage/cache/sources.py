"""The cache seen from a SOURCE: what it holds for one (:func:`cached_volumes`),
checking it (:func:`verify_source`), and what a job reading a manifest through
it needs (:func:`job_env`).

The bodies ``ucstage cache status/clear/verify/lazy`` call; they take the
SOURCE as :func:`ucstage.source.open_source` decided it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

from ..errors import CacheUnusable, SourceNotFound
from ..manifest import Manifest
from ..source import ManifestSource, Source, VolumeSource, open_source
from ..volumes import VOLUMES_ROOT_ENV, Volume, is_volumes_path
from . import maintenance as maint
from .local import MAX_BYTES_ENV, LocalCache, env_max_bytes
from .paths import CACHE_DIR_ENV, user_root
from .reports import CacheStatus, SourceCheck, VerifyReport
from .space import CacheSpace, free_bytes

__all__ = ["cached_volumes", "job_env", "unusable_status", "verify_source"]


class _Finder:
    """What :func:`cached_volumes` asks of a cache, over a root not opened for writing."""

    def __init__(self, space: CacheSpace) -> None:
        self.space = space

    def find(self, source: str) -> list[Volume]:
        return maint.find(self.space, source)


def unusable_status(exc: CacheUnusable, source: str | None = None) -> CacheStatus:
    """What ``cache status`` can still say of a root :class:`LocalCache` refused
    (``exc``): the namespaces found under it (of ``source``, or all), counted
    without writing or locking anything, and why it is unusable
    (:attr:`CacheStatus.unusable`). A root that is no folder holds nothing."""
    root = exc.root
    cap = env_max_bytes()
    if not os.path.isdir(root):
        parent = os.path.dirname(root)
        while parent and not os.path.isdir(parent):
            parent = os.path.dirname(parent)
        return CacheStatus(root, 0, 0, cap, free_bytes(parent or "/"), [],
                           unusable=exc.message)
    space = CacheSpace(root)
    volumes = cached_volumes(_Finder(space), source)  # type: ignore[arg-type]
    found = maint.status(space, volumes, max_bytes=cap, locked=False)
    return dataclasses.replace(found, unusable=exc.message)


def cached_volumes(cache: LocalCache, source: str | None) -> list[Volume] | None:
    """The cached volumes ``source`` names, or None (no ``source``) for every one.

    Found as the cache recorded them (:meth:`LocalCache.find`): a source that
    is gone still names its namespace (clearing the cache of a deleted volume
    works), and a ``/Volumes/...`` path is found whatever
    $UCSTAGE_VOLUMES_ROOT says now. A manifest names its source.

    Raises:
        SourceNotFound: ``source`` neither exists nor has anything cached
            (most likely a typo).
    """
    if source is None:
        return None
    opened = open_source(source)
    if isinstance(opened, ManifestSource):
        source = opened.manifest.source
    found = cache.find(source)
    if found:
        return found
    try:
        return [opened.volume()]
    except SourceNotFound as exc:
        raise SourceNotFound(f"nothing cached for {source} (and {source} does not exist)",
                             hint="`ucstage cache status` lists the cached sources") from exc


def verify_source(cache: LocalCache, source: Source | None, *, checksum: bool = False,
                  include: Sequence[str] = (), exclude: Sequence[str] = (),
                  include_hidden: bool = False, skip_unreadable: bool = False,
                  listed: Callable[[Manifest], None] | None = None,
                  fix: bool = False) -> VerifyReport:
    """:meth:`LocalCache.verify` of what the cache holds for ``source``, or
    (None) of every cached source, each against a fresh listing.

    A volume is checked against where the cache copied it from, as
    :meth:`LocalCache.find` finds it (a ``/Volumes`` path may map elsewhere
    now), one :class:`~ucstage.cache.reports.SourceCheck` per place; a
    manifest, or a volume with nothing cached, against its own listing. The
    filters apply to those listings; ``listed`` hears each one made (to
    warn of the entries and folders it skipped). Orphans (cached files the
    source no longer has) are reported against an unfiltered fresh listing
    only, and deleted with ``fix``; a cached place that no longer exists is
    reported ``vanished``.
    """
    if source is None:
        return cache.verify(checksum=checksum, fix=fix)
    found = cache.find(source.text) if isinstance(source, VolumeSource) else []
    # A manifest is the source as it was; a filtered listing a part of it.
    complete = isinstance(source, VolumeSource) and not (include or exclude or skip_unreadable)

    def snapshot(opened: Source) -> Manifest:
        m = opened.snapshot(include=include, exclude=exclude, include_hidden=include_hidden,
                            skip_unreadable=skip_unreadable)
        if listed is not None:
            listed(m)
        return m

    if not found:
        m = snapshot(source)
        return cache.verify(m.volume(), m.entries, checksum=checksum, complete=complete, fix=fix)
    report = VerifyReport([], checksum)
    for volume in found:
        try:
            m = snapshot(open_source(volume.url))
        except SourceNotFound as exc:
            report.sources.append(SourceCheck(volume.source, vanished=exc.message))
            continue
        label = volume.source if is_volumes_path(volume.source) else m.source
        checked = cache.verify(dataclasses.replace(m.volume(), source=label), m.entries,
                               checksum=checksum, complete=complete, fix=fix)
        report.sources.extend(checked.sources)
    return report


def job_env(manifest: Manifest, cache: LocalCache) -> dict[str, str]:
    """The variables a training job needs to read ``manifest`` through ``cache``:
    the ones this process used that differ from the defaults."""
    env = {}
    root = os.environ.get(VOLUMES_ROOT_ENV, "")
    if is_volumes_path(manifest.source) and root:
        env[VOLUMES_ROOT_ENV] = root  # the manifest names /Volumes/...; this maps it
    if cache.root != user_root():
        env[CACHE_DIR_ENV] = cache.root
    if os.environ.get(MAX_BYTES_ENV, "").strip():
        env[MAX_BYTES_ENV] = os.environ[MAX_BYTES_ENV].strip()
    return env
