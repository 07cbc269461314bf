"""``emit``: calibrated IR → standard ONNX (QDQ / Cast pair / float per node) that onnxruntime runs
like qir's fake quantization, and that ``qir.load`` reads back to the same calibration state."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import qir
from qir.calibration import calib_scale
from qir.errors import InputError, NotFoundError, QirError
from qir.io.qdq_export import export_qdq, quantize_weight, required_opset
from qir.io.qdq_metadata import EMIT_METADATA_KEY
from qir.kinds import CalibMode, CalibRole
from qir.passes import PassManager, PipelineContext, get_pass
from qir.passes.emit import EmitPass
from qir.runtimes.base import get_runtime
from qir.runtimes.numerics import apply_calibration
from qir.tools.emit import emit, emit_model

from ..conftest import REPO, real_models
from ..qir.io.test_qdq_import import (
    REAL,
    calibration_samples,
    clip_model,
    clip_samples,
    cosine,
    quantize,
    reference_session,
    yolo_detections,
)

DIGITS = REPO / "qir" / "examples" / "digits"


# ---------------------------------------------------------------------------------- helpers
def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """A copy that also returns ``names``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names if n not in have)
    return out


def session(model: onnx.ModelProto, fused: bool) -> ort.InferenceSession:
    """onnxruntime as it comes (``fused``: Q/DQ groups may become integer kernels; the x64
    precision mode keeps uint8×int8 kernels from saturating on AVX2) or with the Q/DQ ops
    run as written."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.x64quantprecision" if fused else "session.disable_quant_qdq", "1")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def step(cal) -> float:
    return float(np.max(calib_scale(cal)))


def compared_values(ir: qir.QIR, model: onnx.ModelProto) -> list:
    """Integer activation calibration nodes whose output the emitted model still names."""
    produced = {o for n in model.graph.node for o in n.output}
    return [c for c in ir.calibrations(CalibRole.ACTIVATION)
            if c.mode in (CalibMode.INT8, CalibMode.INT16) and c.output in produced]


def assert_matches(ir: qir.QIR, model: onnx.ModelProto, feeds: list[dict], runtimes=("ort", "numpy"),
                   fused: bool = False, identical: float = 0.999) -> None:
    """Every quantized activation within one step of qir's and identical on ``identical`` of it;
    outputs within 1e-4 of their peak."""
    cals = compared_values(ir, model)
    s = session(with_outputs(model, [c.output for c in cals]), fused)
    names = [o.name for o in s.get_outputs()]
    same = {(r, c.name): [0, 0] for r in runtimes for c in cals}  # identical elements, all elements
    for feed in feeds:
        got = dict(zip(names, s.run(None, feed)))
        for runtime in runtimes:
            ours = get_runtime(runtime).run(ir, feed, capture=[c.output for c in cals])
            for cal in cals:
                diff = np.abs(got[cal.output] - ours[cal.output])
                assert diff.max() <= step(cal) * 1.0001, (runtime, cal.name, diff.max() / step(cal))
                same[runtime, cal.name][0] += int(np.sum(diff == 0))
                same[runtime, cal.name][1] += diff.size
            for out in ir.outputs:
                peak = max(float(np.abs(ours[out]).max()), 1e-12)
                assert np.abs(got[out] - ours[out]).max() <= 1e-4 * peak, (runtime, out)
    for key, (n_same, n_all) in same.items():  # over all feeds
        assert n_same >= identical * n_all, (key, n_same / n_all)


def calibrated_digits() -> qir.QIR:
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e},calibrate{method=max,progress=False}",
                context=PipelineContext(data=DIGITS / "calibration_data")).run(ir)
    return ir


@pytest.fixture
def mixed():
    """The digits model with every mode, per-channel weights, an imported asymmetric quantizer
    and a fixed threshold."""
    ir = calibrated_digits()
    ir.calibration("pool4_out_calib").mode = CalibMode.INT16
    ir.calibration("relu3_out_calib").mode = CalibMode.FP16
    ir.calibration("relu1_out_calib").mode = CalibMode.FLOAT
    ir.calibration("conv5.weight_calib").mode = CalibMode.INT16
    cal = ir.calibration("relu4_out_calib")
    cal.scale, cal.zero_point, cal.threshold = np.float32(0.025), -128, None  # uint8-like [0, 6.375]
    ir.calibration("relu5_out_calib").fixed = True
    ir.touch()
    return ir


def eval_feeds(n: int = 24) -> list[dict]:
    return [{"input": x} for x in np.load(DIGITS / "eval_images.npy")[:n]]


# ---------------------------------------------------------------------------------- digits
def test_emitted_model_is_standard_onnx_with_one_lowering_per_mode(mixed):
    model = export_qdq(mixed)
    onnx.checker.check_model(model, full_check=True)
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 21)]  # int16 QDQ needs 21
    assert model.ir_version >= 10
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for cal in mixed.calibrations():
        node = nodes.get(cal.name)
        if cal.mode is CalibMode.FLOAT:   # nothing: conv2 reads relu1's output directly
            assert node is None and mixed.op("conv2").inputs[0] == cal.output
            assert nodes["conv2"].input[0] == cal.input
        elif cal.mode is CalibMode.FP16:
            assert node.op_type == "Cast" and nodes[node.input[0].replace(".fp16", "/to_fp16")].op_type == "Cast"
        elif cal.role is CalibRole.WEIGHT:
            assert node.op_type == "DequantizeLinear" and node.input[0] == cal.input + "_quantized"
            q = inits[node.input[0]]
            assert q.dtype == (np.int16 if cal.mode is CalibMode.INT16 else np.int8)
            assert [a.i for a in node.attribute if a.name == "axis"] == [cal.axis]
        else:
            assert node.op_type == "DequantizeLinear" and nodes[cal.name + "/quantize"].op_type == "QuantizeLinear"
            zp = inits[node.input[2]]
            assert zp.dtype == (np.int16 if cal.mode is CalibMode.INT16 else np.uint8)  # opset 21: uint8 frame
            np.testing.assert_array_equal(inits[node.input[1]], calib_scale(cal))
    assert inits["relu4_out_calib.zero_point"] == 0  # -128 in the int8 frame is 0 in uint8
    assert not [n for n in model.graph.node if n.domain not in ("", "ai.onnx")]
    assert "conv2.weight" not in inits and "conv2.weight_quantized" in inits  # only the integers


def test_onnxruntime_runs_the_ops_as_written_like_qir_fake_quant(mixed):
    assert_matches(mixed, export_qdq(mixed), eval_feeds(), fused=False)


def test_onnxruntime_default_session_matches_where_it_keeps_the_function(mixed, tmp_path):
    """The default session (integer kernels) agrees within one step wherever onnxruntime does
    not re-quantize weights/biases itself — which the emit report flags."""
    mixed.calibration("conv5.weight_calib").mode = CalibMode.INT8
    mixed.touch()
    assert EmitPass()(mixed).report["onnxruntime_caveats"] == []
    assert_matches(mixed, export_qdq(mixed), eval_feeds(), fused=True)


def test_ops_onnxruntime_would_requantize_are_reported(mixed, tmp_path):
    mixed.calibration("conv2.weight_calib").mode = CalibMode.FLOAT
    mixed.calibration("relu1_out_calib").mode = CalibMode.INT8  # conv2: DQ → Conv → Relu → Q
    mixed.touch()
    report = EmitPass()(mixed).report
    issues = {c["node"]: c["issue"] for c in report["onnxruntime_caveats"]}
    assert set(issues) == {"conv2", "conv5"}  # a float weight; an int16 x int16 bias overflowing int32
    assert "quantizes it to int8" in issues["conv2"] and "overflows" in issues["conv5"]
    model = export_qdq(mixed)
    cal = mixed.calibration("relu5_out_calib")
    feed = eval_feeds(3)[2]
    ours = qir.run(mixed, feed, runtime="ort", capture=[cal.output])[cal.output]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    probe = with_outputs(model, [cal.output]).SerializeToString()
    plain = ort.InferenceSession(probe, opts, providers=["CPUExecutionProvider"])
    assert np.abs(plain.run([cal.output], feed)[0] - ours).max() > 5 * step(cal)  # onnxruntime's rewrite
    kept = ort.InferenceSession(probe, opts, providers=["CPUExecutionProvider"],
                                disabled_optimizers=["WeightBiasQuantization"])
    assert np.abs(kept.run([cal.output], feed)[0] - ours).max() <= step(cal)


def test_weights_are_quantized_with_half_to_even_like_fake_quant():
    ir = calibrated_digits()
    cal = ir.calibration("fc.weight_calib")
    cal.threshold = np.full(10, 127 / 32, np.float32)  # scale 2^-5: the ties below are exact
    w = ir.weight_array("fc.weight").copy()
    scale = calib_scale(cal)
    assert np.all(scale == np.float32(2.0**-5))
    w[:, :6] = (np.array([0.5, 1.5, 2.5, -0.5, -2.5, 300.0], np.float32) * scale[:, None])  # ties, saturation
    ir.set_weight("fc.weight", w)
    q = quantize_weight(cal, w)
    assert q.dtype == np.int8
    np.testing.assert_array_equal(q[:, :6], np.broadcast_to(np.array([0, 2, 2, 0, -2, 127], np.int8), (10, 6)))
    model = export_qdq(ir)
    dq = next(n for n in model.graph.node if n.name == "fc.weight_calib")
    one = helper.make_model(helper.make_graph(
        [dq], "dq", [], [helper.make_empty_tensor_value_info(dq.output[0])],
        initializer=[i for i in model.graph.initializer if i.name in dq.input]), opset_imports=list(model.opset_import))
    one.ir_version = model.ir_version
    np.testing.assert_array_equal(session(one, False).run(None, {})[0], apply_calibration(cal, w))


def test_opset_is_raised_only_as_far_as_the_content_needs():
    ir = calibrated_digits()
    assert ir.opset == 17 and required_opset(ir) == 17  # per-channel QDQ needs 13
    model = export_qdq(ir)
    assert model.opset_import[0].version == 17
    zps = [numpy_helper.to_array(i).dtype for i in model.graph.initializer if i.name.endswith(".zero_point")]
    assert set(zps) == {np.dtype(np.int8)}  # below opset 21: int8 activations stay int8
    ir.calibration("relu2_out_calib").mode = CalibMode.INT16
    ir.touch()
    assert required_opset(ir) == 21 and export_qdq(ir).opset_import[0].version == 21
    with pytest.raises(InputError, match="opset 19 is too low.*needs 21"):
        export_qdq(ir, opset=19)


def _opset11_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "W1"),
             numpy_helper.from_array(rng.standard_normal((4, 8, 1, 1)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array([1, 4, 8, 8], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "W1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["a"], ["r"], name="relu6", min=0.0, max=6.0) if False else
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "W2"], ["c"], name="conv2"),
             helper.make_node("Unsqueeze", ["c"], ["u"], name="unsq", axes=[0]),
             helper.make_node("Squeeze", ["u"], ["y"], name="sq", axes=[0])]
    graph = helper.make_graph(nodes, "m11", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 6
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("int16", [False, True])
def test_old_opset_models_are_converted_not_patched(int16):
    """An opset-11 model (Squeeze/Unsqueeze with ``axes`` attributes) with per-channel weights:
    the whole model moves to opset 13 (21 with int16) through the ONNX version converter."""
    ir = qir.load(_opset11_model())
    rng = np.random.default_rng(1)
    samples = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    PassManager("insert-calibration,calibrate{method=max,progress=False}", context=PipelineContext(data=samples)).run(ir)
    if int16:
        ir.calibrations(CalibRole.ACTIVATION)[-1].mode = CalibMode.INT16
        ir.touch()
    model = export_qdq(ir)
    onnx.checker.check_model(model, full_check=True)  # no attribute the declared opset lacks
    assert model.opset_import[0].version == (21 if int16 else 13)
    nodes = {n.op_type: n for n in model.graph.node}
    assert len(nodes["Squeeze"].input) == 2 and not nodes["Squeeze"].attribute  # axes became an input
    assert_matches(ir, model, samples)


def test_reimport_gives_back_the_calibration_state(mixed, tmp_path):
    ir = mixed
    ir.calibration("relu2_out_calib").implied_clip = (0.0, 6.0)
    ir.calibration("relu1_out_calib").implied_clip = (0.0, np.inf)  # float: written as a Relu
    ir.touch()
    path = tmp_path / "partial.onnx"
    onnx.save(export_qdq(ir), str(path))
    back = qir.load(path)
    assert qir.verify(back) == []
    ours = {c.name: c for c in ir.calibrations()}
    theirs = {c.name: c for c in back.calibrations()}
    assert set(theirs) == set(ours)
    for name, a in ours.items():
        b = theirs[name]
        assert (b.mode, b.role, b.axis, b.fixed, b.feeds, b.implied_clip, b.input, b.output) == \
            (a.mode, a.role, a.axis, a.fixed, a.feeds, a.implied_clip, a.input, a.output), name
        if a.mode in (CalibMode.INT8, CalibMode.INT16):
            np.testing.assert_array_equal(calib_scale(b), calib_scale(a))
        for field in ("threshold", "scale", "zero_point"):
            va, vb = getattr(a, field), getattr(b, field)
            assert (va is None) == (vb is None), (name, field)
            if va is not None:
                np.testing.assert_array_equal(np.asarray(vb), np.asarray(va))
    # the same function: int weights come back dequantized, which fake-quantize to the same values
    for feed in eval_feeds(8):
        np.testing.assert_array_equal(qir.run(back, feed, runtime="ort")["logits"],
                                      qir.run(ir, feed, runtime="ort")["logits"])
    # emitting the re-imported model again gives the same model
    again = export_qdq(back)
    assert [(n.op_type, n.name) for n in again.graph.node] == [(n.op_type, n.name) for n in onnx.load(str(path)).graph.node]


def test_reimport_without_metadata_still_reads_the_quantizers(mixed):
    model = export_qdq(mixed)
    meta = [p for p in model.metadata_props if p.key == EMIT_METADATA_KEY]
    entries = json.loads(meta[0].value)["calibrations"]
    assert {e["name"] for e in entries} == {c.name for c in mixed.calibrations()}
    model.metadata_props.remove(meta[0])
    back = qir.load(model)
    ints = [c for c in mixed.calibrations() if c.mode in (CalibMode.INT8, CalibMode.INT16)]
    theirs = {c.name: c for c in back.calibrations()}
    for cal in ints:  # the same names (<value>_calib) and the same quantizers, as stored scales
        b = theirs[cal.name]
        assert b.mode is cal.mode and b.axis == cal.axis
        np.testing.assert_array_equal(calib_scale(b), calib_scale(cal))
    assert {c.mode for c in back.calibrations()} == {CalibMode.INT8, CalibMode.INT16}  # fp16/float: plain ops


def test_emit_pass_reports_and_does_not_change_the_ir(mixed, tmp_path):
    """The pass returns the model and writes nothing; :func:`qir.tools.emit.emit` writes it."""
    before = str(mixed)
    version = mixed.version
    path = tmp_path / "out" / "partial.onnx"
    result = PassManager("emit").run(mixed)
    assert not result.modified and mixed.version == version and str(mixed) == before
    built = result.report["passes"]["emit"]
    assert isinstance(built["model"], onnx.ModelProto) and built["path"] is None and not path.parent.exists()
    report = emit(mixed, path)
    assert path.exists() and report["path"] == str(path) and "model" not in report
    assert str(mixed) == before and mixed.version == version
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert model.SerializeToString() == built["model"].SerializeToString()
    assert report["modes"] == {"int8": 10, "int16": 2, "fp16": 1, "float": 1}
    assert report["roles"]["weight"] == {"int8": 5, "int16": 1, "fp16": 0, "float": 0}
    assert report["opset"] == 21 and report["source_opset"] == 17
    assert report["quantize_linear"] == 6 and report["dequantize_linear"] == 6 + 6
    assert [c["node"] for c in report["onnxruntime_caveats"]] == ["conv5"]
    assert {k: v for k, v in built.items() if k not in ("model", "seconds", "modified", "path", "overwrite")} == {
        k: v for k, v in report.items() if k != "path"}
    direct = EmitPass()(mixed).report  # build and check only
    assert direct["path"] is None and direct["modes"] == report["modes"]
    with pytest.raises(InputError, match="exists"):
        emit(mixed, path)
    emit(mixed, path, overwrite=True)
    with pytest.raises(InputError, match="is a directory"):
        emit(mixed, tmp_path, overwrite=True)
    assert get_pass("emit", opset=21).name == "emit"
    # a pipeline's emit{path=...} names where tools write the model; the pass itself writes nothing
    named = get_pass("emit", path=str(tmp_path / "named.onnx"))(mixed).report
    assert named["path"] == str(tmp_path / "named.onnx") and not (tmp_path / "named.onnx").exists()
    with pytest.raises(QirError, match="has no option 'paht'"):
        get_pass("emit", paht=str(path))


def test_emit_model_sets_modes_on_a_clone(mixed, tmp_path):
    before = str(mixed)
    report = emit_model(mixed, tmp_path / "p.onnx", int16=["conv2"], float="relu5_out_calib",
                        fp16=["relu2_out_calib", "fc.weight_calib"])
    assert str(mixed) == before
    assert report["selected"] == {"int16": ["conv2.weight_calib", "relu1_out_calib"], "float": ["relu5_out_calib"],
                                  "fp16": ["fc.weight_calib", "relu2_out_calib"]}
    back = qir.load(tmp_path / "p.onnx")
    modes = {c.name: c.mode for c in back.calibrations()}
    assert modes["conv2.weight_calib"] is CalibMode.INT16 and modes["relu5_out_calib"] is CalibMode.FLOAT
    assert modes["fc.weight_calib"] is CalibMode.FP16 and modes["input_calib"] is CalibMode.INT8
    with pytest.raises(InputError, match="both int16 and float"):
        emit_model(mixed, tmp_path / "q.onnx", int16=["relu5_out_calib"], float=["relu5*"])
    with pytest.raises(NotFoundError, match="did you mean 'relu5_out_calib'"):
        emit_model(mixed, tmp_path / "q.onnx", float=["relu5_out_calb"])
    assert not (tmp_path / "q.onnx").exists()


def test_unusable_threshold_is_a_clear_error():
    ir = calibrated_digits()
    ir.calibration("relu2_out_calib").threshold = np.float32(0.0)
    ir.touch()
    with pytest.raises(QirError, match="relu2_out_calib.*unusable scale"):
        export_qdq(ir)


# ---------------------------------------------------------------------------------- imported QDQ models
def test_float_nodes_of_an_imported_model_get_their_relu_and_clip_back(tmp_path):
    float_path = clip_model(tmp_path / "float.onnx")
    ir = qir.load(quantize(float_path, tmp_path / "qdq.onnx", clip_samples()))
    for name in ("a_relu_calib", "b_clip_calib"):
        ir.calibration(name).mode = CalibMode.FLOAT
    ir.calibration("c3_clip_calib").mode = CalibMode.FP16
    ir.touch()
    model = export_qdq(ir)
    onnx.checker.check_model(model, full_check=True)
    nodes = {n.name: n for n in model.graph.node}
    assert nodes["a_relu_calib"].op_type == "Relu" and nodes["b_clip_calib"].op_type == "Clip"
    assert nodes["c3_clip_calib/clip"].op_type == "Clip" and nodes["c3_clip_calib"].op_type == "Cast"
    feeds = [{"x": f["x"] * 4} for f in clip_samples(4, seed=5)]
    assert_matches(ir, model, feeds)
    back = qir.load(model)
    assert {c.name: (c.mode, c.implied_clip) for c in back.calibrations()} == \
        {c.name: (c.mode, c.implied_clip) for c in ir.calibrations()}


def test_an_imported_qdq_model_emits_back_to_the_same_function(tmp_path):
    path = quantize(DIGITS / "model.onnx", tmp_path / "u8.onnx", calibration_samples())
    ir = qir.load(path)
    model = export_qdq(ir)
    assert model.opset_import[0].version == 17
    original = reference_session(path)
    emitted = session(model, fused=False)
    for feed in eval_feeds(16):
        np.testing.assert_array_equal(emitted.run(None, feed)[0], original.run(None, feed)[0])


# ---------------------------------------------------------------------------------- real models
# the numpy runtime against the emitted model run as written (= qir's ort runtime), see REAL;
# the detector is compared on its pre-sigmoid logits: its int8 probability map collapses to
# ~1e-6 on text.png (float: 0.99997), where a cosine of probabilities compares noise
EMIT_NUMPY_COSINE = {"yolov8n_320": 0.999, "ppocr_cls": 0.9999, "ppocrv4_det": 0.99}
COMPARED = {"ppocrv4_det": "p2o.ConvTranspose.3"}  # (the last ConvTranspose, its bias Add folded in: before the Sigmoid)


def mix_modes(ir: qir.QIR) -> None:
    """Every 13th activation float, every 11th fp16, every 7th int16, the rest int8."""
    for i, cal in enumerate(ir.calibrations(CalibRole.ACTIVATION)):
        if i % 13 == 5:
            cal.mode = CalibMode.FLOAT
        elif i % 11 == 3:
            cal.mode = CalibMode.FP16
        elif i % 7 == 1:
            cal.mode = CalibMode.INT16
    ir.touch()


def real_calibrated(name: str) -> tuple[qir.QIR, list[tuple[str, dict]]]:
    """qir's own calibration (fold-bn, fuse, insert-calibration, calibrate max) on the 8 CALIB images."""
    rm = real_models()
    prep, shape, _, images, _ = REAL[name]
    input_name = rm.MODELS[name][1]
    ir = qir.load(rm.model(name), input_shapes={input_name: shape})
    calib = [{input_name: getattr(rm, prep)(img)} for img in rm.images(rm.CALIB)]
    PassManager("fold-bn,fuse,insert-calibration,calibrate{method=max,progress=False}",
                context=PipelineContext(data=calib)).run(ir)
    return ir, [(img, {input_name: getattr(rm, prep)(x)}) for img, x in zip(images, rm.images(images))]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_models_emit_run_and_round_trip(name, tmp_path):
    ir, feeds = real_calibrated(name)
    mix_modes(ir)
    report = emit_model(ir, tmp_path / "partial.onnx")
    model = onnx.load(str(tmp_path / "partial.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert report["opset"] == 21 and min(report["modes"].values()) > 0
    # the Q/DQ ops as written: qir's ort runtime to the bit; every quantized value within a step
    assert_matches(ir, model, [f for _, f in feeds], runtimes=("ort",))
    # onnxruntime's default session loads and runs it too; its rewrites (integer kernels, other
    # float kernels) move values across rounding boundaries, which these deep, fully quantized
    # models amplify, so its outputs are only printed (see the report)
    value = COMPARED.get(name, ir.outputs[0])
    default = session(with_outputs(model, [value]), fused=True)
    for image, feed in feeds:
        ours = qir.run(ir, feed, runtime="ort", capture=[value])[value]
        theirs = dict(zip([o.name for o in default.get_outputs()], default.run(None, feed)))[value]
        assert np.all(np.isfinite(theirs))
        numpy_cos = cosine(qir.run(ir, feed, runtime="numpy", capture=[value])[value], ours)
        print(f"{name} {image} {value}: onnxruntime default session cosine {cosine(theirs, ours):.6f}, "
              f"numpy runtime cosine {numpy_cos:.6f}")
        assert numpy_cos >= EMIT_NUMPY_COSINE[name]
    back = qir.load(tmp_path / "partial.onnx")
    assert [(c.name, c.mode, c.axis, c.implied_clip, c.feeds) for c in sorted(back.calibrations(), key=lambda c: c.name)] == \
        [(c.name, c.mode, c.axis, c.implied_clip, c.feeds) for c in sorted(ir.calibrations(), key=lambda c: c.name)]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_qdq_models_emit_back_to_themselves(name, tmp_path):
    """ORT-quantized real model → qir → emit: the emitted model computes what the original does."""
    from ..qir.io.test_qdq_import import real_qdq

    _, qdq_path, feeds = real_qdq(name, tmp_path)
    ir = qir.load(qdq_path)
    model = export_qdq(ir)
    onnx.checker.check_model(model, full_check=True)
    original, emitted = reference_session(qdq_path), session(model, fused=False)
    for _, feed in feeds:
        a, b = emitted.run(None, feed)[0], original.run(None, feed)[0]
        assert cosine(a, b) >= 0.99999
        np.testing.assert_array_equal(a, b)
        if name == "yolov8n_320":
            assert all(np.array_equal(u, v) for u, v in zip(yolo_detections(a), yolo_detections(b)))


def test_float_weights_and_a_float_graph_output_come_back_too(tmp_path):
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,insert-calibration{outputs=True},calibrate{method=max,progress=False}",
                context=PipelineContext(data=DIGITS / "calibration_data")).run(ir)
    out = ir.calibration("logits_calib")
    assert ir.outputs == (out.output,)
    out.mode = CalibMode.FLOAT
    ir.calibration("dw3.weight_calib").mode = CalibMode.FLOAT   # read directly from the initializer
    ir.calibration("pw4.weight_calib").mode = CalibMode.FP16    # Cast pair on the initializer
    ir.touch()
    model = export_qdq(ir)
    onnx.checker.check_model(model, full_check=True)
    nodes = {n.name: n for n in model.graph.node}
    assert nodes["logits_calib"].op_type == "Identity" and "dw3.weight_calib" not in nodes
    assert nodes["dw3"].input[1] == "dw3.weight"
    assert_matches(ir, model, eval_feeds(8))
    back = qir.load(model)
    assert back.outputs == ir.outputs
    assert {c.name: (c.mode, c.input, c.output, c.feeds) for c in back.calibrations()} == \
        {c.name: (c.mode, c.input, c.output, c.feeds) for c in ir.calibrations()}
    np.testing.assert_array_equal(back.weight_array("dw3.weight"), ir.weight_array("dw3.weight"))
