"""A cache root that cannot hold a cache (a file, a read-only file system, a
folder this user cannot write) is CacheUnusable naming the root and what is
wrong, from the library and the CLI, before anything is copied; `cache
status` still says what the root holds.

Permissions are checked in a child process without CAP_DAC_OVERRIDE and
CAP_DAC_READ_SEARCH (setpriv): the suite runs as root, which writes anywhere,
so a mode bit alone would prove nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.common.parts import require, tmpfs, unique
from ucstage import LocalCache, VolumeDataset
from ucstage.cli import cli
from ucstage.errors import CacheUnusable

NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
"""Root without the power to ignore file modes."""


def _cli(*args: str, root: str) -> Any:
    return CliRunner(env={"UCSTAGE_CACHE_DIR": root}).invoke(cli, list(args))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(b"x" * (100 + i))
    return src


def test_a_root_that_is_a_file_is_named(tmp_path: Path, source: Path) -> None:
    file = tmp_path / "afile"
    file.write_text("my notes")
    with pytest.raises(CacheUnusable, match=rf"^cache root {file} exists and is not a folder$"):
        LocalCache(file)
    with pytest.raises(CacheUnusable, match=rf"^cache root {file}/c cannot be created: "
                                            rf"{file} is a file, not a folder$") as caught:
        LocalCache(file / "c")
    assert caught.value.root == str(file / "c") and "UCSTAGE_CACHE_DIR" in caught.value.hint
    assert file.read_text() == "my notes"
    # The dataset says it too, not a raw OSError.
    with pytest.raises(CacheUnusable, match="is a file, not a folder"):
        list(VolumeDataset(str(source), cache_dir=file / "c"))
    result = _cli("cache", "status", "--json", root=str(file / "c"))
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["entries"] == 0 and doc["namespaces"] == []
    assert doc["unusable"] == f"cache root {file}/c cannot be created: {file} is a file, not a folder"
    assert f"error: cache root {file}/c cannot be created" in result.stderr
    assert "Traceback" not in result.output


def test_a_read_only_file_system(tmp_path: Path, source: Path) -> None:
    require(os.geteuid() == 0, "mounting a read-only tmpfs needs root")
    mount = str(tmp_path / "mnt")
    with tmpfs(mount, "size=4m,mode=0700"):
        root = os.path.join(mount, "cache")
        cache = LocalCache(root)
        cache.warm(cache_volume(source), list_of(source))
        remount = subprocess.run(["mount", "-o", "remount,ro", mount], capture_output=True,
                                 text=True)
        require(remount.returncode == 0, f"cannot remount read-only: {remount.stderr}")
        with pytest.raises(CacheUnusable,
                           match=rf"^cache root {root} is on a read-only file system$"):
            LocalCache(root)
        with pytest.raises(CacheUnusable, match=rf"^cache root {root}/new cannot be created: "
                                                "it is on a read-only file system$"):
            LocalCache(os.path.join(root, "new"))
        # status: what the root holds, read without writing, then the error.
        result = _cli("cache", "status", root=root)
        assert result.exit_code == 2, result.output
        assert "3 files, 303 B" in result.stdout
        assert f"error: cache root {root} is on a read-only file system" in result.stderr
        warm = _cli("cache", "warm", str(source), root=root)
        assert warm.exit_code == 2, warm.output
        assert f"error: cache root {root} is on a read-only file system" in warm.stderr
        assert "Traceback" not in warm.output


def cache_volume(source: Path) -> Any:
    from ucstage.volumes import resolve

    return resolve(str(source))


def list_of(source: Path) -> Any:
    from ucstage.volumes import list_files

    return list_files(str(source)).entries


CHECK = """
import sys
from ucstage import LocalCache
from ucstage.errors import CacheUnusable
try:
    LocalCache(sys.argv[1])
except CacheUnusable as exc:
    print("CacheUnusable", exc.root, "|", exc.message)
else:
    print("opened")
"""


def _without_dac(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    require(os.geteuid() == 0 and shutil.which("setpriv") is not None,
            "dropping root's DAC override needs root and setpriv")
    return subprocess.run([*NO_DAC, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_a_folder_this_user_cannot_write(source: Path) -> None:
    base = Path(f"/tmp/ucstage-unusable-{unique()}")
    base.mkdir(mode=0o700)
    try:
        # An existing cache, made unwritable; and a root under a folder that is.
        root = base / "cache"
        cache = LocalCache(root)
        cache.warm(cache_volume(source), list_of(source))
        os.chmod(root, 0o500)
        locked = base / "locked"
        locked.mkdir(mode=0o500)
        out = _without_dac(sys.executable, "-c", CHECK, str(root)).stdout
        assert out == f"CacheUnusable {root} | cache root {root} is not writable by you (uid 0)\n"
        out = _without_dac(sys.executable, "-c", CHECK, str(locked / "c")).stdout
        assert out == (f"CacheUnusable {locked}/c | cache root {locked}/c cannot be created: "
                       f"{locked} is not writable by you (uid 0)\n")
        # With the power kept, root writes there: the check is the kernel's, not the mode's.
        assert subprocess.run([sys.executable, "-c", CHECK, str(root)], capture_output=True,
                              text=True, check=True).stdout == "opened\n"
        cli_env = {"UCSTAGE_CACHE_DIR": str(root)}
        status = _without_dac(sys.executable, "-m", "ucstage", "cache", "status", "--json",
                              env=cli_env)
        assert status.returncode == 2, status.stderr
        doc = json.loads(status.stdout)
        assert (doc["entries"], doc["bytes"]) == (3, 303)  # what it holds, still reported
        assert doc["unusable"] == f"cache root {root} is not writable by you (uid 0)"
        assert status.stderr.startswith(f"error: cache root {root} is not writable by you")
        assert "hint: set UCSTAGE_CACHE_DIR" in status.stderr
        warm = _without_dac(sys.executable, "-m", "ucstage", "cache", "warm", str(source),
                            env=cli_env)
        assert warm.returncode == 2
        assert warm.stderr.startswith(f"error: cache root {root} is not writable by you")
        assert "Traceback" not in warm.stderr and "Permission denied" not in warm.stderr
    finally:
        for folder in (base / "cache", base / "locked"):
            if folder.exists():
                os.chmod(folder, 0o700)
        shutil.rmtree(base, ignore_errors=True)
