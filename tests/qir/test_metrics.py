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


def test_ill_conditioned_references_are_flagged_by_a_scale_free_rule(rng):
    probs = np.full((1, 1, 64, 64), 1e-5)  # a probability map with nothing detected (range [0, 1])
    probs[0, 0, 3, 4] = 2e-3
    text = probs.copy()
    text[0, 0, 10:14, 5:30] = 0.9  # one word detected: 100 of 4096 values lit
    normal = rng.standard_normal(1000)
    spike = np.zeros(2_000_000)
    spike[7] = 3.0  # one value in two million: RMS below 1e-3 of its own peak
    for k in (1e-6, 1.0, 1e6):  # the same verdicts at any scale (reference and bound scaled alike)
        assert M.ill_conditioned(k * probs, bound=k).startswith("near zero")
        assert M.ill_conditioned(k * text, bound=k) is None
        assert M.ill_conditioned(k * probs) is None  # without a bound: its own peak sets the scale
        assert M.ill_conditioned(k * normal) is None
        assert M.ill_conditioned(k * spike).startswith("near zero")
        assert M.ill_conditioned(np.full(50, 3.0 * k)).startswith("constant")
    assert M.ill_conditioned(np.zeros((2, 3))) == "constant (every value 0)"
    assert M.ill_conditioned(np.array([np.nan, 1.0, 2.0])) is None  # (non-finite positions are not its business)
    # cosine on such a reference is noise: a small, harmless-looking error flips it
    noise = 1e-4 * rng.standard_normal(probs.shape)
    assert M.cosine_similarity(probs, probs + noise) < 0.5 < M.cosine_similarity(text, text + noise)


def test_output_bound_follows_shape_ops_to_a_bounded_activation():
    import onnx.parser

    import qir

    model = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 4] x) => (float[4] p, float[1, 4] r) {
            s = Sigmoid(x)
            p = Squeeze(s)
            r = Relu(x)
        }""")
    ir = qir.import_onnx(model)
    assert M.output_bound(ir, "p") == 1.0 and M.output_bound(ir, "s") == 1.0
    assert M.output_bound(ir, "r") is None and M.output_bound(ir, "not a value") is None
