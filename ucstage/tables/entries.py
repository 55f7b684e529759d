"""A row group's cache entry: the byte ranges of its column chunks, named so
that it can never collide with a whole file (``ucstage.volumes.RangeEntry``).

One naming for every reader: :class:`~ucstage.TableDataset` fetches and reads
these entries, and ``ucstage cache warm --unit row-group`` warms them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ..manifest.rowgroups import RowGroupManifest
from ..volumes import RangeEntry

__all__ = ["group_entries", "group_entry"]


def group_entry(manifest: RowGroupManifest, group: int, columns: Sequence[str] | None
                ) -> RangeEntry:
    """The cache entry of row group ``group``'s chunks of ``columns`` (None:
    all), and of the listing's filter columns, which every reader tests rows on."""
    columns = manifest.fetched_columns(columns)
    f = int(manifest.file[group])
    held = manifest.file_columns(f, columns)
    name = f"rg{int(manifest.index[group])}"
    if columns is not None:
        name += "-" + hashlib.sha256("\0".join(held).encode()).hexdigest()[:12]
    return RangeEntry.of(manifest.files[f], name, tuple(manifest.ranges(group, columns)))


def group_entries(manifest: RowGroupManifest, columns: Sequence[str] | None = None
                  ) -> list[RangeEntry]:
    """Every row group's entry, in the manifest's order (the order the slot rule deals)."""
    return [group_entry(manifest, g, columns) for g in range(manifest.row_groups)]
