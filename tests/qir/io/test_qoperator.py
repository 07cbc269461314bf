"""``qir emit --format qoperator``: the QDQ model with every quantized op that has an integer ONNX
form written in that form (QLinearConv, QGemm, ConvInteger, the com.microsoft QLinear* ops), run
by onnxruntime like the QDQ model, and read back by ``qir.load`` to the same calibration state.

The references: onnxruntime's default session on a QDQ model fuses each ``DQ → op → Q`` group it
can into the same integer kernels, so where it fuses every group (models quantized by its own
``quantize_static`` with uint8 activations) the two forms are bit-equal; qir's integer level with
march ``ort`` computes those kernels, so it reproduces the QOperator model bit for bit, also
where onnxruntime's QDQ session runs a group in float (a Conv + Relu into a symmetric quantizer,
an op with a float output).
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qir
from qir.calibration import calib_scale
from qir.errors import InputError
from qir.io.qdq_export import export_qdq, quantize_weight
from qir.io.qdq_params import dequantize
from qir.io.qoperator_export import export_qoperator
from qir.passes import get_pass
from qir.passes.emit import EmitPass
from qir.records import CalibRecord
from qir.runtimes.integer import IntegerRuntime
from qir.tools.cli import main
from qir.tools.emit import emit

from ...conftest import DIGITS, calibrate_for_nash_e, model_from_text
from .test_qdq_import import calibration_samples, cosine, quantize, real_qdq

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---------------------------------------------------------------------------------- helpers
def fused_session(model: onnx.ModelProto | str | Path, optimized: Path | None = None) -> ort.InferenceSession:
    """onnxruntime's default session (its QDQ fusions on). Its uint8×int8 kernels saturate pair
    sums on CPUs without AVX-VNNI unless the weights leave the headroom, so the uint8 models here
    are quantized with 7-bit weights (``reduce_range``); its int8×int8 kernels are exact. (The x64
    precision mode, ``session.x64quantprecision``, is no way out: with it onnxruntime 1.32 finds
    no kernel for an int8 QGemm with a float output.)"""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if optimized is not None:
        opts.optimized_model_filepath = str(optimized)
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def run(session: ort.InferenceSession, feed: dict) -> np.ndarray:
    return session.run(None, feed)[0]


def state(ir) -> dict:
    """Every calibration node's state, comparable with ``==``."""
    def arr(v):
        return None if v is None else np.asarray(v).tolist()

    return {c.name: (c.mode.value, c.role.value, c.input, c.output, arr(c.threshold), arr(c.scale), arr(c.zero_point),
                     c.axis, c.fixed, tuple(c.feeds), c.implied_clip, bool(c.meta.get("unsigned")))
            for c in ir.calibrations()}


def assert_same_model_but_biases(ir, back, integer_nodes: dict[str, str]) -> None:
    """``back`` is ``ir`` (ops, calibration state, weights) except that quantized weights come back
    as their dequantized integers (as from a QDQ model: they fake-quantize to the same values)
    and the biases of the ops written in integer form as int32 codes times ``s_x·s_w``: within
    half a step."""
    assert state(back) == state(ir)
    assert [str(n) for n in back.ops()] == [str(n) for n in ir.ops()]
    biases = {}
    for op in ir.ops():
        if op.name in integer_nodes and len(op.inputs) > 2 and op.inputs[2]:
            x_cal, w_cal = ir.producer(op.inputs[0]), ir.producer(op.inputs[1])
            biases[op.inputs[2]] = np.float32(calib_scale(x_cal)) * calib_scale(w_cal).astype(np.float32)
    for value in ir.weights():
        got, want = back.value(value.name).data, value.data
        cal = next((r for r, _ in ir.uses(value.name) if isinstance(r, CalibRecord)), None)
        if value.name in biases:
            assert np.all(np.abs(got - want) <= biases[value.name] * np.float32(0.5 + 1e-3)), value.name
        elif cal is not None and cal.mode.value in ("int8", "int16"):
            np.testing.assert_array_equal(got, dequantize(quantize_weight(cal, want), calib_scale(cal), cal.zero_point,
                                                          cal.axis), err_msg=value.name)
        else:
            np.testing.assert_array_equal(got, want, err_msg=value.name)


def quantized_through_relu(ir, value: str) -> bool:
    """Does ``value`` reach an int8 calibration node directly or through one Relu/Clip?"""
    readers = [r for r, _ in ir.uses(value)]
    if len(readers) == 1 and not isinstance(readers[0], CalibRecord) and readers[0].op_type in ("Relu", "Clip"):
        readers = [r for r, _ in ir.uses(readers[0].outputs[0])]
    return len(readers) == 1 and isinstance(readers[0], CalibRecord) and readers[0].mode.value == "int8"


TINY = """
<ir_version: 8, opset_import: ["" : 17]>
tiny (float[1,3,8,8] x) => (float[1,5] y) {
  a = Conv <pads=[1,1,1,1]> (x, W1, B1)
  s = Sigmoid (a)
  m = Mul (s, a)
  p = AveragePool <kernel_shape=[2,2], strides=[2,2]> (m)
  l = LeakyRelu <alpha=0.1> (p)
  c = Concat <axis=1> (l, p)
  c2 = Concat <axis=1> (p, l)
  z = Add (c, c2)
  g = GlobalAveragePool (z)
  f = Flatten (g)
  y = Gemm <transB=1> (f, W2, B2)
}
"""
TINY_WEIGHTS = {"W1": (8, 3, 3, 3), "B1": (8,), "W2": (5, 16), "B2": (5,)}

CLIPS = """
<ir_version: 8, opset_import: ["" : {opset}]>
clips (float[1,4,6,6] x) => (float[1,4,6,6] y) <float lo = {{0.0}}, float hi = {{6.0}}> {{
  a = Conv <pads=[1,1,1,1]> (x, W1, B1)
  a6 = Clip (a, lo, hi)
  b = Conv (a6, W2, B2)
  br = Relu (b)
  y = Conv (br, W3, B3)
}}
"""
CLIPS_WEIGHTS = {"W1": (8, 4, 3, 3), "B1": (8,), "W2": (8, 8, 1, 1), "B2": (8,), "W3": (4, 8, 1, 1), "B3": (4,)}


def random_samples(shape, n: int, scale: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * scale).astype(np.float32) for _ in range(n)]


@pytest.fixture(scope="module")
def ort_quantized(tmp_path_factory):
    """(QDQ path, IR, feeds) of models quantized by onnxruntime's quantize_static (uint8
    activations, 7-bit weights so that its own kernels are exact), made once per name."""
    made = {}

    def get(name: str):
        if name not in made:
            root = tmp_path_factory.mktemp("qop")
            if name == "digits":
                path = quantize(DIGITS / "model.onnx", root / "digits_qdq.onnx", calibration_samples(), reduce_range=True)
                feeds = [{"input": x.reshape(1, 1, 8, 8)} for x in np.load(DIGITS / "eval_images.npy")[:24]]
            else:
                onnx.save(model_from_text(TINY, TINY_WEIGHTS), str(root / "tiny.onnx"))
                feeds = [{"x": x} for x in random_samples((1, 3, 8, 8), 12)]
                path = quantize(root / "tiny.onnx", root / "tiny_qdq.onnx", feeds[:8], reduce_range=True)
            made[name] = path, qir.load(path), [{k: v.astype(np.float32) for k, v in f.items()} for f in feeds]
        return made[name]
    return get


@pytest.fixture(scope="module")
def digits_qop(digits_calibrated):
    model, report = export_qoperator(digits_calibrated)
    return digits_calibrated, model, report


# ---------------------------------------------------------------------------------- the form
def test_digits_ops_take_their_integer_forms(digits_qop):
    """Every Conv whose output reaches an int8 quantizer (through its Relu) is a QLinearConv with
    the Relu on the codes; pw4, whose output the fused Add reads in float, a ConvInteger; fc,
    whose output is the graph output, a QGemm with a float output."""
    ir, model, report = digits_qop
    expected = {}
    for op in ir.ops():
        if op.op_type == "Conv":
            expected[op.name] = "QLinearConv" if quantized_through_relu(ir, op.outputs[0]) else "ConvInteger"
        elif op.op_type == "Gemm":
            expected[op.name] = "QGemm"
    assert report.integer_nodes == expected
    assert set(expected.values()) == {"QLinearConv", "ConvInteger", "QGemm"}
    ops = Counter(n.op_type for n in model.graph.node)
    assert report.forms == dict(Counter(expected.values())) == {k: ops[k] for k in report.forms}
    assert ops["Conv"] == ops["Gemm"] == 0
    producers = {o: n for n in model.graph.node for o in n.output}
    on_codes = [n for n in model.graph.node if n.op_type == "Relu" and producers[n.input[0]].op_type == "QLinearConv"]
    assert len(on_codes) == ops["QLinearConv"]  # add4's Relu stays float, before its quantizer
    kept = {k["node"]: k["reason"] for k in report.kept_qdq_nodes}
    assert kept["pool4"] == "no integer ONNX form" and "pw4_out" in kept["add4"] and "Flatten" in kept["gap"]
    assert report.kept_qdq == dict(Counter(k["op_type"] for k in report.kept_qdq_nodes))
    assert any(o.domain == "com.microsoft" for o in model.opset_import)
    onnx.checker.check_model(model)


@pytest.mark.parametrize("name", ["tiny", "digits"])
def test_onnxruntime_runs_it_bit_equal_to_the_fused_qdq_model(ort_quantized, name, tmp_path):
    """On models whose QDQ groups onnxruntime fuses (uint8 activations), the QOperator model gives
    the QDQ model's outputs bit for bit. qir's integer level on the model read back gives them too
    on the digits model; on the tiny one it differs by one output step on a few inputs (its
    AveragePool rounds some ties otherwise than QLinearAveragePool, and it shares one scale
    across the two Concats; the integer level's own proof asks >= 99.9% equal codes)."""
    qdq_path, ir, feeds = ort_quantized(name)
    model, report = export_qoperator(ir)
    if name == "tiny":  # every op of the tiny model has its integer form
        assert set(report.forms) == {"QLinearConv", "QLinearSigmoid", "QLinearMul", "QLinearAveragePool",
                                        "QLinearLeakyRelu", "QLinearConcat", "QLinearAdd",
                                        "QLinearGlobalAveragePool", "QGemm"}
        assert report.kept_qdq == {"Flatten": 1}
    qdq = fused_session(qdq_path, optimized=tmp_path / "optimized.onnx")
    fused = Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    assert fused["QLinearConv"] == report.forms["QLinearConv"] and fused["Conv"] == 0  # the same kernels
    qop = fused_session(model)
    back = qir.load(model)
    integer = IntegerRuntime("ort")
    step = np.float32(calib_scale(back.producer(back.outputs[0]))) if name == "tiny" else 0.0
    for feed in feeds:
        got = run(qop, feed)
        np.testing.assert_array_equal(got, run(qdq, feed))
        assert np.abs(got - integer.run(back, feed)[back.outputs[0]]).max() <= step * 1.0001


def test_integer_level_reproduces_it_where_onnxruntime_runs_the_qdq_group_in_float(digits_qop):
    """qir's own digits model: Conv + Relu into a symmetric quantizer, pw4 and fc with float
    outputs. onnxruntime's QDQ session runs those in float (FusedConv / Gemm), the QOperator
    model in integer: one code apart near ties (close, not equal); the integer level computes
    the integer kernels and equals the QOperator model bit for bit."""
    ir, model, _ = digits_qop
    qop, qdq = fused_session(model), fused_session(export_qdq(ir))
    integer = IntegerRuntime("ort")
    back = qir.load(model)
    images = np.load(DIGITS / "eval_images.npy")[:32].astype(np.float32)
    same_class = 0
    for image in images:
        feed = {"input": image.reshape(1, 1, 8, 8)}
        got = run(qop, feed)
        np.testing.assert_array_equal(got, integer.run(back, feed)[back.outputs[0]])
        np.testing.assert_array_equal(got, integer.run(ir, feed)[ir.outputs[0]])
        reference = run(qdq, feed)
        assert cosine(got, reference) > 0.999
        same_class += int(got.argmax() == reference.argmax())
    assert same_class >= len(images) - 1


@pytest.mark.parametrize("opset", [13, 17])
def test_relu_and_clip_before_a_quantizer_run_on_the_codes(opset):
    """Conv → Clip(0, 6) and Conv → Relu into int8 quantizers: the clamp is written on the codes
    (Clip with the bounds' codes; Relu on int8 from opset 14, else Clip from the zero point), the
    last Conv (float output) as ConvInteger; the integer level gives the same outputs, and the
    import gives back the Clip with its own bound constants and the Relu."""
    model = model_from_text(CLIPS.format(opset=opset), CLIPS_WEIGHTS)
    samples = [{"x": x} for x in random_samples((1, 4, 6, 6), 6, scale=2.0)]
    ir = calibrate_for_nash_e(qir.load(model), samples[:4])
    qop, report = export_qoperator(ir)
    assert report.integer_nodes == {"Conv_0": "QLinearConv", "Conv_1": "QLinearConv", "Conv_2": "ConvInteger"}
    nodes = {n.name: n for n in qop.graph.node}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in qop.graph.initializer}
    a6 = ir.calibration("a6_calib")
    s = np.float32(calib_scale(a6))
    clip = nodes["Clip_0"]
    assert clip.op_type == "Clip" and [int(inits[v]) for v in clip.input[1:]] == [0, int(np.rint(np.float32(6) / s))]
    relu = nodes["Relu_0"]
    assert (relu.op_type, list(relu.input[1:])) == (("Relu", []) if opset >= 14 else ("Clip", [relu.input[1]]))
    session, integer, back = fused_session(qop), IntegerRuntime("ort"), qir.load(qop)
    for feed in samples:
        np.testing.assert_array_equal(run(session, feed), integer.run(back, feed)["y"])
    assert_same_model_but_biases(ir, back, report.integer_nodes)
    assert str(back.op("Clip_0")) == str(ir.op("Clip_0"))  # reads @lo and @hi again
    np.testing.assert_array_equal(back.value("hi").data, np.float32(6))


# ---------------------------------------------------------------------------------- round trip
def test_reimport_gives_back_the_calibration_state(digits_qop, ort_quantized):
    """Every calibration node's mode, role, threshold, scale, zero point, axis, fixed flag, feeds,
    implied clip and uint8 frame; every op; every weight, the biases to within half a step of
    their int32 codes."""
    ir, model, report = digits_qop
    assert_same_model_but_biases(ir, qir.load(model), report.integer_nodes)
    for name in ("digits", "tiny"):
        _, imported, _ = ort_quantized(name)
        assert any(c.meta.get("unsigned") for c in imported.calibrations())
        assert state(qir.load(export_qdq(imported))) == state(imported)  # the QDQ form keeps the uint8 frame too
        model, report = export_qoperator(imported)
        assert_same_model_but_biases(imported, qir.load(model), report.integer_nodes)


def test_modes_without_an_integer_form_stay_qdq_and_the_report_says_why(digits_calibrated):
    """int16 (the integer ops take 8-bit), fp16 (a Cast pair) and float (nothing) keep the ops
    that read them in QDQ / float form, each with its reason; the model (opset 21 for int16, so
    uint8 activations) still runs in onnxruntime as the integer level computes it, and reads back
    to the same calibration state."""
    ir = digits_calibrated.clone()
    ir.set_calibration("relu1_out_calib", mode="int16")
    ir.set_calibration("relu3_out_calib", mode="fp16")
    ir.set_calibration("pool4_out_calib", mode="float")
    model, report = export_qoperator(ir)
    kept = {k["node"]: k["reason"] for k in report.kept_qdq_nodes}
    assert "int16" in kept["conv2"] and "not quantized" in kept["pw4"] and "not quantized" in kept["conv5"]
    # conv1's output goes to an int16 quantizer: integer sums with a float output, then QDQ
    assert report.integer_nodes == {"conv1": "ConvInteger", "dw3": "ConvInteger", "fc": "QGemm"}
    assert sum(report.kept_qdq.values()) == len(report.kept_qdq_nodes) >= 6
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops["Cast"] == 2 + ops["ConvInteger"]  # the fp16 pair and each ConvInteger's int32 -> float
    session, integer, back = fused_session(model), IntegerRuntime("ort"), qir.load(model)
    for image in np.load(DIGITS / "eval_images.npy")[:8].astype(np.float32):
        feed = {"input": image.reshape(1, 1, 8, 8)}
        np.testing.assert_array_equal(run(session, feed), integer.run(back, feed)[back.outputs[0]])
    assert state(back) == state(ir)


# ---------------------------------------------------------------------------------- pass, API, CLI
def test_emit_pass_and_api_take_the_format(digits_calibrated, tmp_path):
    report = EmitPass(format="qoperator")(digits_calibrated).report
    assert report["format"] == "qoperator" and report["forms"]["QLinearConv"] == 4
    assert "integer_nodes" not in EmitPass()(digits_calibrated).report  # qdq stays what it was
    assert get_pass("emit", format="qoperator").format == "qoperator"
    with pytest.raises(InputError, match="format 'int4'"):
        EmitPass(format="int4")
    with pytest.raises(InputError, match="format"):
        emit(digits_calibrated, tmp_path / "x.onnx", format="qop")
    assert not (tmp_path / "x.onnx").exists()
    written = emit(digits_calibrated, tmp_path / "q.onnx", format="qoperator")
    assert written["path"] == str(tmp_path / "q.onnx") and "model" not in written
    assert state(qir.load(tmp_path / "q.onnx")) == state(digits_calibrated)


def test_cli_emit_format_qoperator_writes_the_model_and_refuses_to_overwrite(digits_calibrated, tmp_path, capsys):
    calibrated, out = tmp_path / "cal.onnx", tmp_path / "int.onnx"
    qir.save(digits_calibrated, calibrated)
    assert main(["emit", str(calibrated), "-o", str(out), "--format", "qoperator"]) == 0
    printed = capsys.readouterr().out
    assert "integer ops written: ConvInteger 1, QGemm 1, QLinearConv 4" in printed
    assert "MaxPool 1" in printed
    written = out.read_bytes()
    assert Counter(n.op_type for n in onnx.load(str(out)).graph.node)["QLinearConv"] == 4
    assert main(["emit", str(calibrated), "-o", str(out), "--format", "qoperator", "--float", "fc"]) != 0
    assert "--force" in capsys.readouterr().err and out.read_bytes() == written
    assert main(["emit", str(calibrated), "-o", str(out), "--format", "qoperator", "--float", "fc", "--force"]) == 0
    assert "QGemm" not in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:  # argparse refuses a format it does not list
        main(["emit", str(calibrated), "-o", str(tmp_path / "x.onnx"), "--format", "int"])
    assert bad.value.code != 0 and "invalid choice: 'int'" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- real models
@pytest.mark.slow
@pytest.mark.parametrize("name", ["yolov8n_320", "ppocr_cls"])
def test_real_qoperator_models_run_like_the_qdq_models(name, tmp_path):
    """Real models quantized by onnxruntime (7-bit weights), with the calibration state coming
    back. YOLOv8n (uint8 activations): the QOperator model gives the fused QDQ model's outputs bit
    for bit on real photos, and so does the integer level on the model read back. PP-OCR cls
    (int8 activations): onnxruntime's QDQ session turns its int8 quantizers into uint8 ones (its
    s8->u8 conversion) and fuses only some groups (its Convs into uint8 QLinearConv; its Adds
    and Muls run in float), the QOperator model runs int8 kernels for all of them: one value
    of one 1x1 Conv comes out a code apart; the outputs stay within cosine 0.9999, same class."""
    _, qdq_path, feeds = real_qdq(name, tmp_path, reduce_range=True)
    ir = qir.load(qdq_path)
    model, report = export_qoperator(ir)
    assert report.forms["QLinearConv"] > 50
    qop, qdq = fused_session(model), fused_session(qdq_path)
    back = qir.load(model)
    assert state(back) == state(ir)
    for image, feed in feeds:
        got, want = run(qop, feed), run(qdq, feed)
        if name == "yolov8n_320":
            np.testing.assert_array_equal(got, want, err_msg=image)
        else:
            assert cosine(got, want) > 0.9999 and got.argmax() == want.argmax(), image
    if name == "yolov8n_320":
        np.testing.assert_array_equal(got, IntegerRuntime("ort").run(back, feed)[back.outputs[0]])
