"""Tune's sensitivity stage on adaptive samples (:func:`qir.passes.tune.ranking.rank_in_rounds`)
on the digits example: it stops after the worst samples when the units the search needs are a
settled set, and otherwise ranks on every sample, with the scores a plain evaluation gives."""
from __future__ import annotations

import numpy as np
import pytest

import qir
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.ranking import needed, rank_in_rounds
from qir.passes.tune.search import per_image_loss
from qir.passes.tune.space import Space
from qir.passes.tune.target import parse_target
from qir.runtimes.march import get_profile

from ..conftest import DIGITS, DIGITS_DATA, calibrate_for_nash_e

EVAL = [{"input": x} for x in np.load(DIGITS / "eval_images.npy")[:16]]


def test_the_units_needed_are_the_fewest_whose_losses_left_out_fit_the_margin():
    losses = [0.5, 0.3, 0.1, 0.05]
    assert needed(losses, 0.2) == 2  # 0.1 + 0.05 fit, 0.3 more does not
    assert needed(losses, 1.0) == 0 and needed(losses, 0.0) == 4 and needed(losses, float("nan")) == 4
    assert needed([0.2, -0.1, float("nan")], 0.1) == 1  # (a gain or NaN adds nothing)


def _case(threshold_from_reference: float):
    ir = calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, "mse")
    space = Space(ir, get_profile("nash-e"))
    base, reference = space.apply(ir.clone(), space.start()), space.upper()
    probe = Evaluator(base, space, parse_target("cosine>=0.5"), EVAL, progress=False)
    mean = probe.score([reference], "test")[0].mean
    probe.close()
    target = parse_target(f"cosine>={mean - threshold_from_reference!r}")
    units = [i for i in space.searchable() if reference.levels[i] > 0]
    lowered = [space.move(reference, {i: 0}) for i in units]
    ev = Evaluator(base, space, target, EVAL, progress=False)
    ev.score([reference], "bounds")
    return ev, space, reference, units, lowered, target


def test_a_margin_that_covers_every_unit_stops_after_the_worst_samples():
    ev, space, reference, units, lowered, target = _case(0.5)
    scores, picked, ranking = rank_in_rounds(ev, reference, lowered, units, space.names(units),
                                             lambda a, b: per_image_loss(target, a, b), first=4)
    values = ev.memo[reference].samples
    assert picked == sorted(sorted(range(len(EVAL)), key=lambda i: values[i])[:4])  # the reference's 4 worst
    assert len(scores[1].samples) == 4 and not any(c in ev.memo for c in lowered)  # nothing run on the others
    assert sorted(ranking.units) == sorted(units) and list(ranking.losses) == sorted(ranking.losses, reverse=True)
    assert ranking.confidence.samples == 4
    ev.close()


def test_an_unsettled_order_is_ranked_on_every_sample_as_a_plain_evaluation_scores_it():
    ev, space, reference, units, lowered, target = _case(-1.0)  # (the reference misses: every unit is needed)
    scores, picked, ranking = rank_in_rounds(ev, reference, lowered, units, space.names(units),
                                             lambda a, b: per_image_loss(target, a, b), first=4)
    assert picked == list(range(len(EVAL))) and all(c in ev.memo for c in lowered)
    plain = Evaluator(ev.base, space, target, EVAL, progress=False)
    for c, s in zip([reference, *lowered], scores):
        got = plain.score([c], "test")[0]
        assert s.samples == pytest.approx(got.samples, abs=1e-6) and s.mean == pytest.approx(got.mean, abs=1e-6)
    assert ranking.confidence.samples == len(EVAL)
    plain.close()
    ev.close()


def test_tune_ranks_in_rounds_on_request_and_refuses_a_bad_count():
    from qir.errors import InputError
    from qir.passes import get_pass

    ir = calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, "mse")
    with pytest.raises(InputError, match="positive number or 'auto'"):
        get_pass("tune", target="cosine>=0.99", eval_data=EVAL, sensitivity_samples=0)
    result = get_pass("tune", target="cosine>=0.9999", eval_data=EVAL, calib_data=DIGITS_DATA, progress=False,
                      transforms=None, sensitivity_samples="auto", verify=False)(ir)
    report = result.report
    picked = report["ratio_search"]["sensitivity_samples"]
    assert report["sensitivity"] is not None  # (ranked: on the 4 worst, or on every sample)
    assert picked is not None and len(picked) in (4, len(EVAL)) and report["sensitivity"]["samples"] == len(picked)
