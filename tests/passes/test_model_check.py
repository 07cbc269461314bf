"""model-check: each kind of finding on a model built to have it, and none on a clean one."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.passes import PassManager, get_pass
from qir.tools.cli import main
from qir.tools.model_check import check_model
from qir.tools.reports.model_check import format_report

from ..conftest import REPO, calibrated_real, model_from_text, real_models

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


def kinds(findings):
    return {(f["kind"], f["node"]) for f in findings}


def test_clean_pipeline_has_no_findings_and_a_full_config():
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DATA, progress=False)(ir)
    report = check_model(ir)
    assert report["unfused"] == [] and report["shared"] == [] and report["unusual"] == []
    conv1 = next(r for r in report["config"] if r["node"] == "conv1")
    assert conv1["inputs"] == [{"input": 0, "mode": "int8"}] and conv1["weights"] == [{"input": 1, "mode": "int8", "axis": 0}]
    assert conv1["method"] == ["max"] and len(report["config"]) == len(ir.ops())


def test_forgotten_passes_and_unusual_modes_are_found():
    raw = check_model(qir.load(DIGITS / "model.onnx"))
    assert ("unfolded batchnorm", "conv1") in kinds(raw["unfused"])
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,insert-calibration{march=nash-e}").run(ir)  # no fuse
    get_pass("calibrate", data=DATA, progress=False)(ir)
    get_pass("set-mode", nodes="relu1_out_calib", mode="fp16")(ir)
    get_pass("set-mode", nodes="conv2.weight_calib", mode="int16")(ir)
    get_pass("set-mode", nodes="flatten_out_calib", threshold=3.0)(ir)
    report = check_model(ir)
    assert {("unfused pattern", "pw4"), ("unfused pattern", "conv1")} <= kinds(report["unfused"])
    assert {("fixed threshold", "flatten_out_calib"), ("gemm dtype pair", "conv2"),
            ("fp16 not native", "conv2")} <= kinds(report["unusual"])
    relu_in = next(c.name for c in ir.calibrations() if "relu2" in c.feeds)
    get_pass("set-mode", nodes=relu_in, mode="fp16")(ir)
    assert ("fp16 not native", "relu2") in kinds(check_model(ir)["unusual"])  # nash-e has no fp16
    assert ("fp16 not native", "relu2") not in kinds(check_model(ir, march="nash-p")["unusual"])


def test_shared_weights_modules_and_quantized_outputs():
    model = model_from_text("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,4] y) {
    a = MatMul (x, w)
    r = Relu (a)
    y = MatMul (r, w)
}
""", {"w": (4, 4)})
    ir = qir.import_onnx(model)
    PassManager("insert-calibration{march=nash-e}").run(ir)
    cal = ir.insert_calibration("y", "y_out_calib", rewire_outputs=True)
    get_pass("calibrate", data=[{"x": np.ones((1, 4), np.float32)}], progress=False)(ir)
    report = check_model(ir)
    assert ("shared weight", "w") in kinds(report["shared"])
    assert ("output not high precision", cal.name) in kinds(report["unusual"])
    ir.meta["torch_call_warnings"] = {"act": 2, "spare": 0}
    found = kinds(check_model(ir)["shared"])
    assert {("shared module", "act"), ("unused module", "spare")} <= found


def test_only_constants_quantized_as_weights_count_as_shared():
    # w: a float weight both MatMuls quantize (one quantization, shared: a finding); shape: an int64
    # constant two Reshapes read (never quantized); b: a float constant two Adds read as data
    model = model_from_text("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4] x) => (float[1,4] y) <int64[2] shape = {1, 4}> {
    a = MatMul (x, w)
    ab = Add (a, b)
    r = Reshape (ab, shape)
    m = MatMul (r, w)
    mb = Add (m, b)
    y = Reshape (mb, shape)
}
""", {"w": (4, 4), "b": (1, 4)})
    for calibrated in (False, True):  # as imported, and with the weight read through its calibration node
        ir = qir.import_onnx(model)
        if calibrated:
            PassManager("insert-calibration{march=nash-e}").run(ir)
            assert [c.input for c in ir.calibrations("weight")] == ["w"]
        assert kinds(check_model(ir)["shared"]) == {("shared weight", "w")}


def test_calibrate_writes_the_check_and_the_check_command(tmp_path, capsys):
    out = tmp_path / "cal.onnx"
    assert main(["calibrate", str(DIGITS / "model.onnx"), str(DATA), "-o", str(out)]) == 0
    assert "model check: 0 finding(s)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "cal.check.json").read_text())  # beside the model, named after it
    assert doc["schema"] == "qir.model_check" and doc["march"] == "nash-e"
    assert main(["check-model", str(DIGITS / "model.onnx"), "-s", str(tmp_path / "c")]) == 0
    printed = capsys.readouterr().out
    assert "unfolded batchnorm" in printed and (tmp_path / "c" / "model_check_result.txt").exists()
    assert "calibration configuration per op" in format_report(doc)


@pytest.mark.slow
def test_yolov8n_has_no_shared_weight_findings():
    # its int64 Split sizes / Reshape shapes and the anchor constant (read by Add and Sub) are
    # shared between ops, but no op quantizes them: none of them is a shared weight
    ir, _ = calibrated_real("yolov8n_320", [1, 3, 320, 320], count=1)
    report = check_model(ir)
    shared_consts = {w.name for w in ir.weights() if len({r.name for r in ir.consumers(w.name)}) > 1}
    assert any(ir.value(n).dtype == "int64" for n in shared_consts)  # the constants the check once reported
    assert report["shared"] == []
    raw = check_model(qir.load(real_models().model("yolov8n_320"), input_shapes={"images": [1, 3, 320, 320]}))
    assert raw["shared"] == []
