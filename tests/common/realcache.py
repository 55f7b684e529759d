"""Keep the suite out of the user's real cache, and fail the run if it got in.

At ``pytest_configure`` (before any fixture of any scope, even a session- or
module-scoped one that starts torchrun) every process of the run points
``$UCSTAGE_CACHE_DIR`` at a throwaway folder of its own and drops
``$UCSTAGE_VOLUMES_ROOT``; the per-test ``_isolated_env`` fixture then gives
each test a fresh one. Processes a test starts inherit the variable.

The run's main process (the pytest-xdist controller, or the only process
without xdist) also records what the real default cache root
(``/tmp/ucstage-<uid>``, :func:`ucstage.cache.paths.user_root`) holds, and
at ``pytest_sessionfinish`` compares: any file or folder created, removed or
rewritten there fails the run (exit 1) and names the paths. Another program
using the same root during the run would trip it too: the check cannot tell
who wrote, and a false alarm is the safe side.

``$UCSTAGE_TEST_GUARDED_ROOT`` replaces the guarded root; only the test of
this guard sets it (tests/test_suite_setup.py), so that it can write
into a root without writing into the real one.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from ucstage.cache.paths import CACHE_DIR_ENV, user_root

GUARDED_ENV = "UCSTAGE_TEST_GUARDED_ROOT"
_SNAPSHOT = pytest.StashKey[dict[str, tuple[int, int, int]] | None]()
_SESSION_DIR = pytest.StashKey[str]()


def guarded_root() -> str:
    """The folder the run must leave as it found it."""
    return os.environ.get(GUARDED_ENV) or user_root()


def snapshot(root: str) -> dict[str, tuple[int, int, int]] | None:
    """Every path under ``root`` (and ``root`` itself, as ``.``) -> (mode,
    size, mtime in ns); None when ``root`` does not exist. A folder's mtime
    moves when an entry is added to or removed from it."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    found = {".": (st.st_mode, st.st_size, st.st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(root, onerror=lambda _exc: None):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:  # removed while walking: it will show as gone
                continue
            found[os.path.relpath(path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def changes(before: dict[str, tuple[int, int, int]] | None,
            after: dict[str, tuple[int, int, int]] | None) -> list[str]:
    """The paths (relative to the root) created, removed or changed between two snapshots."""
    before, after = before or {}, after or {}
    out = [f"{p} (created)" for p in sorted(after.keys() - before.keys())]
    out += [f"{p} (removed)" for p in sorted(before.keys() - after.keys())]
    out += [f"{p} (changed)" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    return out


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """Isolate this process's cache before any fixture runs; the main process
    records the guarded root."""
    if not _is_worker(config):
        config.stash[_SNAPSHOT] = snapshot(guarded_root())
    session_dir = tempfile.mkdtemp(prefix="ucstage-test-session-")
    config.stash[_SESSION_DIR] = session_dir
    os.environ[CACHE_DIR_ENV] = os.path.join(session_dir, "cache")
    os.environ.pop("UCSTAGE_VOLUMES_ROOT", None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when the guarded root changed (the main process only:
    it runs this after every xdist worker has finished)."""
    config = session.config
    if _is_worker(config) or _SNAPSHOT not in config.stash:
        return
    root = guarded_root()
    changed = changes(config.stash[_SNAPSHOT], snapshot(root))
    if not changed:
        return
    shown = "\n  ".join(changed[:20]) + (f"\n  ... and {len(changed) - 20} more" if len(changed) > 20 else "")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = f"the test run changed the real cache root {root}:\n  {shown}"
    if reporter is not None:
        reporter.write_sep("=", "real cache touched", red=True)
        reporter.write_line(message)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove this process's throwaway cache folder."""
    session_dir = config.stash.get(_SESSION_DIR, None)
    if session_dir:
        shutil.rmtree(session_dir, ignore_errors=True)
