"""Layer-by-layer comparison, error split and advisor (QuantAnalysis run + compare_per_layer),
checked against independent runs of the models and planted faults."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.calibration import QRANGE, calib_scale
from qir.data import model_samples
from qir.passes import layer_compare as lc
from qir.passes.lib import layer_run as lr
from qir.runtimes.engine import configured_clone
from qir.tools.reports import layer_compare as lc_report

from ..conftest import DIGITS, DIGITS_DATA


@pytest.fixture()
def digits(digits_calibrated):
    return digits_calibrated.clone(), model_samples(digits_calibrated, DIGITS_DATA, 1)[0]


def _planted_clip(ir, factor=0.2):
    """Shrink the threshold of the calibration node after relu2 (it feeds dw3)."""
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu2_out")
    cal.threshold = np.float32(float(cal.threshold) * factor)
    cal.fixed = True
    ir.touch()
    return cal


def test_rows_match_independent_runs_and_shares_add_up(digits):
    ir, sample = digits
    run = lr.run_layers(ir, None, sample, runtime="numpy")
    rows = lc.compare_per_layer(run)
    values = [v for op in ir.ops() for v in op.outputs]
    flt = qir.run(configured_clone(ir, "float", {}), sample, runtime="numpy", capture=values)
    qnt = qir.run(ir, sample, runtime="numpy", capture=values)
    assert [r["value"] for r in rows] == [op.outputs[0] for op in ir.ops()
                                          if op.name not in {m for g in ir.meta["fusion_groups"].values() for m in g[:-1]}]
    for r in rows:
        b, a = flt[r["value"]], qnt[r["value"]]
        assert r["Cosine"] == pytest.approx(M.cosine_similarity(b, a), abs=1e-12)
        assert r["Atol"] == pytest.approx(float(np.max(np.abs(a - b))))
        assert r["base_model_max"] == pytest.approx(float(b.max())) and r["analy_model_mean"] == pytest.approx(float(a.mean()))
        assert r["clip%"] + r["round%"] + r["inherited%"] == pytest.approx(100.0) or r["Atol"] == 0
        if r["qscale"]:
            assert r["max_qscale_diff"] == pytest.approx(r["Atol"] / r["qscale"])
    first = rows[0]  # conv1+relu1 reads only the model input: all its error is its own
    assert first["analy_op_type"] == "Conv+Relu" and first["inherited%"] == pytest.approx(0.0, abs=1e-6)
    assert rows[-1]["inherited%"] > 50  # fc's error comes mostly from upstream


def test_shadow_equals_only_that_units_quantizers_on(digits):
    """f(Q(x_b)) is what the float model computes with only the unit's input quantizers on."""
    ir, sample = digits
    run = lr.run_layers(ir, None, sample, runtime="numpy")
    shadows = lr.shadow_outputs(run)
    assert "relu2" in shadows and "dw3" not in shadows  # dw3 is inside the group ending at relu3
    for name in ("relu2", "relu5", "fc"):  # (relu4's Add reads relu2_out_calib, shared with dw3 upstream)
        op = ir.op(name)
        members = ir.meta["fusion_groups"].get(op.meta.get("fusion", ""), [name])
        cals = [c for m in members for v in ir.op(m).inputs if v
                for c in [ir.producer(v)] if isinstance(c, qir.records.CalibRecord)]
        only = configured_clone(ir, "float", {c.name: c.mode.value for c in cals})
        want = qir.run(only, sample, runtime="numpy", capture=[op.outputs[0]])[op.outputs[0]]
        np.testing.assert_allclose(shadows[name][0][0], want, rtol=1e-5, atol=1e-6)


def test_planted_clipping_is_flagged_with_the_fixed_threshold(digits, tmp_path):
    ir, sample = digits
    cal = _planted_clip(ir)
    run = lr.run_layers(ir, None, sample)
    rows = lc.compare_per_layer(run)
    findings = lc.advise(run, rows)
    x = run.base_values["relu2_out"]
    s = float(calib_scale(cal))
    beyond = int(((x > (QRANGE[cal.mode][1] + 1) * s) | (x < (QRANGE[cal.mode][0] - 1) * s)).sum())
    assert beyond > 0
    clip = [f for f in findings if f["kind"] == "scale does not cover data"]
    assert [f["calibration"] for f in clip] == [cal.name]
    assert clip[0]["clipped"] == beyond and clip[0]["fixed_threshold"] == pytest.approx(float(np.abs(x).max()))
    own = [f for f in findings if f["kind"].startswith("own error")]
    assert own[0]["layer"] == "relu3" and own[0]["kind"] == "own error: clipping"
    row = next(r for r in rows if r["mod_name"] == "relu3")
    assert row["clip%"] > row["round%"]
    files = lc_report.write_report(rows, findings, tmp_path)
    advisor = (tmp_path / "abnormal_layer_advisor.txt").read_text()
    assert advisor.splitlines()[0].startswith(f"[scale does not cover data] relu2: {beyond} values")
    assert "relu3" in (tmp_path / "compare_per_layer_out.txt").read_text()
    assert json.loads(files[2].read_text())["schema"] == "qir.compare_per_layer"
    header = (tmp_path / "compare_per_layer_out.csv").read_text().splitlines()[0].split(",")
    assert header == list(lc_report.COLUMNS)


def test_planted_nan_is_flagged_at_its_layer_first(digits):
    ir, sample = digits
    name = ir.op("conv2").inputs[2]  # its bias (not quantized: a NaN there reaches the output)
    w = ir.weight_array(name).copy()
    w.flat[0] = np.nan
    analysis = ir.clone()
    analysis.set_weight(name, w)
    run = lr.run_layers(ir, analysis, sample)
    findings = lc.advise(run, lc.compare_per_layer(run))
    assert findings[0]["kind"] == "nan/inf" and findings[0]["layer"] == "conv2"  # found before its Relu hides it


def test_a_sample_with_nan_baseline_outputs_is_refused(digits):
    ir, sample = digits
    spoiled = {"input": sample["input"].copy()}
    spoiled["input"].flat[0] = np.nan
    with pytest.raises(qir.errors.InputError, match="baseline model's outputs hold NaN"):
        lr.run_layers(ir, None, spoiled, runtime="numpy")


def test_range_and_input_and_output_advice(digits):
    ir, sample = digits
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu3_out")
    cal.threshold = np.float32(float(cal.threshold) * 400)  # every value now rounds to a few codes
    out_cal = ir.insert_calibration("logits", "logits_calib", role="activation", rewire_outputs=True)
    out_cal.threshold, out_cal.mode = np.float32(20.0), qir.kinds.CalibMode.INT8
    ir.touch()
    run = lr.run_layers(ir, None, sample)
    kinds = {(f["kind"], f.get("calibration")) for f in lc.advise(run, lc.compare_per_layer(run))}
    assert ("range too large for dtype", cal.name) in kinds
    assert ("output not high precision", "logits_calib") in kinds
    assert ("asymmetric input", next(c.name for c in ir.calibrations() if c.input == "input")) in kinds


def test_fold_bn_outputs_match_the_unfolded_model_after_save_and_load(digits_calibrated, tmp_path):
    path = tmp_path / "cal.onnx"
    qir.save(digits_calibrated, path)
    loaded = qir.load(path)
    assert loaded.meta["fusion_groups"] == digits_calibrated.meta["fusion_groups"]
    assert loaded.meta["value_aliases"] == digits_calibrated.meta["value_aliases"]
    sample = model_samples(loaded, DIGITS_DATA, 1)[0]
    run = lr.run_layers(DIGITS / "model.onnx", loaded, sample)
    rows = lc.compare_per_layer(run)
    assert rows[0]["mod_name"] == "relu1" and rows[0]["base_op_type"] == "Relu"
    assert min(r["Cosine"] for r in rows) > 0.99  # the folded convs are compared with their BN outputs
    lc_report.save_layers(run, tmp_path / "layers")
    index = json.loads((tmp_path / "layers" / "layers.json").read_text())["files"]["analysis"]
    assert {op.outputs[0] for op in loaded.ops()} <= set(index)
    for value, file in index.items():
        np.testing.assert_array_equal(np.load(tmp_path / "layers" / file, allow_pickle=False), run.analy_values[value])


def test_stored_runs_in_chunks_give_the_same_table(digits_calibrated, tmp_path):
    """With a store and a tiny memory budget each model runs once per chunk of values, written
    to .npy files and read back memory-mapped; the table is the in-memory one."""
    sample = model_samples(digits_calibrated, DIGITS_DATA, 1)[0]
    memory = lr.run_layers(digits_calibrated, None, sample)
    stored = lr.run_layers(digits_calibrated, None, sample, store=tmp_path / "layers", memory_budget=16 << 10)
    assert all(isinstance(a, np.memmap) for a in stored.analy_values.values() if a.ndim)
    assert not (tmp_path / "layers" / "layers.json").exists()  # the spill is memory, not a report
    assert len(list((tmp_path / "layers" / "baseline").glob("*.npy"))) == len(memory.base_values)
    # each chunk's session captures other values, so onnxruntime fuses a little differently:
    # values agree to float32 rounding, not bit for bit
    rows, want = lc.compare_per_layer(stored), lc.compare_per_layer(memory)
    assert [r["mod_name"] for r in rows] == [r["mod_name"] for r in want]
    for r, w in zip(rows, want):
        for key, value in w.items():
            if isinstance(value, float):
                assert r[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (r["mod_name"], key)
            elif key != "max_atol_diff":
                assert r[key] == value, (r["mod_name"], key)
    kinds = lambda run: [(f["kind"], f["layer"]) for f in lc.advise(run, lc.compare_per_layer(run))]  # noqa: E731
    assert kinds(stored) == kinds(memory)


def test_prefix_and_type_filters(digits):
    ir, sample = digits
    run = lr.run_layers(ir, None, sample)
    assert [r["mod_name"] for r in lc.compare_per_layer(run, types=["MaxPool"])] == ["pool4"]
    # a fused layer matches through any of its ops
    assert [r["mod_name"] for r in lc.compare_per_layer(run, types=["Add"])] == ["relu4"]
    assert [r["mod_name"] for r in lc.compare_per_layer(run, prefixes=["conv2"])] == ["relu2"]
    assert {r["mod_name"] for r in lc.compare_per_layer(run, prefixes=["relu*"])} == {"relu1", "relu2", "relu3",
                                                                                        "relu4", "relu5"}
    with pytest.raises(qir.errors.InputError, match="no layer matches"):
        lc.compare_per_layer(run, types=["LSTM"])


def test_fakequant_against_its_emitted_qdq_model_is_exact(digits_calibrated, tmp_path):
    """The calibrated model and the QDQ model emitted from it line up layer by layer, equal."""
    from qir.tools.cli import main

    cal, qdq = tmp_path / "cal.onnx", tmp_path / "qdq.onnx"
    qir.save(digits_calibrated, cal)
    assert main(["emit", str(cal), "-o", str(qdq)]) == 0
    sample = model_samples(digits_calibrated, DIGITS_DATA, 1)[0]
    run = lr.run_layers(cal, qdq, sample)
    rows = lc.compare_per_layer(run)
    assert len(rows) == 9 and all(r["Atol"] == 0.0 for r in rows)
    assert [r["quant_dtype"] for r in rows] == [r["quant_dtype"] for r in lc.compare_per_layer(lr.run_layers(cal, None, sample))]
    assert not [f for f in lc.advise(run, rows) if f["kind"].startswith("own error")]


SCALAR_OUT = """
<ir_version: 8, opset_import: ["" : 17]>
scalar_net (float[1, 8] x) => (float total) {
    y = MatMul(x, w)
    total = ReduceSum<keepdims = 0>(y)
}
"""


def test_scalar_outputs_and_unsplittable_layers(tmp_path):
    """A 0-d layer output gets a row; a layer whose shadow cannot run has empty shares, not
    "all inherited"."""
    from qir.passes import get_pass

    from ..conftest import model_from_text

    ir = qir.load(model_from_text(SCALAR_OUT, {"w": (8, 4)}))
    data = [{"x": np.random.default_rng(i).standard_normal((1, 8)).astype(np.float32)} for i in range(4)]
    get_pass("insert-calibration")(ir)
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    run = lr.run_layers(ir, None, data[0])
    rows = {r["value"]: r for r in lc.compare_per_layer(run)}
    assert rows["total"]["shape"] == [] and rows["total"]["Atol"] == pytest.approx(
        abs(float(run.analy_values["total"]) - float(run.base_values["total"])))
    del run.base_values["x"]  # the model input: the MatMul's shadow has nothing to run on
    rows = {r["value"]: r for r in lc.compare_per_layer(run)}
    assert rows["y"]["clip%"] is None and rows["y"]["own_error"] is None


def test_near_zero_baseline_layers_are_flagged_and_not_ranked_by_relative_error(rng, caplog):
    """Issue 17 item 2 in the layer table: a Sigmoid map that is ~0 everywhere on a sample (a
    detector with nothing to detect) is flagged, named in a warning and one advisor line, and
    not ranked by its relative own error; on a sample where it responds nothing is flagged."""
    from ..conftest import near_zero_sigmoid_case

    ir, samples = near_zero_sigmoid_case(rng, 2)
    responds = lc.compare_per_layer(lr.run_layers(ir, None, samples[0], runtime="numpy"))
    assert [r["ill_conditioned"] for r in responds] == [None] * len(responds)
    run = lr.run_layers(ir, None, samples[1], runtime="numpy")
    with caplog.at_level("WARNING", logger="qir.passes.layer_compare"):
        rows = {r["value"]: r for r in lc.compare_per_layer(run)}
    y = float(np.sqrt(np.mean(run.base_values["y"].astype(np.float64) ** 2)))
    assert y < 1e-3 and rows["y"]["ill_conditioned"].startswith("near zero")  # RMS below 1e-3 of the Sigmoid's range 1
    assert rows["h"]["ill_conditioned"] is None
    assert "1 layer(s) have a near-zero or constant baseline output" in caplog.text and rows["y"]["mod_name"] in caplog.text
    findings = lc.advise(run, list(rows.values()))
    assert rows["y"]["own_error"] >= lc.OWN_ERROR_MIN  # large relative error on ~0: noise
    assert not [f for f in findings if f["kind"].startswith("own error") and f["layer"] == rows["y"]["mod_name"]]
    ill = [f for f in findings if f["kind"] == "ill-conditioned baseline"]
    assert len(ill) == 1 and list(ill[0]["layers"]) == [rows["y"]["mod_name"]] and "MSE or L1" in ill[0]["detail"]
