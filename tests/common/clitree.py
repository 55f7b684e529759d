"""Every command of the ucstage CLI, for the tests that check each one's help and docs."""

from __future__ import annotations

from collections.abc import Iterator

import click


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], click.Command]]:
    """``(path, command)`` for ``group`` and every command below it, groups first."""
    yield path, group
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd
