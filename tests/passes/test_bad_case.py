"""Bad-case search: the worst sample per output and metric, the three tables, the saved case."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.errors import InputError
from qir.passes.bad_case import find_bad_cases
from qir.tools.cli import main
from qir.tools.reports.bad_case import load_bad_case, write_report

from ..conftest import DIGITS, DIGITS_DATA, calibrated_real


def test_bad_case_is_the_worst_sample_and_the_tables_are_written(digits_calibrated, tmp_path):
    ir = digits_calibrated
    report = find_bad_cases(ir, None, DIGITS_DATA, num_steps=12, metric="Cosine", runtime="numpy")
    samples = qir.data.model_samples(ir, DIGITS_DATA, 12)
    float_ir = qir.runtimes.engine.configured_clone(ir, "float", {})
    cos = [M.cosine_similarity(qir.run(float_ir, s)["logits"], qir.run(ir, s)["logits"]) for s in samples]
    assert report["bad_case"]["logits"]["Cosine"] == int(np.argmin(cos)) == report["chosen"]
    assert report["values"]["logits"]["Cosine"] == pytest.approx(cos, abs=1e-12)
    l1 = report["values"]["logits"]["L1"]
    assert report["bad_case"]["logits"]["L1"] == int(np.argmax(l1))
    files = write_report(report, tmp_path)
    text = files[0].read_text()
    assert text.count("bad case input index") == 2 and "metric results of each badcase" in text
    assert json.loads(files[1].read_text())["schema"] == "qir.badcase"
    case = load_bad_case(files[2])
    np.testing.assert_array_equal(case["input"], samples[report["chosen"]]["input"])


def test_two_models_errors_and_cli(digits_calibrated, tmp_path, capsys):
    calibrated = tmp_path / "cal.onnx"
    qir.save(digits_calibrated, calibrated)
    report = find_bad_cases(DIGITS / "model.onnx", calibrated, DIGITS_DATA, num_steps=4, metric="ATOL")
    assert report["samples"] == 4 and set(report["worst_output"]) == {"Cosine", "MSE", "L1", "KL", "SQNR", "ATOL"}
    with pytest.raises(InputError, match="unknown bad-case metric"):
        find_bad_cases(calibrated, None, DIGITS_DATA, metric="cos")
    assert main(["bad-case", str(calibrated), str(DIGITS_DATA), "-n", "6", "-o", str(tmp_path / "qa")]) == 0
    assert "the bad case is sample" in capsys.readouterr().out
    assert (tmp_path / "qa" / "badcase.npz").exists()


def test_a_sample_with_nan_baseline_outputs_is_left_out(digits_calibrated, digits_samples, caplog):
    ir = digits_calibrated
    samples = [dict(s) for s in digits_samples]
    samples[1] = {"input": samples[1]["input"].copy()}
    samples[1]["input"].flat[3] = np.nan  # one NaN pixel: the float logits are all NaN
    with caplog.at_level("WARNING"):
        report = find_bad_cases(ir, None, samples, runtime="numpy")
    assert list(report["left_out"]) == ["1"] and "sample 1 is left out" in caplog.text
    clean = find_bad_cases(ir, None, [digits_samples[0], digits_samples[2]], runtime="numpy")
    for m, per in report["bad_case"]["logits"].items():
        assert per != 1 and per == [0, 2][clean["bad_case"]["logits"][m]]  # the same choice as without it
    with pytest.raises(InputError, match="every sample.*NaN"):
        find_bad_cases(ir, None, [{"input": np.full_like(s["input"], np.nan)} for s in digits_samples])


def test_kl_matches_its_definition(rng):
    a, d = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3))
    pa = np.exp(a) / np.exp(a).sum(1, keepdims=True)
    pd = np.exp(d) / np.exp(d).sum(1, keepdims=True)
    assert M.kl_divergence(a, d) == pytest.approx(float(np.mean(pa * (np.log(pa) - np.log(pd)))))
    assert M.kl_divergence(a, a) == pytest.approx(0.0, abs=1e-15)


@pytest.mark.slow
def test_bad_case_search_over_16_real_images(tmp_path):
    from ..conftest import real_models

    rm = real_models()
    ir, _ = calibrated_real("yolov8n_320", [1, 3, 320, 320])
    images = [{"images": rm.yolov8n_input(img)} for img in rm.images(rm.CALIB + rm.EVAL)][:16]
    assert len(images) == 16
    report = find_bad_cases(ir, None, images)
    write_report(report, tmp_path)
    assert report["samples"] == 16 and len(report["values"]["output0"]["L1"]) == 16
    assert (tmp_path / "badcase.txt").read_text().count("\n") >= 10


@pytest.mark.slow
def test_det_photos_without_text_are_flagged_and_never_the_cosine_bad_case():
    """PP-OCRv4 det on ordinary photos: where it sees no text its float output is ~0 everywhere,
    so cosine and SQNR there are noise; the engine flags the same samples."""
    from qir.runtimes.engine import Engine, Variant, configured_clone

    from ..conftest import real_models

    rm = real_models()
    ir, samples = calibrated_real("ppocrv4_det", [1, 3, 640, 640], count=8)
    out = ir.outputs[0]
    float_ir = configured_clone(ir, "float", {})
    peaks = [float(qir.run(float_ir, s, runtime="ort")[out].max()) for s in samples]
    blank = {i for i, p in enumerate(peaks) if p < 0.3}  # below DB's binarization threshold: not one text pixel
    assert 0 < len(blank) < len(samples)
    report = find_bad_cases(ir, None, samples, metric="Cosine")
    assert {int(i) for i in report["ill_conditioned"][out]} == blank
    assert report["chosen"] not in blank and report["bad_case"][out]["SQNR"] not in blank
    result = Engine(ir, samples, metrics=["cosine-similarity"], progress=False).evaluate([Variant("calibrated", {
        c.name: c.mode.value for c in ir.calibrations()})])
    assert set(result.ill_conditioned) == blank
    text = [{"x": rm.ppocr_det_input(img)} for img in rm.text_images(3)]  # printed text on every image
    assert "ill_conditioned" not in find_bad_cases(ir, None, text, metric="Cosine")
