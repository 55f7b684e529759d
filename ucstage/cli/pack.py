"""``ucstage pack``: SOURCE's files into WebDataset tar shards in DEST
(:func:`ucstage.packing.pack` does the work; this parses and renders; the
JSON shape is docs/json.md#pack)."""

from __future__ import annotations

from typing import Any

import click
from rich.console import Console

from ..units import SIZE_HELP
from .args import group_option, size_flag
from .bars import Counting, progress_bar
from .output import CONTEXT, counted, emit, err, escape, filter_options, format_bytes, json_option


@click.command("pack", context_settings=CONTEXT)
@click.argument("source", metavar="SOURCE")
@click.argument("dest", metavar="DEST")
@filter_options
@group_option
@click.option("--shard-size", metavar="SIZE", default=None,
              help="At most about SIZE bytes per shard (a larger sample is a shard of its "
                   f"own). Default 256M unless --samples-per-shard is given; {SIZE_HELP}.")
@click.option("--samples-per-shard", type=click.IntRange(min=1), default=None, metavar="N",
              help="At most N samples per shard (with --shard-size, whichever comes first).")
@click.option("--shuffle", is_flag=True,
              help="Write the samples in a seeded order instead of the listing's, so each "
                   "shard mixes the classes.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True,
              help="The order's seed (with --shuffle).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Pack this rank's share (default $RANK, else 0).")
@click.option("-w", "--world-size", type=click.IntRange(min=1), default=None,
              help="Ranks sharing the pack (default $WORLD_SIZE, else 1). Every rank runs "
                   "the same command; the last to finish publishes DEST.")
@click.option("-j", "--jobs", type=click.IntRange(1, 256), default=None,
              help="Source files read at once (default 16 from a local or mounted folder, "
                   "64 from s3://, gs://, az://).")
@click.option("--force", is_flag=True,
              help="Pack even if DEST already holds this pack of an unchanged SOURCE. Also "
                   "replaces files added to a previous pack, and a DEST of .tar files "
                   "without a pack record (a DEST holding anything else is never replaced).")
@json_option
def command(source: str, dest: str, include: tuple[str, ...], exclude: tuple[str, ...],
            group: str | None, shard_size: str | None, samples_per_shard: int | None,
            shuffle: bool, seed: int, rank: int | None, world_size: int | None, jobs: int | None,
            force: bool, as_json: bool) -> None:
    """Write SOURCE's files into tar shards in DEST, in WebDataset's layout, with an
    index beside them; atomically, and only when SOURCE changed.

    Each file is one sample (member KEY.EXT), or with --group key the files
    sharing a key are one. The shards (shard-RRRRR-NNNNNN.tar) are read by
    the webdataset package, GNU tar and ucstage.ShardDataset, which takes the
    index (DEST/_ucstage_pack.json) instead of scanning the shards.

    The shards are written beside DEST and swapped in when complete: a
    stopped or failed pack leaves DEST as it was. Several processes or
    nodes pack disjoint shares into one DEST with --rank/--world-size (or
    torchrun's RANK/WORLD_SIZE); the last rank to finish publishes. DEST is a
    local or mounted folder.

    \b
    Examples:
      ucstage pack s3://bucket/images /data/images-packed --shuffle
      ucstage pack /Volumes/main/ml/raw/pairs /Volumes/main/ml/train/pairs --group key --shard-size 1G
      ucstage pack s3://bucket/images /mnt/shared/packed --rank 0 --world-size 4
    """
    from ..packing import pack

    size = size_flag(shard_size, "--shard-size")
    callback: Counting | None = None
    try:
        with progress_bar(not as_json, "packing") as callback:
            result = pack(source, dest, group=group, include=include, exclude=exclude,
                          shard_size=size, samples_per_shard=samples_per_shard,
                          shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                          force=force, jobs=jobs, callback=callback)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say what was done, then exit 130/143
        from ..export.interrupt import notes

        for note in notes(exc):
            err.print(f"stopped: {note}", markup=False, highlight=False)
        raise
    data = result.to_json()
    emit(data, as_json, lambda console: _render(console, data))


def _render(console: Console, data: dict[str, Any]) -> None:
    dest = escape(data["dest"])
    pack, share = data["pack"], data["share"]
    if data["skipped_unchanged"]:
        console.print(f"{dest} is up to date: {counted(pack['samples'], 'sample')} in "
                      f"{counted(pack['shards'], 'shard')}, SOURCE unchanged since it was "
                      "packed (--force packs again)")
        return
    who = f"rank {data['rank']} of {data['world_size']}: " if data["world_size"] > 1 else ""
    how = "kept from an earlier run" if share["reused"] else f"in {data['seconds']:.1f}s"
    console.print(f"{who}packed {counted(share['samples'], 'sample')} "
                  f"({counted(share['files'], 'file')}, {format_bytes(share['bytes'])}) into "
                  f"{counted(len(share['shards']), 'shard')} {how}")
    if pack is not None:
        console.print(f"published {dest}: {counted(pack['samples'], 'sample')} in "
                      f"{counted(pack['shards'], 'shard')} ({format_bytes(pack['bytes'])})")
    else:
        console.print(f"{data['parts_done']} of {data['world_size']} ranks done: the last "
                      f"rank to finish publishes {dest}")
