"""The mount table: which mount holds a path, and a dead mount told from a
failed read, for local-like sources.

One parser of ``/proc/self/mountinfo`` (:func:`mount_of`) serves both the
choice of ``--jobs auto``'s first guess (:func:`mount_fstype`,
:func:`ucstage.cache.tuning.source_kind`) and :func:`lost`. A FUSE mount
whose server died (rclone killed, the platform's mount lost) answers every
call with ``ENOTCONN`` ("Transport endpoint is not connected"), or, for
reads already open, ``EIO``. Retrying cannot help, and the error names
neither the mount nor the cause; :func:`lost` turns such an error into
:exc:`ucstage.errors.MountLost`, naming the mount.
"""

from __future__ import annotations

import errno
import os
import re

from ..errors import MountLost

__all__ = ["lost", "mount_fstype", "mount_of"]

_MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_of(path: str, mountinfo: str = _MOUNTINFO) -> tuple[str, str]:
    """``(mount point, filesystem type)`` (``ext4``, ``fuse.rclone``...) of
    the mount holding ``path`` (made absolute, not resolved), from
    ``/proc/self/mountinfo``: no call into the mount itself, which may be
    dead; ``("", "")`` when unknown (not Linux, unreadable). One read of a
    small file: cheap once per job."""
    path = os.path.abspath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return ("", "")
    best = ("", "")
    for line in lines:
        # "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER"
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or not tail:
            continue
        point = _unescape(fields[4])
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):  # the deepest; a later one over-mounts
            best = (point, tail[0])
    return best


def mount_fstype(path: str, mountinfo: str = _MOUNTINFO) -> str:
    """The filesystem type of the mount that holds ``path``, its links
    resolved (:func:`mount_of`); empty when unknown."""
    return mount_of(os.path.realpath(path), mountinfo)[1]


def _dead(point: str) -> bool:
    try:
        os.stat(point)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


def lost(root: str, relpath: str, exc: OSError) -> MountLost | None:
    """The :exc:`MountLost` that ``exc``, raised while ``relpath`` of the
    source at ``root`` was read, means; None when the mount still answers
    (an ordinary error, retried)."""
    if exc.errno not in (errno.ENOTCONN, errno.EIO):
        return None
    point, fstype = mount_of(root)
    if not point or point == "/":
        return None
    if exc.errno == errno.EIO and not _dead(point):
        return None
    kind = f" ({fstype})" if fstype else ""
    return MountLost(
        f"the mount at {point}{kind} stopped answering while {relpath} was read: "
        f"{exc.strerror or exc}",
        hint="its server (rclone, the platform's FUSE mount) has died or lost its "
             "backend: remount it, then rerun (files copied so far stay cached)")
