"""Training-side API: :class:`VolumeDataset` and :class:`DataLoader`.

torch is imported here (and, lazily, by bench's loader mode) and nowhere
else. See docs/training.md.
"""

from .dataset import DataLoader, EpochStats, VolumeDataset

__all__ = ["DataLoader", "EpochStats", "VolumeDataset"]
