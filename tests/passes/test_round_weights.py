"""round-weights: a conv whose weights sit just below rounding midpoints (nearest rounding sends
them all one way and biases the output) gets weights that cut its output error, by AdaRound with
torch and by the threshold search without; weights already on the int8 grid are left alone; the
chosen codes survive emit and qir.load bit for bit; the time budget stops it and a store resumes it."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import qir
import qir.passes.round_weights as round_weights
from qir.calibration import calib_scale
from qir.io.qdq_export import export_qdq
from qir.kinds import CalibMode
from qir.passes import PassManager, PipelineContext, get_pass
from qir.passes.lib.repair import REPAIRS_KEY
from qir.runtimes.numerics import apply_calibration

from ..conftest import HAS_TORCH, NEEDS_TORCH, calibrate_for_nash_e, model_from_text

TEXT = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1,8,12,12] x) => (float[1,16,12,12] y) {
    r = Relu (x)
    c = Conv <pads=[1,1,1,1]> (r, w, b)
    y = Conv (c, w2, b2)
}
"""
STEP = 1.0 / 127  # each output channel's largest tap is 1.0: per-channel int8 steps of 1/127


def planted(on_grid: bool = False):
    """Two convs; the first one's taps sit 0.45 of a step above a grid point (nearest rounds every
    one down: the output loses 0.45 step x the input's sum), or exactly on the grid."""
    ir = qir.load(model_from_text(TEXT, {"w": (16, 8, 3, 3), "b": (16,), "w2": (16, 16, 1, 1), "b2": (16,)}, seed=2))
    rng = np.random.default_rng(3)
    w = (rng.integers(-20, 20, (16, 8, 3, 3)) + (0.0 if on_grid else 0.45)).astype(np.float32) * np.float32(STEP)
    w[:, 0, 1, 1] = 1.0
    ir.set_weight("w", w)
    w2 = rng.integers(-127, 128, (16, 16, 1, 1)).astype(np.float32) * np.float32(STEP)
    w2[:, 0] = 1.0
    ir.set_weight("w2", w2)
    return ir


def samples(n=4, seed=7):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8, 12, 12)).astype(np.float32) + 0.5} for _ in range(n)]


def layer_mse(ir, reference, data):
    """The first conv's output MSE, its weight quantized as calibrated, against the float
    reference's, both on the float input."""
    cal = ir.producer(ir.op("Conv_0").inputs[1])
    wq = apply_calibration(cal, np.asarray(ir.weight_array(cal.input)))
    errs = []
    for s in data:
        want = qir.run(reference, s, runtime="numpy", level="float", capture=["c"])["c"]
        probe = ir.clone()
        probe.set_weight(cal.input, wq)
        got = qir.run(probe, s, runtime="numpy", level="float", capture=["c"])["c"]
        errs.append(np.mean((got - want) ** 2))
    return float(np.mean(errs))


METHODS = [pytest.param("adaround", marks=[pytest.mark.torch, pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)]),
           "threshold"]


@pytest.mark.parametrize("method", METHODS)
def test_weights_near_rounding_midpoints_get_a_rounding_that_cuts_the_output_error(method):
    data = samples()
    ir = calibrate_for_nash_e(planted(), data)
    reference = ir.clone()
    result = get_pass("round-weights", data=data, method=method, iterations=300)(ir)
    report = result.report
    assert result.modified and "Conv_0" in [s["name"] for s in report["changed"]]
    unseen = samples(2, seed=11)
    before, after = layer_mse(reference, reference, unseen), layer_mse(ir, reference, unseen)
    assert after < 0.25 * before, (before, after)
    assert report["after"]["mse"] < report["before"]["mse"]
    assert qir.verify(ir) == []
    assert "Conv_0" in json.loads(ir.metadata_props[REPAIRS_KEY])["round-weights"]
    assert ir.producer(ir.op("Conv_0").inputs[1]).fixed
    if method == "threshold":  # the threshold moved; the float weight did not
        np.testing.assert_array_equal(ir.weight_array("w"), reference.weight_array("w"))


@pytest.mark.parametrize("method", METHODS)
def test_weights_on_the_int8_grid_are_left_alone(method):
    data = samples()
    ir = calibrate_for_nash_e(planted(on_grid=True), data)
    before = str(ir)
    weights = {c.input: ir.weight_array(c.input).copy() for c in ir.calibrations("weight")}
    result = get_pass("round-weights", data=data, method=method, iterations=200)(ir)
    assert not result.modified and not result.report["changed"]
    assert {s["name"] for s in result.report["skipped"]} == {"Conv_0", "Conv_1"}
    assert all("unchanged" in s["reason"] for s in result.report["skipped"])
    assert str(ir) == before
    for name, w in weights.items():
        np.testing.assert_array_equal(ir.weight_array(name), w)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)
def test_adaround_codes_survive_emit_and_load_bit_for_bit():
    data = samples()
    ir = calibrate_for_nash_e(planted(), data)
    w_before = ir.weight_array("w").copy()
    get_pass("round-weights", data=data, iterations=300, measure=False)(ir)
    cal = ir.producer(ir.op("Conv_0").inputs[1])
    s = np.asarray(calib_scale(cal), np.float32).reshape(-1, 1, 1, 1)
    codes = np.rint(ir.weight_array("w") / s)
    np.testing.assert_array_equal(codes * s, ir.weight_array("w"))  # the float weight is on the grid
    assert np.any(codes != np.rint(w_before / s))  # and some codes are not nearest rounding's
    assert np.all(np.abs(codes - w_before / s) < 1)  # each one of the two grid points around the weight
    model = export_qdq(ir)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    emitted = [a for n, a in inits.items() if a.dtype == np.int8 and a.shape == codes.shape]
    assert len(emitted) == 1
    np.testing.assert_array_equal(emitted[0], codes.astype(np.int8))
    back = qir.load(model)
    back_cal = back.producer(back.op("Conv_0").inputs[1])
    np.testing.assert_array_equal(apply_calibration(back_cal, back.weight_array(back_cal.input)), codes * s)
    for runtime in ("ort", "numpy"):
        for feed in samples(2, seed=5):
            np.testing.assert_array_equal(qir.run(back, feed, runtime=runtime)["y"],
                                          qir.run(ir, feed, runtime=runtime)["y"])


def test_without_torch_the_threshold_search_runs(monkeypatch):
    monkeypatch.setattr(round_weights, "load_torch", lambda: None)
    data = samples()
    with pytest.raises(qir.QirError, match="needs torch"):
        get_pass("round-weights", data=data, method="adaround")
    ir = calibrate_for_nash_e(planted(), data)
    result = get_pass("round-weights", data=data)(ir)
    assert result.report["method"] == "threshold"
    assert result.modified and all(s["detail"]["method"] == "threshold" for s in result.report["changed"])


def test_layers_it_skips_keep_their_weights_and_float_function():
    data = samples()
    ir = calibrate_for_nash_e(planted(), data)
    ir.set_calibration(ir.producer(ir.op("Conv_0").inputs[1]).name, mode=CalibMode.INT16)
    reference = ir.clone()
    result = get_pass("round-weights", data=data, method="threshold", op_types=["Conv"])(ir)
    skipped = {s["name"]: s["reason"] for s in result.report["skipped"]}
    assert "int16" in skipped["Conv_0"]
    np.testing.assert_array_equal(ir.weight_array("w"), reference.weight_array("w"))
    feed = samples(1, seed=9)[0]
    want = qir.run(reference, feed, runtime="numpy", level="float", capture=["c"])["c"]
    np.testing.assert_array_equal(qir.run(ir, feed, runtime="numpy", level="float", capture=["c"])["c"], want)


def test_the_time_budget_stops_it_and_a_store_resumes_it(monkeypatch):
    data = samples()
    spent = get_pass("round-weights", data=data, method="threshold", time_budget_s=0, measure=False)
    ir = calibrate_for_nash_e(planted(), data)
    before = str(ir)
    result = spent(ir)
    assert result.report["stopped_by_time_budget"] and not result.modified and str(ir) == before
    assert all("time budget" in s["reason"] for s in result.report["skipped"])

    store: dict = {}
    first = calibrate_for_nash_e(planted(), data)
    get_pass("round-weights", data=data, method="threshold", store=store, measure=False)(first)
    assert len(store) == 2 and json.loads(json.dumps(store)) == store  # JSON: a caller can keep it in a file
    solved = []
    search = round_weights.threshold_search
    monkeypatch.setattr(round_weights, "threshold_search", lambda *a, **k: solved.append(1) or search(*a, **k))
    again = calibrate_for_nash_e(planted(), data)
    result = get_pass("round-weights", data=data, method="threshold", store=store, time_budget_s=0, measure=False)(again)
    assert not solved and not result.report["stopped_by_time_budget"]  # everything came from the store
    assert all(s["detail"]["from_store"] for s in result.report["changed"])
    assert str(again) == str(first)
    for c in first.calibrations("weight"):
        np.testing.assert_array_equal(again.calibration(c.name).threshold, c.threshold)


def test_it_refuses_an_uncalibrated_model_and_runs_after_calibrate_in_a_pipeline():
    data = samples()
    with pytest.raises(qir.QirError, match="calibrated model"):
        get_pass("round-weights", data=data)(planted())
    result = PassManager("fold-bn,fuse,insert-calibration,calibrate,round-weights{method='threshold'}",
                         context=PipelineContext(data=data)).run(planted())
    assert result.report["passes"]["round-weights"]["modified"]
