"""Numeric-suite comparisons on IR pairs (no torch): weights against the per-channel int8
definition, layer outputs against independent runs, and the stub separating a layer's own
error from the error it inherits."""
from __future__ import annotations

import numpy as np
import pytest

import qir
from qir import metrics as M
from qir.data import model_samples
from qir.errors import InputError
from qir.passes import numeric_suite as ns
from qir.runtimes.engine import configured_clone

from ..conftest import DIGITS, DIGITS_DATA


def test_weights_match_the_per_channel_int8_definition(digits_calibrated):
    found = ns.compare_weights(None, digits_calibrated)
    assert {"conv1.weight", "conv2.weight", "fc.weight"} <= set(found)
    for key, entry in found.items():
        w = entry["float"].astype(np.float64)
        axis = 0
        scale = np.abs(w).reshape(w.shape[axis], -1).max(1) / 127
        q = np.clip(np.round(w / scale.reshape((-1,) + (1,) * (w.ndim - 1))), -128, 127)
        q = q * scale.reshape((-1,) + (1,) * (w.ndim - 1))
        want = 20 * np.log10(np.linalg.norm(w) / np.linalg.norm(w - q))
        assert entry["sqnr_db"] == pytest.approx(want, abs=1e-3), key
        assert 35 < entry["sqnr_db"] < 60
    # against the unfolded float model: fc is unchanged by fold-bn, so its float weight is the original
    with_float = ns.compare_weights(DIGITS / "model.onnx", digits_calibrated)
    original = qir.load(DIGITS / "model.onnx")
    fc_w = original.weight_array(original.op("fc").inputs[1])
    np.testing.assert_array_equal(with_float["fc.weight"]["float"], fc_w)
    with pytest.raises(InputError, match="no weight calibration node"):
        ns.compare_weights(None, original)


def test_outputs_accumulate_and_match_independent_runs(digits_calibrated):
    ir = digits_calibrated
    samples = model_samples(ir, DIGITS_DATA, 2)
    found = ns.compare_model_outputs(None, ir, *samples)
    assert "relu1" in found and "conv1" not in found  # one entry per fusion group
    float_ir = configured_clone(ir, "float", {})
    for i, s in enumerate(samples):
        f = qir.run(float_ir, s, capture=["relu3_out"])["relu3_out"]
        q = qir.run(ir, s, capture=["relu3_out"])["relu3_out"]
        assert found["relu3"]["sqnr_db"][i] == pytest.approx(M.sqnr_db(f, q), abs=1e-4)
    assert all(len(e["sqnr_db"]) == 2 for e in found.values())
    only_pool = ns.compare_model_outputs(None, ir, samples[0], allow_list=["MaxPool"])
    assert list(only_pool) == ["pool4"]
    with pytest.raises(InputError, match="one or more"):
        ns.compare_model_outputs(None, ir)


def test_stub_separates_own_error_from_inherited_error(digits_calibrated):
    ir = digits_calibrated.clone()
    cal = next(c for c in ir.calibrations("activation") if c.input == "relu3_out")  # read by pw4 (relu4 group)
    cal.threshold = np.float32(float(cal.threshold) / 10)
    ir.touch()
    sample = model_samples(ir, DIGITS_DATA, 1)[0]
    stub = ns.compare_model_stub(None, ir, None, sample)
    outs = ns.compare_model_outputs(None, ir, sample)
    own = {k: v["sqnr_db"][0] for k, v in stub.items()}
    total = {k: v["sqnr_db"][0] for k, v in outs.items()}
    assert own["relu4"] < own["relu5"] - 10  # the clipped layer's own error
    assert total["relu5"] < own["relu5"] - 10  # relu5 only inherits it
    rows = ns.summary(stub)
    assert rows[0]["name"] == "relu4"


def test_cli_writes_the_three_tables(digits_calibrated, tmp_path, capsys):
    from qir.tools.cli import main

    model = tmp_path / "cal.onnx"
    qir.save(digits_calibrated, model)
    assert main(["numeric-suite", str(DIGITS / "model.onnx"), str(model), str(DIGITS_DATA), "-o",
                 str(tmp_path / "ns"), "-n", "2"]) == 0
    text = (tmp_path / "ns" / "numeric_suite.txt").read_text()
    assert all(f"{k}: SQNR (dB), worst first" in text for k in ("weights", "outputs", "stub"))
    assert "weights: 6 entries" in capsys.readouterr().out
    assert main(["numeric-suite", str(model), str(tmp_path / "nope.onnx"), str(DIGITS_DATA)]) != 0


def _with_nan(samples: list[dict], at: int) -> list[dict]:
    """``samples`` with one NaN pixel in sample ``at``."""
    out = [{k: np.array(v, copy=True) for k, v in s.items()} for s in samples]
    out[at]["input"].flat[3] = np.nan
    return out


def test_a_sample_with_nan_float_outputs_is_left_out_with_a_warning(digits_calibrated, caplog):
    """Issue 17 item 1 in the numeric suite: the NaN sample is named and left out of both layer
    comparisons (the others score what they score alone), the report counts it; none left: an error."""
    ir = digits_calibrated
    clean = list(model_samples(ir, DIGITS_DATA, 3))
    mixed = _with_nan(clean, 1)
    with caplog.at_level("WARNING", logger="qir.passes.numeric_suite"):
        found = ns.compare_on_inputs(None, ir, mixed)
    warned = [r.getMessage() for r in caplog.records if r.name == "qir.passes.numeric_suite"]
    assert len(warned) == 1 and warned[0].startswith("sample 1 is left out of the numeric suite")
    assert found["left_out"] == {"1": "'logits' 10 of 10 values"}
    alone = ns.compare_on_inputs(None, ir, [clean[0], clean[2]])
    assert "left_out" not in alone
    for kind in ("outputs", "stub"):
        assert found[kind].keys() == alone[kind].keys()
        for key, entry in found[kind].items():
            assert entry["sqnr_db"] == alone[kind][key]["sqnr_db"] and all(np.isfinite(entry["sqnr_db"]))
    with pytest.raises(InputError, match="every sample's float outputs hold NaN or Inf"):
        ns.compare_model_outputs(None, ir, *_with_nan(clean[:1], 0))


def test_cli_counts_the_left_out_samples(digits_calibrated, tmp_path, capsys):
    import json

    from qir.tools.cli import main

    model, data = tmp_path / "cal.onnx", tmp_path / "data" / "input"
    qir.save(digits_calibrated, model)
    data.mkdir(parents=True)
    for i, s in enumerate(_with_nan(list(model_samples(digits_calibrated, DIGITS_DATA, 3)), 2)):
        np.save(data / f"{i}.npy", s["input"])
    assert main(["numeric-suite", str(model), str(model), str(data.parent), "-o", str(tmp_path / "ns")]) == 0
    assert "1 of 3 sample(s) left out (NaN or Inf float outputs): 2" in capsys.readouterr().out
    assert (tmp_path / "ns" / "numeric_suite.txt").read_text().startswith("1 sample(s) left out")
    assert json.loads((tmp_path / "ns" / "numeric_suite.json").read_text())["left_out"] == {
        "2": "'logits' 10 of 10 values"}
