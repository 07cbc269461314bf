"""profiler: statistics equal to the captured tensors, filters, files."""
from __future__ import annotations

import csv

import numpy as np
import pytest

import qir
from qir.errors import InputError
from qir.passes.profiler import COLUMNS, profile_model
from qir.runtimes.numerics import apply_calibration
from qir.tools.cli import main

from ..conftest import DIGITS_DATA


def test_rows_match_the_tensors(digits_calibrated, tmp_path):
    ir = digits_calibrated
    rows = profile_model(ir, DIGITS_DATA, tmp_path, data_num=2, histograms=True, types=["Conv", "Relu"])
    samples = qir.data.model_samples(ir, DIGITS_DATA, 2)
    out = np.concatenate([qir.run(ir, s, capture=["conv2_out"])["conv2_out"] for s in samples])
    row = next(r for r in rows if r["op"] == "conv2" and r["role"] == "output0")
    assert row["max"] == pytest.approx(float(out.max())) and row["var"] == pytest.approx(float(out.var()), rel=1e-6)
    assert row["shape"] == [1, 32, 8, 8] and row["dtype"] == "float"  # inside the fused Conv+Relu: never stored
    assert next(r for r in rows if r["op"] == "relu2" and r["role"] == "output0")["dtype"] == "int8"
    w = next(r for r in rows if r["op"] == "conv2" and r["role"] == "weight")
    cal = ir.calibration("conv2.weight_calib")
    assert w["mean"] == pytest.approx(float(apply_calibration(cal, ir.weight_array(cal.input)).mean()))
    assert w["scale"] == pytest.approx(float(np.max(np.asarray(cal.threshold)) / 127), rel=1e-6)
    bias = next(r for r in rows if r["op"] == "conv2" and r["role"] == "bias")
    assert bias["dtype"] == "float" and bias["scale"] is None
    with open(tmp_path / "statistic.csv") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == COLUMNS and len(table) == 1 + len(rows)
    assert (tmp_path / "histograms" / "conv2.png").exists()


def test_filters_errors_and_cli(digits_calibrated, tmp_path, capsys):
    rows = profile_model(digits_calibrated, DIGITS_DATA, types=["Conv"], prefixes=["conv"])
    assert {r["op"] for r in rows} == {"conv1", "conv2", "conv5"}
    with pytest.raises(InputError, match="no op matches"):
        profile_model(digits_calibrated, DIGITS_DATA, types=["LSTM"])
    model = tmp_path / "cal.onnx"
    qir.save(digits_calibrated, model)
    assert main(["model-profiler", str(model), str(DIGITS_DATA), "-t", "Gemm", "-s", str(tmp_path / "p")]) == 0
    assert "4 tensor(s) of 1 op(s)" in capsys.readouterr().out
