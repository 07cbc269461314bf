"""qir.calibration rules: the covering threshold (the fixed threshold advice prints)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qir.calibration import covering_threshold
from qir.errors import QirError


def test_covering_threshold_is_short_and_covers():
    """At most 4 significant digits, never below max |x|, and less than one 4-digit step above it."""
    rng = np.random.default_rng(0)
    for x in [*np.exp(rng.uniform(-12, 12, 500)), 1.0, 2.5, 9.9995, 0.001, 123456.7]:
        t = covering_threshold(float(x))
        assert x <= t and float(f"{t:.4g}") == t, (x, t)  # (written with 4 significant digits, it is itself)
        assert t - x < 10.0 ** (math.floor(math.log10(x)) - 3) * (1 + 1e-9), (x, t)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_covering_threshold_refuses_what_no_threshold_covers(bad):
    with pytest.raises(QirError, match="covering threshold"):
        covering_threshold(bad)
