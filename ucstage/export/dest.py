"""The export's destination: checks, the lock, staging, verification, the swap, the record.

DEST is replaced as a whole, and a reader must see either the old export or
the new one. So Spark writes into a staging folder beside DEST (same
filesystem, a name starting with ``.`` so loaders and listings skip it);
:func:`verify_staged` opens every Parquet footer and checks the rows;
:func:`publish` writes the record into the staging folder, renames DEST
aside, renames the staging folder to DEST and deletes the old export. Both
renames stay within one folder, hence atomic. Any failure before the swap
removes the staging folder and leaves DEST as it was.

Exports into one DEST are serialised on a machine by :func:`dest_lock`, so
the second of two concurrent exports finds the first one's record and skips.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from ..atomic import write_atomic
from ..errors import ExportError, InvalidArgument
from ..progress import Callback
from ..tables.record import RECORD_NAME, ExportedFile, ExportRecord, load_record
from ..volumes import resolve
from .options import ExportOptions

__all__ = [
    "HADOOP_GLOB_CHARS",
    "check_dest_writable",
    "check_replaceable",
    "check_unlisted",
    "dest_lock",
    "load_record",
    "publish",
    "read_record",
    "remove_path",
    "resolve_dest",
    "staging_path",
    "swap",
    "sweep_leftovers",
    "unchanged_export",
    "verify_staged",
]

HADOOP_GLOB_CHARS = frozenset("[]{}*?\\")
"""Characters Hadoop expands in input and output paths."""


# -- checks before anything is written ----------------------------------------

def resolve_dest(dest: str) -> str:
    """The local folder for ``dest`` (``/Volumes/...`` through ``$UCSTAGE_VOLUMES_ROOT``).

    Raises:
        InvalidArgument: an object-store URL, glob characters, a file, ``/`` or home.
    """
    volume = resolve(dest, must_exist=False)
    if not volume.is_local:
        raise InvalidArgument(
            f"cannot export to {volume.url}: export writes only to local or mounted paths",
            hint="Spark here has no s3a, and an object store has no atomic rename: export to "
                 "the volume's mount (/Volumes/... on the platform) or a local folder",
        )
    path = volume.root.rstrip(os.sep) or volume.root
    bad = sorted(HADOOP_GLOB_CHARS & set(path))
    if bad:
        raise InvalidArgument(
            f"DEST {path} contains {' '.join(bad)}, which Hadoop reads as glob characters",
            hint="choose a folder name without [ ] { } * ? \\")
    if os.path.exists(path) and not os.path.isdir(path):
        raise InvalidArgument(f"DEST {path} exists and is not a folder")
    if path in ("/", os.path.expanduser("~")):
        raise InvalidArgument(f"refusing to export into {path}: it would be replaced")
    return path


def check_dest_writable(dest: str) -> None:
    """Refuse, before anything is written, a DEST whose folder cannot be made or written.

    The export writes its staging folder and lock file beside DEST and creates
    the missing folders above it, so the nearest existing folder above DEST
    must be a folder this process can write in.
    """
    parent = os.path.dirname(dest) or os.curdir
    while not os.path.lexists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            break
        parent = up
    if not os.path.isdir(parent):
        raise InvalidArgument(f"DEST {dest} cannot be created: {parent} is not a folder",
                              hint="choose a DEST whose parent is a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidArgument(f"DEST {dest} cannot be written: no write permission in {parent}",
                              hint="choose a DEST in a folder you can write to")


# Spark's own output: data files, markers and checksums, and ucstage's record.
_SPARK_OUTPUT = re.compile(r"(.*\.parquet|_SUCCESS|\..*\.crc|_committed_.*|_started_.*|"
                           + re.escape(RECORD_NAME) + ")")


def check_replaceable(dest: str, force: bool = False) -> None:
    """Refuse to replace a DEST that is not a previous ucstage export.

    An export replaces DEST as a whole. Refused:

    * a DEST holding anything but Parquet files, Spark's markers and
      ``COL=value`` folders (say, a mistyped project folder), even with
      ``force``: it is not an export of any kind;
    * without ``force``, a DEST holding Parquet output but no export record
      (``_ucstage_export.json``): ucstage did not write it.

    Each message names what is there (the first few paths). Files added to
    a previous export are :func:`check_unlisted`'s business.

    Raises:
        InvalidArgument: one of the above; nothing has been touched.
    """
    if not os.path.isdir(dest) or load_record(dest) is not None:
        return
    files, foreign = _dest_contents(dest)
    if foreign:
        raise InvalidArgument(
            f"DEST {dest} is not a Parquet export: it holds {_names(foreign)}; refusing to "
            "replace it", hint="choose another DEST, or move those files away "
                               "(`force` replaces only Parquet exports)")
    if files and not force:
        raise InvalidArgument(
            f"DEST {dest} holds Parquet output ({_names(files)}) but no {RECORD_NAME}: "
            "ucstage did not write it; refusing to replace it",
            hint="choose another DEST, or pass `force` to replace it (its files are deleted)")


def check_unlisted(dest: str, force: bool = False) -> None:
    """Refuse, without ``force``, to replace an export holding files its record does not list.

    Files someone added to a previous export (notes, extra Parquet files)
    would be deleted by the swap. Checked only when the export is about to be
    replaced: an unchanged export is skipped and touches nothing.

    Raises:
        InvalidArgument: naming the first few such files; nothing has been touched.
    """
    record = load_record(dest) if os.path.isdir(dest) else None
    if record is None or force:
        return
    files, foreign = _dest_contents(dest)
    listed = {f["path"] for f in record.files} | {RECORD_NAME}
    unlisted = [p for p in files + foreign if p not in listed]
    if unlisted:
        raise InvalidArgument(
            f"DEST {dest} holds files that its export record does not list: "
            f"{_names(sorted(unlisted))}; the new export would delete them",
            hint="move them out of DEST, or pass `force` to replace DEST with them")


def _dest_contents(dest: str) -> tuple[list[str], list[str]]:
    """(Spark-output files, everything else) in ``dest``, as sorted relative paths.

    "Everything else" is files that no Spark write makes and folders that
    are not ``COL=value`` partitions (``_temporary`` is Spark's too).
    """
    files: list[str] = []
    foreign: list[str] = []
    for folder, dirs, names in os.walk(dest):
        dirs.sort()
        rel = os.path.relpath(folder, dest)
        sub = os.path.basename(folder)
        if folder != dest and "=" not in sub and not sub.startswith("_temporary"):
            foreign.append(rel.replace(os.sep, "/") + "/")
            dirs[:] = []  # named as a whole
            continue
        for name in sorted(names):
            path = os.path.relpath(os.path.join(folder, name), dest).replace(os.sep, "/")
            (files if _SPARK_OUTPUT.fullmatch(name) else foreign).append(path)
    return files, foreign


def _names(paths: list[str], shown: int = 5) -> str:
    """The first ``shown`` paths, quoted, and how many more."""
    text = ", ".join(repr(p) for p in paths[:shown])
    return text + (f" and {len(paths) - shown:,} more" if len(paths) > shown else "")


# -- the record -----------------------------------------------------------------

def read_record(dest: str) -> ExportRecord | None:
    """The record of the export in ``dest``, or None if there is none or it is unreadable.

    ``dest`` is given as to :func:`~ucstage.export.export_table` (a
    ``/Volumes/...`` path or a local folder).
    """
    return load_record(resolve_dest(dest))


def unchanged_export(dest: str, *, table: str, source_kind: str, source_location: str | None,
                     delta_version: int | None, options: dict[str, Any]) -> ExportRecord | None:
    """The record in ``dest`` if that export is what this one would write, else None.

    It is when it names the same table, source and Delta version, was made with
    the same options, and every file it lists is present with its size. An
    unknown version (None) never matches: such a table is always exported.
    """
    if delta_version is None:
        return None
    record = load_record(dest)
    if record is None:
        return None
    if (record.table != table or record.source_kind != source_kind
            or record.source_location != source_location
            or record.delta_version != delta_version
            or ExportOptions.recorded(record.options) != options):
        return None
    for entry in record.files:
        try:
            if os.path.getsize(os.path.join(dest, entry["path"])) != entry["bytes"]:
                return None
        except OSError:
            return None
    return record


# -- the lock ---------------------------------------------------------------------

@contextmanager
def dest_lock(dest: str, callback: Callback) -> Iterator[None]:
    """One export into ``dest`` at a time on this machine (``flock`` on a file beside it).

    A second ``ucstage export`` of the same table (say, one per rank on a node)
    waits, then finds the export unchanged and skips. flock is not reliable
    across machines on network or FUSE mounts: start the export on one node.
    While it waits, ``callback.set_description`` says so.

    The lock file exists only while an export runs: the holder unlinks it
    before releasing the lock, and whoever then gets the lock on the unlinked
    file sees that the path no longer names the file it locked and starts over
    (see :func:`_acquire`). Folders created above DEST are removed again when
    the export wrote nothing (a refused ``where``, say).
    """
    parent, base = os.path.split(dest)
    lock_path = os.path.join(parent, f".{base}.ucstage.lock")
    created = _missing_folders(parent)
    fd = _acquire(parent, lock_path, dest, callback)
    try:
        yield
    finally:
        with suppress(OSError):
            os.unlink(lock_path)  # while holding the lock: see the docstring
        os.close(fd)
        if not os.path.lexists(dest):
            for folder in created:  # deepest first; one in use by another export stays
                try:
                    os.rmdir(folder)
                except OSError:
                    break


def _missing_folders(path: str) -> list[str]:
    """The folders of ``path`` that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    return missing


def _acquire(parent: str, lock_path: str, dest: str, callback: Callback) -> int:
    """Open and ``flock`` the lock file; return its descriptor once the lock is ours.

    The lock counts only if ``lock_path`` still names the file locked: a
    previous holder unlinks it before releasing, so a waiter can get the lock
    on a file no one else will open again. It then closes it and retries with
    the file now at the path.
    """
    waiting = False
    try:
        for _attempt in range(1000):
            try:
                os.makedirs(parent, exist_ok=True)
                # Never through a link: one planted there by another user
                # would have us create or lock a file wherever it points.
                fd = os.open(lock_path,
                             os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileNotFoundError:  # a finishing export removed a folder it had made
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise ExportError(
                        f"the lock file {lock_path} is a symlink; refusing to follow it",
                        "remove it (ucstage never makes one), and check who may write "
                        f"{parent}") from exc
                raise ExportError(f"cannot create the lock file {lock_path}: {exc}") from exc
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if not waiting:
                        callback.set_description(f"waiting for another export into {dest}")
                        waiting = True
                    fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    named = os.stat(lock_path)
                except FileNotFoundError:
                    named = None
            except BaseException:
                os.close(fd)
                raise
            if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                return fd
            os.close(fd)
        raise ExportError(f"could not lock {lock_path}: it kept being replaced")
    finally:
        if waiting:
            callback.set_description("")


# -- leftovers of killed exports ---------------------------------------------------

def sweep_leftovers(dest: str) -> str | None:
    """Clean up after killed exports into ``dest``; call only while holding :func:`dest_lock`.

    Holding the lock means no other export into ``dest`` runs on this machine,
    so the staging folders and set-aside old exports beside it belong to runs
    that were killed. Staging folders are deleted. A set-aside export is put
    back when DEST is missing (the run died between the two renames of the
    swap), and deleted otherwise. (The lock file such a run leaves is the one
    the caller now holds, and goes when it is released.)

    Returns:
        The folder an export was restored from, or None.
    """
    parent, base = os.path.split(dest)
    pattern = re.compile(r"\." + re.escape(base) + r"\.ucstage-(staging|old)-[0-9a-f]{12}")
    try:
        names = sorted(os.listdir(parent or os.curdir))
    except OSError:
        return None
    olds = []
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(parent, name)
        if match.group(1) == "old":
            olds.append(path)
        else:
            remove_path(path)
    restored = None
    if olds and not os.path.lexists(dest):
        restored = max(olds, key=lambda p: os.lstat(p).st_ctime)  # the last one set aside
        os.rename(restored, dest)
        olds.remove(restored)
    for path in olds:
        remove_path(path)
    return restored


# -- staging, verification, the swap ----------------------------------------------

def staging_path(dest: str, kind: str) -> str:
    """A fresh hidden path beside ``dest`` (``.<name>.ucstage-<kind>-<id>``)."""
    parent, base = os.path.split(dest)
    return os.path.join(parent, f".{base}.ucstage-{kind}-{uuid.uuid4().hex[:12]}")


def remove_path(path: str) -> None:
    """Delete a folder tree or a file; nothing if it is gone."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def verify_staged(staging: str, expected_rows: int, files: int | None) -> list[ExportedFile]:
    """Open every file's footer; check the rows and, if ``files`` is given, the file count.

    Markers other servers leave (``_SUCCESS``, ``.crc``, committer files) are
    deleted. Footers, not every page, are read: reading everything back
    would double the cost of an export.

    Returns:
        The Parquet files, sorted by path.

    Raises:
        ExportError: an unreadable or unexpected file, or the counts differ.
    """
    import pyarrow.parquet as pq

    written: list[ExportedFile] = []
    for folder, dirs, names in os.walk(staging):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(folder, name)
            rel = os.path.relpath(full, staging).replace(os.sep, "/")
            if name.startswith(("_", ".")):
                os.unlink(full)
                continue
            if not name.endswith(".parquet"):
                raise ExportError(f"unexpected file {rel} in the Spark output")
            try:
                rows = pq.ParquetFile(full).metadata.num_rows
            except Exception as exc:
                raise ExportError(f"written file {rel} is not readable Parquet: {exc}") from exc
            written.append(ExportedFile(path=rel, bytes=os.path.getsize(full), rows=int(rows)))
    written.sort(key=lambda f: f["path"])
    total = sum(f["rows"] for f in written)
    if total != expected_rows:
        raise ExportError(f"verification failed: the files hold {total:,} rows, the source "
                          f"has {expected_rows:,}")
    if files is not None and len(written) != files:
        raise ExportError(
            f"Spark wrote {len(written)} files, not the {files} asked for "
            f"({expected_rows:,} rows: some of the {files} slices were empty)",
            hint="ask for fewer files than rows")
    return written


def footer_row_groups(folder: str, files: list[ExportedFile]) -> list[list[int]]:
    """The rows of each row group of each of ``files`` of the export in ``folder``.

    From the footers, through the table listing TableDataset reads
    (:func:`ucstage.tables.row_groups`): what the writer actually did (its
    byte limit, and each file's last group, end groups before
    ``row_group_rows``). A listing that fails (an export of no rows) gives
    no row groups; the export itself was verified when it was written.
    """
    from ..errors import UcstageError
    from ..tables import row_groups

    try:
        manifest = row_groups(folder)
    except UcstageError:
        return [[] for _ in files]
    held: dict[str, list[int]] = {}
    for f, rows in zip(manifest.file.tolist(), manifest.rows_per_group.tolist(), strict=True):
        held.setdefault(manifest.files[f].path, []).append(int(rows))
    return [held.get(entry["path"], []) for entry in files]


def publish(staging: str, dest: str, record: ExportRecord) -> None:
    """Write ``record`` into ``staging``, then swap ``staging`` in for ``dest``.

    The old export is renamed aside, the staging folder renamed to ``dest``,
    and the old one deleted. A process killed between the two renames leaves
    ``dest`` missing and the old export in ``.<name>.ucstage-old-<id>``.

    Raises:
        OSError: the record or a rename failed; ``dest`` is as it was.
    """
    write_atomic(os.path.join(staging, RECORD_NAME), record.dumps())
    swap(staging, dest)


def swap(staging: str, dest: str) -> None:
    """Put the folder ``staging`` in ``dest``'s place: two renames within one folder.

    The old ``dest`` is renamed aside, ``staging`` renamed to ``dest``, and the
    old one deleted (``ucstage pack`` publishes with it too). A process killed
    between the two renames leaves ``dest`` missing and the old one in
    ``.<name>.ucstage-old-<id>``, which :func:`sweep_leftovers` puts back.

    Raises:
        OSError: a rename failed; ``dest`` is as it was.
    """
    old = None
    if os.path.lexists(dest):
        old = staging_path(dest, "old")
        os.rename(dest, old)
    try:
        os.rename(staging, dest)
    except BaseException:
        if old is not None:
            os.rename(old, dest)
        raise
    if old is not None:
        remove_path(old)
