"""The consistency pass and ``qir consistency``: fake quantization against the integer level on
the digits example."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.kinds import CalibMode, CalibRole
from qir.passes.consistency import ConsistencyPass
from qir.runtimes.march import get_profile
from qir.tools.cli.app import main

from ..conftest import DIGITS, DIGITS_DATA


def _samples(n: int = 3) -> list[dict]:
    return [{"input": im} for im in np.load(DIGITS / "eval_images.npy")[:n].astype(np.float32)]


def test_rows_cover_every_integer_activation_and_name_where_deviation_starts(digits_calibrated):
    report = ConsistencyPass(_samples(), "nash-e")(digits_calibrated).report
    quantized = [c.name for c in digits_calibrated.calibrations(CalibRole.ACTIVATION) if c.mode is CalibMode.INT8]
    assert [r["node"] for r in report["rows"]] == quantized
    starts = [r for r in report["rows"] if r["introduced"]]
    assert starts and all(r["cause"] == "requant rounding" for r in starts)
    first = next(r for r in report["rows"] if r["differ"])
    assert first["introduced"]  # the first value that differs is where a deviation starts
    assert all(r["cause"] == "inherited" for r in report["rows"] if r["differ"] and not r["introduced"])
    rows = {r["node"]: r for r in report["rows"]}
    # from the same input codes, data movement is exact and one requantization is off by one step at most
    assert rows["pool4_out_calib"]["own_max_step"] == rows["flatten_out_calib"]["own_max_step"] == 0
    assert all(r["own_max_step"] <= 1 for r in report["rows"])
    # a deviation that only grows downstream is inherited: the total exceeds what the node adds
    assert any(r["max_step"] > r["own_max_step"] for r in report["rows"])
    assert report["rows"][0]["node"] == "input_calib" and report["rows"][0]["differ"] == 0  # same quantizer
    assert 0.999 < min(report["output_cosine"]) < 1.0
    assert report["bad_case"] == int(np.argmin(report["output_cosine"]))
    assert "rounding-level differences" in report["summary"]


def test_ops_without_integer_kernel_are_listed(digits_calibrated):
    profile = get_profile("nash-e").with_overrides(integer_ops=("Conv", "Relu", "MaxPool", "GlobalAveragePool",
                                                                "Flatten"))
    report = ConsistencyPass(_samples(2), profile)(digits_calibrated).report
    assert list(report["float_fallback"]) == ["Gemm"]  # (the Add is fused into pw4's accumulator)
    assert "Gemm (1)" in __import__("qir.tools.reports.consistency", fromlist=["x"]).format_report(
        ConsistencyPass(_samples(2), profile).compare(digits_calibrated))


def test_cli_writes_the_report_and_keeps_existing_files(tmp_path, digits_calibrated, capsys):
    import qir

    model = tmp_path / "calibrated.onnx"
    qir.save(digits_calibrated, model)
    out = tmp_path / "cons"
    assert main(["consistency", str(model), str(DIGITS_DATA), "-n", "2", "-s", str(out)]) == 0
    text = capsys.readouterr().out
    assert "where deviations are introduced" in text and (out / "consistency_result.txt").read_text() in text
    doc = json.loads((out / "consistency_result.json").read_text())
    assert doc["samples"] == 2 and len(doc["rows"]) == 8
    (out / "consistency_result.txt").write_text("mine")
    assert main(["consistency", str(model), str(DIGITS_DATA), "-n", "2", "-s", str(out)]) != 0
    assert (out / "consistency_result.txt").read_text() == "mine"
    assert "already exist" in capsys.readouterr().err


def test_forced_values_feed_the_readers_and_captures_return_what_the_run_computed(digits_calibrated):
    from qir.runtimes.integer import IntegerRuntime
    ir, sample = digits_calibrated, _samples(1)[0]
    outputs = {c.name: c.output for c in ir.calibrations(CalibRole.ACTIVATION) if c.mode is CalibMode.INT8}
    fake = qir.run(ir, sample, level="fakequant", capture=list(outputs.values()))
    rt = IntegerRuntime("nash-e")
    plain = rt.run(ir, sample, capture=list(outputs.values()))
    forced = rt.run(ir, sample, capture=list(outputs.values()), forced={n: fake[v] for n, v in outputs.items()})
    # relu4 forced to fake-quant codes: the MaxPool after it moves exactly those codes
    assert np.array_equal(forced[outputs["pool4_out_calib"]], fake[outputs["pool4_out_calib"]])
    assert not np.array_equal(plain[outputs["pool4_out_calib"]], fake[outputs["pool4_out_calib"]])
    # a captured forced node is what its own segment computed: relu1 reads only the (equal) input codes
    assert np.array_equal(forced[outputs["relu1_out_calib"]], plain[outputs["relu1_out_calib"]])
    mixed = ir.clone()
    mixed.set_calibration("relu2_out_calib", mode="float")
    with pytest.raises(qir.errors.QirError, match="integer calibration"):
        rt.run(mixed, sample, forced={"relu2_out_calib": fake[outputs["relu2_out_calib"]]})


def test_a_sample_with_nan_values_is_left_out_with_a_warning(digits_calibrated, caplog):
    """Issue 17 item 1 here: a NaN pixel made every code garbage (max step 2**63); that sample is
    named and left out, the rows are those of the other samples alone; none left is an error."""
    clean = _samples()
    mixed = [dict(s) for s in clean]
    mixed[1] = {"input": clean[1]["input"].copy()}
    mixed[1]["input"].flat[3] = np.nan
    with caplog.at_level("WARNING", logger="qir.passes.consistency"):
        report = ConsistencyPass(mixed, "nash-e")(digits_calibrated).report
    assert "sample 1 is left out of the consistency check" in caplog.text
    assert list(report["left_out"]) == ["1"] and report["output_cosine"][1] is None
    alone = ConsistencyPass([clean[0], clean[2]], "nash-e")(digits_calibrated).report
    assert report["rows"] == alone["rows"] and report["summary"] == alone["summary"]
    assert [report["output_cosine"][i] for i in (0, 2)] == alone["output_cosine"]
    assert report["bad_case"] == (0, 2)[alone["bad_case"]]
    with pytest.raises(qir.errors.InputError, match="every sample's fake-quantized values hold NaN"):
        ConsistencyPass([mixed[1]], "nash-e")(digits_calibrated)
