"""The advisor proposes a repair transform where its cause is seen, measured before it is shown:
an outlier channel before a LayerNorm-fed MatMul -> smooth; a 1000x channel-range imbalance
between two Relu-joined convs -> equalize; a weight quantization that biases a depthwise conv's
output -> bias-correct. A model without the cause gets no such candidate."""
from __future__ import annotations

import numpy as np
import pytest

from qir.tools.advice import advise
from qir.tools.transform_advice import measure_transforms, transform_candidates

from ..conftest import calibrate_for_nash_e
from ..passes import test_bias_correct, test_equalize, test_smooth


def _npy(tmp_path, samples):
    path = tmp_path / "data.npy"
    np.save(path, np.stack([s["x"] for s in samples]))
    return str(path)


CASES = {  # cause -> (planted model, its samples, the transform expected)
    "outlier channels": (lambda: test_smooth.planted(test_smooth.LN_MATMUL), test_smooth.samples, "smooth"),
    "channel-range imbalance": (test_equalize.two_convs, test_equalize.samples, "equalize"),
    "output shift": (test_bias_correct.depthwise, test_bias_correct.samples, "bias-correct"),
}


@pytest.mark.parametrize("cause", list(CASES))
def test_a_planted_cause_gets_its_transform_measured_and_shown(cause, tmp_path):
    build, samples, transform = CASES[cause]
    data = _npy(tmp_path, samples())
    ir = calibrate_for_nash_e(build(), data)
    before = str(ir)
    found = transform_candidates(ir, data, data_num=4)
    assert [c.transform for c in found if c.cause == cause][:1] == [transform]
    measured = advise(ir, {}, data, model_path=str(tmp_path / "m.onnx"), data_num=4, progress=False)
    assert str(ir) == before  # the advisor never changes the model it advises on
    kept = [c for c in measured["advice"] if c.get("transform") == transform]
    assert kept, (measured["dropped"], measured["notes"])
    best = kept[0]
    assert best["after"] > best["before"] and best["gain"] == pytest.approx(best["after"] - best["before"])
    assert transform in best["command"] and best["output"].endswith("_runall_fix%d.onnx" % (
        measured["advice"].index(best) + 1))
    if transform in ("smooth", "equalize"):  # beats the recalibration it needs on its own
        assert best["before"] >= best["recalibrated_only"] and "FLOAT_MODEL.onnx" in best["command"]


@pytest.mark.parametrize("build, samples", [(lambda: test_equalize.two_convs(imbalance=1.0), test_equalize.samples),
                                             (lambda: test_smooth.planted(test_smooth.LN_MATMUL, ), None)],
                         ids=["balanced-convs", "float-data"])
def test_without_the_cause_there_is_no_candidate_and_without_a_data_file_a_note(build, samples, tmp_path):
    if samples is None:  # in-memory data: a command could not name it, so the advisor says so
        data = test_smooth.samples()
        ir = calibrate_for_nash_e(build(), data)
        measured = advise(ir, {}, data, data_num=2, progress=False)
        assert not any(c.get("transform") for c in measured["advice"])
        assert any("smooth" in n and "not tried" in n for n in measured["notes"])
        return
    data = _npy(tmp_path, samples())
    ir = calibrate_for_nash_e(build(), data)
    found = transform_candidates(ir, data, data_num=4)
    assert not [c for c in found if c.transform in ("equalize", "smooth")]
    measure_transforms(ir, data, found, data_num=4)  # whatever else is found is measured
    assert all(c.after is not None for c in found)
