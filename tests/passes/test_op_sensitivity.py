"""Per-op sensitivity on the bad case (QuantAnalysis sensitivity) and its use by set-mode."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.data import model_samples
from qir.errors import InputError
from qir.passes.op_sensitivity import op_sensitivity
from qir.passes.set_mode.sensitivity_table import load_report, select_sensitive
from qir.runtimes.engine import configured_clone
from qir.tools.cli import main
from qir.tools.reports.op_sensitivity import write_report

from ..conftest import DIGITS_DATA


@pytest.fixture()
def digits(digits_calibrated):
    return digits_calibrated.clone(), model_samples(digits_calibrated, DIGITS_DATA, 3)[2]


def test_rows_equal_plain_runs_with_only_those_nodes_quantized(digits):
    ir, sample = digits
    report = op_sensitivity(ir, sample, metric="L1", progress=False, threads=1)
    rows = report.outputs["logits"]
    want = qir.run(configured_clone(ir, "float", {}), sample)["logits"]
    for row in rows:
        only = configured_clone(ir, "float", {c: ir.calibration(c).mode.value for c in row["calibrations"]})
        assert row["L1"] == pytest.approx(M.mean_abs(want, qir.run(only, sample)["logits"]), rel=1e-4, abs=1e-7)
    assert [r["L1"] for r in rows] == sorted((r["L1"] for r in rows), reverse=True)
    kinds = {(r["op_name"], r["sensitive_type"]) for r in rows}
    assert ("relu2", "activation") in kinds and ("conv2", "weight") in kinds and ("input", "activation") in kinds
    relu2 = next(r for r in rows if r["op_name"] == "relu2")
    assert relu2["op_type"] == "Conv+Relu" and relu2["flops_text"].endswith("%)")
    flops = {r["op_name"]: r["flops"] for r in rows if r["sensitive_type"] == "activation" and r["op_type"] != "input"}
    assert sum(flops.values()) <= report.total_flops
    reverse = op_sensitivity(ir, sample, metric="Cosine", reverse=True, progress=False).outputs["logits"]
    assert [r["Cosine"] for r in reverse] == sorted(r["Cosine"] for r in reverse)[::-1]


def test_planted_fault_tops_the_table_and_feeds_set_mode(digits, tmp_path, capsys):
    ir, sample = digits
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu2_out")
    cal.threshold = np.float32(float(cal.threshold) / 20)
    ir.touch()
    report = op_sensitivity(ir, sample, metric="ATOL", progress=False)
    top = report.outputs["logits"][0]
    assert (top["op_name"], top["sensitive_type"], top["calibrations"]) == ("relu2", "activation", [cal.name])
    files = write_report(report, tmp_path)
    assert "output logits" in files[0].read_text() and "ATOL" in files[0].read_text()
    assert select_sensitive(load_report(files[1]), top_k=1) == [cal.name]
    n = len(report.outputs["logits"])
    every = {c for r in report.outputs["logits"] for c in r["calibrations"]}
    assert len(select_sensitive(report.to_json(), ratio=1.0)) == len(every)
    assert n > 3
    model = tmp_path / "cal.onnx"
    qir.save(ir, model)
    out = tmp_path / "int16.onnx"
    assert main(["set-mode", str(model), "-o", str(out), "--mode", "int16", "--sensitive", str(files[1]),
                 "--top-k", "2"]) == 0
    raised = {c.name for c in qir.load(out).calibrations() if c.mode.value == "int16"}
    assert raised == set(select_sensitive(report.to_json(), top_k=2)) and cal.name in raised
    assert main(["set-mode", str(model), "-o", str(tmp_path / "x.onnx"), "--mode", "int16", "--top-k", "2"]) == 2
    assert "give --sensitive" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "qir.badcase"}))
    with pytest.raises(InputError, match="not a sensitive_ops.json"):
        load_report(bad)
    with pytest.raises(InputError, match="exactly one of --top-k"):
        select_sensitive(report.to_json())


def test_needs_a_calibrated_model_and_a_known_metric(digits):
    ir, sample = digits
    with pytest.raises(InputError, match="unknown sensitivity metric"):
        op_sensitivity(ir, sample, metric="cosine")
    float_ir = configured_clone(ir, "float", {})
    with pytest.raises(InputError, match="no quantized calibration node"):
        op_sensitivity(float_ir, sample)


def test_a_report_without_rows_selects_nothing_loudly(tmp_path):
    empty = {"metric": "L1", "outputs": {}}
    with pytest.raises(InputError, match="no rows"):
        select_sensitive(empty, top_k=3)
    with pytest.raises(InputError, match="--ratio must be in"):
        select_sensitive(empty, ratio=1.5)


def test_several_samples_give_intervals_and_a_settled_planted_fault(digits_calibrated, tmp_path):
    ir = digits_calibrated.clone()
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu2_out")
    cal.threshold = np.float32(float(cal.threshold) / 20)
    ir.touch()
    samples = model_samples(ir, DIGITS_DATA, 6)
    report = op_sensitivity(ir, samples, metric="ATOL", progress=False)
    rows, conf = report.outputs["logits"], report.confidence["logits"]
    singles = [op_sensitivity(ir, s, metric="ATOL", progress=False).outputs["logits"] for s in samples]
    top = rows[0]
    assert top["op_name"] == "relu2" and report.samples == 6
    each = [next(r["ATOL"] for r in one if r["op_name"] == "relu2" and r["sensitive_type"] == "activation")
            for one in singles]
    assert top["ATOL"] == pytest.approx(np.mean(each), rel=1e-6)  # the mean of the one-sample tables
    assert conf.named_alone(conf.rows[0].name) and conf.rows[0].low > max(c.high for c in conf.rows[1:])
    doc = json.loads(write_report(report, tmp_path)[1].read_text())
    assert doc["confidence"]["logits"]["stable_top_k"] >= 1 and doc["outputs"]["logits"][0]["rank_high"] == 1
    assert "95% interval" in (tmp_path / "sensitive_ops.txt").read_text()
