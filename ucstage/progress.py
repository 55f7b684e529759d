"""One progress protocol for every long job: warm, bench and export.

Shaped like fsspec's ``Callback``: the job calls :meth:`Callback.set_size`
once it knows its total, :meth:`Callback.relative_update` as work completes,
and the two extra hooks for what a byte count cannot say. The library never
prints; the CLI subclasses this with a rich progress bar. Every method of
the base class does nothing, so ``NO_PROGRESS`` is the default everywhere.

Methods may be called from worker threads; an implementation that is not
thread-safe must lock.
"""

from __future__ import annotations

__all__ = ["NO_PROGRESS", "Callback"]


class Callback:
    """Progress of one job; subclass and override what you show."""

    def set_size(self, size: int, items: int | None = None) -> None:
        """The job's total: ``size`` units of work (bytes for warm and bench),
        and, where it counts files, ``items`` of them. Called again when a new
        phase starts with its own total."""

    def relative_update(self, inc: int = 1) -> None:
        """``inc`` more units of the total are done."""

    def set_description(self, text: str) -> None:
        """What the job is doing now, in a few words ("starting Spark Connect",
        "warm x4", "filling warm cache")."""

    def item_done(self, name: str, status: str, error: str = "") -> None:
        """One item (a file) finished; ``status`` is a short word such as
        ``fetched``, ``cached`` or ``failed``; ``error`` says why it failed."""


NO_PROGRESS = Callback()
"""The default: reports nothing."""
