"""Telling a dead mount from a failed read, for local-like sources.

A FUSE mount whose server died (rclone killed, the platform's mount lost)
answers every call with ``ENOTCONN`` ("Transport endpoint is not
connected"), or, for reads already open, ``EIO``. Retrying cannot help, and
the error names neither the mount nor the cause; :func:`lost` turns such an
error into :exc:`ucstage.errors.MountLost`, naming the mount.
"""

from __future__ import annotations

import errno
import os

from ..errors import MountLost

__all__ = ["lost", "mount_of"]


def _unescape(field: str) -> str:
    # /proc/self/mounts escapes space, tab, newline and backslash as octal.
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
        .replace("\\134", "\\")


def mount_of(path: str) -> tuple[str, str]:
    """``(mount point, filesystem type)`` of the mount holding ``path``,
    from ``/proc/self/mounts`` (no call into the mount itself, which may be
    dead); ``("", "")`` when unknown."""
    path = os.path.abspath(path)
    best = ("", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = _unescape(fields[1])
                inside = path == point or path.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, fields[2])
    except OSError:
        pass
    return best


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
