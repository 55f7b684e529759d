"""The suite's own set-up: it never touches the user's real cache
(tests/common/realcache.py: fixtures of every scope see a throwaway cache
root, and a run that writes into the guarded root fails), and property tests
run without a per-example deadline (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import settings

from tests.common.realcache import GUARDED_ENV, guarded_root
from ucstage.cache.paths import default_root, user_root


@pytest.fixture(scope="session")
def session_root() -> str:
    return default_root()


@pytest.fixture(scope="module")
def module_root() -> str:
    return default_root()


def _outside_real_root(root: str) -> bool:
    real = user_root()
    return root != real and not root.startswith(real + os.sep)


def test_fixtures_of_every_scope_see_a_throwaway_cache_root(session_root: str, module_root: str) -> None:
    # Session and module fixtures run before the per-test _isolated_env.
    assert _outside_real_root(session_root)
    assert _outside_real_root(module_root)
    assert _outside_real_root(default_root())
    assert "UCSTAGE_VOLUMES_ROOT" not in os.environ
    assert guarded_root() == user_root()  # the real one, in the suite itself


def _run_inner(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run a pytest session with the guard as its plugin, guarding tmp_path/real."""
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(body))
    env = {**os.environ, GUARDED_ENV: str(tmp_path / "real")}
    # The inner run starts in tmp_path: the repository must be on its path
    # for its plugin (tests.common.realcache) to import.
    repo = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH")) if p)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.common.realcache",
         "-p", "no:cacheprovider", "-p", "no:xdist", "test_inner.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("existed", [False, True])
def test_a_run_that_writes_into_the_guarded_root_fails(tmp_path: Path, existed: bool) -> None:
    real = tmp_path / "real"
    if existed:
        (real / "vol").mkdir(parents=True)
        (real / "vol" / "f0").write_text("cached")
    proc = _run_inner(tmp_path, f"""
        import os

        def test_writes():
            root = {str(real)!r}
            os.makedirs(os.path.join(root, "vol"), exist_ok=True)
            with open(os.path.join(root, "vol", "f1"), "w") as fh:
                fh.write("leaked")
    """)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 passed" in out  # the test itself passed: the guard failed the run
    assert f"the test run changed the real cache root {real}" in out
    assert os.path.join("vol", "f1") + " (created)" in out


def test_a_run_that_leaves_the_guarded_root_alone_passes(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "vol").mkdir(parents=True)
    (real / "vol" / "f0").write_text("cached")
    proc = _run_inner(tmp_path, f"""
        import os

        from ucstage.cache.paths import default_root

        def test_reads():
            with open(os.path.join({str(real)!r}, "vol", "f0")) as fh:
                assert fh.read() == "cached"
            assert not default_root().startswith({str(real)!r})
    """)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "real cache" not in proc.stdout


def test_property_tests_have_no_deadline() -> None:
    # Hypothesis' default 200 ms per example failed a test doing I/O at load 30.
    assert settings.default.deadline is None
