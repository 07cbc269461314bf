"""acc-error: hmct plot_acc_error semantics on the digits model, files, errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.errors import InputError, NotFoundError
from qir.passes import get_pass
from qir.tools.compat.hmct import plot_acc_error

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


@pytest.fixture(scope="module")
def calibrated(digits_calibrated):
    return digits_calibrated


def _run(ir, quantized, sample, values, others="float"):
    clone = ir.clone()
    for c in clone.calibrations():
        if c.name not in quantized:
            c.mode = qir.CalibMode(others)
    clone.touch()
    return qir.run(clone, sample, capture=values)


def test_curves_follow_the_definition(calibrated, tmp_path):
    ir = calibrated
    report = get_pass("acc-error", data=DATA, quantize_node=["conv2", "activation"], non_quantize_node=[["dw3", "fc"]],
                      runtime="numpy", progress=False)(ir).report
    values = report["values"]
    assert report["nodes"] == [op.name for op in ir.ops()]
    sample = qir.data.model_samples(ir, DATA, 1)[0]
    ref = _run(ir, [], sample, values)
    conv2 = [c.name for c in ir.calibrations() if "conv2" in c.feeds]
    acts = [c.name for c in ir.calibrations("activation")]
    blacklist = {c.name for c in ir.calibrations() if {"dw3", "fc"} & set(c.feeds)}
    quantized_but = [c.name for c in ir.calibrations() if c.name not in blacklist]
    for name, on in (("conv2", conv2), ("only_activation_calibrated", acts), ("without dw3+fc", quantized_but)):
        got = _run(ir, on, sample, values)
        expected = [M.cosine_similarity(ref[v], got[v]) for v in values]
        assert report["curves"][name] == pytest.approx(expected, abs=1e-9), name
    upstream = report["nodes"].index("conv2")
    assert all(x == 1.0 for x in report["curves"]["conv2"][:upstream])  # nothing before conv2 changes


def test_average_mode_files_and_errors(calibrated, tmp_path):
    ir = calibrated
    raw = plot_acc_error(DATA, ir, quantize_node=["weight"], metric="mse", save_dir=tmp_path / "a", progress=False)
    avg = plot_acc_error(DATA, ir, quantize_node=["weight"], metric="mse", average_mode=True, save_dir=tmp_path / "b",
                         progress=False)
    curve = raw["only_weight_calibrated"]
    assert avg["only_weight_calibrated"] == pytest.approx(list(np.cumsum(curve) / np.arange(1, len(curve) + 1)))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["acc_error.csv", "acc_error.json", "acc_error_mse.png"]
    doc = json.loads((tmp_path / "a" / "acc_error.json").read_text())
    assert doc["schema"] == "qir.acc_error" and list(doc["curves"]) == ["only_weight_calibrated"]
    with pytest.raises(InputError, match="cannot both be empty"):
        plot_acc_error(DATA, ir, save_dir=tmp_path, progress=False)
    with pytest.raises(InputError, match="non_quantize_node cannot hold"):
        plot_acc_error(DATA, ir, non_quantize_node=["weight"], save_dir=tmp_path, progress=False)
    with pytest.raises(NotFoundError, match="did you mean"):
        plot_acc_error(DATA, ir, quantize_node=["conv22"], save_dir=tmp_path, progress=False)
