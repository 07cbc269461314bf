"""The `qir` command line: commands work, errors are one line with exit code 2."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qir.tools.cli import main

from ..conftest import REPO

DIGITS = REPO / "qir" / "examples" / "digits"
MODEL = str(DIGITS / "model.onnx")


def test_dump_text_json_dot(capsys, tmp_path):
    assert main(["dump", MODEL]) == 0
    text = capsys.readouterr().out
    assert text.startswith('qir "digits_cnn" opset=17') and "fc: %logits : f32[1,10] = Gemm(" in text
    assert main(["dump", MODEL, "--format", "json", "-o", str(tmp_path / "m.json")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["schema"] == "qir.ir"
    assert main(["dump", MODEL, "--format", "dot", "-o", str(tmp_path / "m.dot")]) == 0
    assert (tmp_path / "m.dot").read_text().startswith("digraph")


def test_outputs_are_never_silently_overwritten(capsys, tmp_path):
    target = tmp_path / "mine.txt"
    target.write_text("precious")
    assert main(["dump", MODEL, "-o", str(target)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert target.read_text() == "precious"
    assert main(["dump", MODEL, "-o", str(target), "--force"]) == 0


def test_run_prints_stats_and_saves_outputs(capsys, tmp_path):
    out = tmp_path / "o.npz"
    assert main(["run", MODEL, str(DIGITS / "calibration_data"), "--runtime", "ort", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "32 sample(s)" in printed and "logits  1x10" in printed
    with np.load(out) as npz:
        assert len(npz.files) == 32 and npz["logits/0"].shape == (1, 10)


@pytest.mark.parametrize("argv, message", [
    (["dump", "missing.onnx"], "model file not found: missing.onnx"),
    (["run", MODEL, "nowhere"], "data not found: nowhere"),
    (["run", MODEL, MODEL], "unsupported data file"),
    (["dump", MODEL, "--input-shape", "nope=1,1,8,8"], "no model input named 'nope'"),
    (["dump", MODEL, "--format", "svg"], "needs -o PATH"),
])
def test_user_errors_are_one_line_and_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("qir: error: ") and message in err and "\n" not in err


def test_corrupt_model_and_bad_data_shape(capsys, tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert main(["dump", str(bad)]) == 2
    assert "not a readable ONNX model" in capsys.readouterr().err
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 1, 9, 9), np.float32))
    assert main(["run", MODEL, str(tmp_path / "x.npy"), "--runtime", "ort"]) == 2
    assert "expects shape [1,1,8,8]" in capsys.readouterr().err


def test_console_script_entry_point_runs_as_a_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "qir", "dump", str(tmp_path / "nope.onnx")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"qir: error: model file not found: {tmp_path / 'nope.onnx'}"
    assert "Traceback" not in proc.stderr


def test_run_output_gets_the_npz_suffix_and_is_not_overwritten(capsys, tmp_path):
    data = str(DIGITS / "calibration_data")
    assert main(["run", MODEL, data, "--runtime", "ort", "-o", str(tmp_path / "out"), "--limit", "2"]) == 0
    assert (tmp_path / "out.npz").exists() and f"wrote {tmp_path / 'out.npz'}" in capsys.readouterr().out
    assert main(["run", MODEL, data, "--runtime", "ort", "-o", str(tmp_path / "out")]) == 2
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["run", MODEL, data, "--limit", "0"])
    assert exc.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_json_dump_is_strict_json_with_infinite_weights(tmp_path, capsys):
    import qir
    ir = qir.load(MODEL)
    ir.add_weight("mask", np.array([0.0, -np.inf], np.float32))
    doc = json.loads(json.dumps(ir.to_json(), allow_nan=False))
    mask = {v["name"]: v for v in doc["values"]}["mask"]
    assert mask["data"] == [0.0, "-inf"] and mask["stats"]["min"] == "-inf"


def test_demo_runs_the_whole_workflow(capsys, tmp_path):
    assert main(["demo", "--runtime", "ort", "-o", str(tmp_path / "demo")]) == 0
    out = capsys.readouterr().out
    assert "fc: %logits : f32[1,10] = Gemm(" in out and "accuracy 1.0000" in out
    repair = next(line for line in out.splitlines() if line.startswith("repair"))
    before, after = (float(x) for x in re.findall(r"accuracy ([0-9.]+) -> ([0-9.]+)", repair)[0])
    assert after > before  # the repaired model recovers accuracy the debugger located
    assert (tmp_path / "demo" / "debug_result" / "index.html").exists()
    assert (tmp_path / "demo" / "repaired.onnx").exists()
    # the measured advice, its first fix naming the file the demo wrote (not calibrated_model.onnx)
    tips = out[out.index("what to try next"):].splitlines()[1:]
    first = re.search(r"output cosine ([0-9.]+) -> ([0-9.]+) \([+-][0-9.]+\): (qir .*)$", tips[0])
    assert first and float(first[2]) > float(first[1])
    assert first[3].split()[2] == str(tmp_path / "demo" / "calibrated_kl.onnx")
    # the deployment check: integer-level accuracy and the consistency report it wrote
    deploy = next(line for line in out.splitlines() if line.startswith("deploy"))
    integer, fake = (float(x) for x in re.findall(r"accuracy ([0-9.]+) \(fake quantization ([0-9.]+)\)", deploy)[0])
    assert abs(integer - fake) <= 0.02
    report = json.loads((tmp_path / "demo" / "consistency" / "consistency_result.json").read_text())
    assert report["march"] == "nash-e" and report["rows"]
    # issue 32 item 8: no line says what is not so
    assert "with -o)" not in out and f"the full text goes to {tmp_path / 'demo' / 'model.qir.txt'}" in out
    wrote = out.splitlines()[-1]
    for entry in ("repaired.onnx", "debug_result/", "consistency/", "calibrated_mix.onnx", "model.qir.txt"):
        assert entry in wrote, wrote
    assert "float fallback" in repair and "not runall's best measured fix" in out


def test_calibrate_set_mode_and_emit_from_the_command_line(tmp_path, capsys):
    data = str(DIGITS / "calibration_data")
    cal, partial, emitted = (str(tmp_path / n) for n in ("cal.onnx", "partial.onnx", "emitted.onnx"))
    assert main(["calibrate", MODEL, data, "-o", cal, "--method", "mse"]) == 0
    assert main(["set-mode", cal, "-o", partial, "--nodes", "conv2,/model.99/*", "--mode", "int16"]) == 2
    assert "matches '/model.99/*'" in capsys.readouterr().err and not Path(partial).exists()
    assert main(["set-mode", cal, "-o", partial, "--mode", "int16"]) == 2  # no selector: --all or a choice
    assert "--all for every one" in capsys.readouterr().err and not Path(partial).exists()
    assert main(["set-mode", cal, "-o", partial, "--nodes", "conv2", "--mode", "int16"]) == 0
    import qir
    modes = {c.name: c.mode.value for c in qir.load(partial).calibrations()}
    assert modes["conv2.weight_calib"] == modes["relu1_out_calib"] == "int16"
    assert list(modes.values()).count("int16") == 2
    assert main(["emit", partial, "-o", emitted, "--float", "fc"]) == 0
    assert "int16: 2" in capsys.readouterr().out
    assert main(["set-mode", cal, "-o", str(tmp_path / "x.onnx"), "--nodes", "conv22", "--mode", "int16"]) == 2
    assert "did you mean 'conv2'" in capsys.readouterr().err
    everything = str(tmp_path / "all_float.onnx")
    assert main(["set-mode", cal, "-o", everything, "--all", "--mode", "float"]) == 0
    assert {c.mode.value for c in qir.load(everything).calibrations()} == {"float"}


def _calibrated(tmp_path):
    """The digits data folder and the model calibrated by `qir calibrate` into tmp_path."""
    data = str(DIGITS / "calibration_data")
    calibrated = tmp_path / "cal.onnx"
    assert main(["calibrate", MODEL, data, "-o", str(calibrated)]) == 0
    return data, calibrated


def test_evaluate_ranks_variants_writes_files_and_resumes(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    out = tmp_path / "eval"
    args = ["evaluate", str(calibrated), data, "-o", str(out), "--data-num", "3", "--metrics", "mse,cosine-similarity",
            "--quiet", "--runtime", "numpy"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    rows = (out / "variants.csv").read_text().splitlines()
    assert rows[0] == "rank,variant,mse,cosine-similarity" and len(rows) == 1 + 8
    mses = [float(r.split(",")[2]) for r in rows[1:]]
    assert mses == sorted(mses, reverse=True) and mses[0] > 0  # worst (largest error) first
    assert rows[1].split(",")[1] in printed
    assert json.loads((out / "engine_stats.json").read_text())["steps_run"] > 0
    assert main(args) == 2 and "--resume" in capsys.readouterr().err  # never silently overwritten
    assert main(args + ["--resume"]) == 0
    assert (out / "variants.csv").read_text().splitlines() == rows
    variants = tmp_path / "v.json"
    variants.write_text(json.dumps({"both": {"relu1_out_calib": "int16", "relu2_out_calib": "int8"}}))
    assert main(args + ["--variants", str(variants), "--force"]) == 0
    assert (out / "variants.csv").read_text().splitlines()[1].startswith("1,both,")
    variants.write_text("[1, 2]")
    assert main(args + ["--variants", str(variants), "--force"]) == 2
    assert "expected" in capsys.readouterr().err


def test_evaluate_batches_variants_on_onnxruntime(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    tables = {}
    for batch in ("1", "3"):
        out = tmp_path / f"batch{batch}"
        assert main(["evaluate", str(calibrated), data, "-o", str(out), "--data-num", "2", "--quiet",
                     "--metrics", "mse", "--batch", batch]) == 0
        stats = json.loads((out / "engine_stats.json").read_text())
        assert stats["batch"] == int(batch) and stats["steps_run"] == 0
        tables[batch] = (out / "variants.csv").read_text()
    assert tables["1"] == tables["3"]  # rows of one call give what one call per variant gives
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", str(calibrated), data, "-o", str(tmp_path / "x"), "--batch", "0"])
    assert exit_.value.code == 2 and "positive integer" in capsys.readouterr().err


def test_sensitivity_hmct_flags_and_list_syntax(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    capsys.readouterr()
    save = tmp_path / "ns"
    assert main(["get-sensitivity-of-nodes", str(calibrated), data, "-m", "['cosine-similarity','mse']",
                 "-n", "activation", "-d", "2", "-v", "True", "-s", str(save)]) == 0
    out = capsys.readouterr().out
    assert "threshold" in out and "bit" in out and "mse" in out
    assert sorted(p.name for p in save.iterdir()) == ["node_sensitivity.csv", "node_sensitivity.json",
                                                      "node_sensitivity.txt"]
    assert main(["sensitivity", str(calibrated), data, "-i", "['conv2','fc']", "-s", str(save), "--runtime", "numpy",
                 "--force"]) == 0
    assert json.loads((save / "node_sensitivity.json").read_text())["rows"][0]["node"] in ("conv2", "fc")
    assert main(["sensitivity", str(calibrated), data, "-i", "['conv2'", "-s", str(save)]) == 2
    assert "cannot read the list" in capsys.readouterr().err


def test_acc_error_from_the_command_line(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    save = tmp_path / "acc"
    assert main(["plot-acc-error", str(calibrated), data, "-q", "[['conv1'],['conv1','conv2']]", "-a", "True",
                 "-s", str(save)]) == 0
    out = capsys.readouterr().out
    assert "conv1+conv2" in out and (save / "acc_error_cosine-similarity.png").stat().st_size > 10_000
    assert main(["acc-error", str(calibrated), data, "-nq", "['conv2']", "-m", "mse", "-s", str(save), "--force"]) == 0
    assert main(["acc-error", str(calibrated), data, "-s", str(save), "--force"]) == 2


def test_distribution_and_channelwise_from_the_command_line(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    assert main(["plot-distribution", str(calibrated), data, "-n", "['relu1_out_calib','conv2']", "-s",
                 str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "conv2.png").exists()
    assert main(["get-channelwise-data-distribution", str(calibrated), data, "-n", "conv2.weight_calib", "-s",
                 str(tmp_path / "c")]) == 0
    assert "32 channels on axis 0" in capsys.readouterr().out


def test_sensitivity_analysis_from_the_command_line(tmp_path, capsys):
    data, calibrated = _calibrated(tmp_path)
    capsys.readouterr()
    assert main(["sensitivity-analysis", str(calibrated), data, "-sn", "['conv2','fc']", "-s", str(tmp_path / "sa")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("conv2: only it quantized") and (tmp_path / "sa" / "partial_quantization.png").exists()
    assert main(["sensitivity-analysis", str(calibrated), data, "-p", "0.5", "-s", str(tmp_path / "sb")]) == 0
    assert "nothing to analyse" in capsys.readouterr().out


def test_pipeline_emit_step_writes_the_qdq_model_where_it_says(tmp_path):
    """`emit{path=...}` in `qir pipeline`: the pass only returns the model, the command writes it;
    an existing file is kept unless --force."""
    import onnx

    data, calibrated = _calibrated(tmp_path)
    qdq = tmp_path / "qdq.onnx"
    args = ["pipeline", str(calibrated), f"set-mode{{nodes='conv2',mode=int16}},emit{{path='{qdq}'}}",
            "-o", str(tmp_path / "partial.onnx")]
    assert main(args) == 0
    ops = [n.op_type for n in onnx.load(str(qdq)).graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    before = qdq.read_bytes()
    assert main(args[:-2] + ["-o", str(tmp_path / "partial2.onnx")]) == 2  # qdq.onnx exists
    assert qdq.read_bytes() == before
    assert main(args[:-2] + ["-o", str(tmp_path / "partial3.onnx"), "--force"]) == 0


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-5", "lots"])
def test_evaluate_memory_budget_must_be_a_finite_positive_number(budget, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", MODEL, str(DIGITS / "calibration_data"), "-o", str(tmp_path / "e"), "--memory-budget", budget])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--memory-budget: must be a" in err and "number above 0" in err
    assert not (tmp_path / "e").exists()
