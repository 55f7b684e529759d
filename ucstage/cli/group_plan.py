"""``--group key`` of ``shard-plan`` and ``cache warm``: a SOURCE's files as
samples (:mod:`ucstage.manifest.groups`), and what a plan over samples shows
beyond files: the member files of each slot's samples."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from ..manifest import Manifest, group_manifest
from ..manifest.groups import KEY, Grouping, split_name
from ..sharding import ShardPlan

GROUP_HELP = ("Group files sharing a key (the path up to the first '.' of the file name) "
              "into one sample, as VolumeDataset(group=\"key\") does: samples are dealt, "
              "never split.")

group_option = click.option("--group", "group", type=click.Choice([KEY]), default=None,
                            help=GROUP_HELP)


def grouped(manifest: Manifest, group: str | None) -> Manifest:
    """The SOURCE's manifest grouped by ``group`` (unchanged without one)."""
    if group is None:
        return manifest
    return group_manifest(manifest, Grouping(group))[0]


class ItemNames:
    """``names[i]``: the path of file ``i``, or the key of sample ``i`` of a
    grouped manifest, made per access."""

    def __init__(self, manifest: Manifest) -> None:
        self._manifest = manifest

    def __getitem__(self, index: int) -> str:
        groups, entries = self._manifest.groups, self._manifest.entries
        if groups is None:
            return entries[int(index)].path
        return split_name(entries[int(groups.offsets[int(index)])].path)[0]

    def __len__(self) -> int:
        groups = self._manifest.groups
        return len(self._manifest.entries) if groups is None else groups.count


def item_sizes(manifest: Manifest) -> Any:
    """Bytes per item: per file, or per sample of a grouped manifest."""
    sizes = manifest.sizes()
    return sizes if manifest.groups is None else manifest.groups.sample_sizes(sizes)


def members_json(manifest: Manifest, p: ShardPlan) -> dict[str, Any] | None:
    """The plan's samples and member files per slot (None when not grouped)."""
    groups = manifest.groups
    if groups is None:
        return None
    members = groups.members()
    per_slot = [{"rank": s.rank, "worker": s.worker, "samples": len(s.indices),
                 "members": int(members[s.indices].sum())} for s in p.slots]
    counts = [s["members"] for s in per_slot] or [0]
    return {"by": groups.by, "samples": groups.count, "members": len(manifest.entries),
            "members_per_slot": {"min": min(counts), "mean": sum(counts) / len(counts),
                                 "max": max(counts)},
            "slots": per_slot}


def render_members(console: Console, doc: dict[str, Any] | None) -> None:
    if doc is None:
        return
    spread = doc["members_per_slot"]
    console.print(f"grouped by {doc['by']}: {doc['samples']:,} samples of "
                  f"{doc['members']:,} files; member files per slot min {spread['min']:,} / "
                  f"mean {spread['mean']:,.1f} / max {spread['max']:,}")
