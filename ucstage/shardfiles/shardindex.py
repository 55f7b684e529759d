"""A shard's samples found once (:func:`index_shard`) and a block of them
read back (:func:`read_block`), whatever its format: the one dispatch from
a shard's format to its indexer and reader."""

from __future__ import annotations

from typing import Any

from ..manifest.shardsamples import ShardManifest, ShardSamples
from .lineindex import SKIPPED, index_lines, line_samples
from .shardformat import read_range
from .tarindex import index_tar, tar_samples

__all__ = ["SKIPPED", "index_shard", "read_block"]

ON_ERROR = ("raise", "skip")


def index_shard(path: str, name: str, format: str, gz: bool) -> ShardSamples:
    """The samples of the local copy ``path`` of shard ``name`` (its relative
    path, for messages), as the frozen manifest keeps them.

    Raises:
        CorruptShard: the file is not readable as ``format`` (see the
            format's indexer).
    """
    import numpy as np

    if format == "tar":
        found = index_tar(path, name, gz)
        return ShardSamples(np.array(found.starts, np.int64), np.array(found.stops, np.int64),
                            found.keys, np.array(found.member_start, np.int64), found.suffixes,
                            np.array(found.offsets, np.int64), np.array(found.sizes, np.int64))
    starts, stops = index_lines(path, name, gz, jsonl=format == "jsonl")
    return ShardSamples(starts, stops)


def read_block(manifest: ShardManifest, block: int, path: str, *, on_error: str = "raise",
               errors: list[tuple[str, int]] | None = None) -> list[Any]:
    """The samples of block ``block``, in file order, read from the local
    copy ``path`` of its shard with one range read: tar samples as
    ``{"__key__", "__shard__", suffix: bytes}``, JSON values, or ``str``s.
    Under ``on_error="skip"`` a JSON line that does not parse is
    :data:`SKIPPED`, and ``(shard, line)`` goes to ``errors``.

    Raises:
        CorruptShard: the bytes end before the indexed samples (a shard cut
            or replaced since), or a line does not parse (``"raise"``).
    """
    f = manifest.block_file(block)
    name = manifest.files[f].path
    format, gz = manifest.file_formats[f]
    lo = int(manifest.block_first[block])
    hi = lo + int(manifest.rows_per_group[block])
    starts, stops = manifest.sample_start[lo:hi], manifest.sample_stop[lo:hi]
    if format != "tar":
        return line_samples(path, gz, starts, stops, name, jsonl=format == "jsonl",
                            on_error=on_error, errors=errors if errors is not None else [])
    base = int(starts[0])
    data = read_range(path, gz, base, int(stops[-1]), name)
    ms = manifest.member_start
    members = [(int(ms[i]), int(ms[i + 1])) for i in range(lo, hi)]
    return tar_samples(data, base, manifest.keys[lo:hi], members, manifest.member_suffix,
                       manifest.member_offset, manifest.member_size, name)
