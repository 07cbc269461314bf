"""passes.lib.repair's float_model and recalibrated: a calibrated model's float model computes what
its float level computes, and calibrating it again as the model was gives back the same nodes,
thresholds and modes."""
from __future__ import annotations

import numpy as np
import pytest

import qir
from qir.kinds import CalibMode
from qir.passes.lib.repair import float_model, recalibrated

from ..conftest import DIGITS, DIGITS_DATA, calibrate_for_nash_e


@pytest.fixture(scope="module")
def calibrated():
    return calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), str(DIGITS_DATA), method="mse")


def test_the_float_model_has_no_calibration_and_the_same_float_function(calibrated):
    before = str(calibrated)
    model = float_model(calibrated)
    assert str(calibrated) == before and not model.calibrations() and qir.verify(model) == []
    feed = {"input": np.load(DIGITS / "eval_images.npy")[0].astype(np.float32)}
    for runtime in ("ort", "numpy"):
        np.testing.assert_array_equal(qir.run(model, feed, runtime=runtime, level="float")["logits"],
                                      qir.run(calibrated, feed, runtime=runtime, level="float")["logits"])


def test_recalibrated_as_the_model_was_gives_its_nodes_thresholds_and_modes_back(calibrated):
    like = calibrated.clone()
    act = like.calibrations("activation")[1].name
    like.set_calibration(act, mode=CalibMode.INT16)
    fixed = like.calibrations("activation")[2].name
    like.set_calibration(fixed, threshold=np.float32(3.5), fixed=True)
    model = float_model(like)
    again = recalibrated(model, str(DIGITS_DATA), like=like)
    assert not model.calibrations()  # the input is not changed
    assert again.meta["calibration"]["method"] == "mse" and again.meta["march"] == like.meta["march"]
    ours = {c.name: c for c in again.calibrations()}
    assert set(ours) == {c.name for c in like.calibrations()}
    for c in like.calibrations():
        assert ours[c.name].mode is c.mode and ours[c.name].fixed == c.fixed, c.name
        np.testing.assert_allclose(np.asarray(ours[c.name].threshold), np.asarray(c.threshold), rtol=1e-6)
