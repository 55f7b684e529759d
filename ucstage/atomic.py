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
import secrets

__all__ = ["write_atomic"]


def write_atomic(path: str, data: bytes | str, *, mode: int | None = None) -> str:
    """Replace ``path`` with ``data`` atomically and durably; return ``path``.

    ``str`` data is written as UTF-8. The file gets ``mode`` exactly when
    given; by default ``0o666`` less the umask (and the folder's default ACL),
    as any program's new file would: a user who keeps their files private with
    ``umask 077`` gets a private manifest or export record. The temp file is
    removed if anything fails, so a failed write leaves no partial file behind.
    """
    folder = os.path.dirname(os.path.abspath(path))
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _create_temp(folder, os.path.basename(path), 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
    return path


def _create_temp(folder: str, name: str, mode: int) -> tuple[int, str]:
    """A new hidden temp file beside ``name``, created with ``mode`` (which the
    kernel narrows by the umask; ``tempfile.mkstemp`` would force 0600).
    ``O_EXCL`` makes it one this call made, never a file or link already
    there (then another name is tried)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = os.path.join(folder, f".{name[:40]}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temp file name in {folder} for {name}")


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
