"""The CLI's progress bar: a rich view of the library's one progress protocol.

Warm and bench both report through :class:`ucstage.progress.Callback`, so
one class draws both: ``set_description`` starts a phase (a bench run; the
previous phase's line goes, so the screen keeps one line), ``set_size`` sets
its total, ``relative_update`` moves the bytes, ``item_done`` counts files and
prints failures above the bar. Off a terminal the bar is disabled (nothing
is drawn) but failures are still printed, one line each.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ..progress import Callback
from .output import err

__all__ = ["RichBar", "progress_bar"]


class RichBar(Callback):
    """One rich task per phase: description, bar, files done, bytes, speed, time left."""

    def __init__(self, bar: Progress, description: str = "") -> None:
        self.bar = bar
        self.description = description
        self.task: TaskID | None = None
        self.items: int | None = None
        self.done = 0
        self._lock = threading.Lock()  # the protocol allows calls from any thread

    def set_description(self, text: str) -> None:
        with self._lock:
            if self.task is not None:
                self.bar.update(self.task, visible=False)
            self.description, self.task, self.items, self.done = text, None, None, 0
            self.task = self.bar.add_task(text, total=None, files="")

    def set_size(self, size: int, items: int | None = None) -> None:
        with self._lock:
            self.items, self.done = items, 0
            if self.task is None:
                self.task = self.bar.add_task(self.description, total=None, files="")
            self.bar.update(self.task, total=size or None, completed=0, files=self._files())

    def relative_update(self, inc: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, inc)

    def item_done(self, name: str, status: str, error: str = "") -> None:
        with self._lock:
            self.done += 1
            if self.task is not None:
                self.bar.update(self.task, files=self._files())
        if status == "failed":
            self.bar.console.print(f"[red]failed[/] {escape(name)}: {escape(error)}", markup=True)

    def _files(self) -> str:
        return "" if self.items is None else f"{self.done:,}/{self.items:,} files"


@contextmanager
def progress_bar(enabled: bool, description: str = "", *, transient: bool = False,
                 console: Console = err) -> Iterator[Callback]:
    """A :class:`RichBar` on stderr while the block runs; drawn only when
    ``enabled`` (not with ``--json``, and only on a terminal)."""
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[files]}"),
        DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
        console=console, transient=transient, disable=not enabled,
    )
    with bar:
        yield RichBar(bar, description)
