"""What a listing gives every command that takes a SOURCE: unreadable folders
(never dropped silently), folder links followed as ``find -L`` does, a single
file as a source, JSON files that are not manifests, and missing backends."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from click.testing import CliRunner

from tests.common.backends import deny_s3_listing
from tests.common.parts import unique
from ucstage.cli import cli

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
          "--bounding-set=-dac_override,-dac_read_search"]
"""Run as an unprivileged user: root reads a chmod 000 folder, nobody does not."""


def run(*args: str, code: int = 0) -> Any:
    """Invoke the CLI in-process; the result (JSON parsed when asked for)."""
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return json.loads(result.stdout) if "--json" in args and code == 0 else result


def test_every_command_taking_a_source_offers_skip_unreadable() -> None:
    for command in (["shard-plan"], ["bench"], ["cache", "warm"], ["cache", "lazy"],
                    ["cache", "verify"]):
        assert "--skip-unreadable" in run(*command, "--help").output, command


# -- unreadable folders ------------------------------------------------------------


@pytest.fixture
def shared_tree() -> Iterator[Path]:
    """A volume nobody can read except its dog/ folder (chmod 000), outside
    root's private temp folder, and a cache folder nobody may create."""
    base = Path(tempfile.mkdtemp(prefix="ucstage-listing-", dir="/tmp"))
    os.chmod(base, 0o755)
    vol = base / "val"
    for label in ("cat", "dog"):
        for i in range(3):
            path = vol / label / f"{i:05d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{label}{i}".encode())
    (base / "home").mkdir()
    os.chown(base / "home", 65534, 65534)
    os.chmod(vol / "dog", 0)
    try:
        yield vol
    finally:
        os.chmod(vol / "dog", 0o755)
        shutil.rmtree(base)


def _as_nobody(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HOME": str(home), "UCSTAGE_CACHE_DIR": str(home / "cache"),
           "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([*NOBODY, sys.executable, "-m", "ucstage", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_an_unreadable_folder_stops_every_command_unless_skipped(shared_tree: Path) -> None:
    home, dog = shared_tree.parent / "home", str(shared_tree / "dog")
    commands = [["shard-plan", str(shared_tree), "-w", "2", "-k", "1"],
                ["cache", "warm", str(shared_tree)], ["cache", "lazy", str(shared_tree)],
                ["cache", "verify", str(shared_tree)], ["bench", str(shared_tree), "--files", "2"]]
    for args in commands:
        proc = _as_nobody(*args, home=home)
        assert proc.returncode == 1, (args, proc.stderr)
        assert dog in proc.stderr and "Permission denied" in proc.stderr, proc.stderr
        assert "--skip-unreadable" in proc.stderr and "Traceback" not in proc.stderr
    assert not (home / "cache").exists() or not any((home / "cache").rglob("*.jpg"))

    plan = _as_nobody("shard-plan", str(shared_tree), "-w", "2", "-k", "1", "--json",
                      "--skip-unreadable", home=home)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["files"] == 3
    assert f"warning: skipped unreadable folder {dog}" in plan.stderr
    warm = _as_nobody("cache", "warm", str(shared_tree), "--json", "--skip-unreadable",
                      home=home)
    assert warm.returncode == 0, warm.stderr
    summary = json.loads(warm.stdout)
    assert (summary["files"], summary["fetched"]) == (3, 3)
    assert f"skipped unreadable folder {dog}" in warm.stderr
    assert [u["path"] for u in summary["unreadable"]] == ["dog"]  # and in the JSON
    refused = run("cache", "verify", "--skip-unreadable", code=2)
    assert "--skip-unreadable needs a SOURCE" in refused.stderr
    assert Path(summary["namespace"], "cat", "00002.jpg").read_bytes() == b"cat2"


def test_an_unreadable_folder_of_a_walked_fsspec_store(walking_store: str) -> None:
    result = run("shard-plan", walking_store, "-w", "1", "-k", "1", code=1)
    assert "cannot read 1 folder" in result.stderr and "/dog (Permission denied)" in result.stderr
    assert "or pass --skip-unreadable to list the rest" in result.stderr
    result = run("shard-plan", walking_store, "-w", "1", "-k", "1", "--skip-unreadable")
    assert "warning: skipped unreadable folder" in result.stderr and "/dog" in result.stderr
    assert "2 (" in result.stdout  # the two cat files


def test_a_manifest_is_not_listed_so_skip_unreadable_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vol").mkdir()
    (tmp_path / "vol" / "a.bin").write_bytes(b"a")
    made = run("cache", "lazy", str(tmp_path / "vol"), "-o", str(tmp_path / "m.json"), "--json")
    result = run("shard-plan", made["manifest"], "-w", "1", "-k", "1", "--skip-unreadable",
                 code=2)
    assert "--skip-unreadable apply to a fresh listing" in result.stderr


def test_an_s3_403_on_listing_is_reported(moto, monkeypatch, engine) -> None:  # type: ignore[no-untyped-def]
    key = unique()
    moto.filesystem().pipe({f"ucstage-test/{key}/cat/1.jpg": b"c"})
    with deny_s3_listing(monkeypatch, moto, key):
        result = run("cache", "warm", f"s3://ucstage-test/{key}", "--skip-unreadable", code=2)
    assert f"cannot read s3://ucstage-test/{key}: PermissionError" in result.stderr
    assert "Access Denied" in result.stderr and len(result.stderr.splitlines()) == 2


# -- folder links --------------------------------------------------------------------


def test_linked_folders_are_planned_and_warmed(tmp_path: Path) -> None:
    vol = tmp_path / "vol"
    (vol / "train" / "cat").mkdir(parents=True)
    (vol / "train" / "cat" / "1.jpg").write_bytes(b"meow")
    (vol / "extra").mkdir()
    (vol / "extra" / "2.jpg").write_bytes(b"woof!")
    (vol / "train" / "more").symlink_to("../extra", target_is_directory=True)
    (vol / "train" / "cat" / "again").symlink_to("..", target_is_directory=True)  # a loop
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key.pem").write_bytes(b"secret")
    (vol / "train" / "leak").symlink_to(tmp_path / "secret", target_is_directory=True)
    source = str(vol)

    plan = run("shard-plan", source, "-w", "1", "-k", "1", "--json")
    assert plan["files"] == 3 and plan["bytes"] == 14
    slot = run("shard-plan", source, "-w", "1", "-k", "1", "--slot", "0:0")
    assert slot.stdout.split() == ["extra/2.jpg", "train/cat/1.jpg", "train/more/2.jpg"]
    assert "skipped train/leak: symlink to" in slot.stderr
    assert "outside the volume" in slot.stderr
    assert "skipped train/cat/again: symlink loop" in slot.stderr

    warm = run("cache", "warm", source, "--json")
    assert (warm["files"], warm["fetched"], warm["failed"]) == (3, 3, [])
    assert {r["path"] for r in warm["refused"]} == {"train/cat/again", "train/leak"}
    assert Path(warm["namespace"], "train", "more", "2.jpg").read_bytes() == b"woof!"
    assert Path(warm["namespace"], "train", "cat", "1.jpg").read_bytes() == b"meow"
    assert not Path(warm["namespace"], "train", "leak").exists()
    assert run("cache", "verify", source, "--json")["clean"]


# -- a single file as SOURCE ---------------------------------------------------------


@pytest.fixture(params=["local", "volumes-local", "volumes-url", "s3", "memory"])
def one_file(request: pytest.FixtureRequest, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    """(SOURCE naming cat/00001.jpg, its bytes), beside two other files, each kind."""
    files = {"cat/00001.jpg": b"one", "cat/00002.jpg": b"two!", "dog/00001.jpg": b"three"}
    kind, key = request.param, unique()
    if kind in ("local", "volumes-local"):
        root = tmp_path / "vols" / "main" / "ml" / "train"
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        if kind == "local":
            return str(root / "cat" / "00001.jpg"), b"one"
        monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", str(tmp_path / "vols"))
        return "/Volumes/main/ml/train/cat/00001.jpg", b"one"
    if kind == "s3":
        request.getfixturevalue("moto").filesystem().pipe(
            {f"ucstage-test/{key}/{rel}": data for rel, data in files.items()})
        return f"s3://ucstage-test/{key}/cat/00001.jpg", b"one"
    fs = fsspec.filesystem("memory")
    fs.pipe({f"/{key}/{rel}": data for rel, data in files.items()})
    request.addfinalizer(lambda: fs.rm(f"/{key}", recursive=True))
    if kind == "memory":
        return f"memory://{key}/cat/00001.jpg", b"one"
    monkeypatch.setenv("UCSTAGE_VOLUMES_ROOT", f"memory://{key}")
    return "/Volumes/cat/00001.jpg", b"one"


def test_a_single_file_source_is_that_file(one_file: tuple[str, bytes]) -> None:
    source, data = one_file
    plan = run("shard-plan", source, "-w", "1", "-k", "1", "--json")
    assert (plan["files"], plan["bytes"]) == (1, len(data))
    warm = run("cache", "warm", source, "--json")
    assert (warm["files"], warm["fetched"], warm["failed"]) == (1, 1, [])
    namespace = Path(warm["namespace"])
    assert "00001.jpg" in namespace.name  # named after the file, not its folder
    assert [p.name for p in namespace.iterdir()] == ["00001.jpg"]
    assert (namespace / "00001.jpg").read_bytes() == data

    check = run("cache", "verify", source, "--json")
    assert [(s["checked"], s["ok"]) for s in check["sources"]] == [(1, 1)]
    everything = run("cache", "verify", "--json")  # re-lists the file, not its folder
    assert [(s["checked"], s["ok"], s["missing"]) for s in everything["sources"]] == [(1, 1, 0)]
    status = run("cache", "status", source, "--json")
    assert [n["entries"] for n in status["namespaces"]] == [1]
    assert status["namespaces"][0]["source"].endswith("/cat/00001.jpg")
    assert run("cache", "warm", source, "--json")["already_cached"] == 1


# -- a JSON file that is not a manifest; a missing backend -----------------------------


def test_a_json_source_that_is_not_a_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "foo.json").write_text('{"images": [], "annotations": []}')
    for args in (["shard-plan", str(tmp_path / "foo.json"), "-w", "1", "-k", "1"],
                 ["cache", "warm", str(tmp_path / "foo.json")]):
        result = run(*args, code=2)
        assert f"{tmp_path / 'foo.json'} is not a ucstage manifest" in result.stderr
        assert f"give its folder {tmp_path} with --include foo.json" in result.stderr
    # What the hint says works: the file, staged as data.
    warm = run("cache", "warm", str(tmp_path), "--include", "foo.json", "--json")
    assert warm["fetched"] == 1


def test_a_missing_backend_names_the_extra_to_install() -> None:
    code = ("import sys; sys.modules['s3fs'] = None\n"
            "from ucstage.cli.app import main\n"
            "main(['shard-plan', 's3://bucket/train', '-w', '1', '-k', '1'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "UCSTAGE_ENGINE": "fsspec"})
    assert proc.returncode == 2, proc.stderr
    assert "no filesystem for s3:// is installed" in proc.stderr
    assert "hint: pip install 'ucstage[s3]'" in proc.stderr


def test_bench_on_an_unreadable_file_says_permission_denied(shared_tree: Path) -> None:
    """Issue 30 item 8: a listed file this user may not read gave
    `PermissionError: [Errno 13] ... hint: check the volume is reachable`."""
    home = shared_tree.parent / "home"
    locked = shared_tree / "cat" / "00001.jpg"
    os.chmod(locked, 0)
    proc = _as_nobody("bench", str(shared_tree / "cat"), "-m", "direct", "-k", "1", home=home)
    assert proc.returncode != 0, proc.stdout
    assert f"error: direct read of {locked.name}: permission denied" in proc.stderr, proc.stderr
    assert "make it readable, or leave it out (--exclude GLOB)" in proc.stderr
    assert "check the volume is reachable" not in proc.stderr
    assert "PermissionError" not in proc.stderr and "Traceback" not in proc.stderr
