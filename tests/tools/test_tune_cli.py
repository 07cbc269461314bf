"""``qir tune`` on the command line and ``qir.tune`` in Python, on the digits example: the files it
writes, its exit codes (0 reached and verified, 3 not reached, 2 bad input), the reproducing
commands (run here, they rebuild the same models), refusing existing files, and resuming."""
from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

import qir
from qir.tools.cli import main
from qir.tools.reports.tune import FILES

from ..conftest import DIGITS, DIGITS_DATA

MODEL = str(DIGITS / "model.onnx")


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits_eval")
    (folder / "input").mkdir()
    for i, x in enumerate(np.load(DIGITS / "eval_images.npy")[:30]):
        np.save(folder / "input" / f"{i}.npy", x)
    return str(folder)


def _tune(out, eval_dir, target, *extra):
    return main(["tune", MODEL, str(DIGITS_DATA), "--eval", eval_dir, "--target", target, "-s", str(out),
                 "--method", "kl", "--quiet", *extra])


def _states(path):
    ir = qir.load(path)
    return {c.name: (c.mode.value, None if c.threshold is None else np.asarray(c.threshold, np.float32).tolist(),
                     c.fixed) for c in ir.calibrations()}


def test_a_reached_target_writes_every_file_and_the_commands_rebuild_the_result(tmp_path, eval_dir, capsys):
    out = tmp_path / "tuned"
    assert _tune(out, eval_dir, "cosine>=0.9999") == 0
    printed = capsys.readouterr().out
    assert printed.startswith("reached: cosine-similarity>=0.9999") and "verified in onnxruntime" in printed
    report = json.loads((out / "tune_report.json").read_text())
    integer = report["verification"]["integer"]  # the march's integer level meets the target too
    assert integer["meets"] and integer["mean"] >= 0.9999 and report["verification"]["agrees"]
    if "search_target" in report:  # fake quantization alone met it first, the integer level did not: searched again
        assert float(report["search_target"].split(">=")[1]) > 0.9999
        assert "so that it holds at the integer level" in printed
    for name in (*FILES, "tuned_model.onnx", "tuned_model_qdq.onnx", "calibrated_model.onnx", "reproduce/commands.sh"):
        assert (out / name).is_file(), name
    report = json.loads((out / "tune_report.json").read_text())
    assert report["schema"] == "qir.tune" and report["reached"] and report["verification"]["agrees"]
    assert "data:image/png;base64," in (out / "tune_report.html").read_text()
    assert '"name":"precision tune chose"' in (out / "tune_report.html").read_text()  # the graph panel
    # the reproducing commands, run as written, rebuild the tuned model and its emitted form
    commands = (out / "reproduce" / "commands.sh").read_text().splitlines()[2:]
    assert commands == report["commands"] and commands[-1].startswith("qir emit")
    for command in commands:
        assert main(shlex.split(command)[1:]) == 0, command
    assert _states(out / "reproduce" / "tuned_model.onnx") == _states(out / "tuned_model.onnx")
    assert _states(out / "reproduce" / "tuned_model_qdq.onnx") == _states(out / "tuned_model_qdq.onnx")
    tuned = _states(out / "tuned_model.onnx")
    assert tuned != _states(out / "calibrated_model.onnx")  # the commands did change something


def test_an_unreachable_target_exits_3_with_the_best_configuration_and_the_upper_bound(tmp_path, eval_dir, capsys):
    assert _tune(tmp_path / "t", eval_dir, "cosine>=0.99999999") == 3
    printed = capsys.readouterr().out
    assert printed.startswith("NOT REACHED") and "the best configuration found" in printed
    report = json.loads((tmp_path / "t" / "tune_report.json").read_text())
    assert f"The upper bound (every unit at its last integer level) scores {report['upper_bound']['mean']:.6g}" in printed
    assert not report["reached"] and (tmp_path / "t" / "tuned_model.onnx").is_file()


@pytest.mark.parametrize("target", ["cosine=0.9", "cosine<=0.9", "accuracy>=0.9", "cosine>=0.99,worst<=0.98"])
def test_a_bad_target_is_one_line_and_exit_2(tmp_path, eval_dir, target, capsys):
    assert _tune(tmp_path / "t", eval_dir, target) == 2
    err = capsys.readouterr().err
    assert err.startswith("qir: error: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


def test_evaluation_data_that_does_not_fit_is_refused_before_anything_is_written(tmp_path, capsys):
    bad = tmp_path / "bad" / "input"
    bad.mkdir(parents=True)
    np.save(bad / "0.npy", np.zeros((1, 3, 8, 8), np.float32))
    assert _tune(tmp_path / "t", str(tmp_path / "bad"), "cosine>=0.9") == 2
    assert "the evaluation data does not fit the model: sample 0: input 'input' expects" in capsys.readouterr().err
    assert not any((tmp_path / "t").glob("*.onnx"))


def test_check_data_the_search_never_saw_is_scored_as_onnxruntime_scores_the_emitted_model(tmp_path, eval_dir, capsys):
    import onnxruntime as ort

    from qir.metrics import cosine_similarity

    check = tmp_path / "check"
    (check / "input").mkdir(parents=True)
    images = np.load(DIGITS / "eval_images.npy")[100:120]  # (the evaluation data is the first 30)
    for i, x in enumerate(images):
        np.save(check / "input" / f"{i}.npy", x)
    out = tmp_path / "tuned"
    assert _tune(out, eval_dir, "cosine>=0.9999", "--check", str(check)) == 0
    printed = capsys.readouterr().out
    unseen = json.loads((out / "tune_report.json").read_text())["unseen"]
    options = ort.SessionOptions()
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    tuned = ort.InferenceSession(str(out / "tuned_model_qdq.onnx"), options, providers=["CPUExecutionProvider"])
    float_model = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    values = [cosine_similarity(float_model.run(None, {"input": x})[0], tuned.run(None, {"input": x})[0]) for x in images]
    assert unseen["samples"] == 20
    assert unseen["mean"] == pytest.approx(np.mean(values), abs=1e-6) and unseen["worst"] == pytest.approx(min(values), abs=1e-6)
    assert unseen["meets"] == (np.mean(values) >= 0.9999)
    assert "20 check sample(s) the search never saw" in printed and ("holds" if unseen["meets"] else "MISSES") in printed
    np.save(check / "input" / "0.npy", np.zeros((1, 3, 8, 8), np.float32))
    assert _tune(tmp_path / "t2", eval_dir, "cosine>=0.9999", "--check", str(check)) == 2
    assert "the check data does not fit the model: sample 0" in capsys.readouterr().err
    assert not any((tmp_path / "t2").glob("*.onnx"))


def test_existing_files_are_refused_without_force_and_a_resumed_run_measures_nothing_again(tmp_path, eval_dir, capsys):
    out = tmp_path / "t"
    out.mkdir()
    (out / "tune_report.txt").write_text("mine")
    assert _tune(out, eval_dir, "cosine>=0.9999") == 2
    assert "tune_report.txt" in capsys.readouterr().err and (out / "tune_report.txt").read_text() == "mine"
    assert _tune(out, eval_dir, "cosine>=0.9999", "--force") == 0
    first = json.loads((out / "tune_report.json").read_text())
    assert first["engine_calls"] > 0
    assert _tune(out, eval_dir, "cosine>=0.9999", "--force", "--resume") == 0
    again = json.loads((out / "tune_report.json").read_text())
    assert again["engine_calls"] == 0 and again["final"]["mean"] == first["final"]["mean"]
    assert _tune(out, eval_dir, "cosine>=0.999", "--force", "--resume") == 2  # another target: not that run
    assert "holds another tuning run" in capsys.readouterr().err


def test_qir_tune_in_python_takes_a_calibrated_ir_and_leaves_it_alone_and_runs_the_integer_level(eval_dir):
    from tests.conftest import calibrate_for_nash_e

    ir = calibrate_for_nash_e(qir.load(MODEL), DIGITS_DATA, "kl")
    before = {c.name: (c.mode, c.fixed) for c in ir.calibrations()}
    report = qir.tune(ir, DIGITS_DATA, eval_dir, "cosine>=0.9999", progress=False)
    assert report["reached"] and report["verification"]["agrees"] and "model" not in report["verification"]
    integer = report["verification"]["integer"]  # the march's integer level, by default: it meets the target too
    assert integer["march"] == "nash-e" and integer["meets"] and integer["mean"] >= 0.9999
    assert {c.name: (c.mode, c.fixed) for c in ir.calibrations()} == before


def test_a_margin_within_two_standard_errors_is_reached_with_a_caution():
    import statistics

    from qir.passes.tune.report import standard_error
    from qir.tools.reports.tune import outcome

    values = [0.991, 0.985, 0.996, 0.990, float("nan"), 0.993]
    finite = [v for v in values if v == v]
    assert standard_error(values) == pytest.approx(statistics.stdev(finite) / len(finite) ** 0.5)
    error = standard_error(values)

    def report(margin):
        final = {"mean": 0.99 + margin, "worst": 0.985, "margin": margin, "standard_error": error}
        return {"target": "cosine-similarity>=0.99", "samples": 5, "reached": True, "final": final}

    thin, wide = outcome(report(0.5 * error)), outcome(report(2.5 * error))
    assert thin.startswith("reached:") and "CAUTION: the margin" in thin and "0.5 standard error(s)" in thin
    assert "CAUTION" not in wide


def test_the_verification_section_says_onnxruntime_agrees_when_only_the_integer_level_misses():
    from qir.tools.reports.tune import _verification_lines

    ver = {"runtime": "onnxruntime", "mean": 0.997, "worst": 0.9916, "worst_sample": 0, "margin": 0.0066,
           "searched": 0.997, "difference": 0.0, "tolerance": 6e-5, "roundtrip": [], "agrees": False,
           "onnxruntime_agrees": True, "integer": {"march": "nash-e", "mean": 0.995, "worst": 0.976,
                                                   "margin": -0.0085, "meets": False}}
    ort_line, integer_line = _verification_lines(ver)[2:]
    assert ort_line.endswith("agrees") and "DISAGREES" not in ort_line
    assert integer_line.endswith("MISSES the target")
    assert _verification_lines({**ver, "onnxruntime_agrees": False})[2].endswith("DISAGREES")


def test_threads_hold_for_the_calibration_of_a_float_model_too(tmp_path, eval_dir, session_threads):
    assert _tune(tmp_path / "one", eval_dir, "cosine>=0.999", "--threads", "1", "--transforms", "none") == 0
    assert session_threads and set(session_threads) == {1}  # (calibration, the search, verification: one thread each)


def test_a_failed_verification_names_what_the_search_at_the_integer_level_found():
    from qir.execution import Level
    from qir.tools.reports.tune import outcome

    final = {"mean": 0.995, "worst": 0.987, "margin": 0.005, "standard_error": 0.001}
    verification = {"agrees": False, "roundtrip": [], "mean": 0.995, "searched": 0.995,
                    Level.INTEGER: {"meets": False, "mean": 0.9867, "march": "nash-e"}}
    repair = {"raised": ["a_calib", "b_calib"], "found": True,
              "failed_verification": {"onnxruntime": (0.9867, 0.9303), Level.INTEGER: (0.9961, 0.9861)}}
    report = {"target": "cosine-similarity>=0.99,worst>=0.98", "samples": 8, "reached": True, "final": final,
              "verification": verification, "integer_repair": repair, "changes": []}
    line = outcome(report)
    assert line.startswith("VERIFICATION FAILED") and "found 2 raise(s) (a_calib, b_calib)" in line
    assert "meet it there (0.9961, worst 0.9861), but with them the emitted model scores 0.9867 (worst 0.9303)" in line
    assert "found 2 raise" not in outcome({**report, "integer_repair": {**repair, "failed_verification": None}})
