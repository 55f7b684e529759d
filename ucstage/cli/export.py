"""``ucstage export``: a Delta table to Parquet files in a volume, atomically, once."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from ..errors import InvalidArgument
from ..progress import Callback
from .args import num_workers_list
from .output import emit, err, format_bytes, json_option, table


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    parts = [p.strip() for p in value.split(",")]
    if any(not p for p in parts):
        raise InvalidArgument(f"empty column name in {value!r}",
                              hint="separate column names with single commas")
    return parts


class _Status(Callback):
    """Shows what the export is doing as a rich spinner on stderr; an empty
    description (the step is over) removes it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._status: Any = None

    def set_description(self, text: str) -> None:
        if not self.enabled:
            return
        if not text:
            if self._status is not None:
                self._status.stop()
                self._status = None
            return
        if self._status is None:
            self._status = err.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def close(self) -> None:
        self.set_description("")


def _suggestion(data: dict[str, Any], world_size: int | None, workers: list[int] | None,
                num_workers: str | None) -> str | None:
    """The --files advice when the file count does not split evenly over the loader slots."""
    from ..sharding import slot_count

    count, suggested = len(data["files"]), data.get("suggested_files")
    if world_size is None or workers is None or suggested is None or suggested == count:
        return None
    return (f"{count} files do not split evenly over {slot_count(world_size, workers)} loader "
            f"slots ({world_size} ranks x {num_workers} workers): use --files {suggested} so "
            "every (rank, worker) slot reads as many files")


def _render(console: Console, data: dict[str, Any], suggestion: str | None) -> None:
    from ..export import RECORD_NAME

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
    summary.add_row("columns", ", ".join(f["name"] for f in data["schema"]["fields"]))
    opts = data["options"]
    shown = {k: v for k, v in opts.items() if v not in (None, [], "")}
    summary.add_row("options", ", ".join(f"{k}={v}" for k, v in shown.items()))
    summary.add_row("record", Text(f"{data['dest']}/{RECORD_NAME}"))
    console.print(summary)
    if suggestion:
        console.print(f"[yellow]![/] {suggestion}")
    pattern = "**/*.parquet" if opts.get("partition_by") else "*.parquet"
    console.print(f"[dim]load: datasets.load_dataset(\"parquet\", "
                  f"data_files=\"{data['dest']}/{pattern}\")[/]")


@click.command("export", context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--force", is_flag=True,
              help="Export even if the table version and options match the last export.")
@click.option("-w", "--world-size", type=int, default=None,
              help="With --num-workers: check that the file count suits this many ranks.")
@click.option("-k", "--num-workers", default=None, metavar="K|K0,K1,...",
              help="DataLoader workers per rank, for the --files suggestion.")
@json_option
def command(
    table_name: str, dest: str, remote: str | None, columns: str | None, where: str | None,
    partition_by: str | None, files: int | None, max_records_per_file: int | None,
    compression: str, force: bool, world_size: int | None, num_workers: str | None,
    as_json: bool,
) -> None:
    """Export a Delta table to Parquet files in DEST, atomically, and only when it changed.

    TABLE is catalog.schema.table (quote odd parts in backticks) or a Delta table
    path. Names resolve through $UCSTAGE_WAREHOUSE/<catalog>/<schema>/<table>
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
      ucstage export ./tables/events out/events --where "day >= '2024-01-01'" --columns id,text
      ucstage export main.ml.events /Volumes/main/ml/train/events --remote sc://spark:15002
    """
    from ..export import export_table
    from ..sharding import workers_per_rank

    # Every check on the arguments alone comes before Spark starts or anything
    # is written: exit 2 means DEST was not touched.
    if (world_size is None) != (num_workers is None):
        raise InvalidArgument("--world-size and --num-workers go together")
    workers: list[int] | None = None
    if world_size is not None and num_workers is not None:
        workers = workers_per_rank(num_workers_list(num_workers), world_size)
    column_list, partition_list = _split(columns), _split(partition_by)
    # pyspark logs every server-side error as JSON on stderr; the CLI prints its own line.
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    # ...and warns when its bounded retries run out; the error line says that.
    warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    status = _Status(enabled=err.is_terminal)
    try:
        result = export_table(
            table_name, dest, remote=remote, columns=column_list, where=where,
            partition_by=partition_list, files=files,
            max_records_per_file=max_records_per_file, compression=compression, force=force,
            callback=status)
    finally:
        status.close()
    data = result.to_json(world_size=world_size, num_workers=workers)
    suggestion = _suggestion(data, world_size, workers, num_workers)
    emit(data, as_json, lambda c: _render(c, data, suggestion))
