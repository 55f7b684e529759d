"""A frozen listing: the files, sizes and versions of a source at one moment.

Every rank of a job can shard the same manifest while the volume changes
underneath. Two on-disk formats (docs/manifest.md): a columnar Arrow IPC file
(``*.manifest.arrow``), which every process opens memory-mapped so that a node
holds one copy of the listing in its page cache, and JSON, for people and
scripts::

    {"format": "ucstage.manifest", "format_version": 1,
     "source": "/Volumes/main/ml/train", "created": "2026-11-29T08:00:00+00:00",
     "filters": {"include": [], "exclude": [], "include_hidden": false},
     "fingerprint": "<sha256 hex>", "files_count": 2, "bytes": 300,
     "files": [["a.jpg", 100, "1764403200.0"], ["b.jpg", 200, "..."]]}

The fingerprint is the SHA-256 of the canonical listing (one
``path NUL size NUL version LF`` record per file, in listing order); it does
not depend on where the source is mounted, so ranks on different nodes agree.

One concept per module: the model (:mod:`~ucstage.manifest.model`), the Arrow
view of its files (:mod:`~ucstage.manifest.columns`), the other kind of frozen
listing, a table's row groups (:mod:`~ucstage.manifest.rowgroups`), saved and
loaded as this one; the Arrow buffer helpers both use
(:mod:`~ucstage.manifest.arrays`), the two formats
(:mod:`~ucstage.manifest.formats`) and the files they live in
(:mod:`~ucstage.manifest.files`). The names other packages and users import
are re-exported here; :func:`snapshot` lives in :mod:`ucstage.source`, which
decides once what a SOURCE names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .columns import ArrowEntries
from .files import load, save
from .formats import ARROW_SUFFIX
from .model import Manifest, fingerprint, group_manifest

if TYPE_CHECKING:  # pragma: no cover
    from ..source import snapshot

__all__ = ["ARROW_SUFFIX", "ArrowEntries", "Manifest", "fingerprint", "group_manifest", "load",
           "save", "snapshot"]


def __getattr__(name: str) -> Any:
    # snapshot opens a SOURCE, which may be a manifest file: ucstage.source sits
    # above this package, so the name is looked up there on first use.
    if name == "snapshot":
        from ..source import snapshot

        return snapshot
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
