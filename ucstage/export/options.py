"""What shapes an export's output, checked before Spark starts; and the ``files`` suggestion.

Messages name the parameters of :func:`~ucstage.export.export_table`
(``max_records_per_file``), never the CLI's flags: the CLI's error mapper
says them as ``--max-records-per-file`` for a person at the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgument
from ..sharding import Layout

__all__ = ["COMPRESSIONS", "ExportOptions", "check_partition_by", "suggest_files"]

COMPRESSIONS = ("zstd", "snappy", "none")


@dataclass(frozen=True)
class ExportOptions:
    """What shapes the output; two exports with equal options and table version are equal."""

    columns: list[str] | None = None
    where: str | None = None
    partition_by: list[str] = field(default_factory=list)
    files: int | None = None
    max_records_per_file: int | None = None
    compression: str = "zstd"
    row_group_rows: int | None = None
    """Parquet's row-count limit per row group (an upper bound: the writer's
    byte limit, and each file's last group, may end a group sooner)."""

    def validate(self) -> None:
        """Refuse what is wrong with the options alone.

        Raises:
            InvalidArgument: naming the parameter at fault.
        """
        if self.compression not in COMPRESSIONS:
            raise InvalidArgument(f"compression must be one of {', '.join(COMPRESSIONS)}, "
                                  f"got {self.compression!r}")
        if self.files is not None and self.max_records_per_file is not None:
            raise InvalidArgument("files and max_records_per_file exclude each other",
                                  hint="files writes exactly that many files, "
                                       "max_records_per_file caps the rows in each: choose one")
        if self.files is not None and self.files < 1:
            raise InvalidArgument(f"files must be at least 1, got {self.files}")
        if self.max_records_per_file is not None and self.max_records_per_file < 1:
            raise InvalidArgument("max_records_per_file must be at least 1, "
                                  f"got {self.max_records_per_file}")
        if self.row_group_rows is not None and (
                not isinstance(self.row_group_rows, int) or isinstance(self.row_group_rows, bool)
                or self.row_group_rows < 1):
            raise InvalidArgument(f"row_group_rows must be at least 1, got {self.row_group_rows}")
        if self.files is not None and self.partition_by:
            raise InvalidArgument(
                "files counts the files of one folder and cannot be combined with partition_by",
                hint="use max_records_per_file with partition_by")
        if self.columns is not None and not self.columns:
            raise InvalidArgument("columns is empty")
        if self.where is not None and not self.where.strip():
            raise InvalidArgument("where is empty")
        if self.columns is not None:
            # The same check Spark's analysis allows later, made before Spark
            # starts; Spark matches column names without regard to case.
            check_partition_by(self.partition_by, self.columns, ignore_case=True)

    def as_dict(self) -> dict[str, Any]:
        """The options as the export record stores them (key order is part of the file)."""
        return {"columns": self.columns, "where": self.where, "partition_by": self.partition_by,
                "files": self.files, "max_records_per_file": self.max_records_per_file,
                "compression": self.compression, "row_group_rows": self.row_group_rows}

    @staticmethod
    def recorded(options: dict[str, Any]) -> dict[str, Any]:
        """A record's ``options`` with the keys an older record lacks at their defaults.

        A record written before ``row_group_rows`` existed was made without
        it, so it still matches an export that does not ask for it.
        """
        return {**ExportOptions().as_dict(), **options}


def check_partition_by(partition_by: Sequence[str], columns: Sequence[str], *,
                       ignore_case: bool = False) -> None:
    """Refuse partition columns that are not in the output, or that would be all of it.

    Raises:
        InvalidArgument: a column of ``partition_by`` is not among ``columns``,
            or ``partition_by`` names every column (the files would be empty).
    """
    if not partition_by:
        return
    chosen = {c.lower() for c in columns} if ignore_case else set(columns)
    missing = [c for c in partition_by if (c.lower() if ignore_case else c) not in chosen]
    if missing:
        raise InvalidArgument(f"partition_by column(s) {', '.join(missing)} not in the output",
                              hint=f"the output has the columns {', '.join(columns)}")
    if len(partition_by) >= len(columns):
        raise InvalidArgument("partition_by cannot use every column: the files would be empty")


def suggest_files(files: int | None, world_size: int, num_workers: int | Sequence[int]) -> int:
    """The smallest multiple of the slot count that is at least ``files``.

    With a multiple of the slot count (:attr:`ucstage.sharding.Layout.slots`),
    every (rank, worker) slot reads the same number of files. ``num_workers``
    is one int for every rank or one per rank, as a ``Layout`` takes.
    """
    slots = Layout(world_size, num_workers).slots
    wanted = max(files or 1, 1)
    return -(-wanted // slots) * slots
