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


def test_debug_is_taken_after_the_subcommand_too(tmp_path):
    import subprocess
    import sys

    missing = str(tmp_path / "nowhere")
    for args in (["--debug", "shard-plan", missing], ["shard-plan", missing, "--debug"]):
        proc = subprocess.run([sys.executable, "-m", "ucstage", *args, "-w", "1", "-k", "1"],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and "Traceback" in proc.stderr, args
    plain = subprocess.run([sys.executable, "-m", "ucstage", "shard-plan", missing, "-w", "1",
                            "-k", "1"], capture_output=True, text=True)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr


def test_tables_in_a_log_are_full_width_without_trailing_spaces(tmp_path):
    """Off a terminal nothing is cut with "…" and no line ends in spaces."""
    import os
    import subprocess
    import sys

    name = "a-folder-name-long-enough-that-an-80-column-table-would-cut-it-" * 2
    src = tmp_path / name
    src.mkdir()
    (src / "f.bin").write_bytes(b"x" * 10)
    env = {**os.environ, "COLUMNS": "80", "UCSTAGE_CACHE_DIR": str(tmp_path / "cache")}
    run = [sys.executable, "-m", "ucstage", "cache"]
    assert subprocess.run([*run, "warm", str(src)], capture_output=True, env=env).returncode == 0
    proc = subprocess.run([*run, "status"], capture_output=True, text=True, env=env)
    table_rows = [line for line in proc.stdout.splitlines() if name in line]
    assert "…" not in proc.stdout and len(table_rows) >= 2, proc.stdout
    assert all(line == line.rstrip() for line in proc.stdout.splitlines())
