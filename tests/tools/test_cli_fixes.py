"""``qir calibrate --fixes``: the repair transforms from the command line."""
from __future__ import annotations

import json

import qir
from qir.passes.lib.repair import REPAIRS_KEY
from qir.tools.cli import main

from ..conftest import DIGITS, DIGITS_DATA


def test_calibrate_with_fixes_runs_them_in_pipeline_order_and_saves_what_they_changed(tmp_path, capsys):
    out = tmp_path / "cal.onnx"
    code = main(["calibrate", str(DIGITS / "model.onnx"), str(DIGITS_DATA), "-o", str(out),
                 "--fixes", "bias-correct{mode=empirical},equalize"])
    printed = capsys.readouterr().out
    assert code == 0
    steps = [line.split()[0] for line in printed.splitlines() if line.startswith("  ")]
    assert steps[:6] == ["fold-bn", "fuse", "equalize", "insert-calibration", "calibrate", "bias-correct"]
    notes = json.loads(qir.load(out).metadata_props[REPAIRS_KEY])
    assert notes["bias-correct"] and {n["mode"] for n in notes["bias-correct"].values()} == {"empirical"}


def test_an_unknown_fix_is_one_clear_error(tmp_path, capsys):
    code = main(["calibrate", str(DIGITS / "model.onnx"), str(DIGITS_DATA), "-o", str(tmp_path / "c.onnx"),
                 "--fixes", "smooth,round"])
    assert code == 2
    assert "unknown transform 'round'; choose from smooth, equalize, round-weights, bias-correct" in capsys.readouterr().err
    assert not (tmp_path / "c.onnx").exists()
    code = main(["calibrate", str(DIGITS / "model.onnx"), str(DIGITS_DATA), "-o", str(tmp_path / "c.onnx"),
                 "--fixes", "bias-correct{mode=exact}"])
    assert code == 2 and "unknown mode 'exact'; choose one of weights, empirical" in capsys.readouterr().err
