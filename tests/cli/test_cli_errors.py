"""The one error mapper: library errors name parameters, the CLI says flags."""

from __future__ import annotations

import click

from ucstage.cli.output import flag_names


@click.command()
@click.option("-w", "--world-size", type=int)
@click.option("--rank", type=int)
@click.option("--files", type=int)
@click.option("--include", multiple=True)
@click.option("--exclude", multiple=True)
@click.option("--all", "include_hidden", is_flag=True)
def command(**_: object) -> None:
    """A stand-in with the same kinds of options the real commands have."""


def test_snake_case_names_become_flags_anywhere():
    assert flag_names("world_size must be at least 1", command) == "--world-size must be at least 1"
    assert flag_names("skipped unless include_hidden", command) == "skipped unless --all"


def test_one_word_names_only_where_they_name_the_parameter():
    assert flag_names("files must be at least 1", command) == "--files must be at least 1"
    # "rank" mid-sentence is the thing, not the option: left alone.
    assert flag_names("node 2 covers rank 5", command) == "node 2 covers rank 5"
    assert flag_names("check `include`/`exclude`", command) == "check --include/--exclude"


def test_names_of_other_commands_are_left_alone():
    assert flag_names("max_seconds must be positive", command) == "max_seconds must be positive"
    assert flag_names("world_size must be at least 1", None) == "world_size must be at least 1"
