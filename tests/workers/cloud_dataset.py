"""A wrapper dataset for tests/cloud (importable by forkserver workers)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.utils.data as tud

from ucstage.engines import objstore


class ReadAll(tud.IterableDataset):  # type: ignore[misc]
    """Each path of the wrapped dataset with its bytes and whether the
    worker read through obstore (False: the fsspec fallback)."""

    def __init__(self, paths: Any) -> None:
        self.paths = paths

    def __iter__(self) -> Iterator[tuple[str, bytes, bool]]:
        for path in self.paths:
            yield path, Path(path).read_bytes(), objstore.usable()
