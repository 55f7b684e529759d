"""The one percentile definition: bench's latency columns and the
DataLoader's MLflow wait metrics both use it, so their numbers compare.

Linear interpolation between closest ranks, numpy's default ("linear"
method): for ``n`` sorted values, percentile ``q`` sits at position
``(n - 1) * q / 100`` and is interpolated between its two neighbours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ascending ``sorted_values``; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
