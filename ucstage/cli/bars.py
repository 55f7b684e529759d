"""The CLI's progress display: one view of the library's one progress protocol.

Warm and bench both report through :class:`ucstage.progress.Callback`, so
one class serves both: ``set_description`` starts a phase (a bench run; the
previous phase's line goes, so the screen keeps one line), ``set_size`` sets
its total, ``relative_update`` moves the bytes, ``item_done`` counts files
(and failures, which the bar shows as a count; the command's report lists
them, once).

On a terminal it draws a rich bar. Off a terminal (a log file, a pipe) a
bar would be noise, so it prints one line every ``interval`` seconds instead,
as ``rclone --stats`` does: files, bytes, rate and time left. Sizes and rates
are IEC (``MiB``, ``MiB/s``) through :mod:`ucstage.units`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Column
from rich.text import Text

from ..progress import Callback
from ..units import format_bytes, format_rate
from .output import err

__all__ = ["INTERVAL", "Counting", "LogLines", "RichBar", "progress_bar"]

INTERVAL = 10.0
"""Seconds between two progress lines off a terminal."""
_COUNTS = 62
"""Columns the bar's counts take at most (``1,235/200,000 files, 1 failed
5.2 GiB/115.0 GiB 12.3 MiB/s 0:01:05`` and the gaps)."""


class Counting(Callback):
    """What both views show: the phase, its totals, and what is done so far.

    ``statuses`` counts finished files by status (``fetched``, ``cached``,
    ``failed``, ``read``), so a command can say what was done when it stops
    early. Calls may come from any thread; one lock guards the counts.
    """

    def __init__(self, description: str = "") -> None:
        self.description = description
        self.size: int | None = None
        self.items: int | None = None
        self.bytes_done = 0
        self.statuses: Counter[str] = Counter()
        self._lock = threading.Lock()

    def set_description(self, text: str) -> None:
        with self._lock:
            self.description, self.size, self.items = text, None, None
            self.bytes_done = 0
            self.statuses = Counter()

    def set_size(self, size: int, items: int | None = None) -> None:
        with self._lock:
            self.size, self.items, self.bytes_done = size, items, 0
            self.statuses = Counter()

    def relative_update(self, inc: int = 1) -> None:
        with self._lock:
            self.bytes_done += inc

    def item_done(self, name: str, status: str, error: str = "") -> None:
        with self._lock:
            self.statuses[status] += 1

    @property
    def files_done(self) -> int:
        return sum(self.statuses.values())

    def _files(self) -> str:
        """``7/10 files, 1 failed``: '' until the phase says how many files."""
        if self.items is None:
            return ""
        failed = self.statuses.get("failed", 0)
        return f"{self.files_done:,}/{self.items:,} files" + (f", {failed:,} failed"
                                                               if failed else "")


class RichBar(Counting):
    """One rich task per phase: description, bar, files done, bytes, speed, time left."""

    def __init__(self, bar: Progress, description: str = "") -> None:
        super().__init__(description)
        self.bar = bar
        self.task: TaskID | None = None

    def set_description(self, text: str) -> None:
        super().set_description(text)
        with self._lock:
            if self.task is not None:
                self.bar.update(self.task, visible=False)
            self.task = self.bar.add_task(text, total=None, files="")

    def set_size(self, size: int, items: int | None = None) -> None:
        super().set_size(size, items)
        with self._lock:
            if self.task is None:
                self.task = self.bar.add_task(self.description, total=None, files="")
            self.bar.update(self.task, total=size or None, completed=0, files=self._files())

    def relative_update(self, inc: int = 1) -> None:
        super().relative_update(inc)
        if self.task is not None:
            self.bar.advance(self.task, inc)

    def item_done(self, name: str, status: str, error: str = "") -> None:
        super().item_done(name, status, error)
        with self._lock:
            if self.task is not None:
                self.bar.update(self.task, files=self._files())


class LogLines(Counting):
    """A progress line every ``interval`` seconds on ``console`` while a phase
    runs (started with :meth:`start`, ended with :meth:`close`)::

        warming: 1,234/2,000 files, 120.0 MiB/190.0 MiB (63%), 12.3 MiB/s, ETA 0:00:06

    The rate is over the last interval (the first line: since the phase
    began), so a resumed warm's already cached bytes inflate only that one.
    ``clock`` and ``interval`` are parameters so tests need not wait.
    """

    def __init__(self, console: Console, description: str = "", *,
                 interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(description)
        self.console = console
        self.interval = interval
        self.clock = clock
        self._mark = (clock(), 0)  # (time, bytes done) at the last line or phase start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def set_description(self, text: str) -> None:
        super().set_description(text)
        with self._lock:
            self._mark = (self.clock(), 0)

    def set_size(self, size: int, items: int | None = None) -> None:
        super().set_size(size, items)
        with self._lock:
            self._mark = (self.clock(), 0)

    def line(self) -> str | None:
        """The progress line for now (and a new rate window); None before a
        phase has a size, since there is nothing to say yet."""
        with self._lock:
            if self.size is None:
                return None
            now, done = self.clock(), self.bytes_done
            then, before = self._mark
            self._mark = (now, done)
            parts = [p for p in (self._files(), self._bytes(done)) if p]
        rate = (done - before) / (now - then) if now > then else 0.0
        parts.append(format_rate(rate))
        left = (self.size - done) if self.size else 0
        parts.append(f"ETA {_clock(left / rate)}" if rate > 0 and left > 0
                     else "ETA -" if left > 0 else "done")
        head = f"{self.description}: " if self.description else ""
        return head + ", ".join(parts)

    def _bytes(self, done: int) -> str:
        if not self.size:
            return format_bytes(done)
        return f"{format_bytes(done)}/{format_bytes(self.size)} ({100 * done // self.size}%)"

    def start(self) -> None:
        """Print a line every ``interval`` seconds from a background thread."""
        self._thread = threading.Thread(target=self._loop, name="ucstage-progress",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            text = self.line()
            if text is not None:
                self.console.print(text, markup=False, highlight=False)


def _clock(seconds: float) -> str:
    """``0:01:05``: hours, minutes, seconds, as rich's time columns show them."""
    total = int(seconds + 0.5)
    return f"{total // 3600}:{total % 3600 // 60:02d}:{total % 60:02d}"


class _BytesColumn(ProgressColumn):
    """``12.0 MiB/190.0 MiB``: done and total, in IEC units."""

    def render(self, task: Task) -> Text:
        total = f"/{format_bytes(task.total)}" if task.total is not None else ""
        return Text(f"{format_bytes(task.completed)}{total}", style="progress.download")


class _RateColumn(ProgressColumn):
    """``12.3 MiB/s``: rich's speed estimate, in IEC units."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(format_rate(speed) if speed is not None else "?",
                    style="progress.data.speed")


@contextmanager
def progress_bar(enabled: bool, description: str = "", *, transient: bool = False,
                 console: Console = err, interval: float = INTERVAL) -> Iterator[Counting]:
    """Progress on ``console`` (stderr) while the block runs.

    On a terminal, a rich bar, drawn only when ``enabled`` (not with
    ``--json``); off a terminal, whatever ``enabled`` says, a progress line
    every ``interval`` seconds, so a long job's log shows it is alive. The
    callback it yields also counts what was done (``statuses``,
    ``bytes_done``), for a command to report when it stops early.
    """
    if not console.is_terminal:
        lines = LogLines(console, description, interval=interval)
        lines.start()
        try:
            yield lines
        finally:
            lines.close()
        return
    # One line at any width: rich folds a cell that does not fit onto more
    # lines (an 80-column terminal got two-line redraws), so the counts never
    # wrap, the bar narrows and only the description gives way (an ellipsis).
    width = console.width
    bar_width = 10 if width < 120 else 30
    bar = Progress(
        TextColumn("[bold]{task.description}", table_column=Column(
            no_wrap=True, overflow="ellipsis", max_width=max(8, width - bar_width - _COUNTS))),
        BarColumn(bar_width=bar_width),
        TextColumn("{task.fields[files]}", table_column=Column(no_wrap=True)),
        _BytesColumn(table_column=Column(no_wrap=True)),
        _RateColumn(table_column=Column(no_wrap=True)),
        TimeRemainingColumn(table_column=Column(no_wrap=True)),
        console=console, transient=transient, disable=not enabled,
    )
    with bar:
        yield RichBar(bar, description)
