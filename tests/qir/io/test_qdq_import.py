"""QDQ import: models quantized by onnxruntime's ``quantize_static`` (QDQ format) load as IR whose
calibration nodes hold the stored scales, and qir's fake quantization reproduces onnxruntime.

The onnxruntime reference runs the QDQ model with ``session.disable_quant_qdq`` (the Q/DQ ops as
written, i.e. the function the ONNX model defines). onnxruntime's default session instead fuses
Q/DQ groups into integer kernels; on x86 machines without AVX-VNNI its uint8×int8 kernels
accumulate pairs in int16 with saturation (VPMADDUBSW), so that run differs from the model's
function (cosine 0.993 on the digits model here) — unless the weights leave the headroom
(``reduce_range=True``), where the default session matches qir bit for bit (tested below).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qir
from qir.calibration import calib_scale
from qir.errors import ImportError_
from qir.io.onnx_import import import_qdq
from qir.io.qdq_import import convert_qdq
from qir.io.qdq_params import dequantize
from qir.kinds import CalibMode, CalibRole
from qir.runtimes.numerics import apply_calibration

from ...conftest import REPO, real_models

quantization = pytest.importorskip("onnxruntime.quantization")

DIGITS = REPO / "qir" / "examples" / "digits"


# ---------------------------------------------------------------------------------- helpers
def calibration_samples(n: int | None = None) -> list[dict[str, np.ndarray]]:
    files = sorted((DIGITS / "calibration_data" / "input").glob("*.npy"), key=lambda p: int(p.stem))
    return [{"input": np.load(f)} for f in files[:n]]


def quantize(src: str | Path, dst: Path, samples: list[dict[str, np.ndarray]], activation: str = "QUInt8",
             per_channel: bool = True, exclude: tuple[str, ...] = (), extra: dict | None = None,
             reduce_range: bool = False) -> Path:
    """onnxruntime's static QDQ quantization (int8 weights) of ``src`` into ``dst``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=getattr(QuantType, activation), weight_type=QuantType.QInt8,
                    per_channel=per_channel, nodes_to_exclude=list(exclude), reduce_range=reduce_range,
                    extra_options=dict(extra or {}))
    return dst


def reference_session(model: str | Path | onnx.ModelProto, fused: bool = False) -> ort.InferenceSession:
    """onnxruntime running the Q/DQ ops as written (``fused``: its default integer kernels)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not fused:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def clip_model(path: Path) -> Path:
    """Conv→Relu→Conv→Clip(0,6)→Conv→hard-swish (x·Clip(x+3,0,6))→Conv, weights k/64 with
    max |k| = 127 per output channel (so int8 per-channel weights are exact)."""
    rng = np.random.default_rng(0)

    def w(shape):
        k = rng.integers(-127, 128, size=shape).astype(np.float32)
        k.reshape(shape[0], -1)[:, 0] = 127
        return k / 64

    inits = [numpy_helper.from_array(w((8, 4, 3, 3)), "W1"), numpy_helper.from_array(w((8, 8, 1, 1)), "W2"),
             numpy_helper.from_array(w((8, 8, 1, 1)), "W3"), numpy_helper.from_array(w((4, 8, 1, 1)), "W4"),
             numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6, np.float32), "six"),
             numpy_helper.from_array(np.array(3, np.float32), "three")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["a_relu"], name="relu_a"),
             helper.make_node("Conv", ["a_relu", "W2"], ["b"], name="conv_b"),
             helper.make_node("Clip", ["b", "zero", "six"], ["b_clip"], name="relu6_b"),
             helper.make_node("Conv", ["b_clip", "W3"], ["c"], name="conv_c"),
             helper.make_node("Add", ["c", "three"], ["c3"], name="add_c"),
             helper.make_node("Clip", ["c3", "zero", "six"], ["c3_clip"], name="clip_c"),
             helper.make_node("Mul", ["c", "c3_clip"], ["hs"], name="mul_c"),
             helper.make_node("Conv", ["hs", "W4"], ["y"], name="conv_y")]
    graph = helper.make_graph(nodes, "clipnet", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def clip_samples(n: int = 8, seed: int = 1) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 4, 8, 8)) * 0.5).astype(np.float32)} for _ in range(n)]


# ---------------------------------------------------------------------------------- digits
VARIANTS = {
    "uint8-per-channel": dict(activation="QUInt8", per_channel=True),
    "int8-per-tensor-exclude": dict(activation="QInt8", per_channel=False, exclude=("conv2", "add4")),
    "int16-per-channel": dict(activation="QInt16", per_channel=True),  # ORT moves the model to opset 21
    "uint16-per-tensor-exclude": dict(activation="QUInt16", per_channel=False, exclude=("fc",)),
    "int16-contrib-ops": dict(activation="QInt16", per_channel=False, extra={"UseQDQContribOps": True}),
}


@pytest.fixture(scope="module")
def digits_qdq(tmp_path_factory):
    """Quantized once per variant, lazily."""
    made: dict[str, Path] = {}

    def get(variant: str) -> Path:
        if variant not in made:
            out = tmp_path_factory.mktemp("qdq") / f"digits_{variant}.onnx"
            made[variant] = quantize(DIGITS / "model.onnx", out, calibration_samples(), **VARIANTS[variant])
        return made[variant]
    return get


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_digits_qdq_reproduces_onnxruntime(digits_qdq, variant):
    path = digits_qdq(variant)
    ir = qir.load(path)
    assert qir.verify(ir) == []
    assert not [o for o in ir.ops() if o.op_type in ("QuantizeLinear", "DequantizeLinear")]
    session = reference_session(path)
    images = np.load(DIGITS / "eval_images.npy")[:40]
    expected = np.concatenate([session.run(None, {"input": x})[0] for x in images])
    for runtime in ("ort", "numpy"):
        got = np.concatenate([qir.run(ir, {"input": x}, runtime=runtime)["logits"] for x in images])
        assert cosine(got, expected) >= 0.99999, (variant, runtime)
        assert np.array_equal(got.argmax(1), expected.argmax(1)), (variant, runtime)
        if runtime == "ort":  # same kernels, same fake-quant arithmetic: bit for bit
            np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_digits_calibration_state_is_the_stored_quantizers(digits_qdq, variant):
    path = digits_qdq(variant)
    model = onnx.load(str(path))
    consts = initializers(model)
    ir = qir.load(path)
    sixteen = "16" in variant
    qs = {n.input[0]: n for n in model.graph.node if n.op_type == "QuantizeLinear"}
    for cal in ir.calibrations(CalibRole.ACTIVATION):
        q = qs[cal.input]
        assert cal.name == cal.input.removesuffix("_QuantizeLinear_Input") + "_calib"
        assert cal.mode is (CalibMode.INT16 if sixteen else CalibMode.INT8)
        assert cal.axis is None and cal.threshold is None
        assert np.float32(cal.scale) == consts[q.input[1]]          # the scale as stored
        zp = consts[q.input[2]]
        offset = {np.uint8: -128, np.uint16: -32768}.get(zp.dtype.type, 0)
        assert (cal.zero_point or 0) == int(zp) + offset             # signed frame
    weights = ir.calibrations(CalibRole.WEIGHT)
    assert {c.name for c in weights} >= {"conv1.weight_calib", "fc.weight_calib"} - (
        {"fc.weight_calib"} if "exclude" in variant and "fc" in VARIANTS[variant]["exclude"] else set())
    for cal in weights:
        assert cal.mode is CalibMode.INT8 and cal.zero_point is None  # int8 symmetric weights
        if VARIANTS[variant]["per_channel"] and cal.name.endswith(".weight_calib"):
            assert cal.axis == 0 and np.ndim(cal.scale) == 1
    # biases (int32 DQ) become float weights read directly; excluded ops stay float
    fc_bias = [c for c in ir.calibrations() if c.input == "fc.bias"]
    assert fc_bias == [] and ir.value("fc.bias").data.dtype == np.float32
    for excluded in VARIANTS[variant].get("exclude", ()):
        op = ir.op(excluded)
        if op.op_type in ("Conv", "Gemm"):
            assert ir.producer(op.inputs[1]) is None  # its weight is read as a float initializer


def test_digits_weights_are_the_dequantized_integers_bit_for_bit(digits_qdq):
    path = digits_qdq("uint8-per-channel")
    model = onnx.load(str(path))
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
           and n.input[0] in {i.name for i in model.graph.initializer}]
    only_dq = helper.make_graph(dqs, "dq", [], [helper.make_empty_tensor_value_info(n.output[0]) for n in dqs],
                                initializer=list(model.graph.initializer))
    dq_model = helper.make_model(only_dq, opset_imports=list(model.opset_import))
    dq_model.ir_version = model.ir_version
    by_ort = dict(zip([n.output[0] for n in dqs], reference_session(dq_model).run(None, {})))
    ir = qir.load(path)
    for cal in ir.calibrations(CalibRole.WEIGHT):
        w = ir.weight_array(cal.input)
        np.testing.assert_array_equal(w, by_ort[cal.output])          # = onnxruntime's DequantizeLinear
        np.testing.assert_array_equal(apply_calibration(cal, w), w)   # fake quant gives W back exactly
    for name in ("bn1.bias", "fc.bias"):                               # int32 biases, dequantized
        np.testing.assert_array_equal(ir.weight_array(name), by_ort[name])


def test_default_onnxruntime_matches_when_weights_leave_headroom(tmp_path):
    """With 7-bit weights (reduce_range) onnxruntime's fused integer kernels cannot saturate and
    its default session agrees with qir's fake quantization exactly."""
    path = quantize(DIGITS / "model.onnx", tmp_path / "rr.onnx", calibration_samples(), reduce_range=True)
    ir = qir.load(path)
    fused = reference_session(path, fused=True)
    for x in np.load(DIGITS / "eval_images.npy")[:16]:
        expected = fused.run(None, {"input": x})[0]
        got = qir.run(ir, {"input": x}, runtime="ort")["logits"]
        assert cosine(got, expected) >= 0.99999
        assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_import_is_deterministic_and_saves_exactly(digits_qdq, tmp_path):
    path = digits_qdq("uint8-per-channel")
    ir = qir.load(path)
    assert str(qir.load(path)) == str(ir)
    back = qir.load(qir.save(ir, tmp_path / "calibrated_model.onnx"))
    assert str(back) == str(ir)
    for a, b in zip(ir.calibrations(), back.calibrations()):
        assert (a.name, a.mode, a.axis, a.zero_point is None, a.implied_clip, a.feeds) == \
            (b.name, b.mode, b.axis, b.zero_point is None, b.implied_clip, b.feeds)
        np.testing.assert_array_equal(np.asarray(a.scale), np.asarray(b.scale))


# ---------------------------------------------------------------------------------- removed activations
@pytest.fixture(scope="module")
def clip_qdq(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    float_path = clip_model(root / "float.onnx")
    return float_path, quantize(float_path, root / "qdq.onnx", clip_samples(), activation="QUInt8")


def test_removed_relu_and_clip_come_back_in_float_mode(clip_qdq):
    float_path, qdq_path = clip_qdq
    qdq = onnx.load(str(qdq_path))
    assert not [n for n in qdq.graph.node if n.op_type in ("Relu", "Clip")]  # onnxruntime deleted them
    ir = qir.load(qdq_path)
    clips = {c.input: c.implied_clip for c in ir.calibrations(CalibRole.ACTIVATION)}
    assert clips["a_relu"] == (0.0, np.inf)         # Conv→Relu: the range starts at 0
    assert clips["b_clip"] == (0.0, 6.0)            # Conv→Clip(0,6): range [0, 6]
    assert clips["c3_clip"] == (0.0, 6.0)           # hard-swish's Add→Clip(0,6)
    assert clips["x"] is None and clips["c"] is None and clips["hs"] is None
    # the float model's own Relu/Clip nodes say the same
    exact = import_qdq(qdq_path, float_model=float_path)
    assert {c.name: c.implied_clip for c in exact.calibrations()} == {c.name: c.implied_clip for c in ir.calibrations()}

    float_session = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    for cal in ir.calibrations():
        cal.mode = CalibMode.FLOAT
    ir.touch()
    for feed in clip_samples(4, seed=7):
        feed = {"x": feed["x"] * 4}  # beyond the calibration range: negatives and values > 6
        expected = float_session.run(None, feed)[0]
        for runtime in ("numpy", "ort"):
            got = qir.run(ir, feed, runtime=runtime)["y"]
            assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), runtime
    # without the implied clips "de-quantizing" would change the function
    for cal in ir.calibrations():
        cal.implied_clip = None
    ir.touch()
    feed = {"x": clip_samples(1, seed=7)[0]["x"] * 4}
    wrong = qir.run(ir, feed)["y"]
    assert np.abs(wrong - float_session.run(None, feed)[0]).max() > 1.0


def test_one_node_to_float_keeps_its_relu_and_quantized_nodes_match_onnxruntime(clip_qdq):
    _, qdq_path = clip_qdq
    ir = qir.load(qdq_path)
    session = reference_session(qdq_path)
    feed = clip_samples(1, seed=3)[0]
    np.testing.assert_array_equal(qir.run(ir, feed, runtime="ort")["y"], session.run(None, feed)[0])
    cal = ir.calibration("a_relu_calib")
    cal.mode = CalibMode.FLOAT
    ir.touch()
    got = qir.run(ir, feed, capture=[cal.output, cal.input])
    assert got[cal.output].min() >= 0 and got[cal.input].min() < 0      # the Relu is back
    np.testing.assert_array_equal(got[cal.output], np.maximum(got[cal.input], 0))
    cal.mode = CalibMode.FP16
    ir.touch()
    for runtime in ("numpy", "ort"):
        got = qir.run(ir, feed, runtime=runtime, capture=[cal.output, cal.input])
        np.testing.assert_array_equal(got[cal.output], np.maximum(got[cal.input], 0).astype(np.float16).astype(np.float32))


def test_implied_clip_survives_save_and_load(clip_qdq, tmp_path):
    ir = qir.load(clip_qdq[1])
    back = qir.load(qir.save(ir, tmp_path / "calibrated_model.onnx"))
    assert [(c.name, c.implied_clip) for c in back.calibrations()] == [(c.name, c.implied_clip) for c in ir.calibrations()]


# ---------------------------------------------------------------------------------- hand-made QDQ graphs
def _qdq_model(nodes, inits, inputs=("x",), outputs=("y",), opset=13) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(i, TensorProto.FLOAT, [1, 3, 4, 4]) for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_uint8_zero_point_is_stored_in_the_int8_frame_with_the_same_values():
    inits = {"s": np.float32(0.05), "zp": np.uint8(200)}
    model = _qdq_model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
                        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq")], inits)
    ir = qir.load(model)
    (cal,) = ir.calibrations()
    assert (cal.name, cal.mode, cal.zero_point, cal.implied_clip) == ("x_calib", CalibMode.INT8, 72, None)
    x = np.random.default_rng(0).uniform(-12, 8, (1, 3, 4, 4)).astype(np.float32)
    x.flat[:4] = [-10.0, -9.975, 2.775, 2.825]  # saturation and exact rounding ties
    expected = reference_session(model).run(None, {"x": x})[0]
    for runtime in ("numpy", "ort"):
        np.testing.assert_array_equal(qir.run(ir, {"x": x}, runtime=runtime)["y"], expected)


def test_one_quantizer_read_by_several_dequantizers_is_one_calibration_node():
    inits = {"s": np.float32(0.1), "zp": np.int8(0)}
    model = _qdq_model([helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
                        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d1"], name="dq1"),
                        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["d2"], name="dq2"),
                        helper.make_node("Add", ["d1", "d2"], ["y"], name="add"),
                        helper.make_node("Relu", ["d2"], ["z"], name="relu")], inits, outputs=("y", "z", "d2"))
    ir = qir.load(model)
    (cal,) = ir.calibrations()
    assert cal.feeds == ("add", "relu") and ir.op("add").inputs == (cal.output, cal.output)
    x = np.linspace(-20, 20, 48, dtype=np.float32).reshape(1, 3, 4, 4)
    out = qir.run(ir, {"x": x})
    for got, expected in zip((out["y"], out["z"], out["d2"]), reference_session(model).run(None, {"x": x})):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case, message", [
    ("non_dq_reader", "QuantizeLinear 'q' feeds Relu 'r'"),
    ("different_params", "quantize with different parameters"),
    ("dq_without_q", "DequantizeLinear 'dq' reads 'x', produced by a graph input"),
    ("quantized_output", "is a graph output"),
    ("int4", "not supported"),
])
def test_unsupported_qdq_patterns_are_clear_errors(case, message):
    s, zp = np.float32(0.1), np.int8(0)
    q = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q")
    dq = helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq")
    inits = {"s": s, "zp": zp}
    outputs = ("y",)
    if case == "non_dq_reader":
        nodes = [q, dq, helper.make_node("Relu", ["q"], ["r"], name="r")]
        outputs = ("y", "r")
    elif case == "different_params":
        inits["s2"] = np.float32(0.2)
        nodes = [q, helper.make_node("DequantizeLinear", ["q", "s2", "zp"], ["y"], name="dq")]
    elif case == "dq_without_q":
        nodes = [helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], name="dq")]
    elif case == "quantized_output":
        nodes = [q, dq]
        outputs = ("y", "q")
    else:
        nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["y"], name="dq")]
        model = _qdq_model(nodes, inits, outputs=outputs, opset=21)
        model.graph.initializer.append(helper.make_tensor("w", TensorProto.INT4, [4], [1, -2, 3, 7]))
        with pytest.raises(ImportError_, match=message):
            qir.load(model)
        return
    with pytest.raises(ImportError_, match=message):
        qir.load(_qdq_model(nodes, inits, outputs=outputs))


def test_float_models_are_left_alone():
    model = onnx.load(str(DIGITS / "model.onnx"))
    assert convert_qdq(model) is model


def test_dequantize_is_onnx_dequantize_linear():
    q = np.array([[-128, 0, 127], [5, -7, 100]], np.int8)
    s = np.array([0.1, 0.37], np.float32)
    zp = np.array([3, -2], np.int8)
    expected = (q.astype(np.int32) - zp[:, None]).astype(np.float32) * s[:, None]
    np.testing.assert_array_equal(dequantize(q, s, zp, 0), expected)


def test_opset11_per_channel_model_that_onnxruntime_refuses_still_imports(tmp_path):
    """quantize_static writes DequantizeLinear ``axis`` into opset-11 models (invalid before 13):
    onnxruntime cannot load them, qir imports them like the opset-13 version."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "W2")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "W2"], ["y"], name="conv2")]
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    states = {}
    for opset in (11, 13):
        graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 7
        onnx.save(model, str(tmp_path / f"f{opset}.onnx"))
        path = quantize(tmp_path / f"f{opset}.onnx", tmp_path / f"q{opset}.onnx", samples)
        if opset == 11:
            with pytest.raises(Exception):
                reference_session(path)
        ir = qir.load(path)
        assert ir.opset == opset
        states[opset] = ir
    a, b = states[11], states[13]
    assert [(c.name, c.axis, c.implied_clip) for c in a.calibrations()] == \
        [(c.name, c.axis, c.implied_clip) for c in b.calibrations()]
    for ca, cb in zip(a.calibrations(), b.calibrations()):
        np.testing.assert_array_equal(calib_scale(ca), calib_scale(cb))
    expected = reference_session(tmp_path / "q13.onnx").run(None, samples[0])[0]
    np.testing.assert_array_equal(qir.run(a, samples[0], runtime="ort")["y"], expected)


# ---------------------------------------------------------------------------------- real models
# name -> (preprocessing, static input shape, quantize_static options, images compared,
#          minimum cosine of the numpy runtime against onnxruntime)
# The ort runtime reproduces onnxruntime bit for bit on all of them. The numpy runtime computes
# the same fake quantization on float values that differ from onnxruntime's in the last bits
# (summation order); a value within that of a rounding boundary quantizes one step apart, and
# a deep, fully int8 network carries such steps on. Measured here: ppocr_cls 1.0, yolov8n
# 0.99996, ppocrv4_det 0.986-0.995 on text images (the same detector's onnxruntime integer
# kernels land at 0.73-0.99 of its own QDQ function, see the module docstring).
REAL = {
    "yolov8n_320": ("yolov8n_input", [1, 3, 320, 320],
                    dict(activation="QUInt8", per_channel=True, exclude=("/model.22/Concat_25",)),
                    ["astronaut.png", "camera.png", "motorcycle_right.png"], 0.9999),
    "ppocr_cls": ("ppocr_cls_input", [1, 3, 48, 192], dict(activation="QInt8", per_channel=False),
                  ["page.png", "text.png", "coins.png"], 0.99999),
    "ppocrv4_det": ("ppocr_det_input", [1, 3, 640, 640], dict(activation="QUInt8", per_channel=True),
                    ["page.png", "text.png"], 0.98),
}


def real_qdq(name: str, root: Path, **options) -> tuple[Path, Path, list[tuple[str, dict]]]:
    """(float model with static shapes at opset >= 13, its QDQ model, evaluation feeds)."""
    rm = real_models()
    prep, shape, default, images, _ = REAL[name]
    input_name = rm.MODELS[name][1]
    ir = qir.load(rm.model(name), input_shapes={input_name: shape})
    float_model = qir.export_onnx(ir)
    if ir.opset < 13:  # per-channel DequantizeLinear needs opset 13
        float_model = onnx.version_converter.convert_version(float_model, 13)
    float_path = root / f"{name}_float.onnx"
    onnx.save(float_model, str(float_path))
    calib = [{input_name: getattr(rm, prep)(img)} for img in rm.images(rm.CALIB)]
    assert len(calib) == 8
    qdq_path = quantize(float_path, root / f"{name}_qdq.onnx", calib, **{**default, **options})
    feeds = [(img, {input_name: getattr(rm, prep)(x)}) for img, x in zip(images, rm.images(images))]
    return float_path, qdq_path, feeds


def yolo_detections(out: np.ndarray, threshold: float = 0.25) -> tuple[np.ndarray, np.ndarray]:
    """Anchors whose best class score passes ``threshold``, and those classes."""
    scores = out[0, 4:]
    keep = np.nonzero(scores.max(0) > threshold)[0]
    return keep, scores.argmax(0)[keep]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_qdq_models_reproduce_onnxruntime(name, tmp_path):
    float_path, qdq_path, feeds = real_qdq(name, tmp_path)
    ir = qir.load(qdq_path)
    assert qir.verify(ir) == []
    assert len(ir.calibrations(CalibRole.WEIGHT)) > 20
    session = reference_session(qdq_path)
    numpy_cosine = REAL[name][4]
    for image, feed in feeds:
        expected = session.run(None, feed)[0]
        for runtime in ("ort", "numpy"):
            got = qir.run(ir, feed, runtime=runtime)[ir.outputs[0]]
            c = cosine(got, expected)
            assert c >= (0.99999 if runtime == "ort" else numpy_cosine), (name, image, runtime, c)
            if runtime == "ort":
                np.testing.assert_array_equal(got, expected)
            if name == "ppocr_cls":
                assert got.argmax() == expected.argmax()
            elif name == "yolov8n_320" and runtime == "ort":
                assert all(np.array_equal(u, v) for u, v in zip(yolo_detections(got), yolo_detections(expected)))


@pytest.mark.slow
def test_real_removed_activations_read_from_ranges_match_the_float_model(tmp_path):
    """ppocr's Relu and hard-swish Clip(0, 6) nodes, deleted by the quantizer, are all found
    from the ranges, with the same bounds the float model has."""
    float_path, qdq_path, feeds = real_qdq("ppocr_cls", tmp_path)
    by_ranges = qir.load(qdq_path)
    exact = import_qdq(qdq_path, float_model=float_path)
    got = {c.name: c.implied_clip for c in by_ranges.calibrations()}
    assert got == {c.name: c.implied_clip for c in exact.calibrations()}
    assert sum(v == (0.0, 6.0) for v in got.values()) == 18 and sum(v == (0.0, np.inf) for v in got.values()) == 15
    # everything in float mode computes the float model (given the same, dequantized, weights)
    for cal in by_ranges.calibrations():
        cal.mode = CalibMode.FLOAT
    by_ranges.touch()
    float_model = onnx.load(str(float_path))
    for init in float_model.graph.initializer:
        if by_ranges.has_value(init.name) and by_ranges.value(init.name).data is not None:
            init.CopyFrom(numpy_helper.from_array(by_ranges.weight_array(init.name), init.name))
    float_session = reference_session(float_model)
    unclipped = by_ranges.clone()
    for cal in unclipped.calibrations():
        cal.implied_clip = None
    unclipped.touch()
    for _, feed in feeds:
        expected = float_session.run(None, feed)[0]
        got = qir.run(by_ranges, feed, runtime="ort")[by_ranges.outputs[0]]
        assert np.abs(got - expected).max() <= 1e-5
        wrong = qir.run(unclipped, feed, runtime="ort")[by_ranges.outputs[0]]  # far off, or NaN
        assert not np.abs(wrong - expected).max() <= 1e-2


@pytest.mark.slow
def test_real_int16_qdq_model_reproduces_onnxruntime(tmp_path):
    _, qdq_path, feeds = real_qdq("ppocr_cls", tmp_path, activation="QInt16", per_channel=True)
    ir = qir.load(qdq_path)
    assert {c.mode for c in ir.calibrations(CalibRole.ACTIVATION)} == {CalibMode.INT16}
    session = reference_session(qdq_path)
    for _, feed in feeds:
        expected = session.run(None, feed)[0]
        for runtime in ("ort", "numpy"):
            assert cosine(qir.run(ir, feed, runtime=runtime)[ir.outputs[0]], expected) >= 0.99999
