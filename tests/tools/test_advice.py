"""qir.tools.advice: the commands it prints parse, run, and write the model it measured."""
from __future__ import annotations

import shlex

import numpy as np
import pytest

import qir
from qir.errors import QirError
from qir.runtimes.engine import configured_clone
from qir.tools.advice import command, helps
from qir.tools.cli import main


def _state(ir) -> dict:
    return {c.name: (c.mode.value, None if c.threshold is None else np.asarray(c.threshold, np.float32).tolist(),
                     c.axis, c.fixed) for c in ir.calibrations()}


@pytest.mark.parametrize("kind", ["one threshold", "one mode, many nodes", "every activation", "everything",
                                  "mixed"])
def test_each_command_form_writes_the_changes_it_was_made_from(digits_calibrated, tmp_path, kind):
    ir = digits_calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    changes = {"one threshold": {"relu2_out_calib": "@2.553"},
               "one mode, many nodes": {"relu2_out_calib": "int16", "conv2.weight_calib": "int16"},
               "every activation": dict.fromkeys(acts, "int16"),
               "everything": {c.name: "float" for c in ir.calibrations()},
               "mixed": {"relu2_out_calib": "@3.083", "relu3_out_calib": "@4.159", "conv1.weight_calib": "int16",
                         "relu1_out_calib": "float"}}[kind]
    model, out = tmp_path / "calibrated model.onnx", tmp_path / "fixed.onnx"  # (a space: the command quotes it)
    qir.save(ir, model)
    text = command(ir, str(model), str(out), changes)
    argv = shlex.split(text)
    assert argv[:3] == ["qir", "pipeline" if len(set(changes.values())) > 1 else "set-mode", str(model)]
    assert main(argv[1:]) == 0
    assert _state(qir.load(out)) == _state(configured_clone(ir, "quantized", changes))


def test_recalibration_command_and_a_list_set_mode_cannot_take(digits_calibrated):
    ir = digits_calibrated
    assert shlex.split(command(ir, "m.onnx", "o.onnx", recalibrate="mix", data="calib data")) == [
        "qir", "pipeline", "m.onnx", "calibrate{method=mix}", "--data", "calib data", "-o", "o.onnx"]
    with pytest.raises(QirError, match="would select other calibration nodes"):  # --nodes splits on commas
        command(ir, "m.onnx", "o.onnx", {"relu2,out": "int16", "relu3_out_calib": "int16"})


def test_helps_needs_a_share_of_what_is_missing():
    assert helps(0.8, 0.8 + 0.01 * 0.2) and not helps(0.8, 0.8 + 0.009 * 0.2)
    assert not helps(0.9, 0.89) and not helps(0.9, float("nan"))
