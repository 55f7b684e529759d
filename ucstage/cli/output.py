"""The one renderer: rich for people, stable JSON for scripts; shared options."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
from rich import markup
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..cache.warm import WARM_FEWER
from ..errors import CacheFull, UcstageError
from ..manifest.model import Manifest
from ..planning import read_row_groups, read_shards
from ..shown import UNSAFE, shown
from ..source import ManifestSource, Source, VolumeSource, open_source
from ..units import format_bytes
from ..volumes.listing import skip_messages

if TYPE_CHECKING:
    from ..manifest.rowgroups import RowGroupManifest

F = TypeVar("F", bound=Callable[..., Any])

def escape(text: str) -> str:
    """``text`` (a name, a message) for a rich markup string: shown safe
    (:func:`ucstage.shown.shown`: ESC, CR, LF... as backslash escapes) and its
    markup escaped. Every renderer puts names through this."""
    return markup.escape(shown(text))


_LAYOUT = re.compile("(\n)")


class _Console(Console):
    """rich's Console, plus what a log file needs when output is not a terminal:
    tables at their full width (never cut with "…") and no trailing spaces;
    and no control character of any text printed reaches the terminal."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # Every str printed (cells of tables too) becomes a Text here: a name
        # that missed :func:`escape` is still shown safe. A LF is the
        # renderer's own line break here; names have theirs escaped by escape().
        if UNSAFE.search(text) is not None:
            text = "".join(part if part == "\n" else shown(part) for part in _LAYOUT.split(text))
        return super().render_str(text, **kwargs)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.is_terminal:
            self.width = 10_000  # a log has no width; 80 columns would cut paths

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self.is_terminal or not any(isinstance(o, Table) for o in objects):
            super().print(*objects, **kwargs)
            return
        with self.capture() as captured:
            super().print(*objects, **kwargs)
        self.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        self.file.flush()

    def on_broken_pipe(self) -> None:
        # `ucstage ... | head`: the reader left. rich exits 1 here, which would
        # read as "found a problem"; exit as the shell's own tools do instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(141)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)

__all__ = [
    "CONTEXT",
    "JSON_META",
    "counted",
    "emit",
    "err",
    "error_hint",
    "escape",
    "fail_found",
    "filter_options",
    "format_bytes",
    "json_option",
    "json_text",
    "listing",
    "out",
    "print_error",
    "read_source",
    "refuse_filters_of_frozen",
    "shard_source",
    "skip_unreadable_given",
    "source_of",
    "source_options",
    "table",
    "table_source",
    "truncated_rows",
    "warn_skipped",
]

CONTEXT: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
"""Every command's context settings: ``-h`` is ``--help`` too."""


JSON_META = "ucstage.json"


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # The error handler in app.py reads this to answer errors in JSON too.
    if value:
        ctx.meta[JSON_META] = True
    return value


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, callback=_remember_json,
        help="Print one JSON document instead of tables (stable schema: docs/json.md "
             "lists every command's).",
    )(func)


SKIP_UNREADABLE_META = "ucstage.skip_unreadable"


def _remember_skip(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    # Kept out of the command's arguments: read_source reads it from here, so
    # every command taking a SOURCE gets the option without a parameter of its own.
    if value:
        ctx.meta[SKIP_UNREADABLE_META] = True
    return value


FILTER_OPTIONS = (
    click.option("--include", multiple=True, metavar="GLOB",
                 help="Only files matching GLOB (repeatable). A glob without / matches "
                      "the file name, with / the relative path."),
    click.option("--exclude", multiple=True, metavar="GLOB",
                 help="Skip files matching GLOB (repeatable)."),
)
"""``--include``/``--exclude``: part of :func:`source_options`, and ``pack``'s."""


def filter_options(func: F) -> F:
    """``--include GLOB`` and ``--exclude GLOB``, as every command taking a SOURCE has them."""
    for option in reversed(FILTER_OPTIONS):
        func = option(func)
    return func


def source_options(func: F) -> F:
    """SOURCE plus --manifest/--include/--exclude/--all/--skip-unreadable, the
    same on every command."""
    options = [
        click.argument("source", required=False, metavar="SOURCE"),
        click.option("--manifest", "manifest_path", metavar="FILE",
                     type=click.Path(dir_okay=False),
                     help="Use this frozen listing (from `ucstage cache lazy`) instead of "
                          "listing SOURCE. SOURCE may also be the manifest file itself."),
        *FILTER_OPTIONS,
        click.option("--all", "include_hidden", is_flag=True,
                     help="Also list names starting with _ or . (skipped by default, as Spark does)."),
        click.option("--skip-unreadable", "skip_unreadable", is_flag=True, expose_value=False,
                     callback=_remember_skip,
                     help="List the rest when folders inside SOURCE cannot be read, with a "
                          "warning naming them. Without it such a folder stops the command "
                          "(exit 1), so no files go missing unnoticed."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def source_of(source: str | None, manifest_path: str | None) -> Source:
    """What SOURCE or ``--manifest FILE`` names, decided once
    (:func:`ucstage.source.open_source`); refuses neither and both."""
    if source is None and manifest_path is None:
        raise click.UsageError("give a SOURCE (path, /Volumes/... or URL) or --manifest FILE")
    if source is not None and manifest_path is not None:
        raise click.UsageError("give SOURCE or --manifest FILE, not both (the manifest "
                               "already names its source)")
    return open_source(source, manifest=manifest_path)


def read_source(
    source: str | Source | None,
    manifest_path: str | None,
    include: Sequence[str],
    exclude: Sequence[str],
    include_hidden: bool,
    skip_unreadable: bool | None = None,
) -> Manifest:
    """Resolve the source options to a manifest; warn on stderr about refused
    entries and skipped folders. ``source`` may be what :func:`source_of`
    returned. ``skip_unreadable`` defaults to the running command's
    ``--skip-unreadable``."""
    if skip_unreadable is None:
        skip_unreadable = skip_unreadable_given()
    opened = (source if isinstance(source, (VolumeSource, ManifestSource))
              else source_of(source, manifest_path))
    refuse_filters_of_frozen(opened, include, exclude, include_hidden, skip_unreadable)
    result = opened.snapshot(include=include, exclude=exclude, include_hidden=include_hidden,
                             skip_unreadable=skip_unreadable)
    warn_skipped(result)
    return result


def table_source(source: str | None, manifest_path: str | None, version: int | None,
                 filter: str | None = None) -> Any:
    """The row groups of a table SOURCE or of ``--manifest FILE.rowgroups.arrow``
    (:func:`ucstage.planning.read_row_groups`); refuses neither and both. Warns
    on stderr about the folder's entries the listing refused."""
    if (source is None) == (manifest_path is None):
        raise click.UsageError("give a table SOURCE or --manifest FILE.rowgroups.arrow")
    result = read_row_groups(source, manifest_path, version, filter)
    warn_skipped(result)
    return result


def shard_source(source: str | None, manifest_path: str | None, include: Sequence[str],
                 exclude: Sequence[str], format: str | None, block_samples: int | None) -> Any:
    """The samples of a shard SOURCE or of ``--manifest FILE.shards.arrow``
    (:func:`ucstage.planning.read_shards`); refuses neither and both."""
    if (source is None) == (manifest_path is None):
        raise click.UsageError("give a SOURCE of shards or --manifest FILE.shards.arrow")
    return read_shards(source, manifest_path, include, exclude, format, block_samples)


def skip_unreadable_given() -> bool:
    """Whether the running command was given ``--skip-unreadable``."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx and ctx.meta.get(SKIP_UNREADABLE_META))


def refuse_filters_of_frozen(opened: Source, include: Sequence[str], exclude: Sequence[str],
                             include_hidden: bool, skip_unreadable: bool) -> None:
    """A manifest is used as frozen: listing options given with one are a usage error."""
    if opened.frozen and (include or exclude or include_hidden or skip_unreadable):
        raise click.UsageError("--include/--exclude/--all/--skip-unreadable apply to a fresh "
                               "listing; a manifest is used as frozen (filter when you make it)")


def warn_skipped(result: Manifest | RowGroupManifest) -> None:
    """Warn on stderr about the entries a listing refused and the folders it skipped."""
    # The library's text (VolumeDataset and TableDataset log the same lines).
    unreadable = result.unreadable if isinstance(result, Manifest) else ()
    for line in skip_messages(result.source, result.refused, unreadable):
        err.print(f"[yellow]warning:[/] {escape(line)}", markup=True)


@contextmanager
def listing(source: str | None) -> Iterator[None]:
    """Say what was done when Ctrl-C or SIGTERM stops a listing (nothing yet)."""
    try:
        yield
    except KeyboardInterrupt:
        what = f"listing {source}" if source is not None else "reading the manifest"
        err.print(f"stopped while {what}: nothing written or copied", markup=False)
        raise


def counted(count: int, noun: str, plural: str = "") -> str:
    """``1 file``, ``2 files``: a count with its noun in the right number."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


_JSON_UNSAFE = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def json_text(data: Any) -> str:
    """``data`` as the indented JSON every ``--json`` prints. Names stay raw
    (a script gets the key as it is); what a terminal would act on is
    written as a ``\\uXXXX`` escape: JSON escapes C0 controls itself, and
    DEL, C1 controls and bidi overrides (which only occur inside strings)
    are escaped here, to the same value."""
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"


def emit(data: dict[str, Any], as_json: bool, human: Callable[[Console], None]) -> None:
    """Print ``data`` as JSON, or call ``human`` to render it for people."""
    if as_json:
        sys.stdout.write(json_text(data))
        sys.stdout.flush()
    else:
        human(out)


def print_error(message: str, hint: str = "") -> None:
    """The one shape of every error: an ``error:`` line and an optional ``hint:`` line."""
    err.print(f"[bold red]error:[/] {escape(message)}", markup=True)
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}", markup=True)


def fail_found(message: str, hint: str = "") -> NoReturn:
    """The command ran and found a problem (its report is already out): exit 1."""
    print_error(message, hint)
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


COMMAND_META = "ucstage.command"


class Group(click.Group):
    """A command group that remembers which command it ran, so the one error
    mapper in :mod:`ucstage.cli.app` can speak that command's flags."""

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None:
            ctx.meta[COMMAND_META] = cmd
        return name, cmd, rest


def flag_names(message: str, command: click.Command | None) -> str:
    """Say the library's parameter names in ``message`` as ``command``'s flags.

    The library raises ``max_seconds must be positive``; a person at the
    terminal typed ``--max-seconds``, so that is what the line says. Only
    options of the command that ran are translated: a ``snake_case`` name
    wherever it stands; a one-word name (``files``) when it opens the message
    or is written in backquotes (``check `include`/`exclude` ``), where it
    names the parameter and not the thing.
    """
    if command is None:
        return message
    for param in command.params:
        longs = [o for o in getattr(param, "opts", []) if o.startswith("--")]
        if not isinstance(param, click.Option) or not param.name or not longs:
            continue
        message = message.replace(f"`{param.name}`", longs[0])
        if "_" in param.name:
            message = re.sub(rf"(?<![\w-]){re.escape(param.name)}(?![\w-])", longs[0], message)
        elif message.startswith(param.name + " "):
            message = longs[0] + message[len(param.name):]
    return message


FEWER_FILES_FLAGS = ("--include", "--rank")
"""The flags that choose fewer files to warm, named after a library hint that
ends in :data:`ucstage.cache.warm.WARM_FEWER` on the commands that have them."""


def error_hint(exc: UcstageError, command: click.Command | None) -> str:
    """``exc``'s hint in ``command``'s terms (:func:`flag_names`); where warming
    fewer files would help, it also names the command's flags that choose them."""
    hint = exc.hint
    flags = {o for p in (command.params if command else []) for o in getattr(p, "opts", [])}
    if isinstance(exc, CacheFull) and hint.endswith(WARM_FEWER) \
            and flags.issuperset(FEWER_FILES_FLAGS):
        hint += f" ({', '.join(FEWER_FILES_FLAGS)})"
    return flag_names(hint, command)
