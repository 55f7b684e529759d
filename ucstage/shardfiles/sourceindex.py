"""A source's shards listed, each fetched to a local copy and indexed: the
one indexing ``ShardDataset.freeze()`` and ``ucstage shard-plan --unit
sample`` both run, so the plan deals the very blocks the dataset deals.

Core (no cache, no torch): the caller passes how a shard gets a local copy
(the dataset its cache's ``fetch``, the plan a default cache's)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import EmptySource
from ..manifest.shardsamples import ShardManifest, ShardSamples
from ..volumes.location import Fetch, remember
from .packindex import indexed_samples
from .shardformat import format_of, shown
from .shardindex import index_shard

__all__ = ["DEFAULT_BLOCK_SAMPLES", "INDEX_THREADS", "index_source"]

_log = logging.getLogger("ucstage")

DEFAULT_BLOCK_SAMPLES = 256
"""Samples per block, the unit the slot rule deals, unless told."""
INDEX_THREADS = 8
"""Shards fetched and indexed at once."""



def index_source(source: str, *, fetch: Fetch, format: str | None = None,
                 include: Sequence[str] = (), exclude: Sequence[str] = (),
                 block_samples: int) -> ShardManifest:
    """The shard manifest of ``source``: its files whose names say a shard
    format (or all, as ``format``), each fetched by ``fetch`` and indexed;
    shards that a ``ucstage pack`` index beside them describes (with their
    listed size) are taken from it, neither fetched nor scanned.

    Raises:
        EmptySource: no shard file, or shards without a sample.
        CorruptShard: a shard not readable as its format.
    """
    from ..source import snapshot

    files = snapshot(source, include=include, exclude=exclude)
    kinds = [format_of(e.path, format) for e in files.entries]
    keep = [i for i, k in enumerate(kinds) if k is not None]
    if not keep:
        raise EmptySource(f"{source} holds no shard file (.tar, .tar.gz, .tgz, "
                          ".jsonl, .jsonl.gz, .ndjson, .txt, .txt.gz)",
                          hint="pass format= to read files of another name as shards")
    if len(keep) < len(kinds):
        left = [shown(files.entries[i].path) for i in range(len(kinds)) if kinds[i] is None]
        _log.warning("left out %d of %d files of %s whose names say no shard format, "
                     "e.g. %s", len(left), len(kinds), source, ", ".join(left[:3]))
    entries = [files.entries[i] for i in keep]
    formats = [k for k in (kinds[i] for i in keep) if k is not None]
    volume = files.volume()
    remember(volume)  # the manifest's readers in this process ask for it by URL
    packed = indexed_samples(volume, entries, formats)  # `ucstage pack`'s: no fetch, no scan

    def index(i: int) -> ShardSamples:
        if i in packed:
            return packed[i]
        kind, gz = formats[i]
        return index_shard(fetch(volume, entries[i]), entries[i].path, kind, gz)

    with ThreadPoolExecutor(min(INDEX_THREADS, len(entries)),
                            thread_name_prefix="ucstage-index") as pool:
        found = list(pool.map(index, range(len(entries))))
    manifest = ShardManifest.build(files.source, volume.url, entries, formats, found,
                                   block_samples)
    if not len(manifest):
        raise EmptySource(f"the shards of {source} hold no sample")
    return manifest
