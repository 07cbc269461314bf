"""distribution and channelwise: the statistics drawn match the data, outlier channels found."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.errors import InputError, NotFoundError
from qir.runtimes.numerics import apply_calibration
from qir.tools.compat.hmct import get_channelwise_data_distribution, plot_distribution

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


@pytest.fixture(scope="module")
def calibrated(digits_calibrated):
    return digits_calibrated


def test_distribution_statistics_match_the_data(calibrated, tmp_path):
    ir = calibrated
    nodes = plot_distribution(tmp_path, ir, DATA, ["relu1_out_calib", "conv2.weight_calib", "conv2"], data_num=3,
                              runtime="numpy")
    samples = qir.data.model_samples(ir, DATA, 3)
    act = np.concatenate([qir.run(ir, s, capture=["relu1_out"])["relu1_out"].ravel() for s in samples])
    assert nodes["relu1_out_calib"]["input"]["abs_max"] == pytest.approx(float(np.abs(act).max()))
    assert nodes["relu1_out_calib"]["threshold"] == pytest.approx(float(ir.calibration("relu1_out_calib").threshold))
    cal = ir.calibration("conv2.weight_calib")
    w = ir.weight_array(cal.input)
    assert nodes["conv2.weight_calib"]["original"]["std"] == pytest.approx(float(w.std()))
    assert nodes["conv2.weight_calib"]["calibrated"]["mean"] == pytest.approx(float(apply_calibration(cal, w).mean()))
    out = ir.op("conv2").outputs[0]
    float_ir = qir.runtimes.engine.configured_clone(ir, "float", {})
    err = np.concatenate([(qir.run(ir, s, capture=[out])[out] - qir.run(float_ir, s, capture=[out])[out]).ravel()
                          for s in samples])
    assert nodes["conv2"]["error"]["abs_max"] == pytest.approx(float(np.abs(err).max()), rel=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv2.png", "conv2.weight_calib.png", "distribution.json",
                                                          "relu1_out_calib.png"]
    doc = json.loads((tmp_path / "distribution.json").read_text())
    assert doc["schema"] == "qir.distribution" and doc["nodes"]["conv2"]["type"] == "node"
    th = nodes["relu1_out_calib"]["threshold"]
    assert nodes["relu1_out_calib"]["clipped_fraction"] == pytest.approx(float(np.mean(np.abs(act) > th)))
    with pytest.raises(NotFoundError, match="did you mean"):
        plot_distribution(tmp_path, ir, DATA, ["conv22"], overwrite=True)
    with pytest.raises(InputError, match="nodes_list"):
        plot_distribution(tmp_path, ir, DATA, [], overwrite=True)


def test_channelwise_finds_a_planted_outlier_channel(calibrated, tmp_path):
    ir = calibrated.clone()
    cal = ir.calibration("conv2.weight_calib")
    w = ir.weight_array(cal.input).copy()
    w[5] *= 20  # one output channel far larger than the rest
    ir.set_weight(cal.input, w)
    nodes = get_channelwise_data_distribution(tmp_path, ir, DATA, ["conv2.weight_calib", "relu1_out_calib"],
                                              data_num=2, runtime="numpy")
    assert nodes["conv2.weight_calib"]["axis"] == 0 and nodes["conv2.weight_calib"]["outlier_channels"] == [5]
    assert nodes["relu1_out_calib"]["axis"] == 1 and nodes["relu1_out_calib"]["channels"] == 16
    peaks = np.abs(np.moveaxis(w, 0, 0).reshape(w.shape[0], -1)).max(axis=1)
    assert nodes["conv2.weight_calib"]["channel_abs_max"] == pytest.approx(peaks.tolist())
    assert "outlier channels (> 4x): 5" in (tmp_path / "channelwise.txt").read_text()
    assert json.loads((tmp_path / "channelwise.json").read_text())["schema"] == "qir.channelwise"
    assert nodes["conv2.weight_calib"]["threshold"] is None and nodes["relu1_out_calib"]["threshold"] > 0
    with pytest.raises(InputError, match="out of range"):
        get_channelwise_data_distribution(tmp_path, ir, DATA, ["relu1_out_calib"], axis=7, overwrite=True)
    with pytest.raises(NotFoundError):
        get_channelwise_data_distribution(tmp_path, ir, DATA, ["conv2"], overwrite=True)


def test_the_passes_only_compute(calibrated, tmp_path, monkeypatch):
    """distribution and channelwise write nothing: the report is JSON data (its to_json()), the plotted arrays come
    in ``PlotResult.arrays``; the writers in qir.tools.reports draw and write them."""
    from qir.passes import get_pass
    from qir.passes.lib.capture import PlotResult

    monkeypatch.chdir(tmp_path)
    dist = get_pass("distribution", data=DATA, nodes_list=["relu1_out_calib", "conv2.weight_calib", "conv2"],
                    runtime="numpy")(calibrated)
    boxes = get_pass("channelwise", data=DATA, nodes_list=["conv2.weight_calib"], runtime="numpy")(calibrated)
    assert list(tmp_path.iterdir()) == []
    assert isinstance(dist, PlotResult) and isinstance(boxes, PlotResult)
    json.dumps(dist.report.to_json()), json.dumps(boxes.report.to_json())
    assert set(dist.arrays["relu1_out_calib"]) == {"input", "float_input"}
    assert set(dist.arrays["conv2"]) == {"float", "calibrated"}
    assert set(dist.arrays["conv2.weight_calib"]) == {"original", "calibrated"}
    assert boxes.arrays["conv2.weight_calib"]["channels"].shape[0] == boxes.report["nodes"]["conv2.weight_calib"]["channels"]
    assert "png" not in dist.report["nodes"]["conv2"] and boxes.report["outlier_ratio"] == 4.0
