"""Durable, all-or-nothing file writes: the one writer for every small file
ucstage publishes (manifests, the export record, the cache's bookkeeping).

A reader sees the old file or the new one, never a mix: the bytes go to a
temp file in the same folder (so the rename stays on one filesystem), are
fsynced, renamed over the target, and the folder is fsynced so the rename
itself survives a power cut.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__ = ["write_atomic"]


def write_atomic(path: str, data: bytes | str, *, mode: int = 0o644) -> str:
    """Replace ``path`` with ``data`` atomically and durably; return ``path``.

    ``str`` data is written as UTF-8. The file gets ``mode`` (before umask is
    not applied: the mode is set explicitly). The temp file is removed if
    anything fails, so a failed write leaves no partial file behind.
    """
    folder = os.path.dirname(os.path.abspath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path)[:40] + ".",
                               suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return path


def fsync_dir(folder: str) -> None:
    """Make a rename or create inside ``folder`` durable."""
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # not every filesystem lets a folder be opened; nothing more to do
    try:
        os.fsync(dfd)
    except OSError:
        pass  # some filesystems (FUSE, tmpfs variants) refuse fsync on a folder
    finally:
        os.close(dfd)
