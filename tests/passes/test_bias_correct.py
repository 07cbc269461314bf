"""bias-correct: a weight quantization that biases a depthwise conv's output is corrected in the
bias and int8 gets better; layers whose quantized weights cause no shift, and MatMuls with nowhere
to put a bias, are left alone."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.passes import PassManager, PipelineContext, get_pass
from qir.passes.lib.repair import REPAIRS_KEY

from ..conftest import calibrate_for_nash_e, model_from_text

DEPTHWISE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,8,16,16] x) => (float[1,8,16,16] y) {
    r = Relu (x)
    y = Conv <group=8, pads=[1,1,1,1]> (r, w BIAS)
}
"""


def depthwise(bias=True):
    text = DEPTHWISE.replace(" BIAS", ", b" if bias else "")
    weights = {"w": (8, 1, 3, 3), **({"b": (8,)} if bias else {})}
    ir = qir.load(model_from_text(text, weights, seed=2))
    # one large tap per channel and eight at 0.45 of a quantization step: int8 per-channel
    # rounding sends all eight to 0, so W_q x loses 8 * 0.45 step * E[x] on every output
    w = np.full((8, 1, 3, 3), 0.45 * 1.0 / 127, np.float32)
    w[:, 0, 1, 1] = 1.0
    ir.set_weight("w", w)
    return ir


def samples(n=4):
    rng = np.random.default_rng(7)
    return [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32) + 1.0} for _ in range(n)]


@pytest.mark.parametrize("bias", [True, False], ids=["with-bias", "bias-added"])
def test_a_biased_depthwise_weight_quantization_is_corrected(bias):
    data = samples()
    ir = calibrate_for_nash_e(depthwise(bias), data)
    result = get_pass("bias-correct", data=data)(ir)
    report = result.report
    assert result.modified and [s["name"] for s in report["changed"]] == ["Conv_0"]
    assert report["after"]["mse"] < report["before"]["mse"] / 2
    assert 1 - report["after"]["cosine_mean"] < 1 - report["before"]["cosine_mean"]
    assert len(ir.op("Conv_0").inputs) == 3  # a bias, added where there was none
    # interior outputs lose 8 taps x 0.45 step x E[relu(x)]; the zero-padded border loses less
    expected = 8 * 0.45 / 127 * float(np.mean([np.maximum(s["x"], 0).mean() for s in data]))
    assert 0.7 * expected < report["changed"][0]["detail"]["shift_mean"] <= 1.01 * expected
    assert qir.verify(ir) == []
    assert "Conv_0" in json.loads(ir.metadata_props[REPAIRS_KEY])["bias-correct"]


def test_weights_on_the_int8_grid_cause_no_shift_and_change_nothing():
    ir = depthwise()
    w = ir.weight_array("w").copy()
    w[:] = np.round(w * 127) / 127  # every tap exactly on its grid point: W_q == W
    ir.set_weight("w", w)
    data = samples()
    ir = calibrate_for_nash_e(ir, data)
    before = ir.weight_array(ir.op("Conv_0").inputs[2]).copy()
    result = get_pass("bias-correct", data=data)(ir)
    assert result.report["changed"][0]["detail"]["shift_max"] < 1e-6
    np.testing.assert_allclose(ir.weight_array(ir.op("Conv_0").inputs[2]), before, atol=1e-6)


def test_a_matmul_without_an_add_after_it_is_skipped_and_reported():
    model = model_from_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,16,8] x) => (float[1,16,4] y) { y = MatMul(x, w) }""", {"w": (8, 4)})
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((1, 16, 8)).astype(np.float32)} for _ in range(2)]
    ir = calibrate_for_nash_e(qir.load(model), data)
    before = str(ir)
    result = get_pass("bias-correct", data=data)(ir)
    assert not result.modified and str(ir) == before
    assert "no bias input" in result.report["skipped"][0]["reason"]


def test_bias_correct_refuses_an_uncalibrated_model_and_runs_last_in_a_pipeline():
    data = samples()
    with pytest.raises(qir.QirError, match="calibrated model"):
        get_pass("bias-correct", data=data)(depthwise())
    result = PassManager("fold-bn,fuse,insert-calibration,calibrate,bias-correct",
                         context=PipelineContext(data=data)).run(depthwise())
    assert result.report["passes"]["bias-correct"]["modified"]


def test_empirical_mode_also_removes_the_shift_activation_quantization_causes():
    """Inputs sit 0.4 of a step above an int8 grid point (step 0.05, a fixed threshold): the
    quantizer rounds every one down, a mean shift the weights mode cannot see and the empirical
    mode removes with the weights' own."""
    rng = np.random.default_rng(1)
    data = [{"x": (1.02 + 0.002 * rng.standard_normal((1, 8, 16, 16))).astype(np.float32)} for _ in range(4)]
    ir = calibrate_for_nash_e(depthwise(), data)
    for name in ("x_calib", "r_calib"):
        ir.set_calibration(name, threshold=np.float32(127 * 0.05), fixed=True)
    by_weights = get_pass("bias-correct", data=data)(ir.clone()).report
    result = get_pass("bias-correct", data=data, mode="empirical")(ir)
    report = result.report
    assert result.modified and report["changed"][0]["detail"]["mode"] == "empirical"
    assert by_weights["after"]["mse"] < by_weights["before"]["mse"]
    assert report["after"]["mse"] < 0.1 * by_weights["after"]["mse"]


CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,12,12] x) => (float[1,4,12,12] y) {
    a = Conv <pads=[1,1,1,1]> (x, w1, b1)
    r = Relu (a)
    y = Conv <pads=[1,1,1,1]> (r, w2, b2)
}
"""


def test_empirical_mode_in_one_pass_finds_the_shifts_of_the_wave_by_wave_correction():
    """The one-pass correction (each layer's output corrected on every sample as soon as it is
    computed) measures the second layer after the first is corrected, as correcting the first,
    then measuring the second in a new fake-quant pass does: the same shifts, the same biases."""
    from qir.passes.bias_correct import BiasCorrectPass

    ir = qir.load(model_from_text(CHAIN, {"w1": (4, 4, 3, 3), "b1": (4,), "w2": (4, 4, 3, 3), "b2": (4,)}, seed=3))
    data = [{"x": np.random.default_rng(i).standard_normal((1, 4, 12, 12)).astype(np.float32)} for i in range(3)]
    ir = calibrate_for_nash_e(ir, data)
    one, waves = ir.clone(), ir.clone()
    corrector = BiasCorrectPass(data, mode="empirical", measure=False)
    shifts = corrector._empirical(one, corrector._layers(one, []), ir)
    expected = corrector._empirical_waves(waves, corrector._layers(waves, []), ir)
    assert set(shifts) == set(expected) == {op.name for op in ir.ops("Conv")}
    assert any(np.abs(v).max() > 1e-4 for v in expected.values())  # (something to correct)
    for name in expected:
        np.testing.assert_allclose(shifts[name], expected[name], rtol=1e-4, atol=1e-6)
    for b in ("b1", "b2"):
        np.testing.assert_allclose(one.weight_array(b), waves.weight_array(b), rtol=1e-4, atol=1e-6)
