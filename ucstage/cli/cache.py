"""``ucstage cache``: warm, lazy, status, verify, clear, prune.

Each subcommand parses, calls one library function and renders; JSON shapes
are documented in docs/json-cache.md. ``warm`` is in :mod:`.cache_warm`,
``status``, ``verify``, ``clear`` and ``prune`` in :mod:`.cache_maint`.
"""

from __future__ import annotations

import os
import shlex

import click
from rich.console import Console

from ..cache.local import LocalCache
from ..cache.warm import job_env
from ..manifest.files import save
from ..manifest.formats import ARROW_SUFFIX
from .cache_maint import clear, prune, status, verify
from .cache_warm import warm
from .output import (
    CONTEXT,
    Group,
    counted,
    emit,
    escape,
    format_bytes,
    json_option,
    listing,
    read_source,
    source_options,
)


@click.group("cache", cls=Group, context_settings=CONTEXT)
def command() -> None:
    """Copy a volume into this node's local cache, lazily or up front, and manage it.

    The cache lives in $UCSTAGE_CACHE_DIR (default /tmp/ucstage-<uid>), one
    folder per source, mirroring the source's paths. See docs/cache.md.

    \b
    Example:
      ucstage cache warm /Volumes/main/ml/train/images --jobs 16
    """



@command.command("lazy", context_settings=CONTEXT)
@source_options
@click.option("-o", "--output", metavar="FILE", default=None,
              help="Where to write the manifest (default <cache>/<namespace>.manifest.arrow, "
                   "or .manifest.json with --format json). Written columnar (Arrow) "
                   "whatever its name, unless --format json or a name ending in .json "
                   "asks for JSON.")
@click.option("--format", "fmt", type=click.Choice(["arrow", "json"]), default=None,
              help="Manifest format: arrow (columnar, memory-mapped by every process; the "
                   "default, also with -o) or json (for people and scripts; also chosen "
                   "by an -o name ending in .json).")
@click.option("--force", is_flag=True,
              help="Replace an existing -o FILE that is not a ucstage manifest (a manifest "
                   "is replaced without it). A FILE inside SOURCE is refused even so.")
@json_option
def lazy(source: str | None, manifest_path: str | None, include: tuple[str, ...],
         exclude: tuple[str, ...], include_hidden: bool, output: str | None, fmt: str | None,
         force: bool, as_json: bool) -> None:
    """Freeze SOURCE's listing into a manifest and prepare its cache folder
    without copying anything; training code then fetches each file on first
    read. Prints how to use it, with every environment variable the training
    job needs to find the same files and the same cache.

    \b
    Example:
      ucstage cache lazy /Volumes/main/ml/train/images
    """
    cache = LocalCache()  # before listing: a bad setting fails fast
    with listing(source):
        m = read_source(source, manifest_path, include, exclude, include_hidden)
    volume = m.volume()
    ns_dir = cache.namespace_dir(volume)  # prepared once the manifest is written
    # Columnar by default: every DataLoader process of the job maps one copy.
    # Only --format json or an -o name ending in .json asks for JSON (the
    # library's save() goes by the name alone, .arrow or not).
    if fmt is None:
        fmt = "json" if output and output.lower().endswith(".json") else "arrow"
    default = f"{ns_dir}{'.manifest.json' if fmt == 'json' else ARROW_SUFFIX}"
    # save() refuses a FILE inside SOURCE, and one that is not a manifest unless forced.
    path = os.path.abspath(save(m, output or default, format=fmt, force=force))
    cache.prepare(volume)
    env = job_env(m, cache)
    data = {"source": m.source, "manifest": path, "fingerprint": m.fingerprint,
            "files": len(m.entries), "bytes": m.total_bytes, "cache_dir": cache.root,
            "namespace": ns_dir, "env": env}

    def human(console: Console) -> None:
        console.print(f"[bold]Manifest[/] {escape(path)}: {counted(len(m.entries), 'file')} "
                      f"({format_bytes(m.total_bytes)}), fingerprint {m.fingerprint[:12]}")
        console.print(f"cache folder: {ns_dir} (files are copied there on first read)",
                      markup=False)
        console.print("\nIn the training job (same node, same user):", markup=False)
        for name, value in env.items():
            console.print(f"  export {name}={shlex.quote(value)}", markup=False)
        if "://" in volume.url and not volume.url.startswith("file://"):
            scheme = volume.url.split("://", 1)[0]
            console.print(f"  # and the credentials and endpoint settings this shell uses "
                          f"for {scheme}://", markup=False)
        console.print("  from ucstage import VolumeDataset\n"
                      f"  paths = VolumeDataset({data['manifest']!r})"
                      "   # local paths; each file is copied on first read",
                      markup=False)

    emit(data, as_json, human)


for _subcommand in (warm, status, verify, clear, prune):
    command.add_command(_subcommand)
