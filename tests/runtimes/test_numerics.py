"""Fake quantization numerics: ties, saturation, guards, per-channel axes, int16, fp16."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qir.calibration import calib_scale
from qir.errors import QirError
from qir.kinds import CalibMode
from qir.records import CalibRecord
from qir.runtimes.numerics import apply_calibration, fake_quant


def cal(mode="int8", **state):
    return CalibRecord("c", "x", "x~q", mode=CalibMode(mode), **state)


def onnx_qdq(x, scale, zero_point, axis=None):
    """QuantizeLinear→DequantizeLinear in onnxruntime: the standard's answer (opset 21)."""
    s = numpy_helper.from_array(np.asarray(scale, np.float32), "s")
    z = numpy_helper.from_array(np.asarray(zero_point), "z")
    kw = {} if axis is None else {"axis": axis}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **kw),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **kw)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)], initializer=[s, z])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def test_ties_round_half_to_even_like_quantizelinear():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5], np.float32)
    y = fake_quant(x, np.float32(1.0), -128, 127, None)
    np.testing.assert_array_equal(y, [-2, -2, -0, 0, 2, 2, 4])
    np.testing.assert_array_equal(y, onnx_qdq(x, 1.0, np.int8(0)))
    np.testing.assert_array_equal(fake_quant(x, np.float32(1.0), -128, 127, None, rounding="half_up"),
                                  [-2, -1, 0, 1, 2, 3, 4])
    np.testing.assert_array_equal(fake_quant(x, np.float32(1.0), -128, 127, None, rounding="half_away"),
                                  [-3, -2, -1, 1, 2, 3, 4])


@pytest.mark.parametrize("mode, qmin, qmax, zdtype", [("int8", -128, 127, np.int8),
                                                     ("int16", -32768, 32767, np.int16)])
def test_saturation_and_range_match_onnx(mode, qmin, qmax, zdtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(4000) * 3).astype(np.float32)
    x[:4] = [1e9, -1e9, 4.0, -4.0]
    c = cal(mode, threshold=np.float32(2.0))
    y = apply_calibration(c, x)
    s = calib_scale(c)
    assert s == np.float32(2.0) / np.float32(qmax)
    assert y.max() == np.float32(qmax) * s and y.min() == np.float32(qmin) * s  # saturates, never wraps
    np.testing.assert_array_equal(y, onnx_qdq(x, s, zdtype(0)))


def test_per_channel_axes_match_onnx():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    for axis in (0, 1):
        th = np.abs(w).max(axis=tuple(a for a in range(4) if a != axis)).astype(np.float32)
        y = apply_calibration(cal(threshold=th, axis=axis), w)
        np.testing.assert_array_equal(y, onnx_qdq(w, th / np.float32(127), np.zeros(len(th), np.int8), axis))


def test_asymmetric_imported_zero_point_matches_onnx():
    x = np.linspace(-1, 6, 101, dtype=np.float32)
    y = apply_calibration(cal(scale=np.float32(0.025), zero_point=-128), x)   # uint8 zp 0 in int8 frame
    np.testing.assert_array_equal(y, onnx_qdq(x, 0.025, np.uint8(0)))
    assert y.min() == 0  # the range starts at 0: negatives clip like a Relu


@pytest.mark.parametrize("threshold", [0.0, -1.0, np.inf, np.nan])
def test_unusable_thresholds_are_a_clear_error(threshold):
    with pytest.raises(QirError, match="unusable scale"):
        apply_calibration(cal(threshold=np.float32(threshold)), np.ones(3, np.float32))
    with pytest.raises(QirError, match="no threshold; calibrate"):
        apply_calibration(cal(), np.ones(3, np.float32))


def test_fp16_round_trip_overflows_to_inf_and_keeps_precision_in_range():
    x = np.array([1.0, 1.0 + 2 ** -11, 65504.0, 65520.0, -70000.0, 1e-8], np.float32)
    y = apply_calibration(cal("fp16"), x)
    assert y[0] == 1.0 and y[1] == 1.0                      # ties to even at 11 bits
    assert y[2] == 65504.0 and np.isposinf(y[3]) and np.isneginf(y[4])
    assert y[5] == 0.0                                      # below the smallest subnormal
    assert apply_calibration(cal("float"), x) is x          # float mode passes through


@pytest.mark.parametrize("zero_point", [None, -128])
def test_switching_an_imported_node_to_int16_keeps_its_range_with_a_finer_step(zero_point):
    from qir.calibration import set_mode
    c = cal(scale=np.float32(0.05), zero_point=zero_point)
    x = np.linspace(-8, 8, 2001, dtype=np.float32)
    y8 = apply_calibration(c, x)
    set_mode(c, "int16")
    y16 = apply_calibration(c, x)
    assert abs(float(y16.min()) - float(y8.min())) < 0.05 and abs(float(y16.max()) - float(y8.max())) < 0.05
    inside = (x > max(y8.min(), y16.min())) & (x < min(y8.max(), y16.max()))
    assert np.abs(y16 - x)[inside].max() < np.abs(y8 - x)[inside].max() / 100  # 256x finer step
    set_mode(c, "int8")
    np.testing.assert_allclose(apply_calibration(c, x), y8, atol=1e-6)


def test_implied_clip_restores_the_removed_activation_in_float_mode():
    c = cal("float", scale=np.float32(0.1), zero_point=-128, implied_clip=(0.0, np.inf))
    x = np.array([-3.0, -0.5, 0.0, 2.0], np.float32)
    np.testing.assert_array_equal(apply_calibration(c, x), [0, 0, 0, 2])
    c6 = cal("fp16", implied_clip=(0.0, 6.0))
    np.testing.assert_array_equal(apply_calibration(c6, np.array([-1, 3, 9], np.float32)), [0, 3, 6])


def test_clip_only_is_the_quantizer_without_rounding():
    """Per channel with zero points: the clip bounds are the dequantized qmin/qmax, and the
    rounding that remains is at most half a step."""
    from qir.runtimes.numerics import clip_only

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 3, 4)) * 4).astype(np.float32)
    rec = CalibRecord("c", "x", "y", mode=CalibMode.INT8, scale=np.array([0.01, 0.02, 0.03], np.float32),
                      zero_point=np.array([0, 10, -20]), axis=1)
    got = clip_only(rec, x)
    for ch, (s, zp) in enumerate([(0.01, 0), (0.02, 10), (0.03, -20)]):
        lo, hi = (-128 - zp) * np.float32(s), (127 - zp) * np.float32(s)
        np.testing.assert_allclose(got[:, ch], np.clip(x[:, ch], lo, hi), rtol=1e-6)
    full = apply_calibration(rec, x)
    steps = np.array([0.01, 0.02, 0.03], np.float32).reshape(1, 3, 1)
    assert np.all(np.abs(full - got) <= steps / 2 + 1e-6)
    assert np.array_equal(clip_only(CalibRecord("f", "x", "y", mode=CalibMode.FLOAT), x), x)


def _fake_quant_step_by_step(x, scale, qmin, qmax, axis, zero_point=None, rounding="half_to_even"):
    """The module docstring's op order, each step a new array (what fake_quant computed before it
    worked in place)."""
    from qir.calibration import along_axis
    from qir.runtimes.numerics import ROUNDING

    s = along_axis(np.asarray(scale, dtype=x.dtype), axis, x.ndim)
    q = ROUNDING[rounding](x / s)
    if zero_point is not None:
        zp = along_axis(np.asarray(zero_point, dtype=x.dtype), axis, x.ndim)
        q = np.clip(q + zp, qmin, qmax) - zp
    else:
        q = np.clip(q, qmin, qmax)
    return (q * s).astype(x.dtype, copy=False)


@pytest.mark.parametrize("rounding", ["half_to_even", "half_up", "half_away"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("axis,zero_point", [(None, None), (None, 3), (1, None), (1, "per-channel"), (0, "scalar-wide")])
def test_fake_quant_in_place_gives_the_same_bits_as_step_by_step(rounding, dtype, axis, zero_point):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 4, 5, 3)) * 4).astype(dtype)
    x.flat[:6] = [-0.0, 0.0, np.inf, -np.inf, np.nan, -1e-6]  # (signed zeros, saturation, NaN)
    given = x.copy()
    scale = np.float32(0.05) if axis is None else np.linspace(0.02, 0.1, x.shape[axis]).astype(np.float32)
    zp = {None: None, 3: np.float32(3), "per-channel": np.arange(4, dtype=np.float32) - 2,
          "scalar-wide": np.float32(-1)}[zero_point]
    for qmin, qmax in ((-128, 127), (-32768, 32767)):
        got = fake_quant(x, scale, qmin, qmax, axis, zp, rounding)
        want = _fake_quant_step_by_step(x, scale, qmin, qmax, axis, zp, rounding)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    np.testing.assert_array_equal(x.view(f"u{x.itemsize}"), given.view(f"u{given.itemsize}"))  # (x untouched)
    scalar = fake_quant(np.float32(0.3), np.float32(0.05), -128, 127, None)  # (a scalar takes the old path)
    assert scalar == _fake_quant_step_by_step(np.float32(0.3), np.float32(0.05), -128, 127, None)


WEIGHTED = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[1,4,6,6] x) => (float[1,5] y) {
    c = Conv <pads=[1,1,1,1]> (x, w)
    f = Flatten <axis=1> (c)
    y = MatMul (f, m)
}
"""


@pytest.mark.parametrize("mode", ["int8", "int16"])
def test_a_weight_is_written_as_its_codes_and_computes_what_quantizing_it_in_onnxruntime_does(mode):
    """onnxruntime's fake-quant sessions hold a constant weight's codes (and a DequantizeLinear)
    instead of the float weight and a QuantizeLinear: the same outputs, bit for bit, with weights
    on exact ties (k + 1/2 steps), per output channel (the Conv) and per tensor (the MatMul)."""
    import qir
    from qir.calibration import along_axis
    from qir.runtimes.base import get_runtime
    from qir.runtimes.ort.lowering import lower_fake_quant

    from ..conftest import calibrate_for_nash_e, model_from_text

    rng = np.random.default_rng(3)
    data = [{"x": rng.standard_normal((1, 4, 6, 6)).astype(np.float32)} for _ in range(3)]
    ir = calibrate_for_nash_e(qir.load(model_from_text(WEIGHTED, {"w": (8, 4, 3, 3), "m": (288, 5)}, seed=4)), data)
    ir.set_calibration("m_calib", threshold=np.float32(np.abs(ir.weight_array("m")).max()), axis=None)
    for c in ir.calibrations("weight"):
        ir.set_calibration(c.name, mode=mode)
        w = np.array(ir.weight_array(c.input))
        scale = along_axis(calib_scale(c), c.axis, w.ndim)
        w.flat[::3] = ((np.floor(w / scale) + np.float32(0.5)) * scale).astype(np.float32).flat[::3]  # (ties)
        ir.set_weight(c.input, w)

    def quantized_in_onnxruntime(ir_, rec):  # (what the lowering wrote before: the float weight quantized there)
        nodes = lower_fake_quant(ir_, rec)
        if ir_.value(rec.input).is_weight:
            p = rec.name + "::"
            axis = {a.name: a.i for a in nodes[-1].attribute}
            nodes[2] = helper.make_node("QuantizeLinear", [rec.input, p + "scale", p + "zp"], [p + "q"], **axis)
        return nodes

    new = get_runtime("ort", level="fakequant")
    old = get_runtime("ort", level="fakequant", lower_calibration=quantized_in_onnxruntime)
    for sample in data:
        a, b = new.run(ir, sample)["y"], old.run(ir, sample)["y"]
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    from qir.io.onnx_export import export_onnx

    model = export_onnx(ir, lower_calibration=lower_fake_quant)
    assert {i.name for i in model.graph.initializer}.isdisjoint({"w", "m"})  # (no float weight is written)
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in ("w", "m")]
