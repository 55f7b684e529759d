"""The command group and the one place library errors become exit codes."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import click

from .. import __version__
from ..errors import Terminated, UcstageError
from . import output
from .output import COMMAND_META, JSON_META, Group, err, error_hint, flag_names, print_error

CONTEXT = {**output.CONTEXT, "max_content_width": 100}


def _report(ctx: click.Context, message: str, hint: str, kind: str, code: int) -> None:
    """One error line (and a hint line) on stderr; with --json, the same on stdout."""
    print_error(message, hint)
    if ctx.meta.get(JSON_META):
        doc = {"error": {"type": kind, "message": message, "hint": hint, "exit_code": code}}
        sys.stdout.write(output.json_text(doc))
    sys.exit(code)


def _export() -> click.Command:
    from .export import command
    return command


def _cache() -> click.Command:
    from .cache import command
    return command


def _pack() -> click.Command:
    from .pack import command
    return command


def _shard_plan() -> click.Command:
    from .shard_plan import shard_plan
    return shard_plan


def _checkpoint() -> click.Command:
    from .checkpoint import command
    return command


def _bench() -> click.Command:
    from .bench import command
    return command


SUBCOMMANDS: dict[str, Callable[[], click.Command]] = {
    "export": _export, "pack": _pack, "cache": _cache, "shard-plan": _shard_plan,
    "bench": _bench, "checkpoint": _checkpoint}
"""The subcommands, in the order a job uses them (help lists them so), each
imported when it runs or help lists it: ``ucstage cache warm`` does not load
bench, export or shard-plan and what they import (start-up time is a fixed
cost of every command). Each subcommand module imports only light library
modules at the top; torch, pyspark and deltalake load inside the commands
that need them."""


class UcstageGroup(Group):
    """Maps errors to one line on stderr; ``--debug`` shows the traceback."""

    @property
    def commands(self) -> dict[str, click.Command]:
        """Every subcommand, imported (click's attribute, for what walks the tree)."""
        for name in SUBCOMMANDS:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: Mapping[str, click.Command]) -> None:
        self._loaded = dict(value)

    def _load(self, name: str) -> None:
        if name not in self._loaded and name in SUBCOMMANDS:
            self._loaded[name] = SUBCOMMANDS[name]()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load(cmd_name)  # only the one asked for
        return self._loaded.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        # Help lists commands in the order a job uses them, not alphabetically.
        return list(dict.fromkeys([*SUBCOMMANDS, *self._loaded]))

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug")) or os.environ.get("UCSTAGE_DEBUG") == "1"
        try:
            return super().invoke(ctx)
        except UcstageError as exc:
            if debug:
                traceback.print_exc()
            command = ctx.meta.get(COMMAND_META)
            _report(ctx, flag_names(exc.message, command), error_hint(exc, command),
                    type(exc).__name__, exc.exit_code)
        except click.exceptions.UsageError as exc:
            # Same one-line shape as every other error, instead of click's usage block.
            command = " ".join(exc.ctx.command_path.split()[1:]) if exc.ctx else ""
            _report(ctx, exc.format_message(), f"see `ucstage {command} --help`".replace("  ", " "),
                    "UsageError", 2)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except KeyboardInterrupt as exc:
            # 128 + the signal's number, as a shell reports a process it stopped.
            terminated = isinstance(exc, Terminated)
            err.print(f"[bold red]{'terminated' if terminated else 'interrupted'}[/]", markup=True)
            sys.exit(143 if terminated else 130)
        except BrokenPipeError:
            # `ucstage ... | head`: the reader left; exit as the shell's own tools do.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            sys.exit(141)
        except OSError as exc:
            # The environment said no (a file where a folder should be, permissions,
            # a full disk): the user can fix that, so no "report it".
            if debug:
                traceback.print_exc()
            where = f": {exc.filename}" if exc.filename else ""
            _report(ctx, f"{exc.strerror or exc}{where}", "", type(exc).__name__, 2)
        except Exception as exc:
            if debug:
                traceback.print_exc()
            _report(ctx, f"unexpected {type(exc).__name__}: {exc}",
                    "" if debug else "rerun as `ucstage --debug COMMAND ...` for the traceback, "
                    "and report it", type(exc).__name__, 1)


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



def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    # `ucstage cache warm SRC --debug` is as natural as `ucstage --debug cache ...`:
    # take the flag wherever it stands (before a `--` that ends the options).
    end = args.index("--") if "--" in args else len(args)
    if "--debug" in args[1:end]:
        args = [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]
        os.environ["UCSTAGE_DEBUG"] = "1"
    # SIGTERM (a scheduler, `kill`) stops like Ctrl-C: the same clean-up, exit 143.
    signal.signal(signal.SIGTERM, _terminate)
    cli(args=args, prog_name="ucstage")
