"""The options several commands share, and parsing flags into what the library takes.

The library speaks Python (``plan(num_workers=[6, 4])``); comma lists are a
command-line convenience, so they are parsed here and nowhere else. Errors
name the flag, since the person reading them typed it: directly, or, where
the check is the library's (``parse_modes``), through the CLI's error mapper.
The shared options (``--shuffle-scope``, ``--nproc-per-node``, ``--group``,
``--unit`` and the table's) have one help text here for every command.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ..errors import InvalidArgument
from ..manifest.groups import KEY
from ..planning import PLAN_UNITS, UNITS
from ..sharding.rule import SHUFFLE_SCOPES
from ..units import parse_size

__all__ = ["NPROC_HELP", "Seconds", "column_list", "float_list", "given", "group_option",
           "int_list", "nproc_option", "num_workers_list", "parse_modes", "parse_workers",
           "row_group_options", "shuffle_scope_option", "size_flag", "warm_options"]

F = TypeVar("F", bound=Callable[..., Any])


def column_list(value: str | None) -> list[str] | None:
    """``"id,text"`` -> ``["id", "text"]`` (None stays None); an empty name is refused."""
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if any(not p for p in parts):
        raise InvalidArgument(f"empty column name in {value!r}",
                              hint="separate column names with single commas")
    return parts


def int_list(text: str, flag: str, *, minimum: int, example: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``; every value a whole number >= ``minimum``."""
    tokens = [t.strip() for t in text.split(",")]
    if not any(tokens):
        raise InvalidArgument(f"{flag} is empty; give e.g. {example}")
    values: list[int] = []
    for token in tokens:
        try:
            value = int(token)
        except ValueError:
            value = None
        if value is None or value < minimum or str(value) != token.lstrip("+"):
            kind = "positive whole numbers" if minimum == 1 else f"whole numbers >= {minimum}"
            raise InvalidArgument(f"{flag} must be {kind} separated by commas, e.g. {example}; "
                                  f"got {token!r}")
        values.append(value)
    return values


def float_list(text: str, flag: str, *, example: str) -> list[float]:
    """``"0.7,0.3"`` -> ``[0.7, 0.3]``; the library checks the values' ranges."""
    values: list[float] = []
    for token in (t.strip() for t in text.split(",")):
        try:
            values.append(float(token))
        except ValueError:
            raise InvalidArgument(f"{flag} must be numbers separated by commas, e.g. {example}; "
                                  f"got {token!r}") from None
    return values


def num_workers_list(text: str) -> list[int]:
    """``-k 6`` or ``-k 6,4``: one value for every rank, or one per rank."""
    return int_list(text, "--num-workers", minimum=0, example="6 or 6,6,4,6")


def parse_workers(text: str) -> list[int]:
    """``bench -w 4,1,2`` -> ``[1, 2, 4]``: whole numbers, deduplicated, ascending.

    0 parses (DataLoader ``num_workers=0`` in loader mode); the library refuses
    it for the thread modes, knowing which modes run.
    """
    return sorted(set(int_list(text, "--workers", minimum=0, example="1,2,4,8")))


def parse_modes(text: str) -> list[str]:
    """``bench -m warm,direct`` -> ``["direct", "warm"]``, in measuring order.

    The names are checked by the library, the one list of modes; its message
    says ``modes``, which the CLI's error mapper turns into ``--modes``.
    """
    from ..bench.settings import check_modes  # bench's own: not loaded for other commands

    return check_modes(text.split(","))


def size_flag(value: str | None, flag: str) -> int | None:
    """A size flag (``500M``, ``20G``) in bytes; None when not given. A bad
    value's error names ``flag`` (an option, or the variable it came from)."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{flag}: {exc.message}", exc.hint) from None


class Seconds(click.FloatRange):
    """A number of seconds: finite, and in range. click's ``FloatRange`` lets
    ``nan`` through (no comparison with nan is true) and ``inf`` too; both
    reached the library as a value it then refused per request (or
    overflowed on), so they are refused here, naming the flag (exit 2)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None
                ) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return super().convert(number, param, ctx)


def given(names: Sequence[str]) -> list[str]:
    """The options among ``names`` given on the running command's line (a
    default is no choice: a rule that refuses an option refuses it only given)."""
    ctx = click.get_current_context()
    return [n for n in names
            if ctx.get_parameter_source(n) not in (None, ParameterSource.DEFAULT)]


SCOPE_HELP = ("With --shuffle: node (default) assigns files to nodes once per seed and "
              "shuffles within each node, so a node's cache serves every epoch; global "
              "deals one permutation over the whole job, so every epoch hands each node "
              "other files. See docs/training.md.")
NPROC_HELP = ("Ranks per node (torchrun's --nproc-per-node): node = rank // P. Without it "
              "the whole job is one node, where both scopes are the same rule.")


def shuffle_scope_option(func: F) -> F:
    """``--shuffle-scope node|global``; None when not given (the library's default)."""
    return click.option("--shuffle-scope", type=click.Choice(SHUFFLE_SCOPES), default=None,
                        help=SCOPE_HELP)(func)


def nproc_option(func: F) -> F:
    """``--nproc-per-node P``."""
    return click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
                        metavar="P", help=NPROC_HELP)(func)


group_option = click.option(
    "--group", "group", type=click.Choice([KEY]), default=None,
    help="Group files sharing a key (the path up to the first '.' of the file name) into one "
         "sample, as VolumeDataset(group=\"key\") does: samples are dealt, never split.")
"""``--group key`` of ``shard-plan`` and ``cache warm``."""

UNIT_HELP = ("What the slot rule deals: files, or the row groups of a table SOURCE (a "
             "Parquet folder, an export destination, a Delta table path or "
             "catalog.schema.table), as TableDataset reads it.")


def _options(func: F, options: list[Callable[[F], F]]) -> F:
    for option in reversed(options):
        func = option(func)
    return func


def _table_options(func: F, *, columns_help: str, units: tuple[str, ...] = UNITS,
                   unit_help: str = UNIT_HELP) -> F:
    """``--unit``, ``--columns`` and ``--version``."""
    return _options(func, [
        click.option("--unit", type=click.Choice(units), default="file", show_default=True,
                     help=unit_help),
        click.option("--columns", metavar="A,B,...", default=None, help=columns_help),
        click.option("--version", "version", type=int, default=None, metavar="N",
                     help="With --unit row-group: this Delta table version (default: "
                          "the latest)."),
        click.option("--filter", "filter", metavar="EXPR", default=None,
                     help="With --unit row-group: only the row groups that can hold a row "
                          "EXPR matches, as TableDataset(filter=...) lists them, e.g. "
                          "\"label >= 3 and split = 'train'\"."),
    ])


def warm_options(func: F) -> F:
    """What ``cache warm`` takes for a table: ``--unit``, ``--columns``, ``--version``."""
    return _table_options(func, columns_help="With --unit row-group: warm only these "
                          "columns' chunks (pass the same columns to TableDataset).")


def row_group_options(func: F) -> F:
    """``--unit``, what a row-group plan takes (``--batch-rows``,
    ``--equal-length``, ``--columns``, ``--version``) and a sample plan
    (``--format``, ``--block-samples``, ``--equal-length``)."""
    func = _table_options(func, columns_help="With --unit row-group: count only these "
                          "columns' bytes.", units=PLAN_UNITS,
                          unit_help=UNIT_HELP[:-1] + ", or the samples inside shard files "
                          "(tar, JSON Lines, text), as ShardDataset reads them.")
    return _options(func, [
        click.option("--batch-rows", type=int, default=None, metavar="N",
                     help="With --unit row-group: rows per batch, as TableDataset's "
                          "batch_rows (default: one row group per batch); counts each "
                          "rank's batches for the batch check."),
        click.option("--equal-length", type=click.Choice(["pad", "drop"]), default=None,
                     help="With --unit row-group and --batch-rows: every slot yields the "
                          "same number of batches, as TableDataset(equal_length=...) does; "
                          "with --unit sample, the same number of samples."),
        click.option("--format", "format", type=click.Choice(["tar", "jsonl", "lines"]),
                     default=None, help="With --unit sample: read every file as this shard "
                                        "format (default: by its suffix)."),
        click.option("--block-samples", type=int, default=None, metavar="N",
                     help="With --unit sample: samples per block, the unit dealt, as "
                          "ShardDataset's block_samples (default 256)."),
    ])
