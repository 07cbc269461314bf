"""The QuantAnalysis workflow end to end: API and ``qir compare``."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.errors import InputError
from qir.tools.cli import main
from qir.tools.compat.quant_analysis import QuantAnalysis, metric_name

from ..conftest import DIGITS, DIGITS_DATA, NEEDS_TORCH, calibrated_real

FILES = ["badcase.txt", "badcase.json", "badcase.npz", "compare_per_layer_out.txt", "compare_per_layer_out.csv",
         "abnormal_layer_advisor.txt", "sensitive_ops.txt", "sensitive_ops.json", "compare.json",
         "layers/baseline/0.npy", "layers/analysis/0.npy", "layers/layers.json"]


def test_cli_runs_the_whole_workflow(digits_calibrated, tmp_path, capsys):
    model = tmp_path / "cal.onnx"
    qir.save(digits_calibrated, model)
    out = tmp_path / "qa"
    assert main(["compare", str(DIGITS / "model.onnx"), str(model), str(DIGITS_DATA), "-o", str(out),
                 "-n", "8", "-m", "cosine", "--layers"]) == 0
    printed = capsys.readouterr().out
    assert "bad case: sample" in printed and "most sensitive for logits" in printed
    for f in FILES:
        assert (out / f).is_file(), f
    summary = json.loads((out / "compare.json").read_text())
    assert summary["bad_case"]["metric"] == "Cosine" and summary["layers"] == 9
    assert summary["layer_values"]["kept"] and summary["layer_values"]["bytes"] > 0
    assert "per-layer values: " in printed and (out / "index.html").is_file()
    # the same file twice: float vs fake-quantized
    assert main(["compare", str(model), str(model), str(DIGITS_DATA), "-o", str(tmp_path / "self"), "-n", "4",
                 "--no-sensitivity"]) == 0
    assert not (tmp_path / "self" / "sensitive_ops.txt").exists()
    assert main(["compare", str(model), str(tmp_path / "missing.onnx"), str(DIGITS_DATA), "-o", str(out)]) != 0
    assert "missing.onnx" in capsys.readouterr().err


def test_api_bad_case_handling(digits_calibrated, tmp_path):
    qa = QuantAnalysis(digits_calibrated, out_dir=tmp_path)
    with pytest.raises(InputError, match="no bad case yet"):
        qa.run()
    report = qa.auto_find_bad_case(DIGITS_DATA, num_steps=6, metric="atol")
    assert qa.chosen == report["chosen"]
    other = next(i for i in range(6) if i not in qa.bad_cases)
    with pytest.raises(InputError, match="not a bad case"):
        qa.run(index=other)
    chosen = qa.bad_cases[qa.chosen]
    qa.save_bad_case(tmp_path / "mine.npz")
    qa2 = QuantAnalysis(digits_calibrated, out_dir=tmp_path)
    qa2.load_bad_case(tmp_path / "mine.npz")
    run = qa2.run()
    np.testing.assert_array_equal(run.sample["input"], chosen["input"])
    rows = qa2.compare_per_layer(types=["Gemm"])
    assert [r["mod_name"] for r in rows] == ["fc"]
    least = qa2.sensitivity(metric="cosine", reserve=True)["outputs"]["logits"]
    assert least[0]["Cosine"] == max(r["Cosine"] for r in least)
    with pytest.raises(InputError, match="set_bad_case takes one sample"):
        qa2.set_bad_case([1, 2])
    with pytest.raises(InputError, match="unknown metric"):
        metric_name("cos")


@pytest.mark.slow
def test_real_detector_planted_faults_are_found(tmp_path):
    """YOLOv8n calibrated on real images, a clipping fault and a NaN planted: bad-case search
    over 16 real images, the per-layer table and advisor flag both, sensitivity ranks the
    clipped node first."""
    from ..conftest import real_models

    rm = real_models()
    ir, _ = calibrated_real("yolov8n_320", [1, 3, 320, 320])
    images = [{"images": rm.yolov8n_input(img)} for img in rm.images(rm.CALIB + rm.EVAL)][:16]
    acts = [c for c in ir.calibrations("activation") if ir.producer(c.input) is not None]
    victim = acts[len(acts) // 3]
    victim.threshold = np.float32(float(victim.threshold) / 50)
    victim.fixed = True
    ops = ir.ops()
    conv = next(op for i, op in enumerate(ops) if op.op_type == "Conv" and i > 2 * len(ops) // 3
                and len(op.inputs) > 2 and op.inputs[2])
    bias = ir.weight_array(conv.inputs[2]).copy()
    bias[0] = np.nan
    analysis = ir.clone()
    analysis.set_weight(conv.inputs[2], bias)
    qa = QuantAnalysis(ir, analysis, out_dir=tmp_path)
    report = qa.auto_find_bad_case(images, metric="L1")
    assert report["samples"] == 16
    assert (tmp_path / "badcase.txt").read_text().count("\n") >= 10
    qa.run()
    rows = qa.compare_per_layer()
    findings = qa.report["advisor"]
    nan = [f for f in findings if f["kind"] == "nan/inf"]
    assert nan and nan[0]["layer"] == conv.name
    clip = [f for f in findings if f["kind"] == "scale does not cover data"]
    assert victim.name in [f["calibration"] for f in clip]
    assert len(rows) > 50
    # sensitivity on the clipped model alone (the NaN would swamp every row)
    qa_clip = QuantAnalysis(ir, out_dir=tmp_path / "clip")
    qa_clip.set_bad_case(qa.bad_cases[qa.chosen])
    sens = qa_clip.sensitivity(metric="L1")
    for out, table in sens["outputs"].items():
        assert victim.name in [c for r in table[:3] for c in r["calibrations"]], out


@pytest.mark.slow
def test_float_model_against_its_onnxruntime_qdq_model(tmp_path, capsys):
    """A model quantized by onnxruntime's quantize_static, compared with its float model: the
    layers line up by name, the table and sensitivity are filled."""
    from ..qir.io.test_qdq_import import real_qdq

    float_path, qdq_path, feeds = real_qdq("ppocr_cls", tmp_path)
    data = tmp_path / "data.npz"
    np.savez(data, **{k: np.stack([f[k] for _, f in feeds]) for k in feeds[0][1]})
    assert main(["compare", str(float_path), str(qdq_path), str(data), "-o", str(tmp_path / "qa")]) == 0
    rows = json.loads((tmp_path / "qa" / "compare_per_layer_out.json").read_text())["rows"]
    qdq = qir.load(qdq_path)
    assert len(rows) > 50 and all(r["base_op_type"] != "-" for r in rows)  # every layer found in the float model
    convs = [r for r in rows if r["analy_op_type"] == "Conv"]
    assert len(convs) == len(qdq.ops("Conv")) and all(r["base_op_type"] == "Conv" for r in convs)
    assert convs[0]["Cosine"] > 0.99 and convs[0]["quant_dtype"] == "int8"
    sens = json.loads((tmp_path / "qa" / "sensitive_ops.json").read_text())
    assert len(next(iter(sens["outputs"].values()))) > 50


@pytest.mark.torch
def test_pytorch_float_model_against_its_torch_ao_fake_quant_version(tmp_path):
    """QuantAnalysis takes the two PyTorch modules; layers carry their module paths."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    from ..qir.io.test_torch_import import _qat_model

    qat = _qat_model(torch.ao.quantization.get_default_qat_qconfig("qnnpack"))
    float_model = type(qat)()
    float_model.load_state_dict({k: v for k, v in qat.state_dict().items() if k in float_model.state_dict()})
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    qa = QuantAnalysis(float_model.eval(), qat, out_dir=tmp_path)
    assert qa.auto_find_bad_case(data, metric="L1")["samples"] == 6
    rows = qa.compare_per_layer()
    # the mean is forward() itself: no module (dict inputs once named it after the exporter's wrapper, "module")
    assert [r["module"] for r in rows] == ["conv", "relu", None, "fc"]
    assert all(r["Cosine"] > 0.99 for r in rows) and rows[0]["quant_dtype"] == "int8"
    sens = qa.sensitivity()["outputs"]["output"]
    assert {(r["module"], r["sensitive_type"]) for r in sens} >= {("conv", "weight"), ("fc", "weight"),
                                                                   ("conv", "activation")}


def test_advisor_fixes_are_measured_before_they_are_suggested(tmp_path, capsys):
    """Issue 17 item 6 in qir compare: on the digits model calibrated with kl (relu2/relu3 clip
    hard), each finding's fix is measured on the bad case; those that help come with a command
    that runs and writes a model scoring as claimed, the others are listed as tried, without one."""
    import shlex

    from qir.passes import PassManager, get_pass
    from qir.runtimes.engine import configured_clone
    from qir.tools.advice import helps
    from qir.tools.reports.bad_case import load_bad_case

    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DIGITS_DATA, method="kl", progress=False)(ir)
    model, out = tmp_path / "calibrated_kl.onnx", tmp_path / "qa"
    qir.save(ir, model)
    assert main(["compare", str(model), str(model), str(DIGITS_DATA), "-o", str(out), "-n", "4", "--no-sensitivity"]) == 0
    printed = capsys.readouterr().out
    sample = load_bad_case(out / "badcase.npz")

    def score(m) -> float:  # output cosine vs the model in float, plain runs (no engine)
        a = qir.run(m, sample, runtime="ort")["logits"].astype(np.float64).ravel()
        b = qir.run(m, sample, runtime="ort", level="float")["logits"].astype(np.float64).ravel()
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))

    fixes = [f["fix"] for f in json.loads((out / "abnormal_layer_advisor.json").read_text())["findings"] if "fix" in f]
    kept, tried = [f for f in fixes if f["helps"]], [f for f in fixes if not f["helps"]]
    assert kept and tried and all("command" not in f for f in tried)
    assert all(f["before"] == pytest.approx(score(ir), abs=1e-6) for f in fixes)
    worst = min(tried, key=lambda f: f["after"])
    assert worst["after"] == pytest.approx(score(configured_clone(ir, "quantized", worst["changes"])), abs=1e-6)
    assert not helps(worst["before"], worst["after"])
    best = max(kept, key=lambda f: f["gain"])
    assert best["command"] in printed and best["command"] in (out / "abnormal_layer_advisor.txt").read_text()
    argv = shlex.split(best["command"])
    assert argv[:2] == ["qir", "pipeline" if len(best["changes"]) > 1 else "set-mode"] and str(model) in argv
    assert main(argv[1:]) == 0
    output = argv[argv.index("-o") + 1]
    assert score(qir.load(output)) == pytest.approx(best["after"], abs=1e-5) and best["after"] > best["before"]
