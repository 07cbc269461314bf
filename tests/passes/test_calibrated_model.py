"""Calibrated models: exact save/load round trip; numpy and onnxruntime agree on fake quant."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import qir
from qir.kinds import CalibMode
from qir.passes import PassManager, PipelineContext
from qir.runtimes.base import get_runtime

from ..conftest import REPO

ROOT = REPO / "qir" / "examples" / "digits"


@pytest.fixture
def calibrated():
    ir = qir.load(ROOT / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    rng = np.random.default_rng(0)
    for cal in ir.calibrations():
        if cal.axis is not None:
            n = ir.value(cal.input).shape[cal.axis]
            cal.threshold = (rng.uniform(0.05, 1.0, n)).astype(np.float32)
        else:
            cal.threshold = np.float32(rng.uniform(0.5, 4.0))
    ir.calibration("pool4_out_calib").mode = CalibMode.INT16
    ir.calibration("relu3_out_calib").mode = CalibMode.FP16
    ir.calibration("relu1_out_calib").mode = CalibMode.FLOAT
    ir.calibration("relu5_out_calib").fixed = True
    ir.touch()
    return ir


def test_save_load_round_trip_is_exact(calibrated, tmp_path):
    path = qir.save(calibrated, tmp_path / "calibrated_model.onnx")
    proto = onnx.load(path)
    onnx.checker.check_model(proto)
    cal_nodes = [n for n in proto.graph.node if n.domain == "qir"]
    assert len(cal_nodes) == len(calibrated.calibrations())
    back = qir.load(path)
    assert str(back) == str(calibrated)
    for a, b in zip(calibrated.calibrations(), back.calibrations()):
        assert (a.name, a.mode, a.role, a.axis, a.fixed, a.feeds) == (b.name, b.mode, b.role, b.axis, b.fixed, b.feeds)
        np.testing.assert_array_equal(np.asarray(a.threshold, np.float32), np.asarray(b.threshold, np.float32))
    x = np.load(ROOT / "eval_images.npy")[0]
    np.testing.assert_array_equal(qir.run(back, {"input": x})["logits"], qir.run(calibrated, {"input": x})["logits"])


@pytest.mark.parametrize("rounding", ["half_to_even", "half_up", "half_away"])
def test_numpy_and_ort_fake_quant_agree(calibrated, rounding):
    images = np.load(ROOT / "eval_images.npy")[:8]
    values = [c.output for c in calibrated.calibrations()]
    a_rt, b_rt = get_runtime("numpy", rounding=rounding), get_runtime("ort", rounding=rounding)
    for x in images:
        a = a_rt.run(calibrated, {"input": x}, capture=values)
        b = b_rt.run(calibrated, {"input": x}, capture=values)
        for cal in calibrated.calibrations():
            diff = np.abs(a[cal.output] - b[cal.output])
            peak = float(np.abs(b[cal.output]).max())
            if cal.mode in (CalibMode.INT8, CalibMode.INT16):
                step = float(np.max(cal.threshold)) / (32767 if cal.mode is CalibMode.INT16 else 127)
                assert diff.max() <= step, cal.name             # at most one quantization step
                assert np.mean(diff == 0) >= 0.999, cal.name    # and identical almost everywhere
            elif cal.mode is CalibMode.FP16:                    # one half-precision ulp
                assert diff.max() <= peak * 2.0 ** -10, cal.name
            else:                                               # float: pass-through of float values
                assert diff.max() <= 1e-5 * peak, cal.name
        assert np.abs(a["logits"] - b["logits"]).max() <= 1e-4 * np.abs(b["logits"]).max()


def test_zero_points_and_explicit_scales(calibrated):
    cal = calibrated.calibration("relu4_out_calib")
    cal.scale, cal.zero_point, cal.threshold = np.float32(0.02), -128, None  # uint8-like, range [0, 5.1]
    calibrated.touch()
    x = np.load(ROOT / "eval_images.npy")[1]
    a = qir.run(calibrated, {"input": x}, capture=[cal.output, cal.input])
    b = qir.run(calibrated, {"input": x}, runtime="ort", capture=[cal.output])
    np.testing.assert_array_equal(a[cal.output], b[cal.output])
    expected = (np.clip(np.rint(a[cal.input] / np.float32(0.02)) - 128, -128, 127) + 128) * np.float32(0.02)
    np.testing.assert_array_equal(a[cal.output], expected.astype(np.float32))


def test_float_level_keeps_implied_clips_in_both_runtimes(calibrated):
    cal = calibrated.calibration("pool4_out_calib")
    cal.implied_clip = (0.0, 0.5)  # pretend a quantizer replaced a Clip(0, 0.5) here
    calibrated.touch()
    assert "clip=[0,0.5]" in str(calibrated)
    x = np.load(ROOT / "eval_images.npy")[2]
    for runtime in ("numpy", "ort"):
        out = qir.run(calibrated, {"input": x}, runtime=runtime, level="float", capture=[cal.output])
        assert float(out[cal.output].max()) <= 0.5 and float(out[cal.output].min()) >= 0.0, runtime


def test_the_saved_model_records_its_march_and_calibration_method(tmp_path):
    """insert-calibration records the march, calibrate the method and sample count; both survive
    save and load (reports state them: issue 17 item 7)."""
    from qir.data import model_samples

    data = ROOT / "calibration_data"
    ir = qir.load(ROOT / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-m},insert-calibration{march=nash-m},calibrate{method=percentile,progress=False}",
                context=PipelineContext(data=data)).run(ir)
    loaded = qir.load(qir.save(ir, tmp_path / "calibrated_model.onnx"))
    assert loaded.meta["march"] == "nash-m"
    assert loaded.meta["calibration"] == {"method": "percentile", "percentile": 99.99,
                                          "samples": len(model_samples(loaded, data))}
