"""node-sensitivity: hmct's get_sensitivity_of_nodes semantics on the digits model, a planted
fault found first, both runtimes agreeing, the report files."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.errors import InputError, NotFoundError
from qir.passes import PassManager, get_pass
from qir.tools.compat.hmct import get_sensitivity_of_nodes
from qir.tools.reports.node_sensitivity import format_table, write_report

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


@pytest.fixture(scope="module")
def calibrated(digits_calibrated):
    return digits_calibrated


def _only(ir, names, mode_of_others="float"):
    """The definition, written independently of the engine: a clone with every calibration
    node float except ``names`` (kept as calibrated), run whole on the numpy runtime."""
    clone = ir.clone()
    for c in clone.calibrations():
        if c.name not in names:
            c.mode = qir.CalibMode(mode_of_others)
    clone.touch()
    return clone


def test_activation_sensitivity_follows_the_definition(calibrated):
    ir = calibrated
    table = get_sensitivity_of_nodes(ir, DATA, metrics=["cosine-similarity", "mse"], node_type="activation",
                                     data_num=2, runtime="numpy", progress=False)
    samples = qir.data.model_samples(ir, DATA, 2)
    float_ir = _only(ir, [])
    for name, values in table.items():
        variant = _only(ir, [name])
        cos, mse = [], []
        for s in samples:
            ref = qir.run(float_ir, s)[ir.outputs[0]]
            got = qir.run(variant, s)[ir.outputs[0]]
            cos.append(M.cosine_similarity(ref, got))
            mse.append(M.mse(ref, got))
        assert values["cosine-similarity"] == pytest.approx(np.mean(cos), abs=1e-9)
        assert values["mse"] == pytest.approx(np.mean(mse), rel=1e-6, abs=1e-12)
    cos = [v["cosine-similarity"] for v in table.values()]
    assert cos == sorted(cos)  # worst (lowest cosine) first
    assert len(table) == len(ir.calibrations("activation"))


def test_planted_fault_ranks_first_for_every_node_type(calibrated):
    ir = calibrated.clone()
    victim = ir.calibration("relu3_out_calib")
    victim.threshold = np.float32(float(victim.threshold) / 50)  # far too small: heavy clipping
    ir.touch()
    reader = ir.consumers(victim.output)[0].name
    activation = get_sensitivity_of_nodes(ir, DATA, node_type="activation", progress=False)
    assert next(iter(activation)) == "relu3_out_calib"
    node = get_sensitivity_of_nodes(ir, DATA, node_type="node", progress=False)
    assert next(iter(node)) == reader
    back = get_sensitivity_of_nodes(ir, DATA, node_type="activation", start="quantized", progress=False,
                                    metrics="mse")
    assert next(iter(back)) == "relu3_out_calib"  # putting it back to float helps most
    assert back["relu3_out_calib"]["mse"] < min(v["mse"] for k, v in back.items() if k != "relu3_out_calib")


def test_runtimes_agree_and_node_types(calibrated):
    ir = calibrated
    by_rt = {rt: get_sensitivity_of_nodes(ir, DATA, metrics=["cosine-similarity", "mse"], data_num=3, runtime=rt,
                                          progress=False) for rt in ("numpy", "ort")}
    assert list(by_rt["numpy"])[:5] == list(by_rt["ort"])[:5]
    for node, values in by_rt["numpy"].items():
        for m in values:
            assert values[m] == pytest.approx(by_rt["ort"][node][m], abs=1e-4)
    assert set(by_rt["numpy"]) == {op.name for op in ir.ops() if any(
        isinstance(ir.producer(v), qir.records.CalibRecord) for v in op.inputs if v)}
    weights = get_sensitivity_of_nodes(ir, DATA, node_type="weight", progress=False)
    assert set(weights) == {c.name for c in ir.calibrations("weight")}


def test_options_files_and_errors(calibrated, tmp_path):
    ir = calibrated
    analysis = get_pass("node-sensitivity", data=DATA, node_type="activation", metrics=["sqnr", "mse"],
                        interested_nodes=["conv2", "relu1_out_calib"], output_node="conv5", data_num=4, progress=False)
    report = analysis(ir).report
    assert [r["node"] for r in report["rows"]] != [] and {r["node"] for r in report["rows"]} == {"conv2", "relu1_out_calib"}
    assert report["compare"] == [ir.op("conv5").outputs[0]]
    act = next(r for r in report["rows"] if r["type"] == "activation")
    assert act["consumers"] == "conv2" and act["bit"] == 8 and act["threshold"] > 0
    typed = analysis.analyse(ir)
    files = write_report(typed, tmp_path / "ns")
    assert [f.name for f in files] == ["node_sensitivity.txt", "node_sensitivity.csv", "node_sensitivity.json"]
    doc = json.loads(files[2].read_text())
    assert doc["schema"] == "qir.node_sensitivity" and len(doc["rows"]) == 2
    assert doc["rows"] == report["rows"] and doc["confidence"]["samples"] == 4
    for row in doc["rows"]:  # the first metric's bootstrap interval holds its mean; ranks within the table
        assert row["sqnr_low"] <= row["sqnr"] <= row["sqnr_high"] and 1 <= row["rank_low"] <= row["rank"] <= row["rank_high"] <= 2
    assert "sqnr_low" in files[1].read_text().splitlines()[0]
    table = format_table(typed)
    assert "node sensitivity" in table.splitlines()[0] and "95% interval" in table and "stable top-" in table
    with pytest.raises(NotFoundError, match="did you mean"):
        get_sensitivity_of_nodes(ir, DATA, interested_nodes=["conv22"], progress=False)
    with pytest.raises(InputError, match="node_type"):
        get_sensitivity_of_nodes(ir, DATA, node_type="op", progress=False)
    with pytest.raises(InputError, match="no calibration nodes"):
        get_sensitivity_of_nodes(qir.load(DIGITS / "model.onnx"), DATA, progress=False)


def test_a_nan_sample_is_left_out_not_scored_as_perfect(calibrated, tmp_path):
    """One NaN pixel made its sample score cosine 1 for every node, pulling every mean toward 1."""
    ir = calibrated
    samples = list(qir.data.model_samples(ir, DATA, 8))
    spoiled = samples[:3] + [{"input": samples[3]["input"].copy()}] + samples[4:]
    spoiled[3]["input"].flat[20] = np.nan
    spoiled_pass = get_pass("node-sensitivity", data=spoiled, data_num=8, node_type="activation", runtime="numpy",
                            progress=False)
    sens = spoiled_pass(ir).report
    clean = get_pass("node-sensitivity", data=samples[:3] + samples[4:], data_num=8, node_type="activation",
                     runtime="numpy", progress=False)(ir).report
    assert sens["samples"] == 7 and list(sens["left_out"]) == ["3"]
    assert sens["rows"] == clean["rows"]
    write_report(spoiled_pass.analyse(ir), tmp_path)
    assert json.loads((tmp_path / "node_sensitivity.json").read_text())["left_out"]["3"].startswith("'logits'")


@pytest.mark.slow
def test_planted_fault_in_a_real_model_is_found_first():
    from ..conftest import calibrated_real

    ir, images = calibrated_real("yolov8n_320", [1, 3, 320, 320])
    acts = ir.calibrations("activation")
    victim = acts[len(acts) // 2]
    victim.threshold = np.float32(float(victim.threshold) / 100)
    ir.touch()
    table = get_sensitivity_of_nodes(ir, images[:1], node_type="activation", threads=2, progress=False)
    assert next(iter(table)) == victim.name
    ranked = list(table)
    assert ranked.index(victim.name) == 0 and len(ranked) == len(acts)


SATURATED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,2,6,6] x) => (float[1,3] prob) {
    c = Conv <pads=[1,1,1,1]> (x, w)
    r = Relu (c)
    p = GlobalAveragePool (r)
    f = Flatten (p)
    logits = Gemm (f, fc)
    k = Constant <value_float = 10000.0> ()
    big = Mul (logits, k)
    prob = Softmax <axis=1> (big)
}
"""


def test_saturated_outputs_rank_on_the_logits(tmp_path):
    from ..conftest import model_from_text

    model = model_from_text(SATURATED, {"w": (4, 2, 3, 3), "fc": (4, 3)}, seed=3)
    ir = qir.import_onnx(model)
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32)} for _ in range(4)]
    PassManager("insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    out = qir.run(ir, data[0])["prob"]
    assert set(np.unique(out)) <= {0.0, 1.0}  # saturated: every variant gives the same one-hot
    report = get_pass("node-sensitivity", data=data, node_type="activation", data_num=2, progress=False,
                      runtime="numpy")(ir).report
    logits = ir.ops("Softmax")[0].inputs[0]  # what the softmax reads (here behind its quantizer)
    assert report["saturated"]["ranked_on"] == [logits] and report["compare"] == [logits]
    values = [r["cosine-similarity"] for r in report["rows"]]
    assert max(values) - min(values) > 1e-6  # the logits tell the nodes apart


def test_threshold_column_of_an_imported_scale(calibrated):
    ir = calibrated.clone()
    cal = ir.calibration("relu1_out_calib")
    threshold = float(cal.threshold)
    cal.scale, cal.threshold = np.float32(threshold / 127), None  # as a QDQ import stores it
    ir.touch()
    rows = get_pass("node-sensitivity", data=DATA, node_type="activation", runtime="numpy",
                    interested_nodes=["relu1_out_calib"], progress=False)(ir).report["rows"]
    assert rows[0]["threshold"] == pytest.approx(threshold, rel=1e-5)  # the range, not the scale


def test_a_planted_sensitive_quantizer_is_settled_first_and_auto_sampling_stops_early(calibrated):
    ir = calibrated.clone()
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu2_out")
    cal.threshold = np.float32(float(cal.threshold) / 20)  # clips hard: far the worst quantizer
    ir.touch()
    analysis = get_pass("node-sensitivity", data=DATA, node_type="activation", data_num="auto", runtime="numpy",
                        progress=False)
    report = analysis.analyse(ir)
    available = len(qir.data.model_samples(ir, DATA))
    conf, sampling = report.confidence, report.sampling
    assert report.rows[0]["node"] == cal.name and conf.named_alone(cal.name)
    assert conf.rows[0].high < min(r.low for r in conf.rows[1:])  # its interval excludes every other row's
    assert sampling.settled and sampling.used == report.samples < available  # stopped early
    assert "worst first" in sampling.line("node sensitivity") and f"of {available}" in sampling.line("x")
    # the worst samples first: by plain runs, the model as it is scores the used samples no better than the rest
    samples = qir.data.model_samples(ir, DATA)
    cos = [M.compute(["cosine-similarity"], qir.run(ir, s, level="float")["logits"], qir.run(ir, s)["logits"])[
        "cosine-similarity"] for s in samples]
    used = set(sampling.order)
    assert max(cos[i] for i in used) <= min(cos[i] for i in range(available) if i not in used) + 1e-9
    with pytest.raises(InputError, match="'auto'"):
        get_pass("node-sensitivity", data=DATA, data_num="some")
