"""The per-op comparison with onnxruntime's integer kernels (:mod:`qir.runtimes.integer.against_ort`),
on small models quantized by onnxruntime's own ``quantize_static``: onnxruntime is the oracle."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import qir
from qir.runtimes.integer.against_ort import compare_with_ort, optimized_graph, ort_float_ops

from ...qir.io.test_qdq_import import clip_model, clip_samples, quantize

pytest.importorskip("onnxruntime.quantization")


@pytest.fixture(scope="module")
def clip_qdq(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    return quantize(clip_model(root / "clip.onnx"), root / "clip_qdq.onnx", clip_samples(8), per_channel=False)


def test_no_departure_where_qir_matches_onnxruntime(clip_qdq):
    report = compare_with_ort(clip_qdq, qir.load(clip_qdq), clip_samples(3, seed=7))
    assert report.values and all(v.count for v in report.values)
    assert report.first is None and report.departing == [], [v for v in report.values if v.differ]
    assert report.output_codes_agree == 1.0 and report.output_cosine > 0.999999
    assert report.kernels.get("QLinearConv", 0) >= 3  # onnxruntime fused the Convs: its integer kernels ran
    assert {v.ort_kernel for v in report.values} >= {"QLinearConv"}
    assert json.loads(json.dumps(report.to_json()))["first_own_departure"] is None


def test_names_the_first_op_that_departs(clip_qdq):
    """qir given the model with one quantizer's scale changed departs there and nowhere before:
    the report names that op first, and the values after it inherit the difference."""
    ir = qir.load(clip_qdq)
    cal = ir.calibration("c_calib")
    cal.scale = np.asarray(cal.scale, np.float32) * np.float32(1.5)
    report = compare_with_ort(clip_qdq, ir, clip_samples(2, seed=7))
    first = report.first_own
    assert first is not None and first.node == "c_calib" and first.op == "conv_c", report.departing
    assert report.first is first and first.own_differ > 0
    order = [v.quantizer for v in report.values]
    assert all(order.index(v.quantizer) >= order.index(first.quantizer) for v in report.values if v.differ)
    assert report.output_codes_agree < 1.0
    assert report.to_json()["first_own_departure"] == first.quantizer


def test_float_ops_are_those_onnxruntime_left_unfused(clip_qdq, tmp_path):
    optimized = optimized_graph(onnx.load(str(clip_qdq)), tmp_path)
    fused = {n.name for n in optimized.graph.node if n.op_type.startswith("QLinear")}
    floats = ort_float_ops(optimized)
    assert fused and not fused & floats
    original = {n.name: n.op_type for n in onnx.load(str(clip_qdq)).graph.node}
    assert all(original.get(name) not in (None, "QuantizeLinear", "DequantizeLinear") for name in floats)


def test_a_model_without_quantize_linear_is_one_clear_error(tmp_path):
    from qir.errors import InputError

    with pytest.raises(InputError, match="QDQ model"):
        path = clip_model(tmp_path / "float.onnx")
        compare_with_ort(path, qir.load(path), clip_samples(1))
    assert np.isfinite(clip_samples(1)[0]["x"]).all()


def test_cli_against_ort_writes_the_report(clip_qdq, tmp_path, capsys):
    from qir.tools.cli import main

    data = tmp_path / "data" / "x"
    data.mkdir(parents=True)
    for i, sample in enumerate(clip_samples(2, seed=3)):
        np.save(data / f"{i}.npy", sample["x"])
    out = tmp_path / "out"
    assert main(["consistency", str(clip_qdq), str(tmp_path / "data"), "--against", "ort", "-d", "2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "no op departs from onnxruntime" in text and "QLinearConv" in text
    saved = json.loads((out / "ort_consistency.json").read_text())
    assert saved["schema"] == "qir.ort-consistency" and saved["samples"] == 2 and saved["first_own_departure"] is None
    assert main(["consistency", str(clip_qdq), str(tmp_path / "data"), "--against", "ort", "-o", str(out)]) != 0


@pytest.mark.parametrize("mode,size", [("half_pixel", (224, 224)), ("asymmetric", (20, 36)), ("align_corners", (9, 31)),
                                       ("pytorch_half_pixel", (7, 5))])
def test_bilinear_resize_is_onnxruntimes_bit_for_bit(mode, size):
    """onnxruntime's 4-tap bilinear Resize in float32 (not the separable interpolation of the
    numpy interpreter, which rounds differently on about half the pixels)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from qir.runtimes.integer.ort_float import bilinear

    shape = [1, 3, 16, 12]
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear", coordinate_transformation_mode=mode)
    graph = helper.make_graph([node], "r", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(np.array([1, 3, *size], np.int64), "sizes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = (np.random.default_rng(0).integers(-128, 128, shape) * np.float32(0.0371)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = bilinear(x, None, None, np.array([1, 3, *size], np.int64), mode="linear", coordinate_transformation_mode=mode)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape_a,shape_b", [((1, 197, 384), (384, 384)), ((2, 3, 33, 197), (2, 3, 197, 40)),
                                             ((5, 300), (300, 20)), ((7, 64), (64, 130))])
def test_float_matmul_is_onnxruntimes_bit_for_bit(shape_a, shape_b):
    """onnxruntime's MLAS SGEMM summation order (K slices, one fused multiply-add chain each), on
    dequantized int8 codes as a DQ -> MatMul -> Q group feeds it; BLAS's order differs."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from qir.runtimes.integer.ort_float import sgemm

    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "m",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    rng = np.random.default_rng(1)
    a = (rng.integers(-128, 128, shape_a) * np.float32(0.0213)).astype(np.float32)
    b = (rng.integers(-127, 128, shape_b) * np.float32(0.00731)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"a": a, "b": b})[0]
    np.testing.assert_array_equal(sgemm(a, b), expected)


@pytest.mark.parametrize("c_in,c_out,group,size", [(300, 16, 1, 8), (48, 32, 1, 9), (8, 6, 2, 5)])
def test_float_conv_transpose_is_onnxruntimes_bit_for_bit(c_in, c_out, group, size):
    """onnxruntime's ConvTranspose: MLAS SGEMM columns (A transposed), col2im by taps, bias."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from qir.runtimes.integer.ort_float import conv_transpose

    rng = np.random.default_rng(2)
    w = (rng.integers(-127, 128, (c_in, c_out // group, 4, 4)) * np.float32(0.0123)).astype(np.float32)
    b = rng.standard_normal(c_out).astype(np.float32)
    attrs = dict(kernel_shape=[4, 4], pads=[1, 1, 1, 1], strides=[2, 2], group=group)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, size, size]),
                                            helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = (rng.integers(0, 256, (1, c_in, size, size)) * np.float32(0.0371)).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "w": w})[0]
    np.testing.assert_array_equal(conv_transpose(x, w, b, **attrs), expected)
