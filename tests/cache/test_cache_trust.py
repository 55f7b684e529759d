"""A cache root another user could swap is refused; nothing in a cache is
written through a link (issue 39, item 2).

Everything under the root is worked on by path, so whoever may rename entries
in a folder above the root could, mid-run, put a tree of their own in its
place. The root and every folder above it must therefore be owned by this
user or root, and writable by no one else (a sticky folder such as /tmp
excepted). A real second user (tests/common/users.py) shows that each folder
refused is one that user could really change, and links are planted at the
names of the files ucstage creates to show none is followed.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.common.parts import require, unique
from tests.common.users import OtherUser
from ucstage import LocalCache
from ucstage.cache import runstats
from ucstage.cache.paths import CONTROL, user_root
from ucstage.errors import CacheOwnershipError
from ucstage.volumes import list_files, resolve

EXPOSED = "another user could swap the cache for files of their own"


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        (src / f"f{i}.bin").write_bytes(bytes([65 + i]) * (100 + i))
    return src


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh folder directly under /tmp (sticky), as a team's scratch folder would be."""
    folder = Path(f"/tmp/ucstage-trust-{unique()}")
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _refused(root: Path, folder: Path, why: str) -> None:
    """LocalCache(root) is refused naming ``folder``, and makes nothing."""
    with pytest.raises(CacheOwnershipError) as caught:
        LocalCache(root)
    assert caught.value.message == f"cache root {root} is under {folder}, which {why}: {EXPOSED}"
    assert caught.value.hint == (f"use a folder only you (and root) can write, all the way up, "
                                 f"e.g. the default {user_root()} (unset UCSTAGE_CACHE_DIR to "
                                 "use it)")
    assert not os.path.lexists(root)


def _cli_warm(source: Path, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ucstage", "cache", "warm", str(source)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "UCSTAGE_CACHE_DIR": str(root)})


def test_a_root_in_a_folder_another_user_owns_is_refused(
        other_user: OtherUser, scratch: Path, source: Path) -> None:
    team = scratch / "team"
    team.mkdir(mode=0o755)
    other_user.chown(team)
    # The danger is real: the folder's owner may rename what root made in it.
    (team / "made-by-root").mkdir(mode=0o700)
    other_user.run(["mv", str(team / "made-by-root"), str(team / "renamed")])
    assert os.listdir(team) == ["renamed"]
    os.rmdir(team / "renamed")

    root = team / "cache"
    owner = f"is owned by uid {other_user.uid} ({other_user.name}), not by you or root"
    _refused(root, team, owner)
    # Deeper down too, before any folder is made in theirs.
    _refused(team / "a" / "b" / "cache", team, owner)
    assert os.listdir(team) == []
    # A path through a link to their folder is judged by where it leads.
    link = scratch / "link"
    link.symlink_to(team)
    _refused(link / "cache", team, owner)

    cli = _cli_warm(source, root)
    assert cli.returncode == 2, cli.stderr
    assert cli.stderr.splitlines() == [
        f"error: cache root {root} is under {team}, which {owner}: {EXPOSED}",
        f"hint: use a folder only you (and root) can write, all the way up, e.g. the default "
        f"{user_root()} (unset UCSTAGE_CACHE_DIR to use it)"]
    assert not os.path.lexists(root)


def test_a_folder_others_may_write_without_the_sticky_bit_is_refused(
        other_user: OtherUser, scratch: Path, source: Path) -> None:
    shared = scratch / "shared"
    shared.mkdir()
    os.chown(shared, 0, other_user.gid)
    os.chmod(shared, 0o2775)  # a team folder: the team's group may write, setgid
    # The other user, by their group, may put things there.
    other_user.run(["mkdir", str(shared / "theirs")])
    os.rmdir(shared / "theirs")

    root = shared / "a" / "cache"
    _refused(root, shared, f"is writable by group {other_user.group} (mode 2775), "
                           "which has other members")
    assert os.listdir(shared) == []
    os.chmod(shared, 0o777)
    _refused(root, shared, "is writable by every user (mode 0777) and not sticky")
    cli = _cli_warm(source, root)
    assert cli.returncode == 2
    assert cli.stderr.startswith(f"error: cache root {root} is under {shared}, which is "
                                 "writable by every user")
    assert "Traceback" not in cli.stderr

    # Sticky, as /tmp is: each user may rename only their own entries.
    os.chmod(shared, 0o1777)
    cache = LocalCache(root)
    assert cache.root == str(root)
    cache.warm(resolve(str(source)), list_files(str(source)).entries)
    assert other_user.run(["mv", str(shared / "a"), str(shared / "b")],
                          check=False).returncode != 0
    # But a folder that user made in it ahead of us is theirs.
    other_user.run(["mkdir", str(shared / "planted")])
    _refused(shared / "planted" / "cache", shared / "planted",
             f"is owned by uid {other_user.uid} ({other_user.name}), not by you or root")


@pytest.fixture
def my_group(other_user: OtherUser) -> Iterator[str]:
    """A fresh group whose one member is this user (root)."""
    require(shutil.which("groupadd") is not None and shutil.which("gpasswd") is not None,
            "groupadd and gpasswd are not installed")
    name = f"ucsg{unique()[-10:]}"
    subprocess.run(["groupadd", name], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(["gpasswd", "-a", "root", name], check=True, capture_output=True,
                       timeout=60)
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True, timeout=60)


def test_a_folder_only_my_own_group_may_write_is_accepted(
        my_group: str, other_user: OtherUser, scratch: Path) -> None:
    # A user private group (Fedora/RHEL make every user one, with umask 002):
    # group-writable, yet no one else may write.
    import grp

    mine = scratch / "mine"
    mine.mkdir()
    os.chown(mine, 0, grp.getgrnam(my_group).gr_gid)
    os.chmod(mine, 0o775)
    assert LocalCache(mine / "cache").root == str(mine / "cache")
    # Once another user is in the group, it is a team's folder.
    subprocess.run(["gpasswd", "-a", other_user.name, my_group], check=True,
                   capture_output=True, timeout=60)
    _refused(mine / "cache2", mine, f"is writable by group {my_group} (mode 0775), "
                                    "which has other members")


def test_the_default_root_and_roots_under_tmp_are_accepted(scratch: Path) -> None:
    # The default root is a folder of /tmp, which is root's and sticky; the
    # real one is not touched here (the suite guards it), a sibling is used.
    assert os.path.dirname(user_root()) == "/tmp"
    tmp = os.stat("/tmp")
    assert tmp.st_uid == 0 and tmp.st_mode & stat.S_ISVTX
    root = scratch / "x" / "cache"
    cache = LocalCache(root)
    assert stat.S_IMODE(os.stat(cache.root).st_mode) == 0o700


# -- nothing in a cache is written through a link ------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A root-only folder outside the cache, holding a root-only file."""
    folder = tmp_path / "outside"
    folder.mkdir(mode=0o700)
    (folder / "secret").write_bytes(b"root only\n")
    os.chmod(folder / "secret", 0o600)
    return folder


def test_a_link_at_a_temp_file_name_is_replaced_not_followed(
        tmp_path: Path, source: Path, outside: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    volume, entries = resolve(str(source)), list_files(str(source)).entries
    ns = cache.prepare(volume)
    planted = {}
    for entry, target in zip(entries[:2], (outside / "secret", outside / "new"), strict=True):
        local = os.path.join(ns, entry.path)
        tmp = cache.space.temp_path(local, cache.space.entry_lock(ns, entry.path))
        os.symlink(target, tmp)
        planted[entry.path] = tmp
    # A first read copies each file (no warm's sweep of leftovers first),
    # under a cap and without one: the two ways a temp file is made.
    for entry in entries[:1]:
        cache.fetch(volume, entry)
    capped = LocalCache(cache.root, max_bytes=10_000)
    for entry in entries[1:]:
        capped.fetch(volume, entry)
    assert (outside / "secret").read_bytes() == b"root only\n"
    assert os.listdir(outside) == ["secret"]
    for entry in entries:
        local = os.path.join(ns, entry.path)
        assert not os.path.islink(local)
        assert Path(local).read_bytes() == (source / entry.path).read_bytes()
    assert not any(os.path.lexists(tmp) for tmp in planted.values())


def test_a_link_at_a_lock_stripe_or_the_ledger_is_refused(
        tmp_path: Path, source: Path, outside: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    volume, entries = resolve(str(source)), list_files(str(source)).entries
    ns = cache.prepare(volume)
    lock = cache.space.entry_lock(ns, entries[0].path)
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    os.symlink(outside / "made-by-root", lock)
    # That file fails, saying why; nothing is made outside.
    report = cache.warm(volume, entries[:1])
    assert report.failed == [(entries[0].path,
                              f"{lock} in the cache is a symlink; refusing to follow it")]
    assert os.listdir(outside) == ["secret"]
    os.unlink(lock)

    ledger = os.path.join(cache.root, CONTROL, "usage")
    if os.path.lexists(ledger):
        os.unlink(ledger)
    os.symlink(outside / "secret", ledger)
    report = cache.warm(volume, entries)
    assert sorted(report.failed) == [
        (e.path, f"{ledger} in the cache is a symlink; refusing to follow it") for e in entries]
    assert (outside / "secret").read_bytes() == b"root only\n"
    assert os.listdir(outside) == ["secret"]


def test_run_counters_are_not_written_through_a_link(tmp_path: Path, outside: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    folder = os.path.join(cache.root, CONTROL, "runs", "run1")
    os.makedirs(folder)
    os.symlink(outside / "made-by-root", os.path.join(folder, f"r0-{os.getpid()}.counters"))
    assert runstats.counters(cache.root, "run1", 0) is None  # counting is off, nothing written
    assert os.listdir(outside) == ["secret"]
