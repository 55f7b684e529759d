"""The shard manifest: the samples inside a source's shard files, frozen,
columnar, with a fingerprint; the third kind of
:class:`~ucstage.manifest.model.Frozen` listing, saved and loaded as the
others (:mod:`ucstage.manifest.files`).

One row per sample, in file order then sample order: its file, its byte
range in the file's (decompressed) stream and, for a tar shard, its key and
members (suffix, data offset, size). The header names the source, the files
(path, size, change marker, format, gzip) and ``block_samples``.

**Blocks.** What the slot rule deals is a *block*: a run of at most
``block_samples`` consecutive samples of one file (each file cut from its
first sample). Blocks depend on the listing alone, never on the job's
layout, so a state saved on one layout resumes on another; with enough of
them, 8 shards feed 64 slots. They play the part a table's row groups play
(``rows_per_group`` is samples per block), so the table's arithmetic of
windows, equal lengths and partial resumes applies unchanged
(:mod:`ucstage.tables.rowplan`, :mod:`ucstage.data.tableslot`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from ..sharding.rule import ReadOrder
from ..volumes.entry import FileEntry
from ..volumes.location import Volume, resolved
from .arrays import int_array, large_strings, numbers, read_marked
from .model import Frozen, fails_fingerprint

if TYPE_CHECKING:
    from pyarrow.ipc import RecordBatchFileReader

__all__ = ["FORMAT", "SUFFIX", "ShardManifest", "ShardSamples"]

FORMAT = "ucstage-shards/1"
SUFFIX = ".shards.arrow"
_KEY = b"ucstage-shards"


@dataclass
class ShardSamples:
    """One file's samples as its indexer found them (numpy arrays; for a tar
    shard also keys and members, cut per sample by ``member_start``)."""

    starts: Any
    stops: Any
    keys: list[str] | None = None
    member_start: Any = None
    suffixes: list[str] = field(default_factory=list)
    offsets: Any = None
    sizes: Any = None


@dataclass(frozen=True, eq=False)
class ShardManifest(Frozen):
    """The samples of a source's shards, frozen (see the module docstring)."""

    source: str
    volume_url: str
    files: list[FileEntry]
    file_formats: list[tuple[str, bool]]
    """Per file: its format (``tar``, ``jsonl``, ``lines``) and whether gzipped."""
    block_samples: int
    sample_file: Any
    sample_start: Any
    sample_stop: Any
    keys: list[str]
    """Per sample: its key (tar shards; ``""`` for lines)."""
    member_start: Any
    """Sample ``i``'s members are ``member_start[i]:member_start[i + 1]``."""
    member_suffix: list[str]
    member_offset: Any
    member_size: Any
    fingerprint: str = ""
    path: str | None = field(default=None, compare=False)
    formats: ClassVar[tuple[str, ...]] = ("arrow",)
    suffix: ClassVar[str] = SUFFIX
    marker: ClassVar[str] = _KEY.decode()

    @classmethod
    def build(cls, source: str, volume_url: str, files: Sequence[FileEntry],
              file_formats: Sequence[tuple[str, bool]], found: Sequence[ShardSamples],
              block_samples: int) -> ShardManifest:
        """The manifest of ``files`` whose indexers found ``found``, fingerprinted."""
        import numpy as np

        counts = [len(f.starts) for f in found]

        def cat(xs: list[Any]) -> Any:
            return np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)

        member_counts = [np.diff(f.member_start) if f.member_start is not None
                         else np.zeros(len(f.starts), np.int64) for f in found]
        manifest = cls(
            source=source, volume_url=volume_url, files=list(files),
            file_formats=[(str(k), bool(g)) for k, g in file_formats],
            block_samples=int(block_samples),
            sample_file=np.repeat(np.arange(len(found), dtype=np.int32), counts),
            sample_start=cat([np.asarray(f.starts) for f in found]),
            sample_stop=cat([np.asarray(f.stops) for f in found]),
            keys=[k for f in found for k in (f.keys if f.keys is not None
                                             else [""] * len(f.starts))],
            member_start=np.concatenate([[0], np.cumsum(cat(member_counts))]).astype(np.int64),
            member_suffix=[s for f in found for s in f.suffixes],
            member_offset=cat([np.asarray(f.offsets) for f in found if f.offsets is not None]),
            member_size=cat([np.asarray(f.sizes) for f in found if f.sizes is not None]))
        object.__setattr__(manifest, "fingerprint", manifest.compute_fingerprint())
        return manifest

    # -- what the slot rule deals: blocks ---------------------------------------

    @functools.cached_property
    def _blocks(self) -> tuple[Any, Any]:
        """(first sample, samples) of every block, in file order."""
        import numpy as np

        b = self.block_samples
        firsts, counts = [], []
        bounds = np.searchsorted(self.sample_file, np.arange(len(self.files) + 1))
        for f in range(len(self.files)):
            lo, hi = int(bounds[f]), int(bounds[f + 1])
            first = np.arange(lo, hi, b, dtype=np.int64)
            firsts.append(first)
            counts.append(np.minimum(b, hi - first))
        if not firsts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(firsts), np.concatenate(counts).astype(np.int64)

    @property
    def block_first(self) -> Any:
        """Each block's first sample (int64)."""
        return self._blocks[0]

    @property
    def rows_per_group(self) -> Any:
        """Samples per block: the name the table's arithmetic reads (int64)."""
        return self._blocks[1]

    def read_order(self, order: ReadOrder) -> ReadOrder:
        """``order`` (its shuffle, seed, epoch, scope, equal length) over this
        manifest's blocks: what the slot rule deals, for the dataset and the
        plan alike. Its ``groups`` are the blocks of each shard, so a shuffle
        permutes shards and keeps each shard's blocks together (a slot reads
        its shards one after another; under the ``"node"`` scope a node keeps
        whole shards); the shuffle buffer then mixes the slot's samples."""
        return replace(order.with_n(len(self)), groups=self.blocks_per_file)

    @functools.cached_property
    def blocks_per_file(self) -> Any:
        """Blocks of each file, in listing order (int64)."""
        import numpy as np

        return np.bincount(self.sample_file[self.block_first].astype(np.int64),
                           minlength=len(self.files)).astype(np.int64)

    def block_file(self, block: int) -> int:
        return int(self.sample_file[int(self.block_first[block])])

    def __len__(self) -> int:
        """Blocks (what the slot rule deals)."""
        return len(self._blocks[0])

    @property
    def samples(self) -> int:
        return len(self.sample_start)

    def sizes(self) -> Any:
        """Bytes per block: its shard's, which is cached whole (what the
        loader's window check sizes)."""
        import numpy as np

        file_sizes = np.array([e.size for e in self.files], dtype=np.int64)
        return file_sizes[self.sample_file[self.block_first]] if len(self) else file_sizes[:0]

    @property
    def entries(self) -> list[FileEntry]:
        """One entry per block, its shard's, named ``<file>#samples-<a>-<b>``
        (sample numbers within the file; for messages)."""
        bounds = self._file_firsts
        out = []
        for first, n in zip(self.block_first.tolist(), self.rows_per_group.tolist(),
                            strict=True):
            f = int(self.sample_file[first])
            e, lo = self.files[f], first - int(bounds[f])
            out.append(FileEntry(f"{e.path}#samples-{lo}-{lo + n}", e.size, e.version))
        return out

    @functools.cached_property
    def _file_firsts(self) -> Any:
        import numpy as np

        return np.searchsorted(self.sample_file, np.arange(len(self.files) + 1))

    def file_range(self, block: int) -> tuple[int, int]:
        """Block ``block``'s sample numbers within its file: ``(first, stop)``."""
        first = int(self.block_first[block])
        lo = first - int(self._file_firsts[self.block_file(block)])
        return lo, lo + int(self.rows_per_group[block])

    def volume(self) -> Volume:
        return resolved(self.volume_url)

    # -- the file -------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "source": self.source,
            "volume": self.volume_url,
            "files": [{"path": e.path, "size": e.size, "version": e.version,
                       "format": k, "gzip": g}
                      for e, (k, g) in zip(self.files, self.file_formats, strict=True)],
            "block_samples": self.block_samples,
            "fingerprint": self.fingerprint,
        }

    def compute_fingerprint(self) -> str:
        described = {k: v for k, v in self.header().items() if k != "fingerprint"}
        h = hashlib.sha256(json.dumps(described, sort_keys=True).encode())
        for arr in (self.sample_file, self.sample_start, self.sample_stop, self.member_start,
                    self.member_offset, self.member_size):
            h.update(arr.astype("<i8").tobytes())
        for names in (self.keys, self.member_suffix):
            h.update(hashlib.sha256("\0".join(names).encode("utf-8", "surrogatepass"))
                     .digest())
        return h.hexdigest()

    def arrow_table(self) -> Any:
        """One row per sample; its members as lists; the header under ``_KEY``."""
        import pyarrow as pa

        offsets = int_array(self.member_start, pa.int64())
        table = pa.table({
            "file": int_array(self.sample_file, pa.int32()),
            "start": int_array(self.sample_start, pa.int64()),
            "stop": int_array(self.sample_stop, pa.int64()),
            "key": large_strings(self.keys),
            "member_suffix": pa.LargeListArray.from_arrays(
                offsets, large_strings(self.member_suffix)),
            "member_offset": pa.LargeListArray.from_arrays(
                offsets, int_array(self.member_offset, pa.int64())),
            "member_size": pa.LargeListArray.from_arrays(
                offsets, int_array(self.member_size, pa.int64())),
        })
        return self.with_header(table)

    @classmethod
    def from_arrow(cls, path: str, reader: RecordBatchFileReader, local_path: str | None, *,
                   verify: bool) -> ShardManifest:
        import numpy as np

        table, meta = read_marked(path, reader, _KEY, FORMAT)
        lists = table.column("member_suffix").combine_chunks()
        files = meta["files"]

        def flat(name: str) -> Any:
            return numbers(table.column(name).combine_chunks().values).astype(np.int64)

        manifest = cls(
            source=meta["source"], volume_url=meta["volume"],
            files=[FileEntry(f["path"], int(f["size"]), str(f["version"])) for f in files],
            file_formats=[(str(f["format"]), bool(f["gzip"])) for f in files],
            block_samples=int(meta["block_samples"]),
            sample_file=numbers(table.column("file")).astype(np.int32),
            sample_start=numbers(table.column("start")).astype(np.int64),
            sample_stop=numbers(table.column("stop")).astype(np.int64),
            keys=table.column("key").to_pylist(),
            member_start=numbers(lists.offsets).astype(np.int64),
            member_suffix=lists.values.to_pylist(),
            member_offset=flat("member_offset"), member_size=flat("member_size"),
            fingerprint=str(meta["fingerprint"]), path=path)
        if verify and not manifest.intact():
            raise fails_fingerprint(path)
        return manifest
