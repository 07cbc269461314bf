"""The engine at the integer level ("node sensitivity as the NPU computes it") on the digits model:
every result is the plain integer evaluation of its variant, resume tells levels and marches
apart, and bad combinations are one clear error."""
from __future__ import annotations

import numpy as np
import pytest

from qir import metrics as qmetrics
from qir import once
from qir.errors import InputError, QirError
from qir.json_dump import finite
from qir.runtimes.engine import Engine, Variant, evaluate_plainly

from .test_engine import variants_of


@pytest.mark.parametrize("reference,mode,baseline", [("float", "int8", "reference"), ("quantized", "float", "reference"),
                                                     ("quantized", "fp16", "float"), ("quantized", "@0.5", "reference"),
                                                     ("float", "int8@1.5", "float"), ("quantized", "int16", "reference")])
def test_integer_level_equals_plain_integer_evaluation(digits_calibrated, digits_samples, reference, mode, baseline):
    ir, samples = digits_calibrated, digits_samples
    before = str(ir)
    variants = variants_of(ir, mode) + [Variant("conv2", {"relu1_out_calib": mode, "conv2.weight_calib": mode})]
    if mode == "int16":  # nash-e takes int16 x int8 but not int8 x int16: activations only
        variants = [v for v in variants if all(ir.calibration(n).role.value == "activation" for n in v.changes)]
    metrics = ["mse", "cosine-similarity"]
    engine = Engine(ir, samples, level="integer", march="nash-e", reference=reference, baseline=baseline,
                    compare=[ir.outputs[0], "relu1_out"], metrics=metrics, progress=False)
    assert engine.runtime == "numpy"
    result = engine.evaluate(variants)
    assert str(ir) == before and result.stats.whole_runs == len(variants) * len(samples)
    plainly = {"compare": engine.compare, "runtime": "numpy", "level": "integer", "march": "nash-e"}
    fakequant = {"compare": engine.compare, "runtime": "numpy"}
    differs = False
    for s, sample in enumerate(samples):
        base = evaluate_plainly(ir, sample, {}, reference="float" if baseline == "float" else reference, **plainly)
        engine._reference(s, sample)
        for v in variants:
            plain = evaluate_plainly(ir, sample, v.changes, reference=reference, **plainly)
            got = engine.run_variant(v)
            assert all(np.array_equal(got[n], plain[n]) for n in engine.compare), v.name
            row = next(r for r in result.rows if r["variant"] == v.name and r["sample"] == s)
            assert row["values"] == finite({n: qmetrics.compute(metrics, base[n], plain[n]) for n in engine.compare})
            fq = evaluate_plainly(ir, sample, v.changes, reference=reference, **fakequant)
            differs = differs or not np.array_equal(fq[ir.outputs[0]], plain[ir.outputs[0]])
    assert differs  # the integer level, not fake quantization, computed them


def test_integer_level_results_file_resumes_only_the_same_level_and_march(digits_calibrated, digits_samples,
                                                                          tmp_path):
    ir, samples = digits_calibrated, digits_samples
    variants = variants_of(ir, "int8")[:3]
    out = tmp_path / "run"
    first = Engine(ir, samples, level="integer", march="nash-e", progress=False).evaluate(variants, out)
    again = Engine(ir, samples, level="integer", march="nash-e", progress=False)
    assert again.evaluate(variants, out, resume=True).rows == first.rows
    assert again.stats["whole_runs"] == 0  # nothing left to compute
    for other in ({"runtime": "numpy"}, {"level": "integer", "march": "nash-m"}):
        with pytest.raises(InputError, match="different analysis"):
            Engine(ir, samples, progress=False, **other).evaluate(variants, out, resume=True)
    fake = tmp_path / "fake"
    Engine(ir, samples, runtime="numpy", progress=False).evaluate(variants, fake)
    with pytest.raises(InputError, match="different analysis"):
        Engine(ir, samples, level="integer", progress=False).evaluate(variants, fake, resume=True)


def test_integer_level_leaves_out_a_nan_sample(digits_calibrated, digits_samples):
    ir, samples = digits_calibrated, digits_samples
    spoiled = [dict(s) for s in samples]
    spoiled[1] = {"input": samples[1]["input"].copy()}
    spoiled[1]["input"].flat[10] = np.nan
    variants = variants_of(ir, "int8")[:2]
    result = Engine(ir, spoiled, level="integer", march="nash-e", progress=False).evaluate(variants)
    assert list(result.left_out) == [1] and {r["sample"] for r in result.rows} == {0, 2}


def test_integer_level_bad_combinations_are_one_clear_error(digits_calibrated, digits_samples):
    ir, samples = digits_calibrated, digits_samples
    with pytest.raises(InputError, match="numpy runtime only"):
        Engine(ir, samples, runtime="ort", level="integer")
    with pytest.raises(InputError, match="integer level only"):
        Engine(ir, samples, march="nash-e")
    with pytest.raises(InputError, match="unknown level 'float'"):
        Engine(ir, samples, level="float")
    with pytest.raises(QirError, match="no march profile named 'nash-x'"):
        Engine(ir, samples, level="integer", march="nash-x")
    weight = ir.calibrations("weight")[0].name  # nash-e forbids an int8 activation x an int16 weight
    engine = Engine(ir, samples[:1], level="integer", march="nash-e", reference="quantized", progress=False)
    with pytest.raises(QirError, match="variant 'w16': node .* takes int8 × int16"):
        engine.evaluate([Variant("w16", {weight: "int16"})])


def test_variant_runs_report_their_fallbacks_once(digits_calibrated, digits_samples, caplog, monkeypatch):
    """From float, each variant's one quantized node makes its op fall back to float: by design,
    so the runs' own warnings are held back and one summary is logged instead."""
    from qir.runtimes.integer import interpreter

    once.forget(interpreter.REPORTED)  # (what earlier runs reported is reported again)
    ir = digits_calibrated
    with caplog.at_level("INFO"):
        Engine(ir, digits_samples, level="integer", march="nash-e", progress=False).evaluate(variants_of(ir, "int8"))
    per_run = [r for r in caplog.records if r.name == "qir.runtimes.integer.arithmetic"]
    summary = [r.getMessage() for r in caplog.records if r.name == "qir.runtimes.engine.whole"]
    assert per_run == [] and len(summary) == 1 and "ran in float" in summary[0] and "conv1" in summary[0]


@pytest.mark.parametrize("level", ["integer", "fakequant"])
def test_float_baselines_the_caller_gives_are_the_ones_compared_with(digits_calibrated, digits_samples, level):
    """A caller whose float model is not the IR's own (tune after a bias correction: the model as
    given) passes its float outputs; the engine compares with those at every level."""
    ir, samples = digits_calibrated, digits_samples
    out = ir.outputs[0]
    given = [{out: evaluate_plainly(ir, s, {}, reference="float", compare=[out], runtime="numpy")[out] * 1.5 + 0.25}
             for s in samples]
    options = {"level": level, "runtime": "numpy", **({"march": "nash-e"} if level == "integer" else {})}
    engine = Engine(ir, samples, reference="quantized", compare=[out], metrics=["mse"], progress=False,
                    float_baselines=lambda: given, **options)
    variants = [v for v in variants_of(ir, "int16")  # (activations: nash-e takes int16 x int8, not int8 x int16)
                if all(ir.calibration(n).role.value == "activation" for n in v.changes)][:2]
    rows = engine.evaluate(variants).rows
    plainly = {"compare": [out], "runtime": "numpy", **({"level": "integer", "march": "nash-e"} if level == "integer" else {})}
    for row in rows:
        changes = next(v.changes for v in variants if v.name == row["variant"])
        plain = evaluate_plainly(ir, samples[row["sample"]], changes, reference="quantized", **plainly)
        assert row["values"] == finite({out: qmetrics.compute(["mse"], given[row["sample"]][out], plain[out])})
