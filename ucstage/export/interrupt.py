"""Stopping an export cleanly: a step that must not be cut in half, and what was done.

Ctrl-C raises ``KeyboardInterrupt`` in the main thread wherever it is, and
the CLI turns SIGTERM into :class:`ucstage.errors.Terminated` (a
``KeyboardInterrupt``) the same way. Most of an export may stop anywhere (the
staging folder is removed, DEST never changed), but its swap is two renames,
and stopping between them would leave DEST missing: :func:`signals_deferred`
holds the signals for that moment and delivers them right after.

:func:`add_note` tells the caller what the stopped export did, on the
exception itself (``__notes__``, which Python 3.11+ also prints under a
traceback); :func:`notes` reads them back.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["add_note", "notes", "signals_deferred"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block act when it ends.

    Only the main thread can change signal handlers (and only it receives
    ``KeyboardInterrupt``), so elsewhere this does nothing. A signal whose
    action is "ignore" stays ignored; one whose action is the default
    (SIGTERM without a handler) is raised again after the block, so the
    process still ends by it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[int, FrameType | None]] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append((signum, frame))

    for signum in _SIGNALS:
        handler = signal.getsignal(signum)
        if handler is signal.SIG_IGN or handler is None:
            continue
        previous[signum] = handler
        signal.signal(signum, hold)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for number, frame in held:
            action = previous[number]
            if callable(action):
                action(number, frame)
            else:
                signal.raise_signal(number)


def add_note(exc: BaseException, text: str) -> None:
    """Attach ``text`` to ``exc`` (``BaseException.add_note`` where Python has it)."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:  # Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]  # type: ignore[attr-defined]


def notes(exc: BaseException) -> list[str]:
    """The notes attached to ``exc``, oldest first."""
    return [str(n) for n in getattr(exc, "__notes__", [])]
