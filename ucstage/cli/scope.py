"""``--shuffle-scope`` and ``--nproc-per-node``: the same options, help and checks
on ``shard-plan``, ``cache warm`` and ``bench --loader``."""

from __future__ import annotations

from typing import Any, TypeVar

import click
from click.core import ParameterSource

from ..errors import InvalidArgument
from ..sharding import DEFAULT_SHUFFLE_SCOPE, SHUFFLE_SCOPES

F = TypeVar("F", bound=Any)

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


def scope_of(shuffle_scope: str | None, shuffle: bool) -> str:
    """The scope to plan with; refuses ``--shuffle-scope`` without ``--shuffle``,
    where it would silently change nothing."""
    ctx = click.get_current_context()
    given = ctx.get_parameter_source("shuffle_scope") not in (None, ParameterSource.DEFAULT)
    if given and not shuffle:
        raise InvalidArgument("--shuffle-scope only matters with --shuffle",
                              hint="add --shuffle, or leave --shuffle-scope out")
    return shuffle_scope or DEFAULT_SHUFFLE_SCOPE
