"""A collapsed output (all zeros, constant, near zero, NaN, saturated where the reference is not) is
named first, drives the choice of the bad case, and the advice starts where the damage begins
(issue: a newcomer's first hour, item 5)."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import qir
from qir import metrics as qmetrics
from qir.passes.bad_case import find_bad_cases
from qir.passes.layer_compare import collapse_start

from ..conftest import model_from_text, real_models


@pytest.mark.parametrize("analysis, says", [
    (np.zeros(64), "all zeros"),
    (np.full(64, 0.25), "constant (every value 0.25)"),
    (np.r_[np.full(63, 1e-9), 2e-9], "near zero"),
    (np.r_[np.full(63, 1.0), np.nan], "not finite: NaN or Inf in 1 of 64"),
    (np.r_[np.full(60, 1.0), np.linspace(0, 0.5, 4)], "saturated: 94% of its values at its maximum 1"),
])
def test_collapsed_names_how_the_output_collapsed(analysis, says):
    reference = np.linspace(0.0, 1.0, 64)
    assert says in qmetrics.collapsed(reference, analysis, 1.0)


@pytest.mark.parametrize("reference, analysis", [
    (np.linspace(0, 1, 64), np.linspace(0, 1, 64) + 0.01),  # a fine output
    (np.zeros(64), np.zeros(64)),  # the reference is all zeros itself: nothing was destroyed
    (np.full(64, 1.0), np.full(64, 1.0)),  # saturated in both
])
def test_collapsed_is_none_when_the_output_is_not_destroyed(reference, analysis):
    assert qmetrics.collapsed(reference, analysis, 1.0) is None


def _pair():
    """The baseline passes x through; the analysis model keeps only what exceeds 3 (Relu(x - 3)):
    on samples below 3 its output is all zeros where the baseline's is not."""
    base = model_from_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 16] x) => (float[1, 16] y) { y = Identity(x) }""")
    analysis = model_from_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 16] x) => (float[1, 16] y) { t = Constant <value = float {3.0}> ()
                                                 d = Sub(x, t)
                                                 y = Relu(d) }""")
    return qir.load(base), qir.load(analysis)


def test_a_collapsed_sample_is_the_bad_case_and_named_once(caplog):
    rng = np.random.default_rng(0)
    samples = [{"x": (rng.random((1, 16)) * 2 + 3.5).astype(np.float32)} for _ in range(6)]
    samples[4] = {"x": (rng.random((1, 16)) * 2.5).astype(np.float32)}  # below 3: the analysis gives zeros
    samples[1] = {"x": (rng.random((1, 16)) * 2.9).astype(np.float32)}
    base, analysis = _pair()
    with caplog.at_level(logging.WARNING):
        report = find_bad_cases(base, analysis, samples, metric="MSE")
    assert set(report["collapsed"]["y"]) == {"1", "4"} and "all zeros" in report["collapsed"]["y"]["4"]
    mse = report["values"]["y"]["MSE"]
    assert report["chosen"] in (1, 4) and report["chosen"] == max((1, 4), key=lambda i: mse[i])
    said = [r.getMessage() for r in caplog.records if "collapses" in r.getMessage()]
    assert len(said) == 1 and "on 2 of 6 sample(s) (1, 4)" in said[0]  # one line, with the count


def test_the_collapse_begins_at_the_first_layer_that_damages_it():
    rows = [{"index": i, "mod_name": name, "value": f"{name}_out", "Cosine": cos, "own_error": own, "collapsed": how}
            for i, (name, cos, own, how) in enumerate([("a", 0.999, 0.001, None), ("b", 0.95, 0.2, None),
                                                       ("c", 0.7, 0.3, None), ("d", 0.0, 0.01, "all zeros"),
                                                       ("e", 0.1, 0.5, None)])]
    start = collapse_start(rows)
    assert (start.layer, start.end, start.end_how) == ("c", "d", "all zeros")
    assert collapse_start([dict(r, collapsed=None) for r in rows]) is None


@pytest.mark.slow
def test_det_calibrated_on_photos_with_max_collapses_and_compare_leads_with_it(tmp_path, capsys):
    """PP-OCRv4 det quantized op by op as its graph has it (no folds, the generic march: every
    learnable affine block's Mul and Add and every HardSwish step quantized) and calibrated with max
    on the calibration photos: on some of them the quantized probability map is near zero where the
    float one responds. compare's first line says so, the bad case is such a sample, and the
    advice's first fix is measured and restores the output. (With nash-e's folds and units the
    same calibration no longer collapses on these photos.)"""
    from qir.tools.cli import main

    rm = real_models()
    data = tmp_path / "photos" / "x"
    data.mkdir(parents=True)
    for i, img in enumerate(rm.images(rm.CALIB)):
        np.save(data / f"{i}.npy", rm.ppocr_det_input(img))
    model, calibrated = str(rm.model("ppocrv4_det")), str(tmp_path / "det_max.onnx")
    assert main(["pipeline", model, "fuse{march=generic},insert-calibration{march=generic},calibrate{method=max}",
                 "--data", str(data.parent), "-o", calibrated]) == 0
    capsys.readouterr()
    assert main(["compare", model, calibrated, str(data.parent), "-o", str(tmp_path / "cmp"), "--no-sensitivity"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("COLLAPSE: output 'sigmoid_0.tmp_0'") and out[1].startswith("COLLAPSE begins at layer")
    assert out[2].startswith("outputs, worst first: sigmoid_0.tmp_0")
    first = next(line for line in out if line.lstrip().startswith("["))
    assert first.lstrip().startswith("[collapse]")
    fix = out[out.index(first) + 1]
    assert fix.lstrip().startswith("fix 1 (int16 for the") and "measured" in fix  # it helps: the first fix listed
