"""runall: the five analyses in hmct's order, every output file, and an offline index.html
that points at a planted fault."""
from __future__ import annotations

import base64
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

import qir
from qir.data import model_samples
from qir.passes import PassManager, get_pass
from qir.passes.acc_error import AccErrorReport
from qir.runtimes.engine import configured_clone
from qir.tools.advice import advise, helps
from qir.tools.cli import main
from qir.tools.reports.acc_error import PANEL, dips, plot_curves
from qir.tools.reports.plots import pyplot
from qir.tools.runall import runall

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
DATA = DIGITS / "calibration_data"


def test_runall_writes_everything_and_points_at_the_fault(tmp_path, capsys):
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DATA, method="max", progress=False)(ir)
    victim = ir.calibration("relu3_out_calib")
    victim.threshold = np.float32(float(victim.threshold) / 40)
    ir.touch()
    model = tmp_path / "faulty.onnx"
    qir.save(ir, model)
    out = tmp_path / "debug_result"
    assert main(["runall", str(model), str(DATA), "-s", str(out), "--runtime", "numpy"]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert lines[0].startswith("runall: analysing ") and "time budget" in lines[0]  # all 32, or as many as fit
    assert lines[1].startswith("outputs, worst first: ")  # the headline (no output collapsed here)
    assert [line[:5] for line in lines[2:7]] == ["[1/5]", "[2/5]", "[3/5]", "[4/5]", "[5/5]"]
    for folder, files in {
        "node_sensitivity": ["sensitivity_of_weight.txt", "sensitivity_of_activation.json"],
        "data_distribution": ["relu3_out_calib.png"],
        "channelwise_distribution": ["relu3_out_calib_channelwise.png", "channelwise.txt"],
        "accumulate_error": ["acc_error_cosine-similarity.png", "acc_error.csv"],
        "sensitivity_analysis": ["partial_quantization.png", "sensitivity_analysis.json"],
    }.items():
        for name in files:
            assert (out / folder / name).stat().st_size > 0, (folder, name)
    page = (out / "index.html").read_text()
    assert not re.findall(r'(?:src|href)="(?!data:|#)', page)  # everything embedded (links: in the page)
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) >= 4 and all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert page.count("<table>") >= 3  # weight and activation sensitivity, sensitivity analysis
    advice = re.sub(r"<[^>]+>", "", page[page.index("<h2>Measured fixes"):page.index("<h2>Node sensitivity")])
    assert "relu3_out_calib" in advice and f"qir set-mode {model}" in advice
    assert (out / "advice.json").stat().st_size > 0
    activation = page[page.index("Node sensitivity: activation"):]
    assert activation.index("relu3_out_calib") < activation.index("relu1_out_calib")


# ------------------------------------------------------------------ measured advice (issue 17, items 6 and 7)
def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _score(model, sample) -> float:
    """Output cosine of a calibrated model against itself in float, on one sample: a plain whole-model
    run on each level, computed here without the engine."""
    quantized = qir.run(model, sample, runtime="ort")["logits"]
    return _cosine(quantized, qir.run(model, sample, runtime="ort", level="float")["logits"])


@pytest.fixture(scope="module")
def kl_report(tmp_path_factory):
    """The demo's case: the digits model calibrated with kl (clips relu2/relu3 hard), saved, and runall on it."""
    folder = tmp_path_factory.mktemp("kl")
    ir = qir.load(DIGITS / "model.onnx")
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=DATA, method="kl", progress=False)(ir)
    model = folder / "calibrated_kl.onnx"
    qir.save(ir, model)
    lines: list[str] = []
    report = runall(str(model), str(DATA), save_dir=folder / "debug_result", progress=False, log=lines.append)
    return model, report, lines


def test_advice_is_measured_and_the_first_fix_helps(kl_report):
    model, report, lines = kl_report
    sample = model_samples(qir.load(model), DATA)[0]
    now = _score(qir.load(model), sample)
    assert report["header"]["score"] == pytest.approx(now, abs=1e-6)
    first = report["advice"][0]
    assert first["before"] == pytest.approx(now, abs=1e-6) and first["after"] > now + 0.01 * (1 - now)
    gains = [fix["gain"] for fix in report["advice"]]
    assert gains == sorted(gains, reverse=True)
    assert all(helps(fix["before"], fix["after"]) for fix in report["advice"])
    assert any(line.startswith("- ") and first["command"] in line for line in lines)  # the log shows it


def test_a_fix_that_does_not_help_is_dropped(kl_report):
    """relu2_out_calib clips (threshold ~1, values to ~2.5): int16 keeps the clipping and does not help,
    so it is tried and dropped; the covering fixed threshold helps and is kept."""
    model, report, lines = kl_report
    ir = qir.load(model)
    sample = model_samples(ir, DATA)[0]
    dropped = next(d for d in report["dropped"] if d["changes"] == {"relu2_out_calib": "int16"})
    as_int16 = configured_clone(ir, "quantized", {"relu2_out_calib": "int16"})
    assert dropped["after"] == pytest.approx(_score(as_int16, sample), abs=1e-6)
    assert not helps(dropped["before"], dropped["after"])
    assert all(fix["changes"] != {"relu2_out_calib": "int16"} for fix in report["advice"])
    assert any("tried and dropped" in line and "relu2_out_calib" in line for line in lines)
    kept = next(fix for fix in report["advice"] if list(fix["changes"] or {}) == ["relu2_out_calib"])
    amax = max(float(np.abs(qir.run(ir, sample, runtime="ort", level=level, capture=["relu2_out"])["relu2_out"]).max())
               for level in ("float", "fakequant"))  # what it sees in either model
    threshold = float(kept["changes"]["relu2_out_calib"].lstrip("@"))
    assert kept["cause"] == "clipping" and amax <= threshold < amax * 1.001
    saved = json.loads((model.parent / "debug_result" / "advice.json").read_text())
    assert {json.dumps(d["changes"], sort_keys=True) for d in saved["dropped"]} >= {'{"relu2_out_calib": "int16"}'}


def test_printed_commands_run_and_score_as_claimed(kl_report, monkeypatch):
    model, report, _ = kl_report
    sample = model_samples(qir.load(model), DATA)[0]
    threshold_fix = next(fix for fix in report["advice"] if list(fix["changes"] or {}) == ["relu2_out_calib"])
    for fix in {id(f): f for f in (report["advice"][0], threshold_fix)}.values():
        argv = shlex.split(fix["command"])
        assert argv[0] == "qir" and str(model) in argv and not Path(fix["output"]).exists()
        assert main(argv[1:]) == 0
        assert _score(qir.load(fix["output"]), sample) == pytest.approx(fix["after"], abs=1e-5), fix["command"]


def test_header_names_model_method_march_data_samples_and_score(kl_report):
    model, report, _ = kl_report
    page = (model.parent / "debug_result" / "index.html").read_text()
    head = page[page.index('id="about"'):]
    for field, value in (("model", str(model)), ("calibration method", "kl"), ("march", "nash-e"),
                         ("data", str(DATA)), ("samples analysed", "1"),
                         ("float vs quantized", f"{report['header']['score']:.6f}")):
        assert re.search(f"<th>{re.escape(field)}[^<]*</th><td><code>{re.escape(value)}", head), field
    sa = page[page.index("<h2>Sensitivity analysis"):]
    assert page.index('id="headline"') < page.index('class="toc"') < page.index('id="fixes"') < page.index('id="about"')
    assert "<th>quantizers</th>" in sa and "relu2_out_calib" in sa  # ops named with their quantizers
    assert "relu2_out_calib (feeds dw3, add4)" in page  # and quantizers with their ops


def test_large_accumulated_error_plot_names_the_worst_dips():
    """233 nodes (YOLOv8n's count): panels of at most PANEL nodes, 12 inches wide, and the worst
    dips (planted here) named on the plot."""
    n = 233
    nodes = [f"/model.{i}/Conv" for i in range(n)]
    smooth = list(np.linspace(1.0, 0.99, n))
    curve = list(smooth)
    planted = {40: 0.05, 150: 0.08, 200: 0.02}
    for i, drop in planted.items():
        for j in range(i, n):
            curve[j] -= drop
    report = AccErrorReport(metric="cosine-similarity", average_mode=False, nodes=nodes, values=nodes,
                            curves={"only_activation_calibrated": curve, "only_weight_calibrated": smooth}, engine={})
    worst = dips(report, 3)
    assert [d.node for d in worst] == [nodes[150], nodes[40], nodes[200]]
    fig = plot_curves(report)
    try:
        assert len(fig.axes) == -(-n // PANEL) and fig.get_size_inches()[0] == 12
        named = {t.get_text() for ax in fig.axes for t in ax.texts}
        assert {nodes[i] for i in planted} <= named
    finally:
        pyplot().close(fig)


def test_an_ir_without_its_file_gets_commands_naming_a_placeholder_and_a_note(kl_report):
    model, report, _ = kl_report
    measured = advise(qir.load(model), report, str(DATA), progress=False)
    assert measured["advice"] and all(f["command"].split()[2] == ("FLOAT_MODEL.onnx" if f.get("transform") in (
        "smooth", "equalize") else "CALIBRATED_MODEL.onnx") for f in measured["advice"])
    assert any("model_path=" in note for note in measured["notes"])


@pytest.mark.parametrize("flags, message", [
    (["-dnl", "nope"], "no node named 'nope'"),
    (["-cn", "nope_calib"], "no calibration node named 'nope_calib'"),
    (["-a", "9"], "axis 9 is out of range"),
    (["-qn", "nope"], "no calibration node or op named 'nope'"),
    (["-sn", "nope"], "no calibration node or op named 'nope'"),
])
def test_a_bad_choice_for_a_later_step_fails_before_any_step_runs(tmp_path, capsys, flags, message):
    model = tmp_path / "cal.onnx"
    assert main(["calibrate", str(DIGITS / "model.onnx"), str(DATA), "-o", str(model)]) == 0
    out = tmp_path / "debug"
    assert main(["runall", str(model), str(DATA), "-s", str(out), *flags]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "[1/5]" not in captured.out
    assert not out.exists()  # nothing written: the check runs before step 1


def test_resume_refuses_a_run_asked_something_else(digits_calibrated_file, tmp_path, capsys):
    """--resume continues only the same run: other arguments are named, and --force starts over."""
    out = str(tmp_path / "ra")
    argv = ["runall", digits_calibrated_file, str(DATA), "-s", out, "--runtime", "numpy"]
    assert main([*argv, "-dn", "2"]) == 0
    state = json.loads((tmp_path / "ra" / "runall_state.json").read_text())
    assert state["finished"] and sorted(state["steps"]) == ["1", "2", "3", "4", "5"]
    capsys.readouterr()
    assert main([*argv, "-dn", "3", "--resume"]) == 2
    assert "data_num differ" in capsys.readouterr().err
    assert main([*argv, "-dn", "2", "--resume"]) == 0  # the same run: every step read back
    assert capsys.readouterr().out.count("read back from runall_state.json") == 5


def test_the_advice_order_carries_its_bootstrap_confidence(kl_report):
    model, report, lines = kl_report
    saved = json.loads((model.parent / "debug_result" / "advice.json").read_text())
    one = [fix for fix in report.advice if fix.gain_low is not None]  # (a recalibration has no per-sample gains)
    assert saved["confidence"]["samples"] == report.header.samples == 1 and one and one[0].settled is None
    measured = advise(qir.load(model), report, str(DATA), model_path=str(model), data_num=6, progress=False)
    ranked = [fix for fix in measured.advice if fix.gain_low is not None]
    assert ranked and measured.confidence["samples"] == 6
    for fix in ranked:
        assert fix.gain_low - 1e-12 <= fix.gain <= fix.gain_high + 1e-12
        assert 1 <= fix.rank_low <= fix.rank_high <= len(ranked) and "95% interval" in fix.text
    first = ranked[0]
    assert isinstance(first.settled, bool) and first.text.endswith(first.command)  # (it still pastes)
    assert ("the best fix in" in first.text) == first.settled != ("not settled" in first.text)
