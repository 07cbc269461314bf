"""Ops whose onnxruntime kernel departs from ONNX's specification run as ONNX says through qir's
ort runtime (:func:`qir.runtimes.ort.lowering.lower_spec`), checked against ONNX's reference
implementation, and the numpy runtime agrees."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import qir
from qir.errors import UnsupportedOpError


def _resize_model(mode: str, scales: np.ndarray, constant: bool, shape=(1, 2, 5, 7), axes=None) -> onnx.ModelProto:
    attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
    if axes is not None:
        attrs["axes"] = axes
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="resize", **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)]
    inits = []
    if constant:
        inits.append(numpy_helper.from_array(scales, "scales"))
    else:
        inputs.append(helper.make_tensor_value_info("scales", TensorProto.FLOAT, [len(scales)]))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("runtime", ["ort", "numpy"])
@pytest.mark.parametrize("constant", [True, False], ids=["constant-scales", "input-scales"])
@pytest.mark.parametrize("mode", ["linear", "cubic", "nearest"])
@pytest.mark.parametrize("scales", [(1, 1, 0.6, 0.45), (1, 1, 1.7, 2.3), (1, 1, 2, 0.5)])
def test_resize_align_corners_with_scales_follows_onnx(scales, mode, constant, runtime, rng):
    """Output index x maps to x (L - 1) / (s L - 1), the unrounded s L (onnxruntime's own kernel
    divides by the rounded output length), with the scales a constant or a graph input."""
    scales = np.array(scales, np.float32)
    model = _resize_model(mode, scales, constant)
    x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    feeds = {"x": x} if constant else {"x": x, "scales": scales}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = qir.run(qir.load(model), feeds, runtime=runtime, level="float")["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resize_align_corners_with_axes_and_input_scales_is_refused_on_ort():
    from qir.backend import OrtBackend

    model = _resize_model("linear", np.array([0.6, 0.45], np.float32), constant=False, axes=[2, 3])
    with pytest.raises(UnsupportedOpError, match="'resize' \\(Resize\\): align_corners with a scales input"):
        OrtBackend.prepare(model)


@pytest.mark.parametrize("op, empty_value", [("ReduceMax", False), ("ReduceMin", True)])
@pytest.mark.parametrize("shape", [(2, 0, 4), (2, 3, 4)])
def test_bool_min_max_reductions_run_on_ort(op, empty_value, shape, rng):
    """onnxruntime fails on an empty bool tensor; qir reduces on uint8, so the empty set gives
    ONNX's identities (False for a maximum, True for a minimum)."""
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.BOOL, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, None)],
                              initializer=[numpy_helper.from_array(np.array([1], np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = rng.random(shape) > 0.5
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    for runtime in ("ort", "numpy"):
        got = qir.run(qir.load(model), {"x": x}, runtime=runtime, level="float")["y"]
        assert got.dtype == np.bool_ and np.array_equal(got, want), runtime
    if 0 in shape:
        assert want.size and (want == empty_value).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cast_to_float4_rounds_as_onnx_on_ort(dtype):
    """onnxruntime has no float4e2m1 kernels; a Cast to it that is a graph output rounds in
    float32 (ties to even, saturating, NaN to zero) as ONNX's reference casts."""
    import ml_dtypes

    x = np.concatenate([np.arange(-8, 8.25, 0.125), [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 7, 6e4, -6e4,
                                                      np.inf, -np.inf, np.nan, 1e-7]]).astype(dtype)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT4E2M1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", elem, [x.size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT4E2M1, [x.size])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    got = qir.run(qir.load(model), {"x": x}, runtime="ort", level="float")["y"]
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.dtype == ml_dtypes.float4_e2m1fn
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))
