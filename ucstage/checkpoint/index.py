"""A checkpoint's ``.metadata``, torch's index of it, read without running it.

``.metadata`` is a pickle torch writes: the byte range of each item in each
data file. A pickle can name any callable, and a checkpoint may come from
anyone, so ucstage reads one with an unpickler that takes only what torch
writes there (:class:`_IndexUnpickler`). Needs torch (its classes are in the
pickle): :mod:`.folder` imports this module only for a plain torch
checkpoint, so ``ucstage checkpoint list`` never imports torch.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import pickle
from typing import Any

import torch

from ..errors import CheckpointCorrupt


class _Refused(Exception):
    """A global a checkpoint's ``.metadata`` holds that torch never writes there."""


class _IndexUnpickler(pickle.Unpickler):
    """Unpickles a ``.metadata`` to what torch writes in one and nothing
    else: torch.distributed.checkpoint's dataclasses and enums, torch's
    dtypes and ``Size``, a layout, a path. A checkpoint someone else wrote
    is read, never run (a pickle can name any callable)."""

    _DCP = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    _OTHERS = frozenset({("torch.serialization", "_get_layout"),
                         ("collections", "OrderedDict"), ("pathlib", "PosixPath"),
                         ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
                         ("pathlib", "PureWindowsPath")})

    def find_class(self, module: str, name: str) -> Any:
        if module in self._DCP:
            found = super().find_class(module, name)
            if isinstance(found, type) and (dataclasses.is_dataclass(found) or
                                            issubclass(found, enum.Enum)):
                return found
        elif module == "torch":
            found = getattr(torch, name, None)
            if found is torch.Size or isinstance(found, torch.dtype):
                return found
        elif (module, name) in self._OTHERS:
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


def load_metadata(raw: bytes, shown: str) -> Any:
    """The ``Metadata`` torch pickled as ``raw``, the ``.metadata`` of
    checkpoint ``shown``, unpickled by :class:`_IndexUnpickler` (a load reads
    it this way too, not with torch's plain ``pickle.load``).

    Raises:
        CheckpointCorrupt: it is no DCP index (or holds what torch never
            writes in one).
    """
    try:
        metadata = _IndexUnpickler(io.BytesIO(raw)).load()
        metadata.storage_data  # noqa: B018 - an index has one: anything else is no index
        return metadata
    except Exception as exc:  # any damage: say what, never the bytes
        raise _corrupt(shown, exc) from exc


def _corrupt(shown: str, exc: Exception) -> CheckpointCorrupt:
    why = f"it holds {exc}, which torch never writes there" if isinstance(exc, _Refused) \
        else f"{type(exc).__name__} reading it"
    return CheckpointCorrupt(f"checkpoint {shown}: its .metadata is not a "
                             f"torch.distributed.checkpoint index ({why})",
                             hint="it was edited or cut short: load another checkpoint")


def read_index(raw: bytes, shown: str) -> dict[str, list[tuple[int, int]]]:
    """The byte ranges the ``.metadata`` ``raw`` of checkpoint ``shown``
    indexes, per file: ``{name: [(offset, length), ...]}``.

    Raises:
        CheckpointCorrupt: it is no DCP index (or holds what torch never
            writes in one).
    """
    storage = load_metadata(raw, shown).storage_data
    try:
        items = [(s.relative_path, int(s.offset), int(s.length)) for s in storage.values()]
    except Exception as exc:  # any damage: say what, never the bytes
        raise _corrupt(shown, exc) from exc
    index: dict[str, list[tuple[int, int]]] = {}
    for name, offset, length in items:
        if not isinstance(name, str):
            raise CheckpointCorrupt(f"checkpoint {shown}: its .metadata names a file by a "
                                    f"{type(name).__name__}, not a name",
                                    hint="it was edited: load another checkpoint")
        index.setdefault(name, []).append((offset, length))
    return index


