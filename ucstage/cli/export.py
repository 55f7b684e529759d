"""``ucstage export``: a Delta table to Parquet files in a volume, atomically, once."""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from ..errors import InvalidArgument
from ..progress import Callback
from ..shown import shown
from .args import column_list, num_workers_list
from .output import (
    CONTEXT,
    counted,
    emit,
    err,
    escape,
    flag_names,
    format_bytes,
    json_option,
    table,
)

INTERVAL = 10.0
"""Seconds between two progress lines off a terminal."""


class _Status(Callback):
    """What the export is doing, on stderr.

    On a terminal, a rich spinner with the step; an empty description (the
    step is over) removes it. Off a terminal (a log), a line when a step
    starts, then every ``interval`` seconds one that says how long it has
    run, as ``rclone --stats`` does, so a long export's log shows it is alive.
    A step with a size (fetching a table on an object store into the cache)
    also shows the files and bytes done.
    """

    def __init__(self, console: Console, *, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console
        self.terminal = console.is_terminal
        self.interval = interval
        self.clock = clock
        self.step = ""
        self.size: int | None = None
        self.items: int | None = None
        self.done = 0
        self.files_done = 0
        self.started = clock()
        self._step_started = self.started
        self._status: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_description(self, text: str) -> None:
        with self._lock:
            if text == self.step:
                return
            self.step, self._step_started = text, self.clock()
            self.size = self.items = None
            self.done = self.files_done = 0
            # Printed under the lock: no periodic line of this step comes first.
            if text and not self.terminal:
                self.console.print(f"export: {text}", markup=False, highlight=False)
        if self.terminal:
            self._spin(text)
            return
        if text and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ucstage-export-status",
                                            daemon=True)
            self._thread.start()

    def set_size(self, size: int, items: int | None = None) -> None:
        with self._lock:
            self.size, self.items, self.done, self.files_done = size, items, 0, 0
        self._counts_changed()

    def relative_update(self, inc: int = 1) -> None:
        with self._lock:
            self.done += inc
        self._counts_changed()

    def item_done(self, name: str, status: str, error: str = "") -> None:
        with self._lock:
            self.files_done += 1
        self._counts_changed()

    def _counts(self) -> str:
        """``: 3/40 files, 1.2 MiB/5.0 MiB (24%)``, or '' for a step without a size."""
        if self.size is None:
            return ""
        files = f"{self.files_done:,}/{self.items:,} files, " if self.items is not None else ""
        pct = f" ({100 * self.done // self.size}%)" if self.size else ""
        return f": {files}{format_bytes(self.done)}/{format_bytes(self.size)}{pct}"

    def _counts_changed(self) -> None:
        if self.terminal:
            with self._lock:
                text = self.step + self._counts() if self.step else ""
            if text and self._status is not None:
                self._status.update(text)

    def _spin(self, text: str) -> None:
        if not text:
            if self._status is not None:
                self._status.stop()
                self._status = None
        elif self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def line(self) -> str | None:
        """The periodic line for now; None between steps."""
        with self._lock:
            return self._line()

    def _line(self) -> str | None:
        if not self.step:
            return None
        now = self.clock()
        # One clock; the export's total only once an earlier step makes it differ.
        line = (f"export: {self.step}{self._counts()}: running for "
                f"{_clock(now - self._step_started)}")
        if _clock(self._step_started - self.started) != _clock(0):
            line += f" ({_clock(now - self.started)} since the export began)"
        return line

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with self._lock:
                text = self._line()
                if text is not None:
                    self.console.print(text, markup=False, highlight=False)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.terminal:
            self._spin("")


def _clock(seconds: float) -> str:
    """``0:01:05``: hours, minutes, seconds."""
    total = int(seconds + 0.5)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


def _suggestion(data: dict[str, Any], world_size: int | None, workers: list[int] | None,
                num_workers: str | None) -> str | None:
    """The --files advice when the file count does not split evenly over the loader slots."""
    from ..sharding import Layout

    count, suggested = len(data["files"]), data.get("suggested_files")
    if world_size is None or workers is None or suggested is None or suggested == count:
        return None
    # Whole files, as VolumeDataset deals them; the row groups above are what
    # TableDataset deals, so both lines can be true at once and say which is which.
    verb = "does" if count == 1 else "do"
    return (f"read as whole files (VolumeDataset), {counted(count, 'file')} {verb} not split "
            f"evenly over {counted(Layout(world_size, workers).slots, 'loader slot')} "
            f"({counted(world_size, 'rank')} x {num_workers} workers): use --files "
            f"{suggested} so every (rank, worker) slot reads as many files; TableDataset "
            "deals the row groups above")


def _render(console: Console, data: dict[str, Any], suggestion: str | None) -> None:
    from ..tables.record import RECORD_NAME

    files = data["files"]
    if data["skipped_unchanged"]:
        console.print(f"[green]✓[/] {data['table']} is unchanged since the export in "
                      f"{data['dest']} (Delta version {data['delta_version']}, "
                      f"{data['created_at']}): nothing to do. --force re-exports.")
    else:
        version = data["delta_version"]
        console.print(f"[green]✓[/] exported {data['table']}"
                      + (f" (Delta version {version})" if version is not None else "")
                      + f" to {data['dest']} in {data['seconds']:.1f} s")
    summary = table("", "", numeric=False)
    summary.show_header = False
    summary.add_row("rows", f"{data['row_count']:,}")
    summary.add_row("files", f"{len(files):,} ({format_bytes(data['bytes'])})")
    summary.add_row("columns", escape(", ".join(f["name"] for f in data["schema"]["fields"])))
    opts = data["options"]
    given = {k: v for k, v in opts.items() if v not in (None, [], "")}
    summary.add_row("options", ", ".join(f"{k}={v}" for k, v in given.items()))
    summary.add_row("row groups", _row_groups(data))
    summary.add_row("record", Text(shown(f"{data['dest']}/{RECORD_NAME}")))
    console.print(summary)
    for advice in (suggestion, _slots_advice(data)):
        if advice:
            console.print(f"[yellow]![/] {advice}")
    console.print(Text(f"load: {load_hint(data['dest'], bool(opts.get('partition_by')))}",
                       style="dim"))
    console.print(Text(f"  or: {stream_hint(data['dest'])}", style="dim"))


def _row_groups(data: dict[str, Any]) -> str:
    """What the footers hold, and the loader slots that fills."""
    groups = data["row_groups"]
    count, files = groups["count"], len(data["files"])
    if not count:
        return f"none in {files:,} file{'s' * (files != 1)}"
    low, high = groups["rows_min"], groups["rows_max"]
    rows = f"{high:,}" if low == high else f"{low:,}-{high:,}"
    text = f"{count:,} in {files:,} file{'s' * (files != 1)}, {rows} rows each"
    slots = data.get("row_group_slots")
    if slots is None:
        return text + f": up to {count:,} loader slots"
    (least, most), (rows_lo, rows_hi) = slots["row_groups"], slots["rows"]
    per = f"{least:,}" if least == most else f"{least:,}-{most:,}"
    per += " row group" + "s" * (most != 1)
    span = f"{rows_lo:,}" if rows_lo == rows_hi else f"{rows_lo:,}-{rows_hi:,}"
    return (text + f": fill {slots['filled']:,} of {slots['slots']:,} loader slots "
            f"({per}, {span} rows per slot)")


def _slots_advice(data: dict[str, Any]) -> str | None:
    """The --row-group-rows advice when some loader slots get no row group."""
    slots = data.get("row_group_slots")
    if slots is None or slots["filled"] >= slots["slots"] or not data["row_count"]:
        return None
    # Each file's ceil(rows / N) groups sum to at least row_count / N.
    limit = max(1, data["row_count"] // slots["slots"])
    return (f"{data['row_groups']['count']:,} row groups leave "
            f"{slots['slots'] - slots['filled']:,} of {slots['slots']:,} loader slots "
            f"empty: use --row-group-rows {limit:,} so every slot reads a row group")


def load_hint(dest: str, partitioned: bool) -> str:
    """A Python expression that loads every column of the export in ``dest``.

    Partition columns live only in the ``COL=value`` folder names, which
    ``datasets``' Parquet loader does not read back; pyarrow's hive
    partitioning does.
    """
    if partitioned:
        return f"pyarrow.dataset.dataset({dest!r}, format='parquet', partitioning='hive')"
    return f"datasets.load_dataset('parquet', data_files={dest + '/*.parquet'!r})"


def stream_hint(dest: str) -> str:
    """The same export as a :class:`ucstage.TableDataset`: streamed by row group,
    dealt over ranks and workers, each node caching its share."""
    return f"ucstage.TableDataset({dest!r})"


@click.command("export", context_settings=CONTEXT)
@click.argument("table_name", metavar="TABLE")
@click.argument("dest", metavar="DEST")
@click.option("--remote", metavar="sc://HOST:PORT", default=None,
              help="Spark Connect server to use. Default: $SPARK_REMOTE, else an embedded "
                   "local server that ucstage starts (needs Java 17).")
@click.option("--columns", metavar="A,B,...", default=None,
              help="Export only these top-level columns, in this order.")
@click.option("--where", metavar="SQL", default=None,
              help="Export only rows matching this Spark SQL expression. Checked by Spark "
                   "before anything is written.")
@click.option("--partition-by", metavar="COL[,COL]", default=None,
              help="Write COL=value/ subfolders (the column moves into the folder name).")
@click.option("--files", type=int, default=None, metavar="N",
              help="Write exactly N files (repartitions the rows).")
@click.option("--max-records-per-file", type=int, default=None, metavar="N",
              help="At most N rows per file.")
@click.option("--compression", type=click.Choice(["zstd", "snappy", "none"]), default="zstd",
              show_default=True, help="Parquet compression codec.")
@click.option("--row-group-rows", type=int, default=None, metavar="N",
              help="At most N rows per Parquet row group (an upper bound: the writer's byte "
                   "limit and each file's last group end groups sooner). Row groups are the "
                   "unit TableDataset deals over ranks and workers; the summary says how "
                   "many the footers hold.")
@click.option("--force", is_flag=True,
              help="Export even if the table version and options match the last export. "
                   "Also replaces a DEST of Parquet files that ucstage did not write, and "
                   "files added to a previous export (a DEST holding anything else is "
                   "never replaced).")
@click.option("-w", "--world-size", type=int, default=None,
              help="With --num-workers: check that the file count suits this many ranks.")
@click.option("-k", "--num-workers", default=None, metavar="K|K0,K1,...",
              help="DataLoader workers per rank, for the --files suggestion.")
@json_option
def command(
    table_name: str, dest: str, remote: str | None, columns: str | None, where: str | None,
    partition_by: str | None, files: int | None, max_records_per_file: int | None,
    compression: str, row_group_rows: int | None, force: bool, world_size: int | None, num_workers: str | None,
    as_json: bool,
) -> None:
    """Export a Delta table to Parquet files in DEST, atomically, and only when it changed.

    TABLE is catalog.schema.table (quote odd parts in backticks) or a Delta table
    path: a local or mounted folder, or s3://, gs://, az://, abfss:// (or a
    /Volumes path mapped there), whose live files are first fetched into the
    local cache and held there while Spark reads them (the disk needs about
    the table's live size; $UCSTAGE_CACHE_MAX_BYTES must fit it). Names resolve through $UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>
    when that is set, else through the Spark server's catalog. DEST is a
    /Volumes/... path (mapped through $UCSTAGE_VOLUMES_ROOT) or a local folder.

    The new files are written beside DEST, verified (every file readable, row
    count equal to the table's) and swapped in; on any failure the previous
    export stays as it was. DEST/_ucstage_export.json records table, Delta
    version, rows, schema, files and options; a rerun with the same version
    and options does nothing.

    \b
    Examples:
      ucstage export main.ml.events /Volumes/main/ml/train/events
      ucstage export main.ml.events /Volumes/main/ml/train/events --files 16 -w 2 -k 4
      ucstage export main.ml.events /Volumes/main/ml/train/events --files 6 --row-group-rows 100000
      ucstage export ./tables/events out/events --where "day >= '2024-01-01'" --columns id,text
      ucstage export main.ml.events /Volumes/main/ml/train/events --remote sc://spark:15002
    """
    from ..export import export_table
    from ..sharding import Layout

    # Every check on the arguments alone comes before Spark starts or anything
    # is written: exit 2 means DEST was not touched.
    if (world_size is None) != (num_workers is None):
        raise InvalidArgument("--world-size and --num-workers go together")
    workers: list[int] | None = None
    if world_size is not None and num_workers is not None:
        workers = Layout(world_size, num_workers_list(num_workers)).workers_per_rank()
    columns_list, partition_list = column_list(columns), column_list(partition_by)
    # pyspark logs every server-side error as JSON on stderr; the CLI prints its own line.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    # ...and warns when its bounded retries run out; the error line says that.
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    # A table on an object store is read through obstore in this process,
    # which forks no DataLoader workers: no child per metadata call (as `cache warm`).
    from ..engines import objstore

    objstore.run_here()
    status = _Status(err)
    try:
        result = export_table(
            table_name, dest, remote=remote, columns=columns_list, where=where,
            partition_by=partition_list, files=files,
            max_records_per_file=max_records_per_file, compression=compression,
            row_group_rows=row_group_rows, force=force, callback=status)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: say what was done, then exit 130/143
        from ..export.interrupt import notes

        status.close()
        for note in notes(exc):
            err.print(f"stopped: {note}", markup=False, highlight=False)
        raise
    finally:
        status.close()
    data = result.to_json(world_size=world_size, num_workers=workers)
    command_ = click.get_current_context().command
    data["warnings"] = [flag_names(w, command_) for w in data["warnings"]]
    for warning in data["warnings"]:
        err.print(Text.assemble(("warning:", "yellow"), f" {warning}"))
    suggestion = _suggestion(data, world_size, workers, num_workers)
    emit(data, as_json, lambda c: _render(c, data, suggestion))
