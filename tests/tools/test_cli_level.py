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
