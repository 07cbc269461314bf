"""Step 7's search at the integer level (:mod:`qir.passes.tune.integer_repair`), checked against
whole-model runs of the integer level (no engine, no cones)."""
from __future__ import annotations

import numpy as np
import pytest

import qir
from qir import metrics as qmetrics
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.integer_repair import integer_repair
from qir.passes.tune.space import Space
from qir.passes.tune.state import TuneState
from qir.passes.tune.target import Score, Target
from qir.runtimes.march import get_profile

from ..conftest import DIGITS, DIGITS_DATA, calibrate_for_nash_e

EVAL = [{"input": x} for x in np.load(DIGITS / "eval_images.npy")[:12]]


@pytest.fixture(scope="module")
def model():
    ir = calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, "max")
    return ir, Space(ir, get_profile("nash-e"))


def _integer_score(ir: qir.QIR, space: Space, config, samples=EVAL) -> Score:
    """Cosine of each sample's output (default: EVAL's), the configured model at nash-e's integer
    level run whole against its float run (the numpy runtime), and their mean."""
    tuned = space.apply(ir.clone(), config)
    values = [qmetrics.compute(["cosine-similarity"], qir.run(tuned, s, level="float")["logits"],
                               qir.run(tuned, s, level="integer", march="nash-e")["logits"])["cosine-similarity"]
              for s in samples]
    return Score(float(np.mean(values)), tuple(values))


def _found(space: Space, final) -> TuneState:
    upper = space.upper()
    return TuneState(start=final, plain_start=final, int16=upper, upper=upper, ceiling=upper, fixes=[], reached=True,
                     final=final, reference=upper)


def _repair(ir: qir.QIR, space: Space, start, target: Target, samples=EVAL):
    """The search at the integer level from ``start`` for ``target`` on ``samples``."""
    ev = Evaluator(space.apply(ir.clone(), start), space, target, samples, progress=False, threads=1)
    try:
        return integer_repair(ev, space, _found(space, start), march="nash-e")
    finally:
        ev.close()


def test_the_repair_finds_raises_that_meet_the_target_at_the_integer_level(model):
    ir, space = model
    start, upper = space.start(), space.upper()
    low, high = _integer_score(ir, space, start), _integer_score(ir, space, upper)
    assert high.mean > low.mean
    target = Target("cosine-similarity", ">=", (low.mean + high.mean) / 2)
    repair = _repair(ir, space, start, target)
    assert repair.before.mean == pytest.approx(low.mean, abs=1e-6)  # the engine's integer level is the whole run's
    assert repair.config is not None and repair.raised
    assert repair.raised == space.names(space.raised(repair.config, start))
    whole = _integer_score(ir, space, repair.config)
    assert target.met(whole) and whole.mean == pytest.approx(repair.after.mean, abs=1e-6)
    assert space.cost(repair.config) < space.cost(upper)  # fewer raises than all of them
    assert repair.to_json(target)["found"] and repair.candidates == len(space.raised(upper, start))


def test_the_repair_says_so_when_no_raise_meets_the_target(model):
    ir, space = model
    start, upper = space.start(), space.upper()
    high = _integer_score(ir, space, upper)
    target = Target("cosine-similarity", ">=", min(1.0, high.mean + 1e-4))  # beyond the upper bound at that level
    repair = _repair(ir, space, start, target)
    assert repair.config is None and repair.after is None and not repair.to_json(target)["found"]


def test_an_onnxruntime_miss_gives_the_gap_to_the_search_only_when_the_search_met_the_target():
    from qir.passes.tune.integer_repair import onnxruntime_gaps

    target = Target("cosine-similarity", ">=", 0.99, 0.98)
    searched = Score(0.9901, (0.9902, 0.9900, 0.9850))
    missed = {"meets": False, "roundtrip": [], "mean": 0.98995, "worst": 0.9849}
    assert onnxruntime_gaps(target, missed, searched) == pytest.approx((0.9901 - 0.98995, 0.9850 - 0.9849))
    assert onnxruntime_gaps(target, dict(missed, meets=True), searched) is None  # it passed there
    assert onnxruntime_gaps(target, dict(missed, roundtrip=["x_calib"]), searched) is None  # another failure
    assert onnxruntime_gaps(target, missed, Score(0.9899, (0.99, 0.99, 0.9898))) is None  # the search missed too
    assert onnxruntime_gaps(Target("cosine-similarity", ">=", 0.99), missed, searched) == pytest.approx(
        (0.9901 - 0.98995, 0.0))  # no floor: the worst sample's gap does not count


def test_a_miss_in_onnxruntime_raises_the_result_further_for_a_tighter_target(monkeypatch, model):
    from qir.passes import get_pass
    from qir.passes import tune as tune_pass
    from qir.passes.tune.target import parse_target

    real, checked = tune_pass.verify, []

    def verify(ir, samples, target, searched, **options):  # the first result misses in onnxruntime by `gap`
        out = real(ir, samples, target, searched, **options)
        checked.append(out)
        if len(checked) == 1:
            gap = out["margin"] + 1e-6
            out = dict(out, mean=out["mean"] - gap, margin=out["margin"] - gap, meets=False, agrees=False,
                       onnxruntime_agrees=False)
        return out

    monkeypatch.setattr(tune_pass, "verify", verify)
    ir, space = model
    start, upper = _integer_score(ir, space, space.start()).mean, _integer_score(ir, space, space.upper()).mean
    target = f"cosine>={(start + upper) / 2!r}"
    # (priced by FLOPs: the faked miss tightens the target by twice the result's margin, which must
    # stay below the upper bound for a tighter search to exist; on these 6 units the time-priced
    # result lands 3e-5 above the target, and twice that is beyond every bound)
    report = get_pass("tune", target=target, eval_data=EVAL, calib_data=DIGITS_DATA, progress=False,
                      transforms=None, price="flops")(ir.clone()).report
    assert len(checked) == 2 and report["reached"] and report["verification"]["agrees"]
    assert parse_target(report["search_target"]).threshold > parse_target(target).threshold


@pytest.mark.parametrize("gap, searched_there", [(1e-6, False), (10.0, True)], ids=["retry-makes-it-up", "beyond-bounds"])
def test_a_miss_at_the_integer_level_only_is_raised_further_first_and_searched_there_last(monkeypatch, model, gap,
                                                                                          searched_there):
    """Step 7's order: a small gap is made up by the cheap fake-quant retry, and the search at the
    integer level never runs; a gap no tightened target can make up goes to that search, from
    the first result."""
    from qir.passes import get_pass
    from qir.passes import tune as tune_pass

    real_verify, real_repair, checked, repaired = tune_pass.verify, tune_pass.integer_repair, [], []

    def verify(ir, samples, target, searched, **options):  # the first result misses at the integer level by `gap`
        out = real_verify(ir, samples, target, searched, **options)
        checked.append(out)
        if len(checked) == 1:
            integer = dict(out["integer"], mean=out["mean"] - gap, worst=out["worst"] - gap, meets=False,
                           margin=out["margin"] - gap, complete=True)
            out = dict(out, agrees=False, integer=integer)
        return out

    def repair(ev, space, found, **options):
        repaired.append(found.final)
        return real_repair(ev, space, found, **options)

    monkeypatch.setattr(tune_pass, "verify", verify)
    monkeypatch.setattr(tune_pass, "integer_repair", repair)
    monkeypatch.setattr(tune_pass.TunePass, "_backtrack", lambda *a: None)  # (nothing goes back)
    ir, space = model
    start, upper = _integer_score(ir, space, space.start()).mean, _integer_score(ir, space, space.upper()).mean
    report = get_pass("tune", target=f"cosine>={(start + upper) / 2!r}", eval_data=EVAL, calib_data=DIGITS_DATA,
                      progress=False, transforms=None, price="flops")(ir.clone()).report
    assert bool(repaired) is searched_there
    assert ("search_target" in report) is not searched_there  # (the retry's tightened target)
    if searched_there:
        assert report["integer_repair"]["candidates"] >= 0 and len(repaired) == 1


def test_a_start_that_misses_only_at_the_integer_level_goes_to_the_search_there(monkeypatch, model):
    """No search ran (the start met the target in fake quantization), so no order exists for the
    fake-quant retry: it would raise units in graph order. The search at the integer level ranks
    them there first (here it finds the start meets there after all, the miss being faked, so the
    retry then runs as the fallback)."""
    from qir.passes import get_pass
    from qir.passes import tune as tune_pass

    real_verify, real_repair, checked, repaired = tune_pass.verify, tune_pass.integer_repair, [], []

    def verify(ir, samples, target, searched, **options):  # the start misses at the integer level by a hair
        out = real_verify(ir, samples, target, searched, **options)
        checked.append(out)
        if len(checked) == 1:
            integer = dict(out["integer"], mean=out["mean"] - 1e-6, worst=out["worst"] - 1e-6, meets=False,
                           margin=out["margin"] - 1e-6, complete=True)
            out = dict(out, agrees=False, integer=integer)
        return out

    def repair(ev, space, found, **options):
        repaired.append((found.final, ev.target.text))
        return real_repair(ev, space, found, **options)

    monkeypatch.setattr(tune_pass, "verify", verify)
    monkeypatch.setattr(tune_pass, "integer_repair", repair)
    ir, space = model
    start = _integer_score(ir, space, space.start()).mean
    report = get_pass("tune", target=f"cosine>={start - 0.05!r}", eval_data=EVAL, calib_data=DIGITS_DATA,
                      progress=False, transforms=None)(ir.clone()).report
    assert report["start"]["meets"] and len(repaired) == 1  # (the start met it: no sensitivity order)
    (config, searched_for), = repaired
    assert config.levels == space.start().levels and searched_for == report["target"]  # before any retry tightened it
    assert report["reached"] and report["verification"]["agrees"]


def test_raises_of_the_search_at_the_integer_level_are_named_so():
    """The start meets the target in fake quantization and misses it at the integer level: the
    result's raises come from the search there, and the report says so, by reason and in its
    first line."""
    from qir.passes import get_pass
    from qir.tools.reports.tune import outcome

    ir = calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, "mse")
    space = Space(ir, get_profile("nash-e"))
    integer = _integer_score(ir, space, space.start()).mean
    tuned = space.apply(ir.clone(), space.start())
    fake = float(np.mean([qir.metrics.cosine_similarity(qir.run(tuned, s, level="float")["logits"],
                                                         qir.run(tuned, s)["logits"]) for s in EVAL]))
    assert integer < fake  # (the planted case: the integer level loses where fake quantization does not)
    report = get_pass("tune", target=f"cosine>={(integer + fake) / 2!r}", eval_data=EVAL, calib_data=DIGITS_DATA,
                      progress=False, transforms=None)(ir.clone()).report
    assert report["start"]["meets"] and report["reached"] and report["verification"]["agrees"]
    repaired = [c["node"] for c in report["changes"] if c["reason"] == "integer level"]
    assert repaired and repaired == report["integer_repair"]["raised"]
    assert f"the search at the integer level raised {', '.join(repaired)}" in outcome(report)
    from qir.tools.reports.tune import format_report

    section = format_report(report).split("== the search at the integer level")[1].split("\n== ")[0]
    repair = report["integer_repair"]
    assert f"{repair['ranked']} of {repair['candidates']} unit(s)" in section and repaired[0] in section


def test_the_rounds_take_the_most_departing_units_first_and_the_rest_last():
    from qir.passes.tune.integer_repair import _rounds

    assert list(_rounds(list(range(30)), [99, 98])) == [list(range(8)), list(range(8, 24)), list(range(24, 30)), [99, 98]]
    assert list(_rounds([], [5])) == [[5]] and list(_rounds([1, 2], [])) == [[1, 2]]


def test_departures_are_the_consistency_pass_own_shares_most_first(model):
    from qir.passes.consistency import ConsistencyPass
    from qir.passes.tune.integer_repair import _departures

    ir, space = model
    start = space.start()
    units = space.searchable()
    found = _departures(ir, space, start, EVAL[:2], "nash-e", units)
    rows = {r.node: r.own_differ for r in ConsistencyPass(EVAL[:2]).compare(space.apply(ir.clone(), start)).rows}
    assert found and list(found.values()) == sorted(found.values(), reverse=True)
    assert found == {i: rows[space.units[i].name] for i in units if rows.get(space.units[i].name, 0) > 0}


@pytest.mark.parametrize("first_round", [1, 2])
def test_a_first_round_that_meets_ends_the_search_before_every_unit_is_ranked(monkeypatch, model, first_round):
    """A target that the most departing unit's raise alone meets is met in the first round: the units
    of later rounds (one round of one unit, or of two: every departing unit here) are never raised alone."""
    import importlib

    from qir.passes.tune.integer_repair import _departures

    repair_module = importlib.import_module("qir.passes.tune.integer_repair")
    monkeypatch.setattr(repair_module, "FIRST_ROUND", first_round)
    ir, space = model
    start = space.start()
    low = _integer_score(ir, space, start)
    picked = Target("cosine-similarity", ">=", 1.0).bad_cases(low.samples, repair_module.SCREEN_SAMPLES)
    departing = list(_departures(ir, space, start, [EVAL[i] for i in picked], "nash-e", space.searchable()))
    top = space.move(start, {departing[0]: space.top_integer(departing[0])})
    alone = _integer_score(ir, space, top)
    assert alone.mean > low.mean  # (the planted case: raising it alone recovers some of the loss)
    target = Target("cosine-similarity", ">=", (low.mean + alone.mean) / 2)
    repair = _repair(ir, space, start, target)
    assert repair.config is not None and target.met(_integer_score(ir, space, repair.config))
    assert repair.departing == len(departing) and repair.candidates == len(space.searchable())
    assert repair.ranked == min(first_round, len(departing)) < repair.candidates  # (those that do not depart: never)


def test_units_that_do_not_depart_are_ranked_last_when_the_departing_ones_do_not_meet(monkeypatch, model):
    """The departures order the search; they do not bound it: a target only raises outside them
    meet is still met, in the last round, after every unit was ranked."""
    import importlib

    repair_module = importlib.import_module("qir.passes.tune.integer_repair")
    ir, space = model
    start, upper = space.start(), space.upper()
    low, high = _integer_score(ir, space, start), _integer_score(ir, space, upper)
    target = Target("cosine-similarity", ">=", (low.mean + high.mean) / 2)
    useless = min(space.searchable(), key=lambda i: _integer_score(ir, space, space.move(start, {i: space.top_integer(i)})).mean)
    monkeypatch.setattr(repair_module, "_departures", lambda *a: {useless: 0.5})  # (the one that helps least "departs")
    monkeypatch.setattr(repair_module, "FIRST_ROUND", 1)  # (rounds of more units than the 6 here: one round)
    repair = _repair(ir, space, start, target)
    assert repair.config is not None and target.met(_integer_score(ir, space, repair.config))
    assert repair.departing == 1 and repair.ranked == repair.candidates


def test_a_failed_comparison_ranks_every_unit_at_once(monkeypatch, model, caplog):
    """The departures only order the search: when the consistency pass fails (it refuses samples
    whose fake-quantized values are not finite, and raises when none is left), the search ranks
    every unit in one round and says so, instead of stopping the tune."""
    import importlib

    from qir.errors import InputError
    from qir.passes.consistency import ConsistencyPass

    def refuse(self, ir):
        raise InputError("every sample's fake-quantized values hold NaN or Inf")

    monkeypatch.setattr(ConsistencyPass, "compare", refuse)
    monkeypatch.setattr(importlib.import_module("qir.passes.tune.integer_repair"), "FIRST_ROUND", 1)
    ir, space = model
    start, upper = space.start(), space.upper()
    low, high = _integer_score(ir, space, start), _integer_score(ir, space, upper)
    target = Target("cosine-similarity", ">=", (low.mean + high.mean) / 2)
    with caplog.at_level("WARNING"):
        repair = _repair(ir, space, start, target)
    assert "every unit is ranked" in caplog.text
    assert repair.departing is None and repair.ranked == repair.candidates and repair.config is not None


def test_with_as_many_samples_as_the_screen_the_gains_are_measured_on_every_sample(model):
    """Two evaluation samples: the screen is the whole evaluator (no second one), and the repair
    still meets the target there."""
    ir, space = model
    start = space.start()
    worst = np.argsort(_integer_score(ir, space, start).samples)[:2]
    two = [EVAL[i] for i in sorted(worst)]
    low = _integer_score(ir, space, start, two)
    high = max((_integer_score(ir, space, space.move(start, {i: space.top_integer(i)}), two) for i in space.searchable()),
               key=lambda s: s.mean)  # (the best single raise: the target is within reach)
    assert high.mean > low.mean
    target = Target("cosine-similarity", ">=", (low.mean + high.mean) / 2)
    repair = _repair(ir, space, start, target, two)
    assert repair.config is not None and target.met(_integer_score(ir, space, repair.config, two))


def test_the_search_at_the_integer_level_compares_with_the_search_s_float_outputs(monkeypatch, model):
    """Its engines take the fake-quant search's float outputs (what verification compares the
    integer level with too) instead of running the float model again in numpy on every sample."""
    from qir.runtimes.engine.whole import WholeRuns

    runs = []
    real = WholeRuns.baseline
    monkeypatch.setattr(WholeRuns, "baseline", lambda self, *a: runs.append(a[-1]) or real(self, *a))
    ir, space = model
    start, upper = space.start(), space.upper()
    low, high = _integer_score(ir, space, start), _integer_score(ir, space, upper)
    repair = _repair(ir, space, start, Target("cosine-similarity", ">=", (low.mean + high.mean) / 2))
    assert repair.config is not None and "float" not in runs


def test_every_score_of_the_search_at_the_integer_level_is_taken_around_the_result(monkeypatch, model):
    """The result is scored by the engine whose reference it is, the one the ratio search then
    uses: it is traced once per sample, not traced as the start's changes first (an integer run
    of the start and one of most of the model per sample, on PP-OCRv4 det 2.7 of 30 s)."""
    arounds = []
    real = Evaluator._engine_scores
    monkeypatch.setattr(Evaluator, "_engine_scores",
                        lambda self, configs, stage, around=None: arounds.append(around) or real(self, configs, stage, around))
    ir, space = model
    start, upper = space.start(), space.upper()
    low, high = _integer_score(ir, space, start), _integer_score(ir, space, upper)
    raised = space.move(start, {space.searchable()[0]: 1})
    arounds.clear()
    repair = _repair(ir, space, raised, Target("cosine-similarity", ">=", (low.mean + high.mean) / 2))
    assert repair.before is not None and arounds and all(a == raised for a in arounds)
