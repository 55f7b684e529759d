"""Interpreter exit as the library's clean-ups see it: :func:`exiting`.

Objects still alive when Python exits (a loader's epoch left by an uncaught
exception, a generator never finished) are collected while modules are torn
down, when builtins such as ``open`` and module globals may already be gone.
A clean-up that would then read files, count or log skips itself instead of
printing "Exception ignored" or a warning about a half-dead interpreter; what
must reach disk is written earlier, by an ``atexit`` handler, which runs
while everything still works.

Imports nothing from ucstage.
"""

from __future__ import annotations

import atexit
import sys

__all__ = ["exiting"]

_state = [False]


def _mark() -> None:
    _state[0] = True


# Registered when ucstage first imports this module, so it runs after the
# atexit handlers registered later (they run last-in, first-out).
atexit.register(_mark)


def exiting(_state: list[bool] = _state, _finalizing: object = sys.is_finalizing) -> bool:
    """Python is exiting: the atexit handlers have run, or it is finalizing.

    The defaults hold their own references, so this works while the module's
    globals are being cleared."""
    return _state[0] or bool(_finalizing())  # type: ignore[operator]
