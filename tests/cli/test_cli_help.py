"""Every command's help ends with examples that run as written."""

from __future__ import annotations

import shlex

import click
from click.testing import CliRunner

from tests.common.clitree import commands
from ucstage.cli import cli


def _examples(cmd: click.Command) -> tuple[str, list[str]]:
    """The heading and the lines of the help text's last paragraph."""
    lines = (cmd.help or "").rstrip().split("\n\n")[-1].strip().splitlines()
    if lines and lines[0].strip() == "\b":  # click's "do not rewrap" marker
        lines = lines[1:]
    return (lines[0].strip() if lines else ""), [line.strip() for line in lines[1:]]


def _parse(line: str) -> tuple[tuple[str, ...], click.Command, list[str]]:
    """Resolve an example command line to (command path, command, its arguments)."""
    args = shlex.split(line)
    assert args[0] == "ucstage", line
    args, cmd, path = args[1:], cli, ()
    while isinstance(cmd, click.Group) and args and args[0] in cmd.commands:
        path, cmd = (*path, args[0]), cmd.commands[args[0]]
        args = args[1:]
    return path, cmd, args


def test_every_command_and_group_help_ends_with_examples_that_parse() -> None:
    seen = {" ".join(path) for path, _ in commands(cli)}
    assert {"", "export", "cache", "cache warm", "shard-plan", "bench"} <= seen
    for path, cmd in commands(cli):
        where = " ".join(("ucstage", *path))
        heading, examples = _examples(cmd)
        assert heading in ("Example:", "Examples:"), f"{where}: help does not end with examples"
        assert examples, f"{where}: an Example heading without examples"
        rendered = CliRunner().invoke(cli, [*path, "--help"])
        assert rendered.exit_code == 0, rendered.output
        for line in examples:
            # Shown unwrapped, as one can paste it.
            assert line in rendered.output, (where, line)
            got, target, args = _parse(line)
            assert got[:len(path)] == path, f"{where}: example runs another command: {line}"
            assert not isinstance(target, click.Group), f"{where}: example names no command"
            # Parsing checks every option and value the example uses exists as written.
            target.make_context(" ".join(("ucstage", *got)), args)


def test_each_short_option_letter_means_one_thing_across_commands() -> None:
    """Issue 30 item 7: `-w` was --world-size in three commands and --workers
    in bench. Every command using a letter must share a long name for it."""
    longs: dict[str, list[tuple[tuple[str, ...], set[str]]]] = {}
    for path, cmd in commands(cli):
        for param in cmd.params:
            if not isinstance(param, click.Option):
                continue
            names = param.opts + param.secondary_opts
            short = [n for n in names if len(n) == 2 and n[0] == "-" and n[1] != "-"]
            for letter in short:
                longs.setdefault(letter, []).append((path, {n for n in names if n.startswith("--")}))
    assert "-w" in longs and "-k" in longs
    for letter, uses in longs.items():
        shared = set.intersection(*(names for _, names in uses))
        assert shared, (letter, uses)
    assert {p for p, _ in longs["-w"]} >= {("shard-plan",), ("cache", "warm"), ("export",)}
    assert all("--world-size" in names for _, names in longs["-w"])
    assert any(p == ("bench",) for p, _ in longs["-k"])


def test_no_example_line_is_mangled() -> None:
    """Issue 30 item 10: a backslash-continued example in a docstring became
    one line with a run of spaces inside (`--node-rank 0           --nproc...`)."""
    for path, cmd in commands(cli):
        _, lines = _examples(cmd)
        for line in lines:
            assert "  " not in line and "\\" not in line, (path, line)
        shown = CliRunner().invoke(cli, [*path, "--help"], env={"COLUMNS": "80"}).output
        for line in shown.splitlines():
            if line.strip().startswith("ucstage "):
                assert "   " not in line.strip(), (path, line)
