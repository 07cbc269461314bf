"""The analysis engine on the bundled digits model: results equal the plain "clone, set the
modes, run the whole model" evaluation, on both runtimes, for every kind of variant; resume,
the memory budget and bad input."""
from __future__ import annotations

import json

import numpy as np
import pytest

from qir.api import run
from qir.errors import InputError, NotFoundError
from qir.runtimes.engine import RESULTS_FILE, Engine, Variant, evaluate_plainly


@pytest.fixture(scope="module")
def calibrated(digits_calibrated):
    return digits_calibrated  # (the engine never changes the IR it analyses: tested below)


@pytest.fixture(scope="module")
def samples(digits_samples):
    return digits_samples


def variants_of(ir, mode):
    """One variant per calibration node, plus a two-node one and a weight+activation one."""
    cals = ir.calibrations()
    out = [Variant(c.name, {c.name: mode}) for c in cals]
    acts = [c.name for c in ir.calibrations("activation")]
    weights = [c.name for c in ir.calibrations("weight")]
    out.append(Variant("pair", {acts[1]: mode, acts[-2]: mode}))
    out.append(Variant("w+a", {weights[2]: mode, acts[3]: "int16"}))
    return out


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
@pytest.mark.parametrize("reference,mode", [("float", "int8"), ("quantized", "float"), ("quantized", "int16"),
                                            ("quantized", "fp16"), ("quantized", "@0.5"), ("float", "int8@1.5")])
def test_engine_equals_plain_evaluation(calibrated, samples, runtime, reference, mode):
    ir = calibrated
    before = str(ir)
    variants = variants_of(ir, mode)
    engine = Engine(ir, samples, runtime=runtime, reference=reference, baseline="reference",
                    compare=[ir.outputs[0], "relu1_out"], metrics=["mse", "cosine-similarity"],
                    progress=False, segments=3)
    result = engine.evaluate(variants)
    assert str(ir) == before  # the engine never changes the IR it analyses
    options = {"threads": 1, "optimization": engine.optimization} if runtime == "ort" else {}
    for s, sample in enumerate(samples):
        engine._reference(s, sample)
        base = evaluate_plainly(ir, sample, {}, reference=reference, compare=engine.compare,
                                runtime=runtime, **options)
        for v in variants:
            plain = evaluate_plainly(ir, sample, v.changes, reference=reference, compare=engine.compare,
                                     runtime=runtime, **options)
            got = engine.run_variant(v)
            for name in engine.compare:
                scale = max(float(np.abs(plain[name]).max()), 1e-12)
                assert float(np.abs(got[name] - plain[name]).max()) / scale <= 1e-6, (v.name, name)
            row = next(r for r in result.rows if r["variant"] == v.name and r["sample"] == s)
            expected = float(np.mean((plain[ir.outputs[0]].astype(np.float64) - base[ir.outputs[0]]) ** 2))
            assert row["values"][ir.outputs[0]]["mse"] == pytest.approx(expected, rel=1e-3, abs=1e-12)
    # a change confined to one node leaves the values upstream of it untouched
    assert result.stats.steps_run + result.stats.segments_run > 0


def test_cone_reexecution_runs_less_than_the_whole_model(calibrated, samples):
    ir = calibrated
    engine = Engine(ir, samples[:1], runtime="numpy", progress=False)
    last = ir.calibrations("activation")[-1].name
    engine.evaluate([Variant("last", {last: "int8"})])
    assert 0 < engine.stats["steps_run"] <= 3  # the last calibration node and the ops after it
    engine.stats["steps_run"] = 0
    first = ir.calibrations("activation")[0].name
    engine.evaluate([Variant("first", {first: "int8"})])
    assert engine.stats["steps_run"] == len(engine.plan.steps)  # the input's quantizer feeds everything


def test_float_baseline_of_a_quantized_reference(calibrated, samples):
    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    engine = Engine(ir, samples[:1], runtime="numpy", reference="quantized", metrics="mse", progress=False)
    table = engine.evaluate([Variant("all-float", {a: "float" for a in acts} | {
        c.name: "float" for c in ir.calibrations("weight")})]).per_variant()
    assert table["all-float"]["mse"] == 0.0  # every node back to float is the float model
    one = engine.evaluate([Variant("one", {acts[0]: "float"})]).per_variant()
    assert one["one"]["mse"] > 0.0


def test_float_baselines_the_caller_gives_are_used_instead_of_runs(calibrated, samples):
    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    variants = [Variant("one", {acts[0]: "int16"}), Variant("all-float", {a: "float" for a in acts} | {
        c.name: "float" for c in ir.calibrations("weight")})]
    def engine(floats=None):
        return Engine(ir, samples[:2], runtime="ort", reference="quantized", metrics="mse", progress=False, threads=1,
                      float_baselines=floats)

    with engine() as own:
        computed, optimization = own.evaluate(variants).per_variant(), own.optimization
    out = ir.outputs[0]
    floats = [evaluate_plainly(ir, sample, {}, reference="float", runtime="ort", threads=1,
                               optimization=optimization) for sample in samples[:2]]
    with engine(lambda: floats) as given:
        assert given.evaluate(variants).per_variant() == computed  # the same values as its own runs
    with engine(lambda: [{out: v[out] + 1.0} for v in floats]) as given:
        shifted = given.evaluate(variants).per_variant()  # (what it compares with is what it was given)
    assert shifted["all-float"]["mse"] == pytest.approx(1.0) and shifted["one"]["mse"] != computed["one"]["mse"]


def test_an_engine_adopts_the_costs_another_of_the_same_model_timed(calibrated, samples, monkeypatch):
    from qir.runtimes.engine.reference import ReferenceCache

    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    weight = ir.calibrations("weight")[1].name  # (a weight change runs cone by cone on a step-level reference: timed)
    options = dict(runtime="ort", reference="quantized", metrics="mse", progress=False, threads=1, segments=3)
    variants = [Variant("one", {acts[1]: "int8", weight: "int16"}), Variant("two", {acts[2]: "int8", acts[3]: "float"})]
    first = Engine(ir, samples[:2], reference_changes={acts[0]: "int16"}, **options)
    first.evaluate([Variant("x", {acts[4]: "int16", weight: "int16"})])
    costs = first.measured_costs()
    assert costs and len(costs.steps) == len(first.plan.steps) and costs.segments
    around = {a: "int16" for a in acts[1:4]}
    own = Engine(ir, samples[:2], reference_changes=around, **options).evaluate(variants).per_variant()
    timed = []
    monkeypatch.setattr(ReferenceCache, "_calibrate_costs", lambda self, *a: timed.append(1))
    adopting = Engine(ir, samples[:2], reference_changes=around, **options)
    adopting.adopt_costs(costs)
    assert adopting.evaluate(variants).per_variant() == own and not timed  # the same, and nothing timed
    other = Engine(ir, samples[:2], reference_changes=around, **dict(options, segments=2))
    other.adopt_costs(costs)  # another plan: its own costs
    assert other.measured_costs() is None and other.ref_cache.step_cost is None
    for e in (first, adopting, other):
        e.close()


def test_a_mixed_call_can_run_every_variant_step_by_step_on_one_reference_pass(calibrated, samples, monkeypatch):
    from qir.runtimes.engine.reference import ReferenceCache

    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    weight = ir.calibrations("weight")[1].name
    variants = [Variant("rows", {acts[2]: "int16"}), Variant("steps", {acts[1]: "int16", weight: "int16"})]
    options = dict(runtime="ort", reference="quantized", metrics="mse", progress=False, threads=1, segments=3)
    loads = []
    real = ReferenceCache.load
    monkeypatch.setattr(ReferenceCache, "load", lambda self, s, sample, pool=None, steps=True:
                        loads.append(steps) or real(self, s, sample, pool, steps))
    split = Engine(ir, samples[:2], **options).evaluate(variants).per_variant()
    assert sorted(loads) == [False, False, True, True]  # a segment-level and a step-level pass a sample
    loads.clear()
    engine = Engine(ir, samples[:2], **options)
    engine.steps_when_mixed = True
    together = engine.evaluate(variants).per_variant()
    assert loads == [True, True]  # one pass a sample
    for v in split:
        assert together[v]["mse"] == pytest.approx(split[v]["mse"], rel=1e-5, abs=1e-12)
    loads.clear()
    engine.evaluate(variants[:1])  # not mixed: the rows as rows
    assert loads == [False, False]


def test_memory_budget_spills_and_gives_the_same_results(calibrated, samples, tmp_path):
    ir = calibrated
    variants = variants_of(ir, "int8")
    full = Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants)
    engine = Engine(ir, samples, runtime="numpy", memory_budget=0, spill_dir=tmp_path, progress=False)
    spilled = engine.evaluate(variants)
    assert spilled.stats.spilled_bytes > 0 and spilled.stats.peak_cache_bytes == 0
    assert spilled.rows == full.rows
    engine.close()
    assert not any(tmp_path.rglob("*.npy"))  # spill files are removed


def test_results_file_and_resume(calibrated, samples, tmp_path):
    ir = calibrated
    variants = variants_of(ir, "int8")
    out = tmp_path / "run"
    first = Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants, out)
    lines = (out / RESULTS_FILE).read_text().splitlines()
    assert len(lines) == 1 + len(variants) * len(samples)
    # interrupt: keep the header and 5 rows, plus half a line written when the process died
    (out / RESULTS_FILE).write_text("\n".join(lines[:6]) + "\n" + lines[6][: len(lines[6]) // 2])
    engine = Engine(ir, samples, runtime="numpy", progress=False)
    resumed = engine.evaluate(variants, out, resume=True)
    assert resumed.rows == first.rows
    assert [json.loads(x) for x in (out / RESULTS_FILE).read_text().splitlines()[1:]] == [
        json.loads(x) for x in lines[1:]]
    # the 5 saved rows were not recomputed: sample 0's first variants are skipped
    fresh = Engine(ir, samples, runtime="numpy", progress=False)
    fresh.evaluate(variants)
    assert engine.stats["steps_run"] < fresh.stats["steps_run"]
    with pytest.raises(InputError, match="already exists"):
        Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants, out)
    with pytest.raises(InputError, match="different analysis"):
        Engine(ir, samples[:2], runtime="numpy", progress=False).evaluate(variants, out, resume=True)
    again = Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants, out, force=True)
    assert again.rows == first.rows


def test_resume_refuses_other_data_of_the_same_size(calibrated, samples, tmp_path):
    ir = calibrated
    variants = variants_of(ir, "int8")[:2]
    out = tmp_path / "run"
    Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants, out)
    other = [dict(s) for s in samples]
    other[1] = {"input": other[1]["input"].copy()}
    other[1]["input"].flat[5] += 0.5  # one value of one sample differs
    with pytest.raises(InputError, match="other data"):
        Engine(ir, other, runtime="numpy", progress=False).evaluate(variants, out, resume=True)
    same = [{"input": s["input"].copy()} for s in samples]  # equal content, other arrays: resumes
    assert Engine(ir, same, runtime="numpy", progress=False).evaluate(variants, out, resume=True).rows


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
def test_a_sample_with_a_nan_reference_is_left_out(calibrated, samples, runtime, caplog):
    ir = calibrated
    variants = variants_of(ir, "int8")[:3]
    spoiled = [dict(s) for s in samples]
    spoiled[1] = {"input": samples[1]["input"].copy()}
    spoiled[1]["input"].flat[10] = np.nan  # one NaN pixel: the float outputs are NaN
    with caplog.at_level("WARNING"):
        result = Engine(ir, spoiled, runtime=runtime, progress=False).evaluate(variants)
    assert list(result.left_out) == [1] and "sample 1 " in caplog.text
    assert {r["sample"] for r in result.rows} == {0, 2}
    clean = Engine(ir, [samples[0], samples[2]], runtime=runtime, progress=False).evaluate(variants)
    assert result.per_variant() == clean.per_variant()  # the means of the other samples, not pulled to 1
    all_nan = [{"input": np.full_like(s["input"], np.nan)} for s in samples]
    with pytest.raises(InputError, match="every sample.*NaN"):
        Engine(ir, all_nan, runtime=runtime, progress=False).evaluate(variants)


def test_near_zero_references_are_flagged_and_left_out_of_cosine_means(rng, caplog):
    """A detector-like head (a Sigmoid map): on a sample where nothing fires the float output is
    ~0 everywhere and cosine is noise there; mse still counts it."""
    from ...conftest import near_zero_sigmoid_case

    ir, samples = near_zero_sigmoid_case(rng, 3)
    variants = [Variant(c.name, {c.name: c.mode.value}) for c in ir.calibrations()]
    with caplog.at_level("WARNING"):
        result = Engine(ir, samples, runtime="numpy", metrics=["cosine-similarity", "mse"],
                        progress=False).evaluate(variants)
    assert list(result.ill_conditioned) == [1] and result.ill_conditioned[1]["y"].startswith("near zero")
    assert "sample 1" in caplog.text and "mse" in caplog.text
    others = Engine(ir, [samples[0], samples[2]], runtime="numpy", metrics=["cosine-similarity", "mse"],
                    progress=False).evaluate(variants).per_variant()
    every = Engine(ir, samples, runtime="numpy", metrics=["mse"], progress=False).evaluate(variants).per_variant()
    for name, values in result.per_variant().items():
        assert values["cosine-similarity"] == others[name]["cosine-similarity"]  # sample 1 left out of cosine
        assert values["mse"] == every[name]["mse"]  # and kept in mse
    alone = Engine(ir, samples[1:2], runtime="numpy", progress=False).evaluate(variants)
    assert alone.per_variant()[variants[0].name]["cosine-similarity"] == alone.rows[0]["values"]["y"][
        "cosine-similarity"]  # nothing else to rank on: kept, and warned about
    assert "every sample" in caplog.text


def test_a_threshold_change_is_what_set_mode_threshold_gives(calibrated, samples):
    """``"@T"`` runs the node as ``qir set-mode --threshold T`` leaves it: own mode, per-tensor T."""
    from qir.passes.set_mode import SetModePass
    ir = calibrated
    name = "relu1_out_calib"
    fixed = ir.clone()
    SetModePass(nodes=name, threshold=0.75)(fixed)
    engine = Engine(ir, samples[:2], runtime="numpy", reference="quantized", baseline="reference", progress=False)
    for s, sample in enumerate(samples[:2]):
        engine._reference(s, sample)
        got = engine.run_variant(Variant("t", {name: "@0.75"}))
        want = run(fixed, sample)
        np.testing.assert_allclose(got[ir.outputs[0]], want[ir.outputs[0]], rtol=1e-6, atol=1e-6)
    assert fixed.calibration(name).mode is ir.calibration(name).mode


def test_bad_input_is_one_clear_error(calibrated, samples):
    ir = calibrated
    engine = Engine(ir, samples, runtime="numpy", progress=False)
    with pytest.raises(NotFoundError, match="did you mean"):
        engine.evaluate([Variant("x", {"relu1_out_calb": "int8"})])
    with pytest.raises(InputError, match="unknown mode"):
        engine.evaluate([Variant("x", {"relu1_out_calib": "int4"})])
    for bad in ("int8@nan", "@0", "@-1", "@abc", "float@1"):
        with pytest.raises(InputError, match="threshold"):
            engine.evaluate([Variant("x", {"relu1_out_calib": bad})])
    with pytest.raises(InputError, match="unique"):
        engine.evaluate([Variant("x", {}), Variant("x", {})])
    with pytest.raises(InputError, match="metric"):
        Engine(ir, samples, metrics=["cosine"])
    with pytest.raises(NotFoundError):
        Engine(ir, samples, compare=["nope"])
    with pytest.raises(InputError, match="reference"):
        Engine(ir, samples, reference="int8")
    with pytest.raises(InputError, match="input"):
        Engine(ir, [{"x": samples[0]["input"]}], progress=False).evaluate([Variant("v", {})])


@pytest.mark.parametrize("node, changes", [("relu1_out_calib", ["int16@9.5", "int16", "int16@0.5"]),
                                           ("conv2.weight_calib", ["int8@0.1", "int8@0.4", "int8"])])
def test_one_engine_never_reuses_a_session_built_for_another_threshold(calibrated, samples, node, changes):
    """Calls of one engine that change one node to the same mode with other thresholds each get
    what a plain run gives (a cached segment or step session once kept the first threshold)."""
    from qir.metrics import cosine_similarity

    ir = calibrated
    out = ir.outputs[0]
    engine = Engine(ir, samples, runtime="ort", reference="quantized", baseline="reference", progress=False,
                    segments=3)
    options = {"threads": 1, "optimization": engine.optimization}
    base = [evaluate_plainly(ir, s, {}, reference="quantized", runtime="ort", **options)[out] for s in samples]
    for change in changes:
        got = engine.evaluate([Variant("v", {node: change})]).per_variant()["v"]["cosine-similarity"]
        plain = [evaluate_plainly(ir, s, {node: change}, reference="quantized", runtime="ort", **options)[out]
                 for s in samples]
        assert got == pytest.approx(np.mean([cosine_similarity(b, p) for b, p in zip(base, plain)]), abs=1e-6), change


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
def test_reference_changes_make_the_reference(calibrated, samples, runtime):
    """With ``reference_changes`` the reference is the IR with those changes: a variant equals the
    plain run of the reference's changes overlaid with its own (a change applies to the IR's own
    record: ``"int8"`` on a node the reference gives a threshold is the calibrated node again),
    and a variant that asks for what the reference already computes changes nothing."""
    ir = calibrated
    acts = [c.name for c in ir.calibrations("activation")]
    weight = ir.calibrations("weight")[1].name
    around = {acts[0]: "int16", acts[2]: "int8@1.5", weight: "int16"}
    variants = [Variant("same", dict(around)), Variant("back", {acts[0]: "int8"}), Variant("more", {acts[3]: "int16"}),
                Variant("calibrated again", {acts[2]: "int8"}),
                Variant("other threshold", {acts[2]: "int8@0.75", acts[1]: "float"})]
    engine = Engine(ir, samples[:3], runtime=runtime, reference="quantized", baseline="reference",
                    compare=[ir.outputs[0]], metrics=["mse"], progress=False, segments=3, reference_changes=around)
    options = {"threads": 1, "optimization": engine.optimization} if runtime == "ort" else {}
    out = ir.outputs[0]
    for s, sample in enumerate(samples[:3]):
        engine._reference(s, sample)
        base = evaluate_plainly(ir, sample, around, reference="quantized", compare=[out], runtime=runtime, **options)
        np.testing.assert_allclose(engine._reference(s, sample)[out], base[out], rtol=1e-6, atol=1e-7)
        for v in variants:
            plain = evaluate_plainly(ir, sample, {**around, **v.changes}, reference="quantized", compare=[out],
                                     runtime=runtime, **options)
            scale = max(float(np.abs(plain[out]).max()), 1e-12)
            assert float(np.abs(engine.run_variant(v)[out] - plain[out]).max()) / scale <= 1e-6, v.name
    assert engine.variant_records.changes(variants[0]) == {}
    with pytest.raises(InputError, match="unknown mode"):
        Engine(ir, samples, reference="quantized", reference_changes={acts[0]: "int4"})
