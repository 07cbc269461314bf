"""Cone re-execution at the integer level equals whole runs bit for bit
(:mod:`qir.runtimes.integer.cone`)."""
from __future__ import annotations

import numpy as np
import pytest

from qir.runtimes.engine.variants import configured_clone
from qir.runtimes.integer import IntegerRuntime
from qir.runtimes.integer.cone import ConeMemo, run_cone, trace
from qir.runtimes.integer.kernels import IntegerDtypeError

from ...conftest import DIGITS


def _images(n: int) -> list[dict[str, np.ndarray]]:
    return [{"input": im} for im in np.load(DIGITS / "eval_images.npy")[:n].astype(np.float32)]


@pytest.mark.parametrize("march,change", [("nash-e", "float"), ("nash-e", "int16"), ("ort", "float")])
def test_every_single_node_variant_equals_its_whole_run(digits_calibrated, march, change):
    rt = IntegerRuntime(march)
    reference = configured_clone(digits_calibrated, "quantized", {})
    capture = [c.output for c in reference.calibrations()][:4]
    samples = _images(3)
    traces = [trace(rt, reference, s, capture) for s in samples]
    smaller = 0
    for cal in reference.calibrations():
        variant = configured_clone(reference, "quantized", {cal.name: change})
        plan_steps = None
        for sample, ref in zip(samples, traces):
            try:
                whole = rt.run(variant, sample, capture=capture)
            except IntegerDtypeError:  # a dtype pair the march forbids: the cone run says so too
                with pytest.raises(IntegerDtypeError):
                    run_cone(rt, variant, sample, ref, capture)
                break
            cone = run_cone(rt, variant, sample, ref, capture)
            assert whole.keys() == cone.keys()
            for name in whole:
                np.testing.assert_array_equal(cone[name], whole[name], err_msg=f"{cal.name} -> {change}: {name}")
            plan_steps = variant.cached(("integer-cone", ref.key, ref.keep, rt.profile), lambda: None)
        smaller += plan_steps is not None and sum(plan_steps) < len(plan_steps)
    assert smaller > len(reference.calibrations()) // 2  # most variants re-run less than the whole model


def test_the_reference_itself_reruns_nothing(digits_calibrated):
    rt = IntegerRuntime("nash-e")
    reference = configured_clone(digits_calibrated, "quantized", {})
    sample = _images(1)[0]
    ref = trace(rt, reference, sample)
    same = configured_clone(digits_calibrated, "quantized", {})
    out = run_cone(rt, same, sample, ref)
    marks = same.cached(("integer-cone", ref.key, ref.keep, rt.profile), lambda: None)
    assert not any(marks)
    for name, value in rt.run(reference, sample).items():
        np.testing.assert_array_equal(out[name], value)


@pytest.mark.parametrize("march,change", [("nash-e", "float"), ("nash-e", "int16"), ("ort", "float")])
def test_a_variant_given_as_records_equals_its_whole_run(digits_calibrated, march, change):
    """No IR of the variant's own: its records over the traced model's graph, plan and cone kept in a memo."""
    from qir.runtimes.engine.variants import effective

    rt = IntegerRuntime(march)
    reference = configured_clone(digits_calibrated, "quantized", {})
    capture = [c.output for c in reference.calibrations()][:4]
    samples = _images(2)
    traces = [trace(rt, reference, s, capture) for s in samples]
    own = {c.name: c for c in reference.calibrations()}
    for cal in reference.calibrations():
        records, memo, ran = {**own, cal.name: effective(cal, change)}, ConeMemo(), False
        variant = configured_clone(reference, "quantized", {cal.name: change})
        for sample, ref in zip(samples, traces):
            try:
                whole = rt.run(variant, sample, capture=capture)
            except IntegerDtypeError:
                with pytest.raises(IntegerDtypeError):
                    run_cone(rt, reference, sample, ref, capture, records=records, memo=memo)
                break
            cone = run_cone(rt, reference, sample, ref, capture, records=records, memo=memo)
            assert whole.keys() == cone.keys()
            for name in whole:
                np.testing.assert_array_equal(cone[name], whole[name], err_msg=f"{cal.name} -> {change}: {name}")
            ran = True
        assert not ran or (memo.plan is not None and set(memo.cones) == {t.key for t in traces})  # kept
