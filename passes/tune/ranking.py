"""How settled ``qir tune``'s sensitivity order is (:mod:`qir.passes.lib.confidence`).

The sensitivity stage scores each unit lowered alone from the reference on every sample it ranks
on; a unit's loss is the mean of each sample's change, up or down, counted as a loss
(:func:`.search.per_image_loss`; with a worst-sample floor, the margin's drop, which may be the
worst sample's). Those per-sample changes are bootstrapped: per unit their mean
(``mean_change``, the loss without a floor) with its 95% interval (``change_low``,
``change_high``) and the unit's rank interval; for the order its stable top-k. The report's ``sensitivity``
(:func:`sensitivity_report`) holds them, most sensitive first; a unit is *the* most sensitive only
when it is the stable top-1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from qir.passes.lib.adaptive import FIRST_ROUND
from qir.passes.lib.confidence import Ranking, rank_confidence
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.space import Config
from qir.passes.tune.target import Score

__all__ = ["SensitivityRanking", "rank_units", "rank_in_rounds", "needed"]


@dataclass(frozen=True)
class SensitivityRanking:
    """The sensitivity stage's order (units most sensitive first) and its confidence."""

    units: tuple[int, ...]
    names: tuple[str, ...]
    losses: tuple[float, ...]
    confidence: Ranking

    def to_json(self) -> dict[str, Any]:
        c = self.confidence
        rows = [{"unit": name, "loss": loss, "mean_change": r.mean, "change_low": r.low, "change_high": r.high,
                 "rank": r.rank, "rank_low": r.rank_low, "rank_high": r.rank_high}
                for name, loss, r in zip(self.names, self.losses, c.rows)]
        return {"level": c.level, "resamples": c.resamples, "samples": c.samples, "stable_top_k": c.stable_top_k,
                "first_settled": c.settled(1), "rows": rows}


def rank_units(reference: Score, lowered: Sequence[Score], units: Sequence[int], names: Sequence[str],
               losses: Sequence[float]) -> SensitivityRanking:
    """The units in order of ``losses`` (the stage's, most sensitive first) with the bootstrap of
    their per-sample changes from ``reference`` (``lowered[k]``: unit ``units[k]`` lowered alone)."""
    changes = {str(u): [abs(p - c) if p == p and c == c else float("nan") for p, c in zip(reference.samples, s.samples)]
               for u, s in zip(units, lowered)}
    order = sorted(range(len(units)), key=lambda k: -losses[k] if losses[k] == losses[k] else float("inf"))
    conf = rank_confidence({str(units[k]): changes[str(units[k])] for k in order}, descending=True)
    return SensitivityRanking(tuple(units[k] for k in order), tuple(names[k] for k in order),
                              tuple(float(losses[k]) for k in order), conf)


def needed(losses: Sequence[float], margin: float) -> int:
    """How many of the most sensitive units (``losses``, most sensitive first) the search must
    likely raise: the fewest whose losses left out leave the rest, added up, within ``margin``
    (every unit when the margin is unknown or spent)."""
    if not margin == margin or margin <= 0:
        return len(losses)
    rest = sum(max(v, 0.0) for v in losses if v == v)
    for k, value in enumerate(losses):
        if rest <= margin:
            return k
        rest -= max(value, 0.0) if value == value else 0.0
    return len(losses)


def rank_in_rounds(ev: Evaluator, reference: Config, lowered: Sequence[Config], units: Sequence[int],
                   names: Sequence[str], loss_of: Callable[[Score, Score], float],
                   first: int = FIRST_ROUND) -> tuple[list[Score], list[int], SensitivityRanking]:
    """The sensitivity stage on adaptive samples (:mod:`qir.passes.lib.adaptive`'s rule, for
    tune): ``lowered`` (unit ``units[k]`` lowered alone from ``reference``) on the ``first``
    samples ``reference`` scores worst; when the :func:`needed` most sensitive units (against
    ``reference``'s margin on every sample) are a settled set there (the same set in 95% of
    bootstrap resamples), that order stands; otherwise the other samples too, and the order on
    every sample. Returns the scores (``reference``'s first), the samples ranked on, the ranking."""
    configs = [reference, *lowered]
    values = ev.memo[reference].samples
    order = ev.target.worst_first(values)
    head, rest = sorted(order[:first]), sorted(order[first:])
    scores = ev.on_samples(head, configs, "sensitivity", reference)
    if rest:
        ranking = rank_units(scores[0], scores[1:], units, names, [loss_of(scores[0], s) for s in scores[1:]])
        need = needed(ranking.losses, ev.target.margin(ev.memo[reference]))
        if 0 < need < len(units) and ranking.confidence.settled(need) or need == 0:
            return scores, head, ranking
        more = ev.on_samples(rest, configs, "sensitivity", reference)
        at = {i: ("head", k) for k, i in enumerate(head)} | {i: ("rest", k) for k, i in enumerate(rest)}
        for config, a, b in zip(configs, scores, more):
            both = tuple((a if part == "head" else b).samples[k] for part, k in (at[i] for i in range(len(values))))
            kept = [v for v in both if v == v]
            ev.adopt(config, Score(sum(kept) / len(kept) if kept else math.nan, both), "sensitivity")
        scores, head = [ev.memo[c] for c in configs], list(range(len(values)))
    ranking = rank_units(scores[0], scores[1:], units, names, [loss_of(scores[0], s) for s in scores[1:]])
    return scores, head, ranking
