"""The index ``ucstage pack`` writes beside its tar shards, and reading it
back at a :class:`~ucstage.data.shardset.ShardDataset`'s freeze instead of
fetching and scanning each shard.

The index is the pack's record, ``_ucstage_pack.json`` in the pack's folder
(a name starting with ``_``, so listings leave it out): what was packed
(source, listing fingerprint, options) and, per shard, its size and its
samples exactly as :func:`~ucstage.shardfiles.tarindex.index_tar` would find
them (keys, byte ranges, members). A shard's entry is used only when the
record's format is :data:`FORMAT` and the listed shard has the recorded
size; any other shard (another size, no entry, an unreadable record) is
fetched and scanned as before. The size is what a listing can check without
reading the shard: a shard rewritten to the same size is caught where the
sample is read (the cache copy's size and version, :mod:`ucstage.data.shardset`).
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Sequence
from typing import Any

from ..manifest.shardsamples import ShardSamples
from ..volumes.entry import FileEntry
from ..volumes.location import Volume
from .shardformat import shown

__all__ = ["FORMAT", "RECORD", "indexed_samples", "parse_record", "shard_index"]

FORMAT = "ucstage-pack/1"
RECORD = "_ucstage_pack.json"
"""The pack's record and index, in the pack's folder."""

_FIELDS = ("keys", "starts", "stops", "member_start", "suffixes", "offsets", "sizes")
_log = logging.getLogger("ucstage")


def shard_index(path: str, size: int, keys: list[str], starts: list[int], stops: list[int],
                member_start: list[int], suffixes: list[str], offsets: list[int],
                sizes: list[int]) -> dict[str, Any]:
    """One shard's entry of the record: its relative ``path``, its ``size``
    in bytes and its samples (the fields of
    :class:`~ucstage.shardfiles.tarindex.TarIndex`)."""
    return {"path": path, "bytes": size, "samples": len(keys), "keys": keys,
            "starts": starts, "stops": stops, "member_start": member_start,
            "suffixes": suffixes, "offsets": offsets, "sizes": sizes}


def parse_record(data: bytes) -> dict[str, Any] | None:
    """The record in ``data``, or None when it is not a pack record of
    :data:`FORMAT` (unparsable, another format, a shard entry malformed)."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        return None
    shards = record.get("shards")
    if not isinstance(shards, list) or not all(
            isinstance(s, dict) and isinstance(s.get("path"), str)
            and isinstance(s.get("bytes"), int) and all(isinstance(s.get(f), list)
                                                         for f in _FIELDS)
            for s in shards):
        return None
    return record


def _samples(shard: dict[str, Any]) -> ShardSamples | None:
    """One shard's entry as the manifest keeps it; None if inconsistent."""
    import numpy as np

    n = len(shard["keys"])
    members = len(shard["suffixes"])
    ms = shard["member_start"]
    if (len(shard["starts"]) != n or len(shard["stops"]) != n or len(ms) != n + 1
            or len(shard["offsets"]) != members or len(shard["sizes"]) != members
            or (n and (ms[0] != 0 or ms[-1] != members))):
        return None
    try:
        return ShardSamples(np.array(shard["starts"], np.int64), np.array(shard["stops"], np.int64),
                            [str(k) for k in shard["keys"]], np.array(ms, np.int64),
                            [str(s) for s in shard["suffixes"]],
                            np.array(shard["offsets"], np.int64), np.array(shard["sizes"], np.int64))
    except (TypeError, ValueError, OverflowError):
        return None


def indexed_samples(volume: Volume, entries: Sequence[FileEntry],
                    formats: Sequence[tuple[str, bool] | None]) -> dict[int, ShardSamples]:
    """The samples of those of ``entries`` (uncompressed tar shards) that a
    pack record beside them indexes with their listed size, by position in
    ``entries``. One record read per folder holding shards; a folder without
    a usable record gives nothing (its shards are scanned)."""
    folders: dict[str, list[int]] = {}
    for i, (entry, kind) in enumerate(zip(entries, formats, strict=True)):
        if kind == ("tar", False):
            folders.setdefault(posixpath.dirname(entry.path), []).append(i)
    found: dict[int, ShardSamples] = {}
    for folder, members in folders.items():
        name = posixpath.join(folder, RECORD) if folder else RECORD
        try:
            # One whole GET (a size lookup and a ranged read would be two round
            # trips, and some servers answer a range with the whole object).
            data = volume.fs.cat_file(volume.full_path(name))
        except (OSError, KeyError, ValueError, TypeError):
            continue  # no record there (or not readable now): scan those shards
        record = parse_record(data)
        if record is None:
            _log.warning("%s is not a pack index ucstage can read: the shards beside it are "
                         "scanned", shown(name))
            continue
        by_name = {s["path"]: s for s in record["shards"]}
        for i in members:
            shard = by_name.get(posixpath.basename(entries[i].path))
            if shard is not None and shard["bytes"] == entries[i].size:
                samples = _samples(shard)
                if samples is not None:
                    found[i] = samples
    return found
