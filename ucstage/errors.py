"""Typed errors. Every error ucstage raises on purpose derives from UcstageError.

The CLI maps them, in one place (``ucstage.cli.app``), to a one-line message,
an optional hint and an exit code: 2 for "you asked for something wrong",
1 for "the command ran and found a problem". Messages name the library's
parameters, never CLI flags: the mapper says them as the running command's
flags (``ucstage.cli.output.flag_names`` and ``error_hint``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .shown import shown

__all__ = [
    "NESTED_TOO_DEEP",
    "CacheError",
    "CacheFull",
    "CacheOwnershipError",
    "CacheUnusable",
    "CheckpointCorrupt",
    "CheckpointError",
    "CheckpointIncomplete",
    "CheckpointUnsafe",
    "CorruptParquet",
    "CorruptShard",
    "EmptySource",
    "ExportError",
    "FetchFailed",
    "GroupingError",
    "InvalidArgument",
    "ManifestError",
    "MissingDataFiles",
    "MissingDependency",
    "MountLost",
    "NotParquet",
    "PackError",
    "RankMismatch",
    "ResumeMismatch",
    "SchemaMismatch",
    "ShardChanged",
    "SourceNotFound",
    "SourceUnreadable",
    "SparkUnavailable",
    "TableNotFound",
    "UcstageError",
    "UnknownColumn",
    "UnreadableDeltaLog",
    "UnreadableFolders",
    "UnsafePath",
    "UnsupportedTable",
]


NESTED_TOO_DEEP = "not valid JSON: arrays or objects nested too deeply"
"""Why a JSON file ucstage reads (a manifest, a saved state) is refused when
it nests deeper than Python's decoder can follow (it raises RecursionError)."""


_TORCH_RERAISE = re.compile(r"Caught \w+ in (DataLoader worker process \d+|pin memory thread|"
                            r"replica \d+ on device \S+)\.\nOriginal ")
"""How torch re-raises a DataLoader worker's error in the main process:
``type(exc)(message=...)`` with the worker's traceback after this line."""


def _shown_message(text: str) -> str:
    """``text`` made safe to show (:func:`ucstage.shown.shown`), but for the
    line breaks of torch's re-raise of a worker's error: that text is the
    worker's traceback, whose messages were made safe when they were raised
    there, and its lines read as one traceback only when they stay lines."""
    if _TORCH_RERAISE.match(text):
        return "\n".join(shown(line) for line in text.split("\n"))
    return shown(text)


class UcstageError(Exception):
    """Base class: a problem ucstage can explain in one line.

    Attributes:
        hint: what the user can do about it (may be empty).
        exit_code: 2 for bad input or setup, 1 for a problem found at run time.
    """

    exit_code: int = 2

    def __init__(self, message: str, hint: str = "") -> None:
        # Messages name files, and a name may hold ESC or CR: every typed
        # error's text is shown safe here, once (ucstage.shown).
        super().__init__(_shown_message(message))
        self.message = message
        self.hint = hint

    @property
    def message(self) -> str:
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        self._message = _shown_message(value)

    @property
    def hint(self) -> str:
        return self._hint

    @hint.setter
    def hint(self, value: str) -> None:
        self._hint = shown(value)

    def __str__(self) -> str:
        return self.message


class InvalidArgument(UcstageError):
    """An option or argument has a value ucstage cannot use."""


class SourceNotFound(UcstageError):
    """The source path or URL does not exist."""


class SourceUnreadable(UcstageError):
    """The source's store refused or failed the request (credentials, endpoint, permissions)."""


class UnreadableFolders(SourceUnreadable):
    """Folders inside a source could not be listed: the listing is incomplete.

    Exit 1 (the listing ran and found a problem), unlike an unreadable source
    as a whole (:class:`SourceUnreadable`, exit 2). ``folders`` holds
    ``(path, reason)`` with each folder's full path or URL.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str = "",
                 folders: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message, hint)
        self.folders = list(folders)


class EmptySource(UcstageError):
    """The source exists but lists no files after filtering."""


class GroupingError(UcstageError):
    """Files cannot be grouped into samples: two members of one sample share a
    suffix, or a sample lacks a required member (``on_incomplete="error"``)."""


class ManifestError(UcstageError):
    """A manifest file is missing, malformed, or fails its fingerprint check."""


class MissingDependency(UcstageError):
    """An optional package or system tool needed for this feature is absent."""


class UnsafePath(UcstageError):
    """A source entry would read or write outside its volume or the cache root,
    or a Delta log names a file outside its table's folder."""


class CacheError(UcstageError):
    """The local cache cannot be used as asked."""


class CacheOwnershipError(CacheError):
    """The cache root is not a private folder owned by this user: it is a
    symlink, another user's, or writable by others; or a folder above it is
    another user's or writable by others (without the sticky bit), so they
    could swap the root; or a symlink sits where the cache keeps a file of
    its own."""


class CacheUnusable(CacheError):
    """The cache root cannot hold a cache: it is a file, on a read-only file
    system, or a folder this user cannot write. ``root`` is the path and
    ``reason`` what is wrong with it; the hint says what to do."""

    def __init__(self, root: str, reason: str, hint: str = "") -> None:
        super().__init__(f"cache root {root} {reason}", hint or (
            "set UCSTAGE_CACHE_DIR to a folder you can write on a writable disk (a new one: "
            "ucstage creates it private)"))
        self.root = root
        self.reason = reason


class CacheFull(CacheError):
    """The cache's filesystem or byte cap has no room for what must be stored."""

    exit_code = 1


class CheckpointError(UcstageError):
    """A folder is not a checkpoint ucstage can load or manage: nothing of a
    torch.distributed.checkpoint is in it, or it is one that is already
    complete where a new one would be written."""


class CheckpointIncomplete(CheckpointError):
    """A checkpoint folder without its ``.metadata``: a save that has not
    finished (or never will: a killed job). It is never loaded."""


class CheckpointCorrupt(CheckpointError):
    """A complete checkpoint whose files disagree with its record: a file
    missing, of another size, or whose bytes fail their checksum; or a save
    whose copy to the destination landed other bytes than were written."""

    exit_code = 1


class CheckpointUnsafe(CheckpointCorrupt):
    """A checkpoint whose record or ``.metadata`` names a file that is not
    one of its own data files: a path leading out of its folder (``../x``,
    an absolute path), a name with control characters, or a file that is a
    link. Refused before anything is read; bad input (exit 2), not damage
    found by a check (exit 1)."""

    exit_code = 2


class FetchFailed(UcstageError):
    """One or more files could not be copied from the source after retries."""

    exit_code = 1


class MountLost(SourceUnreadable):
    """A mount the source is read through stopped answering mid-read (its
    FUSE server died: ``ENOTCONN``, or ``EIO`` from a dead mount)."""

    exit_code = 1


class RankMismatch(UcstageError):
    """Distributed ranks disagree on num_workers or on the listing they shard."""

    exit_code = 1


class ResumeMismatch(UcstageError):
    """A saved loader state cannot be honoured: another listing, seed or shuffle."""


class ExportError(UcstageError):
    """An export failed; the previous export, if any, is left intact."""

    exit_code = 1


class PackError(UcstageError):
    """A pack failed while reading SOURCE or writing shards; DEST is left as it was."""

    exit_code = 1


class TableNotFound(UcstageError):
    """The table name does not resolve to a Delta table."""


class UnreadableDeltaLog(TableNotFound):
    """A Delta table's log (or a deletion vector it names) is there but cannot
    be read: a commit or checkpoint that does not parse, a deletion vector whose
    checksum, magic or row count is wrong."""


class MissingDataFiles(SourceNotFound):
    """Files a table's log or record names (data files, deletion vectors) are
    gone from its folder: the table was vacuumed past the version read, or
    copied incompletely."""


class UnsupportedTable(UcstageError):
    """The table uses a Delta reader feature this read path cannot honour."""


class NotParquet(UcstageError):
    """A file of a table source is not a readable Parquet file."""


class CorruptParquet(NotParquet):
    """A Parquet file's footer and its bytes disagree: a column chunk past the
    end of the file, or pages that do not decode (named: file, row group, column)."""


class CorruptShard(UcstageError):
    """A shard file cannot be read as its format: a truncated tar, a member
    running past the end, a gzip stream cut short, a JSON line that does not
    parse (named: the file, and the member or line number)."""


class ShardChanged(CorruptShard):
    """A shard's bytes are not the ones indexed when its samples were frozen:
    the file was replaced between ``freeze()`` and the read."""


class SchemaMismatch(UcstageError):
    """The Parquet files of a table source have schemas that cannot be unified."""


class UnknownColumn(InvalidArgument):
    """A column asked for is not in the table."""


class SparkUnavailable(UcstageError):
    """No Spark Connect server could be reached or started."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same clean-up runs (the CLI installs
    the handler and exits 143 instead of 130). Library code that stops on
    ``KeyboardInterrupt`` stops on this too."""
