"""equalize: a 1000x channel-range imbalance between two Relu-joined convs is evened out and int8
gets better, the float function stays; balanced pairs and non-homogeneous activations are left
alone (the latter reported)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.passes import get_pass
from qir.passes.lib.repair import REPAIRS_KEY

from ..conftest import model_from_text

TWO_CONVS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,12,12] x) => (float[1,8,12,12] y) {{
    h = Conv <pads=[1,1,1,1]> (x, w1, b1)
    r = {act} (h{extra})
    y = Conv <pads=[1,1,1,1]{group}> (r, w2, b2)
}}
"""


def two_convs(act="Relu", extra="", group="", w2=(8, 8, 3, 3), seed=0, imbalance=1000.0):
    text = TWO_CONVS.format(act=act, extra=extra, group=group)
    weights = {"w1": (8, 4, 3, 3), "b1": (8,), "w2": w2, "b2": (8,)}
    if "slope" in extra:
        weights["slope"] = (8, 1, 1)
    ir = qir.load(model_from_text(text, weights, seed=seed))
    w1, b1 = ir.weight_array("w1").copy(), ir.weight_array("b1").copy()
    w1[2] *= imbalance  # channel 2 of the activation is `imbalance` times the others
    b1[2] *= imbalance
    ir.set_weight("w1", w1)
    ir.set_weight("b1", b1)
    w2 = ir.weight_array("w2").copy()
    w2[:, 2 % w2.shape[1]] /= imbalance if w2.shape[1] > 1 else 1.0
    ir.set_weight("w2", w2)
    return ir


def samples(n=4):
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((1, 4, 12, 12)).astype(np.float32)} for _ in range(n)]


def assert_same_float(before, after, data):
    for sample in data:
        for runtime in ("ort", "numpy"):
            a = qir.run(before, sample, runtime=runtime, level="float")
            b = qir.run(after, sample, runtime=runtime, level="float")
            for name in before.outputs:
                assert np.abs(a[name] - b[name]).max() <= 1e-5 * np.abs(a[name]).max(), (runtime, name)


@pytest.mark.parametrize("act, extra", [("Relu", ""), ("LeakyRelu", ""), ("PRelu", ", slope")],
                         ids=["relu", "leakyrelu", "prelu"])
def test_a_1000x_channel_imbalance_between_two_convs_is_equalized(act, extra):
    ir = two_convs(act, extra)
    original, data = ir.clone(), samples()
    result = get_pass("equalize", data=data)(ir)
    report = result.report
    assert result.modified and [s["name"] for s in report["changed"]] == ["Conv_0 -> Conv_1"]
    assert 1 - report["after"]["cosine_mean"] < (1 - report["before"]["cosine_mean"]) / 3
    assert report["after"]["mse"] < report["before"]["mse"] / 3
    assert qir.verify(ir) == []
    assert_same_float(original, ir, data)
    assert set(json.loads(ir.metadata_props[REPAIRS_KEY])["equalize"]) == {"Conv_0", "Conv_1"}


def test_a_depthwise_second_conv_is_equalized_without_data():
    ir = two_convs(group=", group=8", w2=(8, 1, 3, 3))
    original, data = ir.clone(), samples()
    result = get_pass("equalize")(ir)  # data-free: weight ranges only, nothing measured
    assert result.modified and result.report["before"] is None
    w1 = np.abs(ir.weight_array("w1")).reshape(8, -1).max(axis=1)
    w2 = np.abs(ir.weight_array("w2")).reshape(8, -1).max(axis=1)
    assert np.all(np.abs(np.log2(w1 / w2)) <= 1.01)  # ranges equal up to the power-of-two rounding
    assert_same_float(original, ir, data)


def test_an_already_balanced_pair_is_left_alone():
    ir = two_convs(imbalance=1.0)
    w1 = ir.weight_array("w1")
    ir.set_weight("w2", ir.weight_array("w2") * (np.abs(w1).max() / np.abs(ir.weight_array("w2")).max()))
    scale = np.abs(ir.weight_array("w2")).max(axis=(0, 2, 3)) / np.abs(w1).max(axis=(1, 2, 3))
    ir.set_weight("w1", w1 * scale[:, None, None, None])  # r1_i == r2_i on every channel
    ir.set_weight("b1", ir.weight_array("b1") * scale)
    before = str(ir)
    result = get_pass("equalize", data=samples())(ir)
    assert not result.modified and str(ir) == before
    assert result.report["skipped"][0]["reason"].startswith("already balanced")


def test_a_non_homogeneous_activation_in_between_is_skipped_and_reported():
    ir = two_convs("HardSwish")
    before = str(ir)
    result = get_pass("equalize", data=samples())(ir)
    assert not result.modified and str(ir) == before
    assert "HardSwish" in result.report["skipped"][0]["reason"]


def test_high_bias_absorption_moves_a_always_positive_bias_into_the_next_conv():
    model = model_from_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1,4,6,6] x) => (float[1,8,6,6] y) {
            h = Conv (x, w1, b1)
            r = Relu (h)
            y = Conv (r, w2)
        }""", {"w1": (8, 4, 1, 1), "b1": (8,), "w2": (8, 8, 1, 1)})
    ir = qir.load(model)
    ir.set_weight("b1", np.full(8, 20.0, np.float32))  # pre-activation always > 0: a high bias
    original, data = ir.clone(), samples(3)
    data = [{"x": 0.3 * s["x"][:, :, :6, :6]} for s in data]
    result = get_pass("equalize", data=data, absorb_bias=True)(ir)
    assert result.report["changed"][0]["detail"]["bias_absorbed"] == 8
    assert np.all(ir.weight_array(ir.op("Conv_0").inputs[2]) < 20.0 - 1.0)
    assert len(ir.op("Conv_1").inputs) == 3  # the second conv got a bias
    assert_same_float(original, ir, data)


@pytest.mark.parametrize("flag", ["activations", "absorb_bias"])
def test_options_that_measure_need_data(flag):
    with pytest.raises(qir.QirError, match=f"equalize{{{flag}=True}} needs calibration data"):
        get_pass("equalize", **{flag: True})
