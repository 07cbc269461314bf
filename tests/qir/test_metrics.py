"""Metrics against their definitions (horizon-semantics.md §1.5) and edge cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qir import metrics as M
from qir.errors import InputError


def test_definitions(rng):
    a = rng.standard_normal(1000)
    d = a + 0.01 * rng.standard_normal(1000)
    got = M.compute(list(M.METRICS), a, d)
    assert got["cosine-similarity"] == pytest.approx(a @ d / np.linalg.norm(a) / np.linalg.norm(d), rel=1e-12)
    assert got["mse"] == pytest.approx(np.mean((a - d) ** 2), rel=1e-12)
    assert got["mre"] == got["l1"] == pytest.approx(np.mean(np.abs(a - d)), rel=1e-12)  # hmct's "mre" is a mean abs
    assert got["chebyshev"] == got["atol"] == pytest.approx(np.max(np.abs(a - d)))
    db = 20 * np.log10(np.linalg.norm(a) / np.linalg.norm(a - d))
    assert got["sqnr-db"] == pytest.approx(db, rel=1e-12)
    assert got["sqnr"] == pytest.approx(db / 2, rel=1e-12)  # hmct's sqnr is half the dB value
    assert M.compute("mse", a.astype(np.float32).reshape(10, 100), d.astype(np.float32).reshape(100, 10))["mse"] > 0


def test_edge_cases():
    z = np.zeros(4)
    one = np.ones(4)
    assert M.compute("cosine-similarity", z, z)["cosine-similarity"] == 1.0
    assert M.compute("cosine-similarity", z, one)["cosine-similarity"] == 0.0
    assert M.compute("sqnr", z, z)["sqnr"] == 0.0
    assert M.compute("sqnr", z, one)["sqnr"] == -math.inf
    assert M.compute("sqnr-db", one, one)["sqnr-db"] == math.inf
    empty = np.zeros(0)
    assert M.compute(["mse", "mre", "chebyshev"], empty, empty) == {"mse": 0.0, "mre": 0.0, "chebyshev": 0.0}
    assert M.compute("sqnr", empty, empty)["sqnr"] == math.inf


def test_identical_tensors_have_cosine_exactly_one(rng):
    # analyses read "1.0" as "this value did not change"; |a|·|a| != Σa² in floating point
    for _ in range(200):
        x = (rng.standard_normal(int(rng.integers(1, 4000))) * 10.0 ** rng.uniform(-20, 20)).astype(np.float32)
        assert M.cosine_similarity(x, x.copy()) == 1.0


def test_non_finite_positions_are_left_out():
    a = np.array([1.0, 2.0, np.nan, 4.0])
    d = np.array([1.0, 2.5, 3.0, np.inf])
    assert M.compute("mse", a, d)["mse"] == pytest.approx(0.125)
    assert M.nonfinite_count(a, d) == 2


def test_worst_first_and_errors():
    values = {"a": 0.9, "b": 0.99, "c": float("nan")}
    assert sorted(values, key=lambda k: M.worst_first("cosine-similarity", values[k])) == ["a", "b", "c"]
    assert sorted(values, key=lambda k: M.worst_first("mse", values[k])) == ["b", "a", "c"]
    with pytest.raises(InputError, match="did you mean 'cosine-similarity'"):
        M.check_metrics(["cosine-similarty"])
    with pytest.raises(InputError, match="elements"):
        M.compute("mse", np.zeros(3), np.zeros(4))
