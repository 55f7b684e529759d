"""The private folder the cold, warm and loader modes put their caches in.

Never the user's cache: a fresh ``ucstage-bench-XXXX`` folder under
``scratch_dir`` (default: the system temp folder), removed when the bench
ends, however it ends (return, error, ``KeyboardInterrupt``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import InvalidArgument
from ..units import format_bytes

__all__ = ["scratch_folder"]


@contextmanager
def scratch_folder(scratch_dir: str | None, needed: int) -> Iterator[str]:
    """A new folder for ``needed`` bytes of cache copies, removed on exit.

    A missing ``scratch_dir`` is made (and removed afterwards) when its parent
    exists; a missing parent is an error, so a typo'd path never leaves a
    tree of folders behind.

    Raises:
        InvalidArgument: the parent is missing, or the disk has too little room.
    """
    parent = scratch_dir or tempfile.gettempdir()
    made_parent = False
    if not os.path.isdir(parent):
        above = os.path.dirname(os.path.abspath(parent))
        if not os.path.isdir(above):
            raise InvalidArgument(f"scratch folder {parent}: {above} does not exist",
                                  hint="create it first, or leave scratch_dir out")
        _check_space(above, needed)
        os.mkdir(parent)
        made_parent = True
    else:
        _check_space(parent, needed)
    try:
        folder = tempfile.mkdtemp(prefix="ucstage-bench-", dir=parent)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        if made_parent:
            shutil.rmtree(parent, ignore_errors=True)


def _check_space(folder: str, needed: int) -> None:
    free = shutil.disk_usage(folder).free
    # A tenth of headroom: files take whole blocks, and other jobs write there too.
    if needed > free * 0.9:
        raise InvalidArgument(
            f"the cold and warm modes copy the sample ({format_bytes(needed)}) into {folder}, "
            f"which has {format_bytes(free)} free",
            hint="bench a smaller sample with `files` or sample_bytes, "
                 "or point scratch_dir at a bigger disk")
