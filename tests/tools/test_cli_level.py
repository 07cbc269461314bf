"""``--level`` and ``--march`` on the commands that run models (``qir run``, ``evaluate``,
``sensitivity``/``get-sensitivity-of-nodes``, ``compare``), and ``qir compare --consistency``."""
from __future__ import annotations

import json

import numpy as np
import pytest

import qir
from qir.tools.cli import main

from ..conftest import DIGITS

DATA = str(DIGITS / "calibration_data")


@pytest.fixture(scope="module")
def calibrated(digits_calibrated, tmp_path_factory):
    path = tmp_path_factory.mktemp("level") / "cal.onnx"
    qir.save(digits_calibrated, path)
    return str(path)


def _cos(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_run_at_the_integer_level(calibrated, tmp_path, capsys):
    got = {}
    for level in ("integer", "fakequant"):
        out = tmp_path / f"{level}.npz"
        assert main(["run", calibrated, DATA, "--level", level, "--limit", "4", "-o", str(out)]
                    + (["--march", "nash-e"] if level == "integer" else [])) == 0
        with np.load(out) as npz:
            got[level] = {k: npz[k] for k in npz.files}
    assert "on the numpy runtime at the integer level of nash-e" in capsys.readouterr().out
    ir = qir.load(calibrated)
    samples = qir.data.load_samples(DATA, ir.inputs)
    name = ir.outputs[0]
    for i in range(4):
        integer, fake = got["integer"][f"{name}/{i}"], got["fakequant"][f"{name}/{i}"]
        assert np.array_equal(integer, qir.run(ir, samples[i], level="integer", march="nash-e")[name])
        assert not np.array_equal(integer, fake) and _cos(integer, fake) > 0.99


@pytest.mark.parametrize("command", ["sensitivity", "get-sensitivity-of-nodes"])
def test_sensitivity_at_the_integer_level_writes_its_table(calibrated, tmp_path, capsys, command):
    save = tmp_path / "ns"
    assert main([command, calibrated, DATA, "--level", "integer", "--march", "nash-m", "-s", str(save)]
                + (["-v"] if command == "sensitivity" else ["-v", "True"])) == 0
    printed = capsys.readouterr().out
    assert "node sensitivity (integer level, nash-m)" in printed and "at the integer level of nash-m" in printed
    report = json.loads((save / "node_sensitivity.json").read_text())
    assert (report["level"], report["march"]) == ("integer", "nash-m")
    ir = qir.load(calibrated)
    assert {r["node"] for r in report["rows"]} == {op.name for op in ir.ops()
                                                   if any(c.feeds and op.name in c.feeds for c in ir.calibrations())}


def test_evaluate_resume_refuses_results_of_another_level(calibrated, tmp_path, capsys):
    out = tmp_path / "ev"
    args = ["evaluate", calibrated, DATA, "-o", str(out), "--data-num", "2", "--quiet", "--metrics", "mse"]
    assert main(args + ["--level", "integer"]) == 0
    assert "at the integer level of nash-e" in capsys.readouterr().out
    assert main(args + ["--level", "integer", "--resume"]) == 0
    assert main(args + ["--resume"]) == 2
    assert "different analysis" in capsys.readouterr().err
    assert main(args + ["--level", "integer", "--march", "nash-p", "--resume"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["run", "{model}", DATA, "--level", "integer", "--runtime", "ort"], "--level integer runs on the numpy runtime"),
    (["sensitivity", "{model}", DATA, "--level", "integer", "--runtime", "ort", "-s", "{tmp}"],
     "--level integer runs on the numpy runtime"),
    (["evaluate", "{model}", DATA, "-o", "{tmp}", "--march", "nash-e"], "--march nash-e applies to --level integer"),
    (["run", "{model}", DATA, "--level", "integer", "--march", "nash-x"], "no march profile named 'nash-x'"),
])
def test_level_misuse_is_one_clear_error(calibrated, tmp_path, capsys, argv, message):
    argv = [a.format(model=calibrated, tmp=tmp_path / "out") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qir: error: ") and message in err and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_evaluate_refuses_the_float_level(calibrated, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", calibrated, DATA, "-o", str(tmp_path / "x"), "--level", "float"])
    assert exit_.value.code == 2 and "invalid choice: 'float'" in capsys.readouterr().err


def test_compare_at_the_integer_level_runs_the_analysis_model_as_the_npu(calibrated, tmp_path, capsys):
    from qir import metrics as qmetrics

    got = {}
    for level in ("integer", "fakequant"):
        out = tmp_path / level
        assert main(["compare", calibrated, calibrated, DATA, "-o", str(out), "-n", "4", "--no-sensitivity",
                     "--level", level]) == 0
        got[level] = json.loads((out / "badcase.json").read_text())["values"]
    assert "at the integer level of nash-e" in capsys.readouterr().out
    ir = qir.load(calibrated)
    name, samples = ir.outputs[0], qir.data.load_samples(DATA, ir.inputs)
    for i in range(4):  # baseline: the model in float; analysis: the same model at nash-e's integer level
        base = qir.run(ir, samples[i], level="float")[name]
        integer = qir.run(ir, samples[i], level="integer", march="nash-e")[name]
        assert got["integer"][name]["MSE"][i] == pytest.approx(qmetrics.compute(["mse"], base, integer)["mse"],
                                                                 rel=1e-9)
    assert got["integer"][name]["MSE"] != got["fakequant"][name]["MSE"]
    layers = json.loads((tmp_path / "integer" / "compare_per_layer_out.json").read_text())
    assert layers  # the layer table of the integer run is written


def test_compare_consistency_writes_the_consistency_table_of_the_bad_case(calibrated, tmp_path, capsys):
    from qir.tools.consistency import check_consistency
    from qir.tools.reports.bad_case import load_bad_case

    out = tmp_path / "cmp"
    argv = ["compare", calibrated, calibrated, DATA, "-o", str(out), "-n", "4", "--no-sensitivity", "--consistency",
            "--march", "nash-m"]
    assert main(argv) == 0
    assert "fake quantization vs nash-m's integer level on the bad case" in capsys.readouterr().out
    report = json.loads((out / "consistency_result.json").read_text())
    assert (out / "consistency_result.txt").read_text().startswith("fake quantization vs the integer level of nash-m")
    expected = check_consistency(calibrated, [load_bad_case(out / "badcase.npz")], march="nash-m")
    assert report["rows"] == json.loads(json.dumps(expected.to_json()["rows"])) and report["samples"] == 1
    assert json.loads((out / "compare.json").read_text())["consistency"]["march"] == "nash-m"
    # the consistency files follow the rule of every output: planned, refused before any work without --force
    (out / "consistency_result.txt").write_text("mine")
    other = tmp_path / "other"
    other.mkdir()
    (other / "consistency_result.txt").write_text("mine")
    assert main(argv[:5] + [str(other)] + argv[6:]) == 2
    assert "already exists" in capsys.readouterr().err
    assert sorted(p.name for p in other.iterdir()) == ["consistency_result.txt"]
    assert main(argv + ["--force"]) == 0 and (out / "consistency_result.txt").read_text() != "mine"
