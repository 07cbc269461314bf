"""`qir calibrate --fixes round-weights`: it runs after calibrate, keeps its per-layer choices in
OUTPUT's .round_weights.jsonl, a rerun takes them from there, and a file there that is not such a
store is refused untouched."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import qir
from qir.tools.cli import main
from qir.tools.cli.commands.calibrate import calibration_passes, parse_fixes

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
MODEL, DATA = str(DIGITS / "model.onnx"), str(DIGITS / "calibration_data")
FIX = "round-weights{method='threshold'}"


def test_round_weights_runs_after_calibrate_and_before_bias_correct():
    names = [p.name for p in calibration_passes(DATA, march="nash-e", method="max", percentile=99.99,
                                                fixes=parse_fixes("bias-correct," + FIX))]
    assert names[-3:] == ["calibrate", "round-weights", "bias-correct"]


def test_calibrate_keeps_the_choices_beside_the_model_and_a_rerun_uses_them(tmp_path, capsys):
    out = tmp_path / "cal.onnx"
    assert main(["calibrate", MODEL, DATA, "-o", str(out), "--fixes", FIX]) == 0
    store = tmp_path / "cal.round_weights.jsonl"
    lines = store.read_text().splitlines()
    first = qir.load(out)
    assert json.loads(lines[0]) == {"qir_round_weights_store": 1}
    layers = [json.loads(line)["key"].split(":")[0] for line in lines[1:]]  # one line a layer chosen
    assert len(set(layers)) == len(layers) >= 4 and "fc" not in layers  # fc: one row a sample, left alone
    notes = json.loads(first.metadata_props.get("qir.repairs", "{}")).get("round-weights", {})
    assert notes and all(first.producer(first.op(op).inputs[1]).fixed for op in notes)
    assert main(["calibrate", MODEL, DATA, "-o", str(out), "--fixes", FIX, "--force"]) == 0
    assert store.read_text().splitlines() == lines  # every layer came from the store
    again = qir.load(out)
    for c in first.calibrations("weight"):
        np.testing.assert_array_equal(np.asarray(again.calibration(c.name).threshold), np.asarray(c.threshold))


def test_a_file_in_the_stores_place_that_is_not_one_is_refused(tmp_path, capsys):
    store = tmp_path / "cal.round_weights.jsonl"
    store.write_text("mine\n")
    assert main(["calibrate", MODEL, DATA, "-o", str(tmp_path / "cal.onnx"), "--fixes", FIX]) == 2
    assert "not a round-weights store" in capsys.readouterr().err
    assert store.read_text() == "mine\n" and not Path(tmp_path / "cal.onnx").exists()
