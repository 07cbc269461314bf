"""tune's transforms stage: a transform that makes all-int8 better is kept before any precision is
raised (and saves the raises it makes unneeded); one that changes nothing is not; a calibrated
model is rebuilt as it was calibrated; the files say what was kept and the commands rebuild it."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest

import qir
from qir.passes import get_pass
from qir.passes.tune.space import Space
from qir.passes.tune.target import parse_target
from qir.passes.tune.transforms import choose_transforms, float_model, rebuild
from qir.runtimes.march import get_profile
from qir.tools.reports.tune import format_report

from ..conftest import calibrate_for_nash_e
from .test_bias_correct import depthwise, samples

NASH_E = get_profile("nash-e")


def _space(ir):
    return Space(ir, NASH_E)


def _cosine(ir, data):
    """All-int8 mean cosine of ``ir`` against the float depthwise model, on ``data``."""
    ref = depthwise()
    return float(np.mean([qir.metrics.cosine_similarity(qir.run(ref, s, level="float")["y"], qir.run(ir, s)["y"])
                          for s in data]))


def test_a_calibrated_model_is_rebuilt_as_it_was_calibrated():
    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data, method="mse")
    stripped = float_model(ir)
    assert not stripped.calibrations() and [op.name for op in stripped.ops()] == [op.name for op in ir.ops()]
    again, sites = rebuild(ir, [], data, march="nash-e")
    assert sites == {}
    assert {c.name: float(np.max(c.threshold)) for c in again.calibrations()} == \
        pytest.approx({c.name: float(np.max(c.threshold)) for c in ir.calibrations()})


def test_a_float_transform_recalibrates_only_the_values_it_changed():
    """smooth changes the LayerNorm's output (X / s) and nothing else of the float function: the
    rebuilt model's thresholds are what calibrating the smoothed float model from scratch gives,
    the unchanged values' copied from the model as given."""
    from .test_smooth import LN_MATMUL, planted
    from .test_smooth import samples as ln_samples

    data = ln_samples()
    ir = calibrate_for_nash_e(planted(LN_MATMUL), data, method="mse")
    model, sites = rebuild(ir, ["smooth"], data, march="nash-e")
    assert sites == {"smooth": 1}
    scratch = planted(LN_MATMUL)
    get_pass("smooth", data=data)(scratch)
    calibrate_for_nash_e(scratch, data, method="mse")
    got = {c.name: np.asarray(c.threshold) for c in model.calibrations()}
    want = {c.name: np.asarray(c.threshold) for c in scratch.calibrations()}
    assert got.keys() == want.keys()
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)
    given = {c.name: float(np.max(c.threshold)) for c in ir.calibrations("activation")}
    moved = [n for n in given if not np.isclose(given[n], float(np.max(got[n])), rtol=1e-5)]
    assert moved == ["n_calib"]  # (only the smoothed activation's range moved)
    assert not any(c.fixed for c in model.calibrations())


def test_bias_correction_is_kept_before_precision_and_saves_the_raises():
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    ir = calibrate_for_nash_e(depthwise(), calib)
    corrected, _ = rebuild(ir, ["bias-correct"], calib, march="nash-e")
    before, after = _cosine(ir, evaluation), _cosine(corrected, evaluation)
    assert after > before  # (the planted case: the correction helps on data it was not fitted on)
    target = f"cosine>={(before + after) / 2!r}"
    model, stage = choose_transforms(ir, calib, evaluation, parse_target(target), march="nash-e", space_of=_space,
                                     candidates=("equalize", "bias-correct"), progress=False)
    assert stage.chosen == ("bias-correct",)
    trials = {t.transforms: t for t in stage.trials}
    assert trials[("equalize",)].gain == pytest.approx(0.0, abs=1e-9) and dict(trials[("equalize",)].sites) == {"equalize": 0}
    assert trials[("bias-correct",)].gain > 0 and model is not ir
    assert ir.weight_array(ir.op("Conv_0").inputs[2]) is not None  # (the given model is not changed)

    common = dict(eval_data=evaluation, calib_data=calib, march="nash-e", progress=False)
    given = ir.clone()
    with_stage = get_pass("tune", target=target, **common)(given)
    assert with_stage.ir is given
    without = get_pass("tune", target=target, transforms=None, **common)(ir.clone())
    assert with_stage.report["reached"] and without.report["reached"]
    assert with_stage.report["transforms"]["chosen"] == ["bias-correct"] and "transforms" not in without.report
    assert with_stage.report["raised"] == 0 < without.report["raised"]  # int8 meets it: no precision spent
    assert with_stage.report["final"]["cost"] < without.report["final"]["cost"]
    assert with_stage.report["verification"]["agrees"]
    tuned = with_stage.ir  # (the IR given, now the transformed model at the configuration found)
    assert "bias-correct" in tuned.metadata_props.get("qir.repairs", "") and qir.verify(tuned) == []


def test_a_candidate_that_meets_the_target_all_int8_ends_the_stage():
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    ir = calibrate_for_nash_e(depthwise(), calib)
    corrected, _ = rebuild(ir, ["bias-correct"], calib, march="nash-e")
    before, after = _cosine(ir, evaluation), _cosine(corrected, evaluation)
    met, unmet = parse_target(f"cosine>={(before + after) / 2!r}"), parse_target(f"cosine>={after + (1 - after) / 2!r}")
    _, stage = choose_transforms(ir, calib, evaluation, met, march="nash-e", space_of=_space,
                                 candidates=("bias-correct", "equalize"), progress=False)
    assert [t.transforms for t in stage.trials] == [("bias-correct",)] and stage.chosen == ("bias-correct",)
    assert stage.stopped.startswith("bias-correct meets the target") and stage.to_json()["stopped"] == stage.stopped
    _, stage = choose_transforms(ir, calib, evaluation, unmet, march="nash-e", space_of=_space,
                                 candidates=("bias-correct", "equalize"), progress=False)
    assert [t.transforms for t in stage.trials] == [("bias-correct",), ("equalize",)] and stage.stopped is None


def test_a_transform_that_changes_nothing_is_neither_recalibrated_nor_scored(monkeypatch):
    """equalize finds no Conv pair in the depthwise model: the trial is the model as given."""
    from qir.passes.tune import transforms

    calls = []
    real_recalibrated, real_score = transforms._recalibrated, transforms._score
    monkeypatch.setattr(transforms, "_recalibrated", lambda *a, **k: calls.append("calibrate") or real_recalibrated(*a, **k))
    monkeypatch.setattr(transforms, "_score", lambda *a, **k: calls.append("score") or real_score(*a, **k))
    data = samples(4)
    ir = calibrate_for_nash_e(depthwise(), data)
    model, sites = rebuild(ir, ["equalize"], data, march="nash-e")
    assert sites == {"equalize": 0} and calls == [] and model is not ir
    assert {c.name: c.threshold for c in model.calibrations()}.keys() == {c.name for c in ir.calibrations()}
    _, stage = choose_transforms(ir, data, data, parse_target("cosine>=0.999999"), march="nash-e", space_of=_space,
                                 candidates=("equalize",), progress=False)
    assert calls == ["score", "score"]  # (the model as given, all-int8 and at its upper bound: nothing for equalize)
    assert stage.trials[0].gain == 0 and stage.trials[0].mean == stage.baseline.mean and not stage.trials[0].helps


def test_a_start_that_meets_the_target_tries_nothing(monkeypatch):
    """Nor does it score the upper bound, which decides only whether a candidate is kept."""
    from qir.passes.tune import transforms

    calls = []
    real_score = transforms._score
    monkeypatch.setattr(transforms, "_score", lambda *a, **k: calls.append("score") or real_score(*a, **k))
    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data)
    model, stage = choose_transforms(ir, data, data, parse_target("cosine>=0.5"), march="nash-e", space_of=_space,
                                     progress=False)
    assert model is ir and stage.trials == [] and stage.chosen == () and "meets" in stage.skipped
    assert calls == ["score"] and np.isnan(stage.baseline.upper_mean)  # (all-int8 alone)
    assert len(stage.floats) == len(data) and "y" in stage.floats[0]  # (the float outputs, for verification)


def test_verification_compares_with_the_float_outputs_the_transforms_stage_computed(monkeypatch):
    """The model as given runs as float once in a tune with its transforms stage: verification
    takes the stage's outputs (the same model, samples and values)."""
    from qir.passes import tune as tune_pass
    from qir.passes.tune import transforms

    runs = []
    real = transforms.float_outputs
    monkeypatch.setattr(transforms, "float_outputs", lambda *a, **k: runs.append("stage") or real(*a, **k))
    monkeypatch.setattr(tune_pass, "float_outputs", lambda *a, **k: runs.append("verification") or real(*a, **k))
    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data)
    report = get_pass("tune", target="cosine>=0.5", eval_data=data, calib_data=data, progress=False)(ir).report
    assert report["verification"]["agrees"] and runs == ["stage"]


def test_unknown_transforms_are_one_clear_error():
    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data)
    with pytest.raises(qir.QirError, match="unknown transform 'sharpen'"):
        rebuild(ir, ["sharpen"], data, march="nash-e")


@pytest.mark.slow
def test_qir_tune_writes_the_transformed_model_and_commands_that_rebuild_it(tmp_path):
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    float_path = tmp_path / "float.onnx"
    onnx.save(qir.export_onnx(depthwise()), float_path)
    for name, data in (("calib", calib), ("eval", evaluation)):
        (tmp_path / name / "x").mkdir(parents=True)
        for i, s in enumerate(data):
            np.save(tmp_path / name / "x" / f"{i}.npy", s["x"])
    ir = calibrate_for_nash_e(depthwise(), calib)
    corrected, _ = rebuild(ir, ["bias-correct"], calib, march="nash-e")
    target = f"cosine>={(_cosine(ir, evaluation) + _cosine(corrected, evaluation)) / 2!r}"
    out = tmp_path / "tuned"
    run = subprocess.run([sys.executable, "-m", "qir.tools", "tune", str(float_path), str(tmp_path / "calib"), "--eval",
                          str(tmp_path / "eval"), "--target", target, "-o", str(out), "--transforms", "equalize,bias-correct",
                          "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    text = (out / "tune_report.txt").read_text()
    assert "== transforms before precision" in text and "kept: bias-correct" in text
    commands = (out / "reproduce" / "commands.sh").read_text()
    assert "--fixes bias-correct" in commands
    assert (out / "transformed_model.onnx").exists()
    done = subprocess.run(["sh", str(out / "reproduce" / "commands.sh")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rebuilt, tuned = qir.load(str(out / "reproduce" / "tuned_model.onnx")), qir.load(str(out / "tuned_model.onnx"))
    for op in tuned.ops():
        for value in op.inputs:
            if value and tuned.value(value).kind.value == "weight":
                np.testing.assert_allclose(rebuilt.weight_array(value), tuned.weight_array(value), rtol=1e-6, atol=1e-7)
    assert {c.name: c.mode for c in rebuilt.calibrations()} == {c.name: c.mode for c in tuned.calibrations()}


def _digits_stage(method: str, candidate: str, target: str = "cosine>=0.9999"):
    """The digits example calibrated with ``method``, its 12 evaluation images, and the transforms
    stage trying ``candidate`` alone against ``target``."""
    from ..conftest import DIGITS, DIGITS_DATA

    ir = qir.load(str(DIGITS / "model.onnx"))
    calibrate_for_nash_e(ir, DIGITS_DATA, method=method)
    evaluation = [{"input": x} for x in np.load(DIGITS / "eval_images.npy")[:12]]
    _, stage = choose_transforms(ir, DIGITS_DATA, evaluation, parse_target(target), march="nash-e", space_of=_space,
                                 candidates=(candidate,), progress=False)
    return ir, evaluation, stage


def test_empirical_bias_correction_is_not_kept_where_it_moves_the_float_function_out_of_reach():
    """On the digits example calibrated with kl, empirical bias correction lifts all-int8 a lot,
    but it folds activation error into the biases: the float function moves too far for a tight
    target to stay in reach, so it does not count as help; the weights' own correction would."""
    from ..conftest import DIGITS_DATA

    ir, evaluation, stage = _digits_stage("kl", "bias-correct{mode=empirical}")
    (trial,) = stage.trials
    assert trial.gain > 0.05  # all-int8 much better ...
    assert trial.float_mean < 1 - (1 - 0.9999) / 2  # ... but the float function out of reach
    assert not trial.helps and stage.chosen == ()
    assert np.isnan(trial.upper_mean)  # (the function refused it: its upper bound decides nothing, not scored)
    loose = parse_target("cosine>=0.9")  # (where the float function's move is within reach, it is kept)
    _, stage = choose_transforms(ir, DIGITS_DATA, evaluation, loose, march="nash-e", space_of=_space,
                                 candidates=("bias-correct{mode=empirical}",), progress=False)
    assert stage.chosen == ("bias-correct{mode=empirical}",)


def test_a_model_qir_did_not_calibrate_is_not_rebuilt():
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    ir = calibrate_for_nash_e(depthwise(), calib)
    del ir.meta["calibration"]  # (as an imported onnxruntime QDQ model has none)
    model, stage = choose_transforms(ir, calib, evaluation, parse_target("cosine>=0.99999"), march="nash-e",
                                     space_of=_space, progress=False)
    assert model is ir and stage.trials == [] and "not calibrated by qir" in stage.skipped


def test_round_weights_is_a_transform_tune_can_try():
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    ir = calibrate_for_nash_e(depthwise(), calib)
    model, sites = rebuild(ir, ["round-weights{method=threshold}"], calib, march="nash-e")
    assert set(sites) == {"round-weights"} and model is not ir
    _, stage = choose_transforms(ir, calib, evaluation, parse_target("cosine>=0.99999"), march="nash-e",
                                 space_of=_space, candidates=("round-weights{method=threshold}",), progress=False)
    (trial,) = stage.trials
    assert trial.error is None and trial.transforms == ("round-weights{method=threshold}",)


def test_rebuild_knows_the_transforms_before_any_other_pass_is_loaded():
    # (a fresh process that only imports the stage: rebuild is public, and may be the first call)
    code = ("from qir.passes.tune.transforms import _steps; "
            "print([name for name, _ in _steps(['smooth', 'equalize', 'bias-correct{mode=empirical}'])])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['smooth', 'equalize', 'bias-correct']"


def test_threads_hold_for_every_session_of_a_tune_the_transforms_and_calibration_included(session_threads):
    built = session_threads
    calib, evaluation = samples(4), [{"x": s["x"] + 0.01} for s in samples(3)]
    ir = calibrate_for_nash_e(depthwise(), calib)
    before = _cosine(ir, evaluation)
    target = f"cosine>={before + (1 - before) / 4!r}"  # (all-int8 misses it: the transforms are tried)
    common = dict(target=target, eval_data=evaluation, calib_data=calib, march="nash-e", progress=False)
    built.clear()  # (what the setup built)
    result = get_pass("tune", threads=1, **common)(ir.clone())
    assert result.report["transforms"]["trials"]  # (the stage rebuilt and scored models: its own sessions)
    assert built and set(built) == {1}
    built.clear()
    get_pass("tune", **common)(ir.clone())
    assert 0 in built  # (without a count, onnxruntime's choice: the limit did not outlive the run)


def test_the_float_function_is_scored_only_for_a_transform_that_folds_activation_error(monkeypatch):
    """The weights' own bias correction keeps what raising activations removes: its float function
    decides nothing, so only its upper bound is scored (a float run of the evaluation data saved)."""
    from qir.passes.tune import transforms

    levels = []
    real_score = transforms._score
    monkeypatch.setattr(transforms, "_score", lambda *a, **k: levels.append(k.get("level", "fq")) or real_score(*a, **k))
    _, _, stage = _digits_stage("max", "bias-correct")
    (trial,) = stage.trials
    gains = trial.gain > parse_target("cosine>=0.9999").tolerance(stage.baseline.mean)
    assert gains and trial.helps  # (it gains, and is kept: its bound ...)
    assert not np.isnan(trial.upper_mean) and levels.count("fq") == 4  # (... scored: int8 and bound, twice)
    assert np.isnan(trial.float_mean) and "float" not in levels  # (... and its float function was not)


def _mse_against_float(ir, data):
    ref = depthwise()
    return float(np.mean([np.mean((qir.run(ref, s, level="float")["y"] - qir.run(ir, s)["y"]) ** 2) for s in data]))


def test_a_bias_corrected_layer_keeps_the_weight_precision_it_was_corrected_for(tmp_path):
    """The correction removes the shift the *int8* weights cause: next to int16 weights it is a
    shift of its own (here 8x the error the model as given has there), so the search does not offer
    the levels that would move those weights (int16+w16, float), also after a save and load."""
    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data)
    corrected, sites = rebuild(ir, ["bias-correct"], data, march="nash-e")
    assert sites == {"bias-correct": 1}
    given = Space(ir, NASH_E, allow_float=True)
    assert given.units[given.index["r_calib"]].levels == ("int8", "int16", "int16+w16", "float") and given.tied == {}
    dual = given.start().with_levels({given.index["r_calib"]: 2})  # (the Conv's input and weights at int16)
    assert _mse_against_float(given.apply(corrected.clone(), dual), data) > 4 * _mse_against_float(
        given.apply(ir.clone(), dual), data)
    path = tmp_path / "corrected.onnx"
    qir.save(corrected, path)
    for model in (corrected, qir.load(str(path))):
        space = Space(model, NASH_E, allow_float=True)
        assert space.units[space.index["r_calib"]].levels == ("int8", "int16") and space.tied == {"r_calib": "int8"}
        assert space.units[space.index["x_calib"]].levels == given.units[given.index["x_calib"]].levels  # (no GEMM)
    tuned = get_pass("tune", target="cosine>=0.5", eval_data=data, calib_data=data, transforms=None,
                     progress=False)(corrected.clone())
    assert tuned.report["weight_tied"] == {"r_calib": "int8"}
    assert "1 unit(s) kept their GEMMs' weights at int8" in format_report(tuned.report)


def test_a_note_written_before_the_weight_mode_was_recorded_ties_the_weights_as_they_are():
    import json

    from qir.passes.lib.repair import REPAIRS_KEY

    data = samples()
    corrected, _ = rebuild(calibrate_for_nash_e(depthwise(), data), ["bias-correct"], data, march="nash-e")
    notes = json.loads(corrected.metadata_props[REPAIRS_KEY])
    del notes["bias-correct"]["Conv_0"]["weight_mode"]
    corrected.metadata_props[REPAIRS_KEY] = json.dumps(notes)
    assert Space(corrected, NASH_E).tied == {"r_calib": "int8"}


def test_raising_a_bias_corrected_layer_s_weights_by_hand_says_the_correction_is_stale(caplog):
    """set-mode moves what tune will not: it does, and says the correction was made for int8
    weights (the report names the layer); activations and the layers no repair fitted pass quietly."""
    data = samples()
    corrected, _ = rebuild(calibrate_for_nash_e(depthwise(), data), ["bias-correct"], data, march="nash-e")
    quiet = get_pass("set-mode", mode="int16", role="activation")(corrected.clone())
    assert quiet.modified and "stale_repairs" not in quiet.report
    with caplog.at_level("WARNING"):
        raised = get_pass("set-mode", mode="int16", role="weight")(corrected)
    assert raised.report["stale_repairs"] == {"Conv_0": "int8"}
    assert "Conv_0 (fitted at int8)" in caplog.text and "stale" in caplog.text


@pytest.mark.parametrize("notes", ["{not json", "[1, 2]", '{"bias-correct": 3}'])
def test_repair_notes_that_are_not_qir_s_are_one_clear_error(notes):
    from qir.errors import InputError
    from qir.passes.lib.repair import REPAIRS_KEY

    ir = calibrate_for_nash_e(depthwise(), samples())
    ir.metadata_props[REPAIRS_KEY] = notes
    with pytest.raises(InputError, match="metadata is not the notes qir writes"):
        Space(ir, NASH_E)


def test_set_mode_still_changes_modes_where_the_repair_notes_cannot_be_read(caplog):
    from qir.passes.lib.repair import REPAIRS_KEY

    ir = calibrate_for_nash_e(depthwise(), samples())
    ir.metadata_props[REPAIRS_KEY] = "{not json"
    assert get_pass("set-mode", mode="int16", role="activation")(ir).modified
    with caplog.at_level("WARNING"):
        assert get_pass("set-mode", mode="int16", role="weight")(ir).modified
    assert "cannot tell whether a repair fitted these weights" in caplog.text


def test_a_repair_on_a_model_whose_notes_cannot_be_read_is_one_clear_error():
    from qir.errors import InputError
    from qir.passes.lib.repair import REPAIRS_KEY

    data = samples()
    ir = calibrate_for_nash_e(depthwise(), data)
    ir.metadata_props[REPAIRS_KEY] = "[1, 2]"
    with pytest.raises(InputError, match="metadata is not the notes qir writes"):
        get_pass("bias-correct", data=data, measure=False)(ir)
