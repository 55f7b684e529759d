"""Names made safe to show: :func:`shown`.

A file name comes from whoever wrote the source (an object key can hold any
character), and ucstage prints names in errors, warnings, logs and tables. A
name holding ``ESC`` would drive the reader's terminal (set its title, erase a
line, fake an ``error:`` line after a CR or LF), so every name that reaches a
person passes through :func:`shown` first: control characters become visible
backslash escapes, ordinary Unicode stays as it is. ``--json`` documents keep
the raw name (JSON escapes what it must; see ``ucstage.cli.output``).
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "shown"]

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                    "\ud800-\udfff]")
"""Characters never printed raw: C0 controls (TAB, LF and CR among them), DEL,
C1 controls (``\\x9b`` is a CSI on some terminals), the line and paragraph
separators, the bidi marks and overrides (``\\u202e`` shows a name reversed),
and lone surrogates (an undecodable byte of a local file name)."""

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    named = _NAMED.get(c)
    if named is not None:
        return named
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every :data:`UNSAFE` character as a backslash escape
    (``\\x1b``, ``\\r``, ``\\n``, ``\\t``, ``\\u202e``), the rest unchanged.
    Idempotent: what it returns holds no unsafe character."""
    if UNSAFE.search(text) is None:  # the usual name: no copy
        return text
    return UNSAFE.sub(_escape, text)
