"""Alternating pairs: run two (or more) sides in turn, median per side.

On a shared machine load drifts; running the sides back to back, with the
order reversed every other round (A B, B A, A B, ...), lets the drift fall on
every side alike. A comparison reads the median of each side, the ratio of
those medians and the median of the per-pair ratios (the steadier figure when
the load moves between pairs). Three pairs is the least a median means
anything with (:data:`MIN_PAIRS`).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

MIN_PAIRS = 3


def order(sides: Sequence[T], round_index: int) -> list[T]:
    """``sides`` in order on even rounds, reversed on odd ones."""
    return list(sides) if round_index % 2 == 0 else list(reversed(sides))


def schedule(sides: Sequence[T], rounds: int) -> list[tuple[int, T]]:
    """Every side once per round, alternating the order: ``(round, side)`` pairs."""
    return [(r, side) for r in range(rounds) for side in order(sides, r)]


def alternate(sides: Mapping[str, Callable[[], R]], pairs: int,
              on_run: Callable[[int, str, R], None] | None = None) -> dict[str, list[R]]:
    """Run every side ``pairs`` times, alternating the order; results per side.

    ``on_run(round, side, result)`` is called after each run (progress lines).
    """
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")
    found: dict[str, list[R]] = {name: [] for name in sides}
    for r, name in schedule(list(sides), pairs):
        result = sides[name]()
        found[name].append(result)
        if on_run is not None:
            on_run(r, name, result)
    return found


@dataclass(frozen=True)
class Comparison:
    """Side ``b`` against side ``a`` over alternating pairs of one figure.

    ``ratio`` is ``b``'s median over ``a``'s; ``pair_ratios`` the ratio within
    each pair, and ``median_pair_ratio`` their median.
    """

    a: list[float]
    b: list[float]

    def __post_init__(self) -> None:
        if not self.a or len(self.a) != len(self.b):
            raise ValueError(f"need the same number of runs per side, got {len(self.a)} "
                             f"and {len(self.b)}")

    @property
    def a_median(self) -> float:
        return float(statistics.median(self.a))

    @property
    def b_median(self) -> float:
        return float(statistics.median(self.b))

    @property
    def ratio(self) -> float:
        return self.b_median / self.a_median if self.a_median else float("nan")

    @property
    def pair_ratios(self) -> list[float]:
        return [b / a if a else float("nan") for a, b in zip(self.a, self.b, strict=True)]

    @property
    def median_pair_ratio(self) -> float:
        return float(statistics.median(self.pair_ratios))

    def within(self, tolerance: float) -> bool:
        """Whether the ratio of medians is within ``1 ± tolerance``."""
        return abs(self.ratio - 1) <= tolerance

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "a_median": self.a_median,
                "b_median": self.b_median, "ratio": self.ratio,
                "pair_ratios": self.pair_ratios, "median_pair_ratio": self.median_pair_ratio}


def pairs_argument(parser: argparse.ArgumentParser, default: int = MIN_PAIRS,
                   flag: str = "--pairs") -> None:
    """Add the usual ``--pairs N`` (alternating rounds) option to ``parser``."""
    parser.add_argument(flag, type=int, default=default,
                        help=f"alternating rounds; medians need {MIN_PAIRS} or more "
                             f"(default {default})")
