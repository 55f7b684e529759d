"""A second local user, made for a test and removed after it.

The suite runs as root, which writes anywhere, so a test about what *another
user* can do to ucstage's files needs a real other user: ``other_user`` makes
one with ``useradd`` (its own group, no home, no login shell) and removes
both with ``userdel`` at teardown. ``OtherUser.run`` runs a command as that
user (``setpriv``: its uid and gid, no supplementary groups), so what it
does is what the kernel lets that user do, nothing more.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.common.parts import require

__all__ = ["OtherUser", "other_user"]


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int

    @property
    def group(self) -> str:
        return grp.getgrgid(self.gid).gr_name

    def run(self, args: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``args`` as this user; raises when it fails (``check``)."""
        kwargs.setdefault("check", True)
        return subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", *args],
            capture_output=True, text=True, timeout=60, **kwargs)

    def chown(self, path: str | os.PathLike[str]) -> None:
        """Give ``path`` to this user (as if they had made it)."""
        os.chown(path, self.uid, self.gid, follow_symlinks=False)


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    """A throwaway local user and group (removed at teardown, files they own
    are the test's to remove)."""
    require(os.geteuid() == 0, "making a second local user needs root")
    for tool in ("useradd", "userdel", "setpriv"):
        require(shutil.which(tool) is not None, f"{tool} is not installed")
    name = f"ucst{uuid.uuid4().hex[:10]}"
    made = subprocess.run(["useradd", "--no-create-home", "--user-group",
                           "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True, timeout=60)
    require(made.returncode == 0, f"useradd failed: {made.stderr.strip()}")
    try:
        entry = pwd.getpwnam(name)
        yield OtherUser(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)
        # useradd --user-group made the group; userdel removes it with the
        # user, unless the system's USERGROUPS_ENAB says otherwise.
        try:
            grp.getgrnam(name)
        except KeyError:
            pass
        else:
            subprocess.run(["groupdel", name], capture_output=True, timeout=60)
