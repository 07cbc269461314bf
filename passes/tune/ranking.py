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

from dataclasses import dataclass
from typing import Any, Sequence

from qir.passes.lib.confidence import Ranking, rank_confidence
from qir.passes.tune.target import Score

__all__ = ["SensitivityRanking", "rank_units"]


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
