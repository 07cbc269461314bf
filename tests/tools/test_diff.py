"""``qir diff``: two result folders of the same command side by side (qir.tools.diff)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.data import model_samples
from qir.passes import PassManager, get_pass
from qir.tools.cli import main
from qir.tools.diff import diff_runs, load_run

from ..conftest import DIGITS, DIGITS_DATA

CLIPPED = "relu2_out_calib"  # with kl calibration it clips its input hard (threshold ~1, values to ~2.5)


@pytest.fixture(scope="module")
def before_after(tmp_path_factory):
    """The digits model calibrated with kl, and the same with the clipping quantizer's threshold
    covering its data (the advisor's fix), each saved."""
    folder = tmp_path_factory.mktemp("diff")
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DIGITS_DATA, method="kl", progress=False)(ir)
    before = folder / "before.onnx"
    qir.save(ir, before)
    amax = max(float(np.abs(qir.run(ir, s, level="float", capture=[ir.calibration(CLIPPED).input])[
        ir.calibration(CLIPPED).input]).max()) for s in model_samples(ir, DIGITS_DATA, 8))
    after = folder / "after.onnx"
    assert main(["set-mode", str(before), "--nodes", CLIPPED, "--threshold", f"{amax * 1.01:.4g}", "-o", str(after)]) == 0
    return folder, ir, before, after


def _sensitivity(model, out) -> None:
    assert main(["sensitivity", str(model), str(DIGITS_DATA), "-d", "8", "-o", str(out)]) == 0


def test_a_fix_names_the_fixed_node_as_the_mover_and_identical_runs_no_change(before_after, capsys):
    folder, ir, before, after = before_after
    _sensitivity(before, folder / "A")
    _sensitivity(before, folder / "A2")
    _sensitivity(after, folder / "B")
    capsys.readouterr()
    d = diff_runs(load_run(folder / "A"), load_run(folder / "B"))
    (table,) = d.tables
    fixed = set(ir.calibration(CLIPPED).feeds)  # the node(s) the fixed quantizer feeds
    assert {m.key for m in table.movers} == fixed and all(m.change > 0 for m in table.movers)
    assert not table.appeared and not table.vanished and d.changed
    same = diff_runs(load_run(folder / "A"), load_run(folder / "A2"))
    assert not same.changed and not same.tables[0].movers
    assert main(["diff", str(folder / "A"), str(folder / "A2")]) == 0
    assert "no change" in capsys.readouterr().out.splitlines()[0]
    assert main(["diff", str(folder / "A"), str(folder / "B"), "-o", str(folder / "D")]) == 0
    text = capsys.readouterr().out
    assert all(node in text for node in fixed) and "moved (value)" in text
    doc = json.loads((folder / "D" / "diff.json").read_text())
    assert doc["schema"] == "qir.diff" and {m["key"] for m in doc["tables"][0]["movers"]} == fixed
    assert "<table" in (folder / "D" / "diff.html").read_text()


def test_rows_that_appear_or_vanish_and_bad_folders(before_after, tmp_path, capsys):
    folder, ir, before, _ = before_after
    for name, nodes in (("X", "conv2,fc"), ("Y", "conv2,pw4")):
        assert main(["sensitivity", str(before), str(DIGITS_DATA), "-d", "3", "-i", nodes, "-o", str(tmp_path / name)]) == 0
    d = diff_runs(load_run(tmp_path / "X"), load_run(tmp_path / "Y"))
    assert d.tables[0].appeared == ["pw4"] and d.tables[0].vanished == ["fc"]
    (tmp_path / "empty").mkdir()
    capsys.readouterr()
    assert main(["diff", str(tmp_path / "X"), str(tmp_path / "empty")]) == 2
    assert "holds no qir result" in capsys.readouterr().err
    assert main(["diff", str(tmp_path / "X"), str(tmp_path / "nowhere")]) == 2
    assert "not a folder" in capsys.readouterr().err


def _write(folder, name, doc) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc))


def test_tune_and_compare_results_diff_their_tables_and_headline(tmp_path):
    def tune(mean, loss_a):
        rows = [{"unit": "a", "loss": loss_a, "mean_change": loss_a, "change_low": loss_a * 0.9,
                 "change_high": loss_a * 1.1, "rank": 1, "rank_low": 1, "rank_high": 1},
                {"unit": "b", "loss": 0.001, "mean_change": 0.001, "change_low": 0.0009, "change_high": 0.0011,
                 "rank": 2, "rank_low": 2, "rank_high": 2}]
        return {"schema": "qir.tune", "version": 1, "target": "cosine>=0.99", "reached": True, "samples": 8,
                "final": {"mean": mean, "worst": 0.98, "cost_vs_int16": 0.66}, "raised": 3, "seconds": 50.0,
                "changes": [{"node": "a", "gain": 0.01}], "sensitivity": {"stable_top_k": 1, "rows": rows}}
    _write(tmp_path / "t1", "tune_report.json", tune(0.995, 0.02))
    _write(tmp_path / "t2", "tune_report.json", tune(0.996, 0.05))
    d = diff_runs(load_run(tmp_path / "t1"), load_run(tmp_path / "t2"))
    assert d.a.kind == "tune" and ("final mean", 0.995, 0.996) in d.headline
    order = next(t for t in d.tables if t.name == "sensitivity order")
    assert [m.key for m in order.movers] == ["a"] and not next(t for t in d.tables if t.name == "changes").changed
    compare = {"schema": "qir.compare", "version": 1, "bad_case_index": 3, "output_cosine": 0.9, "layers": 12}
    ops = {"schema": "qir.sensitive_ops", "version": 1, "metric": "L1", "outputs": {"logits": [
        {"op_name": "conv1", "sensitive_type": "activation", "L1": 0.5}]}}
    _write(tmp_path / "c1", "compare.json", compare)
    _write(tmp_path / "c1", "sensitive_ops.json", ops)
    _write(tmp_path / "c2", "compare.json", dict(compare, output_cosine=0.99))
    ops["outputs"]["logits"][0]["L1"] = 0.1  # one sample, no interval: any change beyond rounding moves
    _write(tmp_path / "c2", "sensitive_ops.json", ops)
    c = diff_runs(load_run(tmp_path / "c1"), load_run(tmp_path / "c2"))
    assert [m.key for m in c.tables[0].movers] == ["conv1 (activation)"] and "one sample" in c.tables[0].movers[0].why
    with pytest.raises(qir.errors.InputError, match="same command"):
        diff_runs(load_run(tmp_path / "t1"), load_run(tmp_path / "c1"))
