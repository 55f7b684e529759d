"""The one percentile definition, shared by bench and the loader's MLflow metrics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ucstage.data.timing import summarise
from ucstage.percentile import percentile


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200),
       st.sampled_from([0, 1, 25, 50, 90, 95, 99, 100]))
def test_matches_numpy_linear(values, q):
    ordered = sorted(values)
    assert percentile(ordered, q) == pytest.approx(float(np.percentile(ordered, q)), abs=1e-6)


def test_empty_is_zero():
    assert percentile([], 50) == 0.0


def test_loader_metrics_use_it():
    # Nearest rank gave 2 ms (p50) and 4 ms (p95) for these four waits; linear: 2.5 and 3.85.
    stats = summarise(0, [0.001, 0.002, 0.003, 0.004], wall_s=1.0, overhead_s=0.0, complete=True)
    assert stats.wait_p50_ms == pytest.approx(2.5)
    assert stats.wait_p95_ms == pytest.approx(3.85)
