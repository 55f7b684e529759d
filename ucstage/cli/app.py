"""The command group and the one place library errors become exit codes."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import click
from rich.markup import escape

from .. import __version__
from ..errors import UcstageError
from .output import err

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class UcstageGroup(click.Group):
    """Maps errors to one line on stderr; ``--debug`` shows the traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug")) or os.environ.get("UCSTAGE_DEBUG") == "1"
        try:
            return super().invoke(ctx)
        except UcstageError as exc:
            if debug:
                traceback.print_exc()
            # escape(): messages and hints hold paths and `pip install 'x[extra]'`.
            err.print(f"[bold red]error:[/] {escape(exc.message)}", markup=True)
            if exc.hint:
                err.print(f"[dim]hint:[/] {escape(exc.hint)}", markup=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]", markup=True)
            sys.exit(130)
        except Exception as exc:
            if debug:
                traceback.print_exc()
            err.print(f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(str(exc))}",
                      markup=True)
            if not debug:
                err.print("[dim]hint:[/] rerun with --debug for the traceback, and report it",
                          markup=True)
            sys.exit(1)


@click.group(cls=UcstageGroup, context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="ucstage")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Stage training data from volumes and Delta tables onto this node's local disk,
    in the order a distributed PyTorch job reads it.

    \b
    Paths: /Volumes/<catalog>/<schema>/<volume>/... (mapped through
    $UCSTAGE_VOLUMES_ROOT when set), dbfs:/Volumes/..., fsspec URLs
    (s3://, gs://, abfs://, file://, memory://) and local folders.

    \b
    Example:
      ucstage shard-plan /Volumes/main/ml/train/images --world-size 8 --num-workers 6
    """
    if debug:
        os.environ["UCSTAGE_DEBUG"] = "1"


# Each subcommand module imports only light library modules at the top; torch,
# pyspark and deltalake load inside the commands that need them.
from . import bench, cache, export, shard_plan  # noqa: E402

cli.add_command(shard_plan.shard_plan)
cli.add_command(cache.command)
cli.add_command(bench.command)
cli.add_command(export.command)


def main() -> None:
    cli(prog_name="ucstage")
