"""One interface over the four source kinds, so a test suite can run on each.

A Backend writes files into its store the way a data platform would and gives
the source string a user would pass to ucstage to read them back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any


@dataclass
class Backend:
    name: str
    url: str
    """What a user passes to ucstage."""
    store: Any
    """An fsspec filesystem writing to the backing store."""
    store_root: str
    """Where ``url``'s files live inside ``store``."""

    def write(self, relpath: str, data: bytes) -> None:
        """Write one file; on FUSE, return once the mount shows it."""
        self._put(relpath, data)
        self.settle()

    def write_many(self, files: dict[str, bytes]) -> None:
        for rel, data in files.items():
            self._put(rel, data)
        self.settle()

    def _put(self, relpath: str, data: bytes) -> None:
        path = f"{self.store_root}/{relpath}"
        if self.name in ("local", "fuse"):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(data)
        else:
            self.store.pipe_file(path, data)

    def settle(self) -> None:
        """Wait until a FUSE mount's directory cache shows what was written."""
        if self.name == "fuse":
            from tests.common.parts import wait_synced

            wait_synced(self.store_root, self.url)
