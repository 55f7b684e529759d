"""The one renderer: rich for people, stable JSON for scripts; shared options."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..manifest import Manifest, snapshot
from ..units import format_bytes

F = TypeVar("F", bound=Callable[..., Any])

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

__all__ = [
    "emit",
    "err",
    "fail_found",
    "format_bytes",
    "json_option",
    "out",
    "read_source",
    "source_options",
    "table",
    "truncated_rows",
]


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True,
        help="Print one JSON document (stable schema, see docs/json.md) instead of tables.",
    )(func)


def source_options(func: F) -> F:
    """SOURCE plus --manifest/--include/--exclude/--all, the same on every command."""
    options = [
        click.argument("source", required=False, metavar="SOURCE"),
        click.option("--manifest", "manifest_path", metavar="FILE",
                     type=click.Path(dir_okay=False),
                     help="Use this frozen listing (from `ucstage cache lazy`) instead of "
                          "listing SOURCE. SOURCE may also be the manifest file itself."),
        click.option("--include", multiple=True, metavar="GLOB",
                     help="Only files matching GLOB (repeatable). A glob without / matches "
                          "the file name, with / the relative path."),
        click.option("--exclude", multiple=True, metavar="GLOB",
                     help="Skip files matching GLOB (repeatable)."),
        click.option("--all", "include_hidden", is_flag=True,
                     help="Also list names starting with _ or . (skipped by default, as Spark does)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def read_source(
    source: str | None,
    manifest_path: str | None,
    include: Sequence[str],
    exclude: Sequence[str],
    include_hidden: bool,
) -> Manifest:
    """Resolve the source options to a manifest; warn on stderr about refused entries."""
    if source is None and manifest_path is None:
        raise click.UsageError("give a SOURCE (path, /Volumes/... or URL) or --manifest FILE")
    result = snapshot(source, manifest=manifest_path, include=include, exclude=exclude,
                      include_hidden=include_hidden)
    for path, reason in result.refused[:5]:
        err.print(f"[yellow]warning:[/] skipped {escape(path)}: {escape(reason)}", markup=True)
    if len(result.refused) > 5:
        err.print(f"[yellow]warning:[/] skipped {len(result.refused) - 5} more unsafe entries")
    return result


def emit(data: dict[str, Any], as_json: bool, human: Callable[[Console], None]) -> None:
    """Print ``data`` as JSON, or call ``human`` to render it for people."""
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()
    else:
        human(out)


def fail_found(message: str) -> NoReturn:
    """The command ran and found a problem: one line on stderr, exit 1."""
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    sys.exit(1)


def table(*columns: str, title: str | None = None, numeric: bool = True) -> Table:
    """A borderless table; columns after the first are right-aligned when ``numeric``."""
    t = Table(title=title, title_justify="left", header_style="bold", box=None, pad_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="right" if numeric and i > 0 else "left")
    return t


def truncated_rows(rows: Sequence[Any], head: int = 8, tail: int = 4) -> tuple[list[Any], int]:
    """Keep tables readable: the first ``head`` and last ``tail`` rows, and how many were cut."""
    if len(rows) <= head + tail + 1:
        return list(rows), 0
    return [*rows[:head], None, *rows[-tail:]], len(rows) - head - tail

