"""What :func:`ucstage.bench.run` accepts, checked before anything is read.

The library speaks Python: worker counts are a sequence of ints, modes a
sequence of names, and every message names the parameter (one-word names in
backquotes, so they read as names). The CLI parses its comma lists itself
(:mod:`ucstage.cli.args`) and calls :func:`check_options` before listing the
source, so bad input fails fast; its error mapper turns the parameter names
into the flags the user typed.
"""

from __future__ import annotations

from collections.abc import Sequence

from .. import params
from ..errors import InvalidArgument
from ..sharding import DEFAULT_SHUFFLE_SCOPE, ReadOrder
from .sampling import MODES, check_sample_size

__all__ = ["DEFAULT_MODES", "DEFAULT_WORKERS", "check_modes", "check_options", "check_workers"]

DEFAULT_WORKERS = (1, 2, 4, 6, 8)
DEFAULT_MODES = ("direct", "cold", "warm")


def check_workers(workers: Sequence[int], *, allow_zero: bool = False) -> list[int]:
    """Positive ints -> deduplicated and ascending, the order runs are made in.

    ``allow_zero``: 0 is accepted too (the loader mode's ``num_workers=0``).
    """
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        # A comma string is the CLI's spelling; iterating it would read digits.
        raise InvalidArgument(
            f"workers must be a sequence of ints such as [1, 2, 4, 8], got {workers!r}")
    if not workers:
        raise InvalidArgument("workers is empty; give e.g. [1, 2, 4, 8]")
    for value in workers:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            kind = "ints >= 0" if allow_zero else "positive ints"
            raise InvalidArgument(f"workers must be {kind}, got {value!r}")
        if value == 0 and not allow_zero:
            raise InvalidArgument(
                "workers 0 is DataLoader num_workers=0 (the main process reads), which only "
                "the loader mode measures; direct, cold and warm need at least 1 reader thread",
                hint="measure the loader mode too, or leave 0 out of `workers`")
    return sorted(set(workers))


def check_modes(modes: Sequence[str]) -> list[str]:
    """Mode names -> the ones asked for, in measuring order (warm needs cold's cache)."""
    modes = params.strings(modes, "modes")  # a str is one mode, as everywhere
    wanted = {m.strip().lower() for m in modes if m.strip()}
    unknown = sorted(wanted - set(MODES))
    if unknown:
        raise InvalidArgument(
            f"unknown mode {unknown[0]!r} in `modes`; choose from {', '.join(MODES)}")
    if not wanted:
        raise InvalidArgument(f"modes is empty; choose from {', '.join(MODES)}")
    return [m for m in MODES if m in wanted]


def check_options(
    *,
    files: int | str | None = None,
    sample_bytes: int | None = None,
    workers: Sequence[int] = DEFAULT_WORKERS,
    modes: Sequence[str] = DEFAULT_MODES,
    batch_size: int = 32,
    max_seconds: float | None = None,
    shuffle_scope: str = DEFAULT_SHUFFLE_SCOPE,
    nproc_per_node: int | None = None,
) -> tuple[list[int], list[str]]:
    """Check :func:`ucstage.bench.run`'s options; return (worker counts, modes) normalised.

    Raises:
        InvalidArgument: naming the parameter, e.g. "max_seconds must be
            positive, got -1".
    """
    if max_seconds is not None and max_seconds <= 0:
        raise InvalidArgument(f"max_seconds must be positive, got {max_seconds:g}")
    mode_list = check_modes(modes)
    worker_counts = check_workers(workers, allow_zero="loader" in mode_list)
    if batch_size < 1:
        raise InvalidArgument(f"batch_size must be at least 1, got {batch_size}")
    check_sample_size(files, sample_bytes, "sample_bytes")
    ReadOrder(0, shuffle_scope=shuffle_scope)  # checks the scope
    if nproc_per_node is not None and nproc_per_node != 1:
        # The loader mode is one rank: its job is one node of one rank.
        raise InvalidArgument(
            f"nproc_per_node must be 1 here, got {nproc_per_node}: the loader mode runs one "
            "rank, a job of one node",
            # Words, not flags: the library is called from Python too; the
            # shard plan's forecast is what covers a job of several nodes.
            hint="plan a multi-node job with the shard plan's network forecast over epochs "
                 "(ucstage.sharding.forecast, or the shard-plan command)")
    return worker_counts, mode_list
