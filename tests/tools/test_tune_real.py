"""``qir tune`` on a real model (slow; CI runs it): PP-OCRv4 det at 320x320 on printed-text images
(ordinary photos hold no text and the detector outputs ~0 on them), from the float model to a
verified nash-e configuration, held on images neither calibration nor tuning saw."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import qir
from qir.tools.reports.tune import CAUTION_ERRORS

from ..conftest import real_models

pytestmark = pytest.mark.slow

SIZE = 320
TARGET = 0.99


def _text_samples(rm, seed: int, count: int) -> list[dict]:
    return [{"x": rm.ppocr_det_input(img, SIZE)} for img in rm.text_images(count, seed=seed, size=SIZE)]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_det_is_tuned_to_a_verified_nash_e_configuration_that_holds_on_unseen_images(tmp_path):
    rm = real_models()
    calib, evaluation, held = (_text_samples(rm, seed, n) for seed, n in ((11, 4), (12, 4), (13, 6)))
    report = qir.tune(rm.model("ppocrv4_det"), calib, evaluation, f"cosine>={TARGET}", march="nash-e", method="mse",
                      input_shapes={"x": [1, 3, SIZE, SIZE]}, save_dir=tmp_path, threads=2, progress=False)
    assert not report["start"]["meets"]  # (int8 misses: there is something to tune)
    assert report["reached"], report["final"]
    checked = report["verification"]
    assert checked["agrees"] and checked["mean"] >= TARGET, checked
    assert checked["integer"]["meets"] and checked["integer"]["march"] == "nash-e", checked["integer"]
    assert report["final"]["cost"] < report["upper_bound"]["cost"]
    assert 0 < report["raised"] < report["searchable_units"]
    final = report["final"]
    thin = final["margin"] < CAUTION_ERRORS * final["standard_error"]
    assert ("CAUTION: the margin" in (tmp_path / "tune_report.txt").read_text()) == thin

    # on images neither calibration nor tuning saw: close to the target, far better than all-int8
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    tuned = ort.InferenceSession(str(tmp_path / "tuned_model_qdq.onnx"), options, providers=["CPUExecutionProvider"])
    float_model = ort.InferenceSession(str(rm.model("ppocrv4_det")), providers=["CPUExecutionProvider"])
    int8 = qir.load(tmp_path / "calibrated_model.onnx")
    refs = [float_model.run(None, s)[0] for s in held]
    unseen = [_cosine(r, tuned.run(None, s)[0]) for r, s in zip(refs, held)]
    start = [_cosine(r, qir.run(int8, s)[int8.outputs[0]]) for r, s in zip(refs, held)]
    assert np.mean(unseen) >= TARGET - 0.01, unseen  # (four evaluation images do not bound other images closer)
    assert min(unseen) > min(start) and np.mean(unseen) - np.mean(start) > 0.5 * (TARGET - np.mean(start)), (unseen, start)
