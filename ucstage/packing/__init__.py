"""``ucstage pack``: a source's small files written into WebDataset tar
shards with an index beside them (:func:`pack`); how a pack is published
across ranks is in :mod:`.packer`'s docstring and docs/training.md."""

from .packer import pack

__all__ = ["pack"]
