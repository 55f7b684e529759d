"""Generated source files for the benchmarks that need real ones."""

from __future__ import annotations

import os


def write_files(folder: str, count: int, size: int, *, spread: int = 8,
                vary: bool = True, name: str = "f{i:05d}.bin") -> list[str]:
    """``count`` files of ``size`` bytes under ``folder``, spread over ``spread``
    sub-folders ``part0`` ... (``spread=0``: all in ``folder``); their sorted paths.

    One random block is written rotated by a per-file offset (``vary``), so the
    files differ without generating ``count`` blocks.
    """
    payload = os.urandom(size)
    paths = []
    for i in range(count):
        sub = os.path.join(folder, f"part{i % spread}") if spread else folder
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, name.format(i=i))
        with open(path, "wb") as fh:
            fh.write(payload[i % 997:] + payload[:i % 997] if vary else payload)
        paths.append(path)
    return sorted(paths)


def tree_size(path: str, hidden: bool = False) -> tuple[int, int]:
    """(files, bytes) under ``path``; names starting with ``.`` are skipped
    unless ``hidden`` (ucstage's control folder and temp files are hidden)."""
    files = total = 0
    for folder, dirs, names in os.walk(path):
        if not hidden:
            dirs[:] = [d for d in dirs if not d.startswith(".")]
        for n in names:
            if hidden or not n.startswith("."):
                files += 1
                total += os.path.getsize(os.path.join(folder, n))
    return files, total
