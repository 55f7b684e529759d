"""WebDataset tar shards: their samples found from the member headers, and
read back from a byte range.

A sample is a run of consecutive regular-file members sharing a key, as
WebDataset groups them: the key is the member path up to the first ``.`` of
its base name, the suffix the rest (``d/0001.seg.png``: key ``d/0001``,
suffix ``seg.png``; one rule with grouped files, :func:`ucstage.manifest.groups.split_name`).
Other members (folders, links) belong to no sample. Headers are parsed by
the standard library's :mod:`tarfile` (ustar, GNU long names, pax), which
seeks past each member's data, so indexing reads the headers only (a gzip
shard is decompressed once).
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptShard
from ..manifest.groups import split_name
from .shardformat import GZIP_ERRORS, cut_gzip, open_stream, shown

__all__ = ["TarIndex", "index_tar", "tar_samples"]

BLOCK = 512


@dataclass
class TarIndex:
    """One shard's samples, in order: each one's key and byte range, and its
    members (suffix, data offset, size) as flat lists cut by ``member_start``."""

    keys: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    stops: list[int] = field(default_factory=list)
    member_start: list[int] = field(default_factory=lambda: [0])
    suffixes: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


def index_tar(path: str, name: str, gz: bool) -> TarIndex:
    """The samples of the tar shard at local ``path`` (``name``: its relative
    path, for messages).

    Raises:
        CorruptShard: a truncated tar (a member whose data runs past the end,
            a header cut short, no end-of-archive marker), a gzip stream cut
            short, or two members of one sample with the same suffix.
    """
    found = TarIndex()
    try:
        with open_stream(path, gz) as fh:
            try:
                archive = tarfile.open(fileobj=fh, mode="r:")  # noqa: SIM115 (a with below)
            except tarfile.ReadError as exc:
                fh.seek(0)
                if fh.read(BLOCK)[257:262] == b"ustar":  # a tar header, then too little
                    raise CorruptShard(f"tar shard {shown(name)} is truncated: its first "
                                       f"member is cut short ({exc})",
                                       hint="the file was cut short: write or copy it "
                                            "again") from None
                raise CorruptShard(f"shard {shown(name)} is not a tar file ({exc})",
                                   hint="give format= for a shard whose name does not say "
                                        "its format") from None
            with archive:
                current: dict[str, int] = {}
                for info in _members(archive, name):
                    if not info.isreg():
                        continue
                    key, suffix = split_name(info.name)
                    if not found.keys or key != found.keys[-1]:
                        if found.keys:
                            found.member_start.append(len(found.suffixes))
                        found.keys.append(key)
                        found.starts.append(info.offset)
                        found.stops.append(info.offset_data + info.size)
                        current = {}
                    if suffix in current:
                        raise CorruptShard(
                            f"shard {shown(name)} holds two members {shown(info.name)} in one "
                            f"sample (key {shown(key)}): a sample has one member per suffix")
                    current[suffix] = 1
                    found.suffixes.append(suffix)
                    found.offsets.append(info.offset_data)
                    found.sizes.append(info.size)
                    found.stops[-1] = info.offset_data + info.size
                end = archive.offset
                fh.seek(end)
                marker = fh.read(BLOCK)
    except GZIP_ERRORS as exc:
        raise cut_gzip(name, exc) from None
    if found.keys:
        found.member_start.append(len(found.suffixes))
    if len(marker) < BLOCK or marker.count(0) != BLOCK:
        raise CorruptShard(f"tar shard {shown(name)} is truncated: no end-of-archive marker "
                           f"after its last member (byte {end:,})",
                           hint="the file was cut short (an interrupted copy or write): "
                                "write or copy it again")
    return found


def _members(archive: tarfile.TarFile, name: str) -> Any:
    """The archive's members; a header or data cut short is CorruptShard."""
    while True:
        try:
            info = archive.next()
        except tarfile.ReadError as exc:
            # tarfile says "unexpected end of data" when a member's data runs
            # past the end of the file (it checks the last byte is there).
            raise CorruptShard(f"tar shard {shown(name)} is truncated: {exc} (a member's "
                               f"data runs past the end of the file, after byte "
                               f"{archive.offset:,})",
                               hint="the file was cut short: write or copy it again") from None
        if info is None:
            return
        yield info


def tar_samples(data: bytes, base: int, keys: list[str], members: list[tuple[int, int]],
                suffixes: list[str], offsets: Any, sizes: Any, shard: str) -> list[dict[str, Any]]:
    """The samples whose bytes ``data`` holds (from stream offset ``base``),
    as WebDataset yields them: ``{"__key__", "__shard__", suffix: bytes}``.
    ``members[i]``: sample ``i``'s (first, stop) in the member lists."""
    out = []
    for key, (lo, hi) in zip(keys, members, strict=True):
        sample: dict[str, Any] = {"__key__": key, "__shard__": shard}
        for m in range(lo, hi):
            at = int(offsets[m]) - base
            sample[suffixes[m]] = data[at:at + int(sizes[m])]
        out.append(sample)
    return out
