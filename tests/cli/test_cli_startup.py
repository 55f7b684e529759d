"""What a command loads: start-up is a fixed cost of every command (a job's
set-up warm of a few thousand files pays it whole), so a command imports
only what it runs. Each case runs the command in a fresh interpreter and
reads its ``sys.modules`` at exit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.common.backends import make_source

HEAVY = ("torch", "pyarrow", "numpy", "pandas", "pyspark", "deltalake")
"""Never loaded by these commands (they use none of them)."""
OTHER_COMMANDS = ("ucstage.bench", "ucstage.cli.bench", "ucstage.cli.export",
                  "ucstage.cli.shard_plan", "ucstage.data")
"""What only other commands use: ``cache warm`` must not load it."""
FSSPEC = ("fsspec", "s3fs", "botocore", "aiobotocore")
"""An s3:// source read through obstore needs none of fsspec's stack."""

_CODE = """
import atexit, json, os, sys
forks = []
_fork = os.fork
def fork():
    forks.append(1)
    return _fork()
os.fork = fork
atexit.register(lambda: open(sys.argv[1], "w").write(
    json.dumps(sorted(sys.modules) + ["forks=%d" % len(forks)])))
from ucstage.cli import main
main(sys.argv[2:])
"""


def _loaded(tmp_path: Path, *args: str) -> tuple[set[str], str]:
    """The modules loaded by ``ucstage ARGS`` (run to its exit), and its
    stdout; ``forks=N`` among them counts the processes it forked."""
    out = tmp_path / "modules.json"
    env = {**os.environ, "UCSTAGE_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("UCSTAGE_ENGINE", None)
    done = subprocess.run([sys.executable, "-c", _CODE, str(out), *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text())), done.stdout


def _present(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m in names or m.startswith(tuple(n + "." for n in names)))


def test_help_loads_no_heavy_library(tmp_path: Path) -> None:
    modules, out = _loaded(tmp_path, "--help")
    assert "cache warm" not in out and "shard-plan" in out  # every command listed
    assert _present(modules, HEAVY + FSSPEC) == []


def test_warm_of_a_folder_loads_only_what_it_runs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(os.urandom(100))
    modules, out = _loaded(tmp_path, "cache", "warm", str(src), "--json")
    assert json.loads(out)["fetched"] == 3
    assert _present(modules, HEAVY + OTHER_COMMANDS) == []


@pytest.mark.usefixtures("moto")
def test_warm_of_s3_loads_no_fsspec_and_lists_in_process(tmp_path: Path) -> None:
    pytest.importorskip("obstore")
    src = make_source("s3", "", {f"d/f{i}.bin": os.urandom(100 + i) for i in range(5)})
    modules, out = _loaded(tmp_path, "cache", "warm", src, "--json")
    doc = json.loads(out)
    assert (doc["fetched"], doc["engine"]) == (5, "obstore")
    assert _present(modules, HEAVY + OTHER_COMMANDS + FSSPEC) == []
    # Resolved and listed in this process (objstore.run_here), with the
    # client the copies use: no child forked for a metadata call.
    assert "forks=0" in modules
