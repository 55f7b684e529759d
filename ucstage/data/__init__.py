"""Training-side API: :class:`VolumeDataset`, :class:`TableDataset`, :class:`ShardDataset`, :class:`Mix` and
:class:`DataLoader`.

torch is imported here (and, lazily, by bench's loader mode) and nowhere
else. ``dataset`` shards and fetches, ``loader`` runs it with ucstage's
defaults and the rank guard, ``timing`` logs batch waits to MLflow, ``dist``
wraps the two ``torch.distributed`` calls. See docs/training.md.
"""

from ..errors import MissingDependency

try:
    import torch  # noqa: F401  (checked first, so a missing torch gets one clear error)
except ImportError as exc:  # pragma: no cover - exercised only without torch
    raise MissingDependency(
        "VolumeDataset and DataLoader need PyTorch, which is not installed",
        hint="install torch (on a CPU machine: pip install torch==2.13.0), "
             "or pip install 'ucstage[torch]'",
    ) from exc

from .dataset import VolumeDataset
from .loader import DataLoader
from .mix import Mix
from .shardset import ShardDataset
from .table import TableDataset

__all__ = ["DataLoader", "Mix", "ShardDataset", "TableDataset", "VolumeDataset"]
