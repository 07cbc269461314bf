"""The bad-input corpus, part 1 (issue 17, "Done when"): models that are not ONNX and data that
does not fit, fed to every command that reads them, and NaN samples. Every case ends in one clear
error naming the file (exit code 2, no traceback, no internal error, nothing written, no pickle
payload run) or in documented handling: a NaN sample is named in a warning and left out of what
compares outputs; data with nothing finite to compare is one clear error. Part 2
(``test_bad_inputs_flags.py``): list strings, numbers and output paths."""
from __future__ import annotations

import csv
import json
import shutil

import pytest

from .bad_inputs import (
    COMMANDS,
    FLOAT_MODEL,
    MODEL,
    TAKES_DATA,
    argv,
    files,
    make_data,
    make_models,
    nan_data,
    one_clear_error,
    run_cli,
)


@pytest.fixture(scope="module")
def calibrated(digits_calibrated_file) -> str:
    return digits_calibrated_file


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    return make_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("data"))


MODEL_KINDS = {"empty": "holds no ONNX graph", "garbage": "not a readable ONNX model",
               "truncated": "not a readable ONNX model", "text": "not a readable ONNX model",
               "directory": "is a directory", "missing": "model file not found"}


@pytest.mark.parametrize("kind", list(MODEL_KINDS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_model_that_is_not_onnx_is_one_clear_error(command, kind, bad_models, tmp_path, capsys):
    model = bad_models[kind]
    code, _, err = run_cli(argv(command, model, MODEL if command in FLOAT_MODEL else "unused", tmp_path / "out"),
                           capsys)
    if command in TAKES_DATA and command not in FLOAT_MODEL:  # (the data is read after the model)
        code, _, err = run_cli(argv(command, model, str(tmp_path), tmp_path / "out"), capsys)
    one_clear_error(code, err, str(model), MODEL_KINDS[kind])
    assert files(tmp_path / "out") == {}


def test_a_model_file_is_read_by_its_content_not_its_extension(tmp_path, capsys):
    """Documented handling: qir reads ONNX from any file name (the content decides)."""
    renamed = tmp_path / "model.txt"
    renamed.write_bytes(open(MODEL, "rb").read())
    code, out, _ = run_cli(["dump", renamed], capsys)
    assert code == 0 and 'qir "digits_cnn"' in out


NEEDS_CALIBRATION = ["set-mode", "emit", "evaluate", "sensitivity", "acc-error", "channelwise",
                     "sensitivity-analysis", "runall", "consistency", "bad-case", "compare", "numeric-suite"]


@pytest.mark.parametrize("command", NEEDS_CALIBRATION)
def test_a_float_model_where_a_calibrated_one_is_needed_is_one_clear_error(command, tmp_path, capsys):
    code, _, err = run_cli(argv(command, MODEL, MODEL.replace("model.onnx", "calibration_data"), tmp_path / "out"),
                           capsys)
    line = one_clear_error(code, err, "calibration node")
    assert "calibrate it first" in line or "no weight calibration node" in line
    assert files(tmp_path / "out") == {}


@pytest.mark.parametrize("kind", ["missing", "empty folder", "no input sub-folder", "empty input sub-folder",
                                  "wrong shape", "wrong rank", "int64 dtype", "string dtype", "pickle in a folder",
                                  "pickle .npy", "pickle .npz", "corrupt .npy", "truncated .npy", "text as .npy",
                                  "corrupt .npz", "empty .npz", "no input in .npz", "a model as data"])
@pytest.mark.parametrize("command", TAKES_DATA)
def test_data_that_does_not_fit_is_one_clear_error(command, kind, bad_data, calibrated, tmp_path, capsys):
    cases, marker = bad_data
    data, says = cases[kind]
    model = MODEL if command in FLOAT_MODEL else calibrated
    code, _, err = run_cli(argv(command, model, data, tmp_path / "out"), capsys)
    line = one_clear_error(code, err, says)
    assert (str(data) in line or "input 'input'" in line), line  # names the file, or the input it does not fit
    assert not marker.exists()  # the pickle payload never ran
    assert files(tmp_path / "out") == {}


COMPARES_OUTPUTS = ["evaluate", "sensitivity", "acc-error", "sensitivity-analysis", "runall", "bad-case", "compare",
                    "numeric-suite", "consistency"]


@pytest.mark.parametrize("command", TAKES_DATA)
def test_a_nan_sample_is_named_in_a_warning(command, calibrated, tmp_path, capsys, caplog):
    """Issue 17 item 1: a sample with a NaN pixel never passes silently. Every command names it;
    those that compare outputs leave it out and say so."""
    data = nan_data(tmp_path / "nan")
    model = MODEL if command in FLOAT_MODEL else calibrated
    with caplog.at_level("WARNING"):
        code, _, err = run_cli(argv(command, model, data, tmp_path / "out"), capsys)
    assert code == 0, err
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith(f"sample 1 of {data} holds NaN or Inf in its inputs") for w in warnings), warnings
    assert not any(w.startswith(("sample 0 ", "sample 2 ")) for w in warnings), warnings
    if command in COMPARES_OUTPUTS:
        assert any("sample 1" in w and "left out" in w for w in warnings), warnings


def _rows(folder, name: str) -> list[list[str]]:
    with open(folder / name) as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("command, table", [("evaluate", "variants.csv"), ("sensitivity", "node_sensitivity.csv"),
                                            ("bad-case", "badcase.json"), ("numeric-suite", "numeric_suite.json")])
def test_a_nan_sample_leaves_the_other_samples_results_as_they_are(command, table, calibrated, tmp_path, capsys):
    """No silent garbage: with the NaN sample left out, the tables equal those of the clean
    samples alone (0 and 2), apart from the record of what was left out."""
    mixed = nan_data(tmp_path / "mixed")
    clean = tmp_path / "clean" / "input"
    clean.mkdir(parents=True)
    for new, old in ((0, 0), (1, 2)):
        shutil.copy(mixed / "input" / f"{old}.npy", clean / f"{new}.npy")
    tables = []
    for data, out in ((mixed, tmp_path / "a"), (clean.parent, tmp_path / "b")):
        code, _, err = run_cli(argv(command, calibrated, data, out), capsys)
        assert code == 0, err
        tables.append(_rows(out, table) if table.endswith(".csv") else json.loads((out / table).read_text()))
    if command == "bad-case":
        assert tables[0].pop("left_out") == {"1": "'logits' 10 of 10 values"}
        for report in tables:  # sample indices differ (2 is 1 in the clean folder); the values do not
            report["values"] = {o: {m: [v for v in vs if v != "nan"] for m, vs in per.items()}
                                for o, per in report["values"].items()}
            for key in ("bad_case", "worst_output", "chosen", "samples"):
                report.pop(key)
    if command == "numeric-suite":
        assert tables[0].pop("left_out") == {"1": "'logits' 10 of 10 values"}
    assert tables[0] == tables[1]


@pytest.mark.parametrize("command", COMPARES_OUTPUTS + ["calibrate", "pipeline"])
def test_data_with_nothing_finite_is_one_clear_error(command, calibrated, tmp_path, capsys):
    data = nan_data(tmp_path / "nan", count=2, bad=(0, 1), everywhere=True)
    model = MODEL if command in FLOAT_MODEL else calibrated
    code, _, err = run_cli(argv(command, model, data, tmp_path / "out"), capsys)
    line = one_clear_error(code, err, "NaN")
    assert "every sample" in line or "only non-finite values" in line
