"""The ``tune`` pass on the digits example: targets parse or say their syntax, the precision ladders
follow the march profile, a reachable target is reached and verified, an unreachable one stops
honestly with the best configuration and the upper bound, pruning never leaves the target unmet,
clipping is fixed by thresholds before precision is raised, and every number is checked against
a plain whole-model run (not the engine the search uses)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import qir
from qir import metrics as qmetrics
from qir.errors import InputError
from qir.passes import get_pass
from qir.passes.tune import STAGES
from qir.passes.tune.evaluator import ENGINE_FROM, WHOLE_FROM, Evaluator
from qir.passes.tune.search import _prefix_sizes, by_loss_per_cost, changes_as_losses, prune, ratio_search
from qir.passes.tune.space import Space
from qir.passes.tune.target import SYNTAX, Score, Target, parse_target
from qir.runtimes.engine.cost import op_flops
from qir.runtimes.march import get_profile
from qir.tools.reports.tune import format_report

from ..conftest import DIGITS, DIGITS_DATA, calibrate_for_nash_e

EVAL = [{"input": x} for x in np.load(DIGITS / "eval_images.npy")[:40]]
LABELS = np.load(DIGITS / "eval_labels.npy")[:40]


def _calibrated(method: str = "max") -> qir.QIR:
    return calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, method)


def _plain_score(ir: qir.QIR, metric: str = "cosine-similarity") -> Score:
    """``metric`` of ``ir`` (as its calibration nodes say) against its float run, on each sample
    of EVAL and their mean: whole-model runs on the numpy runtime, no engine."""
    values = [qmetrics.compute([metric], qir.run(ir, s, level="float")["logits"], qir.run(ir, s)["logits"])[metric]
              for s in EVAL]
    return Score(float(np.mean(values)), tuple(values))


def _plain(ir: qir.QIR, metric: str = "cosine-similarity") -> float:
    return _plain_score(ir, metric).mean


def _configured(ir: qir.QIR, modes: dict[str, str]) -> qir.QIR:
    clone = ir.clone()
    for name, mode in modes.items():
        clone.set_calibration(name, mode=mode)
    return clone


def _tune(ir: qir.QIR, target, **options):
    """The precision search alone (the transforms stage is tested in test_tune_transforms.py)."""
    options.setdefault("transforms", None)
    return get_pass("tune", target=target, eval_data=EVAL, calib_data=DIGITS_DATA, progress=False, **options)(ir)


# ------------------------------------------------------------------ targets
@pytest.mark.parametrize("text, metric, op, threshold", [
    ("cosine>=0.99", "cosine-similarity", ">=", 0.99), (" mse <= 1e-3 ", "mse", "<=", 1e-3),
    ("sqnr-db>=30", "sqnr-db", ">=", 30.0), ("COS>=0.5", "cosine-similarity", ">=", 0.5)])
def test_targets_parse(text, metric, op, threshold):
    t = parse_target(text)
    assert (t.metric, t.op, t.threshold) == (metric, op, threshold)
    assert t.met(Score(threshold, (threshold,))) and not t.met(Score(math.nan, ()))
    assert t.floor is None and parse_target(t.text) == t


@pytest.mark.parametrize("text, floor, mean, breaking", [("cosine>=0.99,worst>=0.98", 0.98, 0.995, 0.97),
                                                         ("mse<=1e-3, worst <= 1e-2", 1e-2, 5e-4, 2e-2),
                                                         ("cos>=0.99,WORST>=0.99", 0.99, 0.995, 0.985)])
def test_a_worst_sample_floor_is_part_of_the_target(text, floor, mean, breaking):
    t = parse_target(text)
    assert t.floor == floor and parse_target(t.text) == t
    good, missed = Score(mean, (mean, mean)), Score(mean, (mean, breaking))  # the mean is met; one sample breaks the floor
    assert t.met(good) and not t.met(missed) and t.margin(missed) < 0 < t.margin(good)
    assert t.margin(missed) == pytest.approx(abs(breaking - floor) * -1)
    assert t.gain(good, missed) == pytest.approx(t.margin(good) - t.margin(missed))
    assert not t.met(Score(mean, (mean, math.nan)))  # a NaN sample misses a floor...
    assert Target(t.metric, t.op, t.threshold).met(Score(mean, (mean, math.nan)))  # ...the mean alone skips it
    fn = lambda outputs, i: 1.0  # noqa: E731
    assert parse_target((fn, ">=", 0.9, 0.8)).floor == 0.8


@pytest.mark.parametrize("bad, says", [("cosine>=0.99,worst<=0.98", "must have the direction of the target"),
                                       ("cosine>=0.98,worst>=0.99", "stricter than the mean's threshold"),
                                       ("cosine>=0.99,worst>=x", "METRIC>=VALUE"), ("cosine>=0.99,best>=0.9", "METRIC>=VALUE")])
def test_a_bad_floor_says_what_is_wrong(bad, says):
    with pytest.raises(InputError, match=says):
        parse_target(bad)


@pytest.mark.parametrize("bad", ["cosine", "cosine=0.99", "cosine>=x", "cosine>=nan", "accuracy>=0.9", 0.99,
                                 ("cosine", "~", 0.9)])
def test_an_unreadable_target_gives_the_syntax(bad):
    with pytest.raises(InputError) as exc:
        parse_target(bad)
    assert SYNTAX in str(exc.value) and "METRIC>=VALUE" in str(exc.value)


def test_a_target_in_the_wrong_direction_says_which_is_right():
    with pytest.raises(InputError, match="better when higher: write 'cosine>=0.99'"):
        parse_target("cosine<=0.99")
    fn = lambda outputs, i: 1.0  # noqa: E731
    assert parse_target((fn, 0.9)).op == ">=" and parse_target((fn, "<=", 0.1)).op == "<="


# ------------------------------------------------------------------ the space
def test_ladders_are_the_profiles_filtered_by_its_dtype_rules():
    ir = _calibrated()
    e = Space(ir, get_profile("nash-e"))
    levels = {u.name: u.levels for u in e.units}
    # relu4 feeds MaxPool, whose data input is int8-only on nash-e (int8_only_inputs): no int16 there
    assert levels["relu4_out_calib"] == ("int8",)
    assert levels["relu1_out_calib"] == get_profile("nash-e").tune_ladder["gemm"]
    # without the (int16, int16) GEMM pair, dual int16 is no level: the profile decides, not the march name
    no_dual = get_profile("nash-e").with_overrides(gemm_dtype_pairs=(("int8", "int8"), ("int16", "int8")))
    assert all("int16+w16" not in u.levels for u in Space(ir, no_dual).units)
    # nash-p: non-GEMM inputs start (and stay) at fp16; allow_float adds float last
    p = {u.name: u.levels for u in Space(ir, get_profile("nash-p"), allow_float=True).units}
    assert p["relu4_out_calib"] == ("fp16", "float") and p["relu1_out_calib"][0] == "int8"


def test_flop_cost_is_flops_times_the_profiles_cost_of_each_op():
    ir = _calibrated()
    profile = get_profile("nash-e")
    space = Space(ir, profile)
    i = space.index["relu1_out_calib"]
    raised = space.start().with_levels({i: space.units[i].levels.index("int16")})
    # relu1 feeds conv2 only: raising it moves conv2 from "int8 x int8" to "int16 x int8"
    conv2 = ir.op("conv2")
    costs = profile.tune_costs
    assert space.flop_cost(raised) - space.flop_cost(space.start()) == pytest.approx(
        op_flops(ir, conv2) * (costs["int16 x int8"] - costs["int8 x int8"]))
    assert space.changes(raised) == {"relu1_out_calib": "int16"}
    # a model configured elsewhere costs what its own modes cost (the peers' emitted models, imported)
    assert Space(space.apply(ir.clone(), raised), profile).flop_cost_of_ir() == pytest.approx(space.flop_cost(raised))
    assert Space(ir, profile).flop_cost_of_ir() == pytest.approx(space.flop_cost(space.start()))
    # an op that reads no quantizer runs in float and costs so: the float model costs float everywhere
    plain = qir.load(DIGITS / "model.onnx")
    gemms = ("Conv", "ConvTranspose", "Gemm", "MatMul")
    want = sum(op_flops(plain, op) * costs["float x float" if op.op_type in gemms else "float"] for op in plain.ops())
    assert Space(plain, profile).flop_cost_of_ir() == pytest.approx(want) and want > space.flop_cost(space.upper())


def test_cost_is_the_latency_models_time_of_the_configuration():
    from qir.passes.lib.latency import LatencyModel
    from qir.passes.lib.latency_groups import precisions_of

    ir = _calibrated()
    profile = get_profile("nash-e")
    space = Space(ir, profile, price="latency")
    i = space.index["relu1_out_calib"]
    raised = space.start().with_levels({i: space.units[i].levels.index("int16")})
    tuned = space.apply(ir.clone(), raised)
    # the same figure as the latency model on the IR configured so (every op's precision from its quantizers)
    assert space.cost(raised) == pytest.approx(LatencyModel(tuned, profile).estimate().total_us)
    assert space.cost(raised) == pytest.approx(LatencyModel(ir, profile).estimate(
        precisions_of(ir, space.modes(raised))).total_us)
    assert Space(tuned, profile, price="latency").cost_of_ir() == pytest.approx(space.cost(raised))
    # raising an activation costs time: at least the extra bytes of the int16 value it quantizes
    assert space.cost(raised) > space.cost(space.start())
    assert space.cost(space.upper()) > space.cost(space.level_named(space.start(), "int16")) > space.cost(space.start())
    # price="flops": the search minimises the FLOP-weighted cost instead; the time is still there
    assert Space(ir, profile).price == "latency"  # (the default price)
    by_flops = Space(ir, profile, price="flops")
    assert by_flops.cost(raised) == by_flops.flop_cost(raised) and by_flops.time_us(raised) == space.cost(raised)
    with pytest.raises(InputError, match="unknown price 'bytes'"):
        Space(ir, profile, price="bytes")


# ------------------------------------------------------------------ the search
def test_a_reachable_target_is_reached_verified_and_holds_in_a_plain_run():
    ir = _calibrated("percentile")
    start = _plain(_configured(ir, {c.name: "int8" for c in ir.calibrations()}), "mse")
    upper = _plain(_configured(ir, {c.name: "int16" for c in ir.calibrations("activation")}), "mse")
    threshold = (start + upper) / 2  # between all-int8 and all-int16 activations: some nodes must be raised
    result = _tune(ir, f"mse<={threshold!r}")
    report = result.report
    assert report["reached"] and report["verification"]["agrees"], report["verification"]
    assert _plain(result.ir, "mse") <= threshold  # the tuned IR itself, run whole without the engine
    plain = _plain(result.ir, "mse")  # (onnxruntime and numpy round a few ties apart: agreement as verify defines it)
    assert report["verification"]["mean"] == pytest.approx(plain, abs=parse_target(f"mse<={threshold!r}").tolerance(plain))
    assert 0 < report["raised"] < report["searchable_units"]
    assert report["final"]["cost"] < report["all_int16"]["cost"]
    assert {c["reason"] for c in report["changes"]} <= {"rounding", "interaction", "clipping"}
    # each sample's change counted as a loss is at least the mean loss, and never negative
    assert all(c["per_image"] >= max(c["gain"], 0.0) - 1e-12 for c in report["changes"])
    assert report["pareto"] and all(report["history"][i]["mean"] == report["history"][i]["mean"]
                                    for i in report["pareto"])


def test_a_worst_sample_floor_is_reached_where_the_mean_alone_would_raise_nothing():
    ir = _calibrated("mse")
    space = Space(ir, get_profile("nash-e"))
    start = _plain_score(space.apply(ir.clone(), space.start()), "mse")
    int16 = _plain_score(space.apply(ir.clone(), space.level_named(space.start(), "int16")), "mse")
    assert max(int16.samples) < max(start.samples)  # int16 activations help the worst sample
    target = parse_target(f"mse<={start.mean * 1.01!r},worst<={(max(start.samples) + max(int16.samples)) / 2!r}")
    assert target.threshold > start.mean and not target.met(start)  # the start meets the mean only
    result = _tune(ir, target)
    report = result.report
    assert report["reached"] and report["verification"]["agrees"], report["verification"]
    assert report["raised"] > 0 and not report["start"]["meets"]
    assert report["worst_floor"] == target.floor and report["final"]["worst"] <= target.floor
    tuned = _plain_score(result.ir, "mse")  # the tuned IR itself, run whole: every sample within the floor
    assert target.met(tuned) and max(tuned.samples) <= target.floor
    assert report["verification"]["worst"] == pytest.approx(max(tuned.samples), rel=1e-4)


def test_an_unreachable_target_stops_with_the_best_configuration_and_the_upper_bound():
    ir = _calibrated()
    upper_modes = {c.name: "int16" for c in ir.calibrations()
                   if c.role.value == "weight" or c.name not in ("relu4_out_calib", "relu5_out_calib")}
    upper = _plain(_configured(ir, upper_modes))
    result = _tune(ir, f"cosine>={1 - (1 - upper) / 10!r}")  # ten times closer to float than the upper bound
    report = result.report
    assert not report["reached"]
    assert report["upper_bound"]["mean"] == pytest.approx(upper, abs=1e-6)
    assert report["final"]["mean"] == max(h["mean"] for h in report["history"])  # the best found
    assert _plain(result.ir) == pytest.approx(report["final"]["mean"], abs=1e-6)


def test_the_ceiling_is_measured_only_where_the_upper_bound_misses_the_target():
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"), allow_float=True)
    assert space.ceiling() != space.upper()  # float32 beyond the integer levels
    upper = _plain(space.apply(ir.clone(), space.upper()))
    met = _tune(ir, "cosine>=0.5", allow_float=True, verify=False).report
    assert met["upper_bound"]["meets"] and met["ceiling"] is None
    assert space.describe(space.ceiling()) not in [h["levels"] for h in met["history"]]
    beyond = _tune(ir, f"cosine>={1 - (1 - upper) / 10!r}", allow_float=True, verify=False).report
    assert not beyond["upper_bound"]["meets"] and beyond["ceiling"]["meets"]
    assert beyond["ceiling"]["mean"] == pytest.approx(_plain(space.apply(ir.clone(), space.ceiling())), abs=1e-6)


def test_when_all_int16_just_misses_the_search_works_down_from_the_upper_bound_with_its_int16_weights():
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    int16 = _plain(space.apply(ir.clone(), space.level_named(space.start(), "int16")))
    upper = _plain(space.apply(ir.clone(), space.upper()))
    result = _tune(ir, f"cosine>={(int16 + 3 * upper) / 4!r}")
    report = result.report
    assert not report["all_int16"]["meets"] and report["upper_bound"]["meets"]  # (the case this is about)
    assert report["reference"]["cost"] == report["upper_bound"]["cost"]
    assert report["reached"] and report["verification"]["agrees"], report["verification"]
    assert report["final"]["levels"].get("int16+w16", 0) > 0 and report["final"]["cost"] <= report["upper_bound"]["cost"]
    assert parse_target(report["target"]).met(_plain_score(result.ir))  # the tuned IR itself, run whole


def test_units_are_raised_in_order_of_loss_per_cost():
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start, upper = space.start(), space.upper()
    units = [i for i in space.searchable() if upper.levels[i] > 0]
    added = {i: space.cost(space.move(start, {i: upper.levels[i]})) - space.cost(start) for i in units}
    cheapest, dearest = min(units, key=added.get), max(units, key=added.get)
    loss = {i: 1.0 for i in units}
    loss[dearest] = 2.0  # twice the loss, at many times the cost
    order = by_loss_per_cost(space, start, upper.levels, loss)
    assert order[0] == cheapest and order.index(dearest) > 0 and added[dearest] > 2 * added[cheapest]
    assert order == sorted(units, key=lambda i: -loss[i] / added[i])


def test_cheap_units_are_raised_without_a_search_and_their_gain_is_measured_together(monkeypatch):
    from qir.passes import tune as tune_pass

    monkeypatch.setattr(tune_pass, "CHEAP_SHARE", 0.01)  # on digits: one unit (the input's, by the latency model)
    ir = _calibrated("percentile")
    space = Space(ir, get_profile("nash-e"))
    expected = space.names(space.cheap(space.start(), space.upper(), 0.01))
    assert 0 < len(expected) < len(space.searchable())
    start = _plain(_configured(ir, {c.name: "int8" for c in ir.calibrations()}), "mse")
    upper = _plain(_configured(ir, {c.name: "int16" for c in ir.calibrations()}), "mse")
    result = _tune(ir, f"mse<={(start + upper) / 2!r}")
    report = result.report
    assert report["reached"] and report["verification"]["agrees"]
    cheap = [c for c in report["changes"] if c["reason"] == "cheap"]
    assert [c["nodes"] for c in cheap] == [expected]
    top = {u.name: u for u in space.units}
    undo = {}
    for name in expected:  # each at its reference level (the upper bound's), undone together
        assert result.ir.calibration(name).mode.value == "int16"
        undo[name] = "int8"
        undo.update({w: "int8" for w in top[name].weights})
    picked = [EVAL[i] for i in report["attribution_samples"]]
    undone = _configured(result.ir, undo)
    def on(model):
        return np.mean([qmetrics.compute(["mse"], qir.run(model, s, level="float")["logits"],
                                         qir.run(model, s)["logits"])["mse"] for s in picked])
    assert cheap[0]["gain"] == pytest.approx(on(undone) - on(result.ir), rel=1e-3, abs=1e-9)  # measured, undone together


def test_cheap_units_the_target_does_not_need_go_back_down_in_pruning(monkeypatch):
    from qir.passes import tune as tune_pass

    monkeypatch.setattr(tune_pass, "CHEAP_SHARE", 1.0)  # every unit cheap: raised with no search, then pruned
    ir = _calibrated("percentile")
    space = Space(ir, get_profile("nash-e"))
    cheap = space.cheap(space.start(), space.upper(), 1.0)
    assert len(cheap) == len([i for i in space.searchable() if space.upper().levels[i] > 0]) > 2
    start = _plain(_configured(ir, {c.name: "int8" for c in ir.calibrations()}), "mse")
    upper = _plain(_configured(ir, {c.name: "int16" for c in ir.calibrations()}), "mse")
    result = _tune(ir, f"mse<={(start + upper) / 2!r}")
    report = result.report
    assert report["reached"] and report["verification"]["agrees"]
    assert report["ratio_search"]["cheap"] == len(cheap)
    assert 0 < report["raised"] < len(cheap)  # the floor was every unit raised: pruning took some back down
    assert report["ratio_search"]["cheap_kept"] == report["raised"]
    assert f"({report['raised']} cheap unit(s) kept)" in format_report(report)
    assert parse_target(report["target"]).met(_plain_score(result.ir, "mse"))


def test_the_integer_level_retry_raises_the_cheap_units_pruning_lowered_first(monkeypatch):
    from qir.passes import tune as tune_pass
    from qir.passes.tune.state import TuneState

    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start, upper = space.start(), space.upper()
    units = [i for i in space.searchable() if upper.levels[i] > 0]
    cheap, searched = units[-1], units[:2]  # one cheap unit pruning lowered, two the search ordered
    final = space.move(upper, {i: start.levels[i] for i in [cheap, *searched]})
    found = TuneState(start=start, plain_start=start, int16=upper, upper=upper, ceiling=upper, fixes=[],
                      reached=True, final=final, reference=upper, cheap=[cheap], order=list(searched))
    seen = {}

    def ratio_search(ev, base, order, step, **kwargs):
        seen["order"] = list(order)
        return None, None, None
    monkeypatch.setattr(tune_pass, "ratio_search", ratio_search)

    class Ev:
        memo = {upper: Score(1.0, (1.0,))}
        target = parse_target("cosine>=0.99")
    tune = get_pass("tune", target="cosine>=0.99", eval_data=EVAL, progress=False, transforms=None)
    result = tune._raise_further(Ev(), space, found)
    assert seen["order"] == [cheap, *searched]  # (the cheap one was in no order before)
    assert not result.reached and result.final == final


@pytest.mark.parametrize("needed", [1, 0])
def test_the_integer_level_retry_prunes_what_its_search_raised_back_to_the_result(monkeypatch, needed):
    from qir.passes import tune as tune_pass
    from qir.passes.tune.state import TuneState

    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start, upper = space.start(), space.upper()
    units = [i for i in space.searchable() if upper.levels[i] > 0]
    final = space.move(upper, {i: start.levels[i] for i in units[:3]})
    met = space.move(final, {i: upper.levels[i] for i in units[:2]})  # the retry's search raised two back
    pruned = space.move(final, {i: upper.levels[i] for i in units[1:1 + needed]})  # one of them needed, or none
    found = TuneState(start=start, plain_start=start, int16=upper, upper=upper, ceiling=upper, fixes=[],
                      reached=True, final=final, reference=upper, cheap=[], order=units[:3])
    seen = {}
    monkeypatch.setattr(tune_pass, "ratio_search", lambda ev, base, order, step, **kw: (met, base, 2))

    def prune(ev, config, floor, **kwargs):
        seen.update(config=config, floor=floor)
        return pruned
    monkeypatch.setattr(tune_pass, "prune", prune)

    class Ev:
        memo = {upper: Score(1.0, (1.0,))}
        target = parse_target("cosine>=0.99")
        samples = EVAL
    tune = get_pass("tune", target="cosine>=0.99", eval_data=EVAL, progress=False, transforms=None)
    result = tune._raise_further(Ev(), space, found)
    assert seen == {"config": met, "floor": final}  # pruned from what the search met, never below the result
    # (pruned all the way down, it would be the result that missed again: the search's configuration stays)
    assert result.reached and result.final == (pruned if needed else met)


@pytest.mark.parametrize("metric", ["cosine-similarity", "mse"])
def test_configurations_far_from_the_reference_run_whole_and_score_what_the_engine_and_a_plain_run_score(metric):
    ir = _calibrated("percentile")
    space = Space(ir, get_profile("nash-e"))
    base = space.apply(ir.clone(), space.start())
    threshold = 0.5 if metric == "cosine-similarity" else 1.0
    target = parse_target(f"{metric}{'>=' if metric == 'cosine-similarity' else '<='}{threshold}")
    configs = [space.upper(), space.level_named(space.start(), "int16"), space.ceiling()]
    whole = Evaluator(base, space, target, EVAL, progress=False)
    assert all(whole._units_changed(c, None) > WHOLE_FROM for c in configs)  # these run whole
    got = whole.score(configs, "test")
    engine = Evaluator(base, space, target, EVAL, progress=False)
    by_engine = engine._engine_scores(configs, "test")
    for config, w, e in zip(configs, got, by_engine):
        plain = _plain_score(space.apply(ir.clone(), config), metric)
        for other in (e, plain):
            assert w.mean == pytest.approx(other.mean, rel=1e-5, abs=1e-9)
            assert np.allclose(w.samples, other.samples, rtol=1e-4, atol=1e-9)
    for ev in (whole, engine):
        ev.close()


def test_a_few_configurations_near_a_new_one_run_whole_rather_than_build_an_engine_around_it():
    ir = _calibrated("percentile")
    space = Space(ir, get_profile("nash-e"))
    base, target, around = space.apply(ir.clone(), space.start()), parse_target("cosine>=0.5"), space.upper()
    near = [space.move(around, {i: 0}) for i in space.searchable()[:ENGINE_FROM - 1]]
    few = Evaluator(base, space, target, EVAL, progress=False)
    got = few.score(near, "test", around)
    assert not few._engines  # no engine was built around `around`: they ran whole
    engine = Evaluator(base, space, target, EVAL, progress=False)
    by_engine = engine._engine_scores(near, "test", around)
    assert engine._engines  # (the engine's way builds one)
    for w, e in zip(got, by_engine):
        assert w.mean == pytest.approx(e.mean, rel=1e-5, abs=1e-9)
    for ev in (few, engine):
        ev.close()


def test_on_the_numpy_runtime_far_configurations_stay_on_the_engine(monkeypatch):
    ir = _calibrated("percentile")
    space = Space(ir, get_profile("nash-e"))
    ev = Evaluator(space.apply(ir.clone(), space.start()), space, parse_target("cosine>=0.5"), EVAL[:4], progress=False,
                   runtime="numpy")
    monkeypatch.setattr(ev, "_whole_scores", lambda configs: pytest.fail("a whole onnxruntime run on the numpy runtime"))
    got = ev.score([space.upper()], "test")[0]
    ev.close()
    plain = _plain_score(space.apply(ir.clone(), space.upper()))
    assert got.samples == pytest.approx(plain.samples[:4], abs=1e-6)


def _pruning_case(method: str = "percentile"):
    """The digits model calibrated with ``method``, its space, the start as an IR, the upper bound
    and a target just below the upper bound's score: pruning has room, but not much."""
    ir = _calibrated(method)
    space = Space(ir, get_profile("nash-e"))
    upper = space.upper()
    target = parse_target(f"cosine>={_plain(space.apply(ir.clone(), upper)) - 2e-5!r}")
    return ir, space, space.apply(ir.clone(), space.start()), upper, target


def test_pruning_never_leaves_the_target_unmet_and_stops_where_any_lowering_would_miss():
    ir, space, base, upper, target = _pruning_case()
    ev = Evaluator(base, space, target, EVAL, progress=False)
    pruned = prune(ev, upper, space.start(), recheck=math.inf, as_measured=True)  # every unit measured at the end
    assert ev.met(pruned) and space.cost(pruned) < space.cost(upper)
    assert target.met(_plain_score(space.apply(ir.clone(), pruned)))  # checked by a plain run too
    for entry in ev.history:  # every configuration pruning moved to was measured to meet the target
        assert entry["config"] != pruned or entry["meets"]
    for i in space.raised(pruned):  # a local minimum: one more step down anywhere misses
        lower = pruned.with_levels({i: pruned.levels[i] - 1})
        assert not target.met(_plain_score(space.apply(ir.clone(), lower)))
    ev.close()


def test_pruning_tries_the_longest_prefix_within_each_share_of_the_margin():
    assert _prefix_sizes([0.1, 0.1, 0.1, 0.1], 0.4) == {2, 3, 4}  # 0.5, 0.75 and all of the margin
    assert _prefix_sizes([-0.5, 0.1, 0.1, 0.1, 0.1], 0.4) == {3, 4, 5}  # a negative loss counts as none
    assert _prefix_sizes([0.0] * 300, 1e-4) == {300}  # one size per share, not every size that fits
    assert _prefix_sizes([1.0], 0.5) == set()


def test_a_lowering_counts_each_samples_change_as_a_loss_however_many_samples():
    target = parse_target("cosine>=0.9")
    parent, child = Score(0.99, (0.99,) * 4), Score(0.99, (0.999, 0.981, 0.999, 0.981))  # mean change 0
    counted = changes_as_losses(target, parent, child)
    assert counted.mean == pytest.approx(0.981) and counted.samples == pytest.approx((0.981,) * 4)
    many = changes_as_losses(target, Score(0.99, (0.99,) * 400), Score(0.99, (0.999, 0.981) * 200))
    assert many.mean == pytest.approx(0.981)  # the risk to each image does not shrink with more of them
    mse = parse_target("mse<=1")
    assert changes_as_losses(mse, Score(0.1, (0.1, 0.3)), Score(0.2, (0.2, 0.2))).samples == pytest.approx((0.2, 0.4))
    earlier = Score(0.98, (0.98,) * 4)  # the parent as it counts, after earlier lowerings
    assert changes_as_losses(target, parent, child, earlier).mean == pytest.approx(0.971)
    assert math.isnan(changes_as_losses(target, parent, Score(0.99, (math.nan, 0.99, 0.99, 0.99))).samples[0])


@pytest.mark.parametrize("method", ["percentile", "mse"])
def test_pruning_counts_each_samples_change_as_a_loss_so_no_luck_pays_for_the_target(method):
    ir = _calibrated(method)
    space = Space(ir, get_profile("nash-e"))
    base, upper = space.apply(ir.clone(), space.start()), space.upper()
    before = _plain_score(space.apply(ir.clone(), upper))
    target = parse_target(f"cosine>={before.mean - 2e-5!r}")
    results = {}
    for as_measured in (False, True):
        ev = Evaluator(base, space, target, EVAL, progress=False)
        results[as_measured] = prune(ev, upper, space.start(), as_measured=as_measured)
        ev.close()
    for as_measured, result in results.items():  # run whole: each sample's change since the upper bound a loss
        assert space.cost(result) < space.cost(upper)
        counted = changes_as_losses(target, before, _plain_score(space.apply(ir.clone(), result)))
        assert target.met(counted) != as_measured  # as measured, the target is met only thanks to chance
    assert space.cost(results[True]) < space.cost(results[False])


def _just_below_the_upper_bound():
    """The mse-calibrated digits model, its space, the start as an IR, the upper bound and its plain
    score, a target just below it, and the units the upper bound raises."""
    ir = _calibrated("mse")
    space = Space(ir, get_profile("nash-e"))
    base, upper = space.apply(ir.clone(), space.start()), space.upper()
    before = _plain_score(space.apply(ir.clone(), upper))
    target = parse_target(f"cosine>={before.mean - 5e-5!r}")
    order = [i for i in space.searchable() if upper.levels[i] > 0]
    return ir, space, base, upper, before, target, order


def test_the_ratio_search_judged_by_changes_as_losses_raises_at_least_as_many_and_holds_so():
    ir, space, base, upper, before, target, order = _just_below_the_upper_bound()
    ev = Evaluator(base, space, target, EVAL, progress=False)
    ref = ev.score([upper], "test")[0]
    found = {}
    for name, counted in (("measured", lambda s: s), ("as losses", lambda s: changes_as_losses(target, ref, s))):
        found[name] = ratio_search(ev, space.start(), order, {i: upper.levels[i] for i in order}, counted=counted)
    ev.close()
    met, _, k = found["as losses"]
    assert met is not None and k >= found["measured"][2]
    after = _plain_score(space.apply(ir.clone(), met))  # run whole: each sample's change from the upper bound a loss
    assert target.met(changes_as_losses(target, before, after))


def test_a_ratio_search_that_knows_its_parent_decides_misses_on_fewer_samples_and_finds_the_same():
    ir, space, base, upper, before, target, order = _just_below_the_upper_bound()
    found, evs = {}, {}
    for early in (False, True):
        ev = evs[early] = Evaluator(base, space, target, EVAL, progress=False)
        ref = ev.score([upper], "test")[0]
        found[early] = ratio_search(ev, space.start(), order, {i: upper.levels[i] for i in order}, points=1,
                                    counted=lambda s, ref=ref: changes_as_losses(target, ref, s),
                                    parent=ref if early else None)
        ev.close()
    assert found[True] == found[False]
    missed = evs[True].missed
    assert missed and all(n < len(EVAL) for n in missed.values())  # each miss settled before the last sample
    assert all(c not in evs[True].memo and c in evs[False].memo for c in missed)
    for c in missed:  # (a miss as the full run counts it)
        assert not target.met(changes_as_losses(target, evs[False].memo[upper], evs[False].memo[c]))
    met = found[True][0]
    assert evs[True].memo[met] == evs[False].memo[met]  # a configuration that meets is scored on every sample


def test_the_ratio_search_upward_finds_the_bracket_from_one_raise():
    ir = _calibrated("mse")
    space = Space(ir, get_profile("nash-e"))
    base, upper = space.apply(ir.clone(), space.start()), space.upper()
    order = [i for i in space.searchable() if upper.levels[i] > 0]
    step = {i: upper.levels[i] for i in order}
    one = space.move(space.start(), {order[0]: step[order[0]]})
    target = parse_target(f"cosine>={_plain(space.apply(ir.clone(), one)) - 1e-9!r}")  # one raise meets it
    ev = Evaluator(base, space, target, EVAL, progress=False)
    met, _, k = ratio_search(ev, space.start(), order, step, upward=True)
    assert k == 1 and met == one and len(ev.history) == 1  # measured one configuration, the first probe
    ev.close()


def test_pruning_with_a_screen_measures_fewer_configurations_on_every_sample_and_still_meets_the_target():
    ir, space, base, upper, target = _pruning_case()
    every, full, few = (Evaluator(base, space, target, samples, progress=False) for samples in (EVAL, EVAL, EVAL[:4]))
    screened = []

    def screen(current, configs):  # estimates on 4 samples
        screened.extend(configs)
        scores = few.score([current, *configs], "screen", current)
        return scores[0], scores[1:]

    plain = prune(every, upper, space.start())
    pruned = prune(full, upper, space.start(), screen=screen)
    assert screened and full.met(pruned) and target.met(_plain_score(space.apply(ir.clone(), pruned)))
    assert len(full.history) < len(every.history)  # configurations measured on every sample
    assert space.cost(pruned) < space.cost(upper) and space.cost(plain) < space.cost(upper)
    for engine in (every, full, few):
        engine.close()


def test_clipping_is_fixed_with_thresholds_before_precision_is_raised():
    ir = _calibrated("kl")  # kl clips the digits model's activations: all-int16 alone does not help
    result = _tune(ir, "cosine>=0.999")
    report = result.report
    assert report["reached"] and report["verification"]["agrees"]
    assert report["calibrated"]["mean"] < 0.9 and report["start"]["mean"] > 0.999
    clipped = [c for c in report["changes"] if c["reason"] == "clipping"]
    assert clipped and all(c["gain"] > 0 for c in clipped)
    for c in clipped:  # the tuned model holds the covering threshold, fixed
        cal = result.ir.calibration(c["node"])
        assert cal.fixed and float(cal.threshold) == pytest.approx(c["threshold"], rel=1e-6)
    assert report["raised"] == 0  # thresholds were enough: no int16 at all
    assert _plain(result.ir) >= 0.999


def test_a_task_metric_target_is_met_on_the_evaluation_data():
    ir = _calibrated("kl")
    accuracy = [float(qir.run(ir, s)["logits"].argmax() == y) for s, y in zip(EVAL, LABELS)]
    assert np.mean(accuracy) < 0.95  # the kl model loses accuracy

    def correct(outputs, index):
        return float(outputs["logits"].argmax() == LABELS[index])

    result = _tune(ir, (correct, ">=", 0.95))
    assert result.report["reached"] and result.report["verification"]["agrees"]
    tuned = [float(qir.run(result.ir, s)["logits"].argmax() == y) for s, y in zip(EVAL, LABELS)]
    assert np.mean(tuned) >= 0.95


def test_evaluation_data_that_does_not_fit_is_one_clear_error():
    ir = _calibrated()
    with pytest.raises(InputError, match="evaluation data does not fit the model: sample 1: input 'input' expects"):
        get_pass("tune", target="cosine>=0.9", eval_data=[EVAL[0], {"input": np.zeros((1, 1, 4, 4), np.float32)}],
                 progress=False)(ir)
    with pytest.raises(InputError, match="no calibration nodes"):
        get_pass("tune", target="cosine>=0.9", eval_data=EVAL, progress=False)(qir.load(DIGITS / "model.onnx"))


def test_tuning_reports_its_progress_with_an_eta(monkeypatch, caplog):
    import logging

    from qir.runtimes import progress as P

    monkeypatch.setattr(P, "DELAY", 0.0)
    monkeypatch.setattr(P, "INTERVAL", 0.0)
    with P.use_reporter(P.LogProgress), caplog.at_level(logging.INFO, logger="qir.progress"):
        get_pass("tune", target="cosine>=0.9999", eval_data=EVAL, calib_data=DIGITS_DATA)(_calibrated("kl"))
    lines = [r.getMessage() for r in caplog.records if r.name == "qir.progress"]
    assert any(line.startswith(f"tune: 1/{len(STAGES)} stages") and "ETA" in line for line in lines)
    assert any(line.startswith("tune: bounds: ") and "ETA" in line for line in lines)
    assert any(line.startswith("tune: clipping: ") for line in lines)


def test_float_is_the_last_resort_only_when_allowed():
    ir = _calibrated()
    upper = _tune(ir.clone(), "cosine>=0.999999").report  # above every integer level on digits
    assert not upper["reached"]
    result = _tune(ir, "cosine>=0.999999", allow_float=True)
    report = result.report
    assert report["reached"] and report["verification"]["agrees"]
    floats = [n for c in report["changes"] if c["change"].endswith("-> float") for n in c.get("nodes", [c["node"]])]
    assert floats and all(result.ir.calibration(n).mode.value == "float" for n in floats)
    space = Space(ir, get_profile("nash-e"), allow_float=True)
    for n in floats:  # a GEMM input in float runs on the CPU: its weights are not quantized either
        for w in space.units[space.index[n]].weights:
            assert result.ir.calibration(w).mode.value == "float"
    assert _plain(result.ir) >= 0.999999


def test_a_result_that_misses_the_target_at_the_integer_level_is_not_verified():
    """The emitted model must meet the target as the NPU computes it too: with the target between
    its integer-level and its fake-quant score, verification fails (and passes below both)."""
    from qir.passes.tune.target import Target
    from qir.passes.tune.verify import verify

    ir = _calibrated("kl")  # kl clips: integer and fake-quant scores differ enough to put a target between
    searched = _plain(ir)
    loose = verify(ir, EVAL, Target("cosine-similarity", ">=", 0.5), searched, march="nash-e", threads=1)
    fq, integer = loose["mean"], loose["integer"]["mean"]
    assert loose["agrees"] and loose["integer"]["meets"] and fq == pytest.approx(searched, abs=1e-6)
    assert abs(fq - integer) > 1e-5  # (so that a target fits between them)
    between = Target("cosine-similarity", ">=", (fq + integer) / 2)
    strict = verify(ir, EVAL, between, searched, march="nash-e", threads=1)
    assert strict["agrees"] is (integer > fq) and strict["integer"]["meets"] is (integer > fq)
    assert verify(ir, EVAL, between, searched, threads=1)["agrees"] is (fq > integer)  # without the integer level


def test_the_integer_level_can_stop_at_the_first_sample_that_misses_the_floor():
    from qir.passes.tune.verify import verify

    ir = _calibrated("kl")
    searched = _plain(ir)
    loose = Target("cosine-similarity", ">=", 0.5, 0.0)
    full = verify(ir, EVAL, loose, searched, march="nash-e", threads=1)
    quick = verify(ir, EVAL, loose, searched, march="nash-e", threads=1, stop_at_floor=True)
    assert full["integer"]["meets"] and full["integer"]["complete"]
    assert quick["integer"] == full["integer"]  # every sample passes: it runs them all
    strict = Target("cosine-similarity", ">=", 0.5, 1.0 - 1e-9)  # no sample is that close at the integer level
    missed = verify(ir, EVAL, strict, searched, march="nash-e", threads=1, stop_at_floor=True)["integer"]
    assert not missed["meets"] and not missed["complete"] and missed["samples_run"] == 1
    everything = verify(ir, EVAL, strict, searched, march="nash-e", threads=1)["integer"]
    assert not everything["meets"] and everything["complete"] and "samples_run" not in everything


@pytest.mark.parametrize("op, sign", [(">=", 1.0), ("<=", -1.0)])
def test_an_integer_miss_tightens_only_the_criterion_the_integer_level_loses_on(op, sign):
    from qir.passes.tune.integer_repair import integer_gaps as _integer_gaps

    target = Target("cosine-similarity" if op == ">=" else "mse", op, 0.5, 0.5 - sign * 0.1)
    fq = {"mean": 0.6, "worst": 0.41}
    worse_worst = {"mean": 0.6 + sign * 0.01, "worst": 0.41 - sign * 0.02, "meets": False}  # the mean gains, the worst loses
    checked = dict(fq, onnxruntime_agrees=True, integer=worse_worst)
    mean_gap, worst_gap = _integer_gaps(target, checked)
    assert mean_gap == 0 and worst_gap == pytest.approx(0.02)
    tighter = target.tightened(mean_gap, worst_gap)
    assert tighter.threshold == target.threshold and tighter.floor == pytest.approx(target.floor + sign * 0.02)
    assert _integer_gaps(Target(target.metric, op, 0.5), checked) is None  # no floor: nothing lost where it counts
    assert _integer_gaps(target, dict(checked, integer=dict(worse_worst, meets=True))) is None
    assert _integer_gaps(target, dict(checked, onnxruntime_agrees=False)) is None


def test_a_verification_stopped_at_the_floor_is_completed_when_nothing_replaces_its_result(monkeypatch):
    from qir.passes import tune as tune_pass

    real, calls = tune_pass.verify, []

    def verify(ir, samples, target, searched, **options):  # the first run stops at a sample that misses the floor
        out = real(ir, samples, target, searched, **options)
        calls.append((options["stop_at_floor"], _plain(ir)))
        if len(calls) == 1:
            out = dict(out, agrees=False, integer=dict(out["integer"], meets=False, complete=False, samples_run=1))
        return out

    monkeypatch.setattr(tune_pass, "verify", verify)
    monkeypatch.setattr(tune_pass.TunePass, "_backtrack", lambda *a: None)  # (nothing goes back)
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start = _plain_score(space.apply(ir.clone(), space.start()))
    report = _tune(ir, Target("cosine-similarity", ">=", min(start.samples) / 2, min(start.samples) / 2)).report
    assert [quick for quick, _ in calls] == [True, False] and calls[0][1] == calls[1][1]  # the same result, in full
    assert report["verification"]["agrees"] and report["verification"]["integer"]["complete"]


def test_a_miss_at_the_integer_level_first_raises_back_one_unit_of_the_last_step_then_goes_back_the_path(monkeypatch):
    from qir.passes import tune as tune_pass

    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start, upper = space.start(), space.upper()
    between = space.level_named(start, "int16")
    tune = get_pass("tune", target="cosine>=0.5", eval_data=EVAL, progress=False, threads=1)
    ev = Evaluator(space.apply(ir.clone(), start), space, tune.target, EVAL, progress=False, threads=1)
    path = [(c, ev.score([c], "test")[0]) for c in (upper, between, start)]  # (each counting as measured)
    found = _state(path, start)  # pruning's path, down to the result that missed
    moved = space.raised(between, start)  # what the last step lowered
    singles = sorted((space.move(start, {i: between.levels[i]}) for i in moved), key=space.cost)
    back, checked = tune._backtrack(ev, space, ir, EVAL, found)
    (raised,) = space.raised(back.final, start)  # the cheapest single raise back
    assert back.final == singles[0] and back.backtracked == {"steps": 0, "raised_back": [space.units[raised].name]}
    assert checked["agrees"] and checked["integer"]["meets"] and back.score == ev.memo[singles[0]]

    verified = []
    monkeypatch.setattr(tune_pass, "verify", lambda tuned, *a, **k: verified.append(_plain(tuned)) or {"agrees": False})
    longer = _state(path[:1] * 3 + path[1:], start)
    assert tune._backtrack(ev, space, ir, EVAL, longer) is None  # none passes: the raise further comes next
    assert len(verified) == tune_pass.BACKTRACK_SINGLES + tune_pass.BACKTRACK_STEPS  # the singles, then the path
    expected = singles[:tune_pass.BACKTRACK_SINGLES] + [between]
    assert verified[:len(expected)] == pytest.approx([_plain(space.apply(ir.clone(), c)) for c in expected])

    # a single raise back that misses the target in fake quantization is not verified
    cheapest = ev.memo[singles[0]].mean
    ev.target = tune.target = Target("cosine-similarity", ">=", math.nextafter(cheapest, 1.0))
    assert ev.target.met(ev.memo[between]) and not ev.target.met(ev.memo[singles[0]])
    verified.clear()
    tune._backtrack(ev, space, ir, EVAL, found)
    assert _plain(space.apply(ir.clone(), singles[0])) not in verified and len(verified) >= 1
    ev.close()


def test_a_tighter_target_beyond_the_upper_bound_measures_the_ceiling_then(monkeypatch):
    from qir.passes import tune as tune_pass

    real, calls = tune_pass.verify, []
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"), allow_float=True)
    upper = _plain(space.apply(ir.clone(), space.upper()))

    def verify(tuned, samples, target, searched, **options):  # the start "misses" at the integer level, by a lot
        out = real(tuned, samples, target, searched, **options)
        calls.append(out)
        if len(calls) == 1:
            gap = upper / 2  # cosine>=0.5 tightened to (1 + upper) / 2: past the upper bound, short of float
            out = dict(out, agrees=False, integer=dict(out["integer"], mean=out["mean"] - gap, meets=False))
        return out

    monkeypatch.setattr(tune_pass, "verify", verify)
    report = _tune(ir, "cosine>=0.5", allow_float=True).report  # the start meets it: no search, no ceiling yet
    assert report["ceiling"] is not None and report["ceiling"]["mean"] > upper  # measured when the retry needed it
    assert len(calls) >= 2 and parse_target(report["search_target"]).threshold > upper


def test_a_miss_at_the_integer_level_raises_the_result_further_for_a_tighter_target(monkeypatch):
    from qir.passes import tune as tune_pass

    real, checked = tune_pass.verify, []

    def verify(ir, samples, target, searched, **options):  # the first result misses at the integer level by `gap`
        out = real(ir, samples, target, searched, **options)
        checked.append((out, _plain(ir)))
        if len(checked) == 1:
            gap = out["margin"] + 1e-6
            out = dict(out, agrees=False, integer=dict(out["integer"], mean=out["mean"] - gap,
                                                       margin=out["margin"] - gap, meets=False))
        return out

    monkeypatch.setattr(tune_pass, "verify", verify)
    ir = _calibrated()
    space = Space(ir, get_profile("nash-e"))
    start = _plain(space.apply(ir.clone(), space.start()))
    upper = _plain(space.apply(ir.clone(), space.upper()))
    target = f"cosine>={(start + upper) / 2!r}"
    report = _tune(ir, target).report
    assert len(checked) == 2 and report["reached"] and report["verification"]["agrees"]
    gap = checked[0][0]["margin"] + 1e-6
    tighter = parse_target(report["search_target"])
    assert tighter.threshold == pytest.approx(parse_target(target).threshold + tune_pass.INTEGER_GAP_FACTOR * gap)
    assert checked[1][1] >= tighter.threshold - 1e-9 > checked[0][1]  # the raised result, run whole, meets it
    assert report["final"]["cost"] > space.cost(space.start())


def _state(path, final):
    """A tune state whose pruning went through ``path`` down to ``final`` (what backtracking reads)."""
    from qir.passes.tune.state import TuneState

    return TuneState(start=final, plain_start=final, int16=final, upper=final, ceiling=final, fixes=[], reached=True,
                     final=final, path=path)


# ------------------------------------------------------------------ a target on named values
def test_a_target_may_name_the_values_it_scores():
    target = parse_target("cosine>=0.99,worst>=0.98@scores, boxes")
    assert target.values == ("scores", "boxes") and target.text == "cosine-similarity>=0.99,worst>=0.98@scores,boxes"
    assert parse_target(target.text) == target and target.tightened(0.001).values == target.values
    with pytest.raises(InputError, match="names no value after '@'"):
        parse_target("cosine>=0.99@")
    ir = _calibrated()
    with pytest.raises(InputError, match="no value named 'relu3_ot'; did you mean 'relu3_out'"):
        parse_target("cosine>=0.99@relu3_ot").compared(ir)
    assert parse_target("cosine>=0.99").compared(ir) == list(ir.outputs)


def _value_score(ir: qir.QIR, value: str, metric: str) -> float:
    """``metric`` of ``value`` in ``ir`` against the same value in its float run, mean over EVAL:
    whole-model runs on the numpy runtime, no engine."""
    return float(np.mean([qmetrics.compute([metric], qir.run(ir, s, level="float", capture=[value])[value],
                                           qir.run(ir, s, capture=[value])[value])[metric] for s in EVAL]))


def test_a_target_on_an_inner_value_is_met_and_verified_on_that_value():
    """A detector's class scores can fall where its one concatenated output hides it: a target on
    an activation is searched, verified in onnxruntime and at the integer level on that value."""
    ir, value = _calibrated("percentile"), "relu3_out"
    start = _value_score(_configured(ir, {c.name: "int8" for c in ir.calibrations()}), value, "mse")
    upper = _value_score(_configured(ir, {c.name: "int16" for c in ir.calibrations("activation")}), value, "mse")
    threshold = (start + upper) / 2
    result = _tune(ir, f"mse<={threshold!r}@{value}")
    report = result.report
    assert report["target"].endswith(f"@{value}") and report["reached"] and report["verification"]["agrees"]
    plain = _value_score(result.ir, value, "mse")
    assert plain <= threshold
    assert report["verification"]["mean"] == pytest.approx(plain, abs=parse_target("mse<=1").tolerance(plain))
    assert _plain(result.ir, "mse") != pytest.approx(plain)  # (the model's output scores otherwise: it was not what counted)


@pytest.mark.slow
def test_on_yolov8n_a_target_on_the_class_scores_sees_what_the_output_cosine_hides():
    """YOLOv8n's one output concatenates boxes and class scores: its cosine stays near 1 while the
    class scores (/model.22/Sigmoid) fall. Verified as tune verifies a result, the target on the
    scores measures the scores, and misses where the output-wide target is met."""
    from qir.passes.tune.verify import verify

    from ..conftest import calibrated_real, real_models

    ir, _ = calibrated_real("yolov8n_320", [1, 3, 320, 320], count=8)
    rm = real_models()
    unseen = [{"images": rm.yolov8n_input(img)} for img in rm.images(rm.EVAL)]
    scores = "/model.22/Sigmoid_output_0"
    whole = verify(ir, unseen, parse_target("cosine>=0.99"), 0.0)
    on_scores = verify(ir, unseen, parse_target(f"cosine>=0.99@{scores}"), 0.0)
    pairs = [(qir.run(ir, s, runtime="ort", level="float", capture=[scores])[scores],
              qir.run(ir, s, runtime="ort", capture=[scores])[scores]) for s in unseen]
    bound = qmetrics.output_bound(ir, scores)  # (photos with nothing detected: cosine is noise there, left out)
    plain = np.mean([qmetrics.compute(["cosine-similarity"], f, q)["cosine-similarity"] for f, q in pairs
                     if qmetrics.ill_conditioned(f, bound) is None])
    assert whole["meets"] and not on_scores["meets"]
    assert on_scores["mean"] == pytest.approx(plain, abs=2e-3) and on_scores["mean"] < whole["mean"] - 0.02


def test_the_sensitivity_order_carries_its_bootstrap_confidence():
    """The ranking's rows are the stage's losses in its order; without a floor the loss is the mean
    per-sample change the bootstrap resamples, so its interval holds it."""
    ir = _calibrated("percentile")
    start = _plain(_configured(ir, {c.name: "int8" for c in ir.calibrations()}), "mse")
    upper = _plain(_configured(ir, {c.name: "int16" for c in ir.calibrations("activation")}), "mse")
    result = _tune(ir, f"mse<={(start + upper) / 2!r}", verify=False)
    sens = result.report["sensitivity"]
    assert sens is not None and sens["samples"] == result.report["samples"] > 1
    rows = sens["rows"]
    assert [r["loss"] for r in rows] == sorted((r["loss"] for r in rows), reverse=True) and len(rows) > 1
    for r in rows:
        assert r["mean_change"] == pytest.approx(r["loss"], rel=1e-9, abs=1e-15)
        assert r["change_low"] - 1e-15 <= r["loss"] <= r["change_high"] + 1e-15
        assert 1 <= r["rank_low"] <= r["rank"] <= r["rank_high"] <= len(rows)
    k = sens["stable_top_k"]
    assert 0 <= k < len(rows) and (not sens["first_settled"] or k >= 1)
