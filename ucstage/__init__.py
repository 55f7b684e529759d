"""ucstage: stage training data from volumes and Delta tables onto local disk.

The library never prints and never imports click or rich; the ``ucstage``
command is a thin layer over it. Heavy optional parts (torch, Spark) are
imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import UcstageError
from .manifest import Manifest
from .resume import merge_states
from .source import snapshot

__version__ = "0.1.0"

__all__ = [
    "DataLoader",
    "LocalCache",
    "Manifest",
    "Mix",
    "ShardDataset",
    "TableDataset",
    "UcstageError",
    "VolumeDataset",
    "__version__",
    "export_table",
    "merge_states",
    "read_table",
    "snapshot",
]

_LAZY = {
    "VolumeDataset": "ucstage.data",
    "Mix": "ucstage.data",
    "TableDataset": "ucstage.data",
    "ShardDataset": "ucstage.data",
    "DataLoader": "ucstage.data",
    "LocalCache": "ucstage.cache",
    "export_table": "ucstage.export",
    "read_table": "ucstage.export",
}

if TYPE_CHECKING:  # pragma: no cover
    from .cache import LocalCache
    from .data import DataLoader, Mix, ShardDataset, TableDataset, VolumeDataset
    from .export import export_table, read_table


def __dir__() -> list[str]:
    # Tab completion should show the public API, lazy names included.
    return sorted(__all__)


def __getattr__(name: str) -> Any:
    # torch and pyspark are optional and slow to import: load on first use.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ucstage' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
