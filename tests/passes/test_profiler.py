"""profiler: statistics equal to the captured tensors, filters, files."""
from __future__ import annotations

import csv

import numpy as np
import pytest

import qir
from qir.errors import InputError
from qir.runtimes.numerics import apply_calibration
from qir.tools.cli import main
from qir.tools.profiler import profile_model
from qir.tools.reports.profiler import COLUMNS

from ..conftest import DIGITS_DATA


def test_rows_match_the_tensors(digits_calibrated, tmp_path):
    ir = digits_calibrated
    rows = profile_model(ir, DIGITS_DATA, save_dir=tmp_path, data_num=2, histograms=True, types=["Conv", "Relu"])
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


def test_tensorboard_histograms_hold_every_tensor(digits_calibrated, tmp_path, monkeypatch):
    """Read back with TensorBoard's own event reader: one histogram per profiled tensor, with
    the tensor's count, min, max and sum."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    from qir.passes.profiler import ProfilerPass
    from qir.tools.reports.profiler import write_tensorboard

    report = ProfilerPass(DIGITS_DATA, 2, types=["Conv"])(digits_calibrated).report
    log_dir = write_tensorboard(report["tensors"], tmp_path / "tb")
    acc = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()["histograms"]
    want = {f"{op}/{label}": a for op, named in report["tensors"].items() for label, a in named.items()}
    assert set(tags) == set(want)
    for tag, array in want.items():
        h = acc.Histograms(tag)[0].histogram_value
        assert h.num == array.size and h.min == pytest.approx(float(array.min()))
        assert h.max == pytest.approx(float(array.max()))
        assert h.sum == pytest.approx(float(array.astype(np.float64).sum()), rel=1e-9, abs=1e-9)
        assert sum(h.bucket) == array.size
    assert main(["profile", str(tmp_path / "m.onnx"), str(DIGITS_DATA)]) != 0  # (no such model)
    qir.save(digits_calibrated, tmp_path / "m.onnx")
    assert main(["profile", str(tmp_path / "m.onnx"), str(DIGITS_DATA), "-t", "Gemm", "--tensorboard",
                 "-s", str(tmp_path / "p")]) == 0
    assert list((tmp_path / "p" / "tensorboard").glob("events.out.tfevents.*"))
    monkeypatch.setitem(__import__("sys").modules, "tensorboard.summary.writer.event_file_writer", None)
    with pytest.raises(InputError, match="pip install tensorboard"):
        write_tensorboard(report["tensors"], tmp_path / "tb2")
