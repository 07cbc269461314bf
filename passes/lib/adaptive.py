"""Sampling that stops when a ranking is settled (``--samples auto``).

A ranking on all samples costs one run per candidate and sample; most of its order is often
settled on far fewer. :func:`rank_in_rounds` scores the samples worst first (the samples the
model as it is scores worst against the float model: where quantization hurts, candidates differ
most), in rounds of :data:`FIRST_ROUND`, then twice as many, ..., and after each round bootstraps
the ranking on the samples so far (:mod:`.confidence`); it stops when the top ``need`` set is
settled (the same set in 95% of resamples), or when the budget (every sample given) is spent.
Its :class:`Sampling` says how many samples were used and why it stopped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from qir.passes.lib.confidence import Ranking
from qir.runtimes.engine import EngineResult

__all__ = ["Sampling", "rank_in_rounds", "rounds", "merged", "FIRST_ROUND", "NEED"]

FIRST_ROUND = 4  # samples in the first round; each later round doubles what was used
NEED = 5  # rows whose set must be settled (the advisor's most sensitive per type; runall's distribution nodes)


@dataclass(frozen=True)
class Sampling:
    """How an adaptive ranking sampled: ``used`` of ``available`` samples (their indices, worst
    first, in ``order``) and why it stopped (``reason``)."""

    used: int
    available: int
    reason: str
    settled: bool
    order: tuple[int, ...] = ()

    def line(self, what: str) -> str:
        """The first line a command prints."""
        return f"{what}: {self.used} of {self.available} sample(s), worst first (--samples auto): {self.reason}"

    def to_json(self) -> dict[str, Any]:
        return {"mode": "auto", "used": self.used, "available": self.available, "reason": self.reason,
                "settled": self.settled, "order": list(self.order)}


def rounds(available: int, first: int = FIRST_ROUND) -> list[int]:
    """The sample counts after each round: ``first``, twice that, ... up to ``available``."""
    sizes, n = [], max(1, first)
    while n < available:
        sizes.append(n)
        n *= 2
    return sizes + [available]


def merged(parts: Sequence[tuple[Sequence[int], EngineResult]]) -> EngineResult:
    """One result of several engine calls on disjoint samples: each call's samples renumbered to
    the indices ``parts`` gives them (its rows, left-out samples; the statistics of the last)."""
    rows, left_out = [], {}
    for indices, result in parts:
        rows += [dict(r, sample=indices[r["sample"]]) for r in result.rows]
        left_out.update({indices[s]: why for s, why in result.left_out.items()})
    last = parts[-1][1]
    return EngineResult(rows, last.metrics, last.compare, last.stats, left_out)


def rank_in_rounds(scores: Sequence[float], evaluate: Callable[[list[int]], EngineResult],
                   confidence: Callable[[EngineResult], Ranking], *, higher_is_better: bool, need: int = NEED,
                   first: int = FIRST_ROUND) -> tuple[EngineResult, Sampling]:
    """Rank in rounds (module docstring). ``scores``: the model as it is, per sample (against
    the float model); ``evaluate(indices)``: the candidates on those samples; ``confidence``: the
    ranking of a result so far. Returns the merged result and how it sampled."""
    key = np.nan_to_num(np.asarray(scores, np.float64), nan=np.inf if higher_is_better else -np.inf)
    order = [int(i) for i in np.argsort(key if higher_is_better else -key, kind="stable")]
    parts: list[tuple[list[int], EngineResult]] = []
    used = 0
    for size in rounds(len(order), first):
        new = order[used:size]
        parts.append((new, evaluate(new)))
        used = size
        result = merged(parts)
        conf = confidence(result)
        k = min(need, len(conf.rows) - 1)
        if k >= 1 and conf.settled(k):
            why = (f"the top {k} {'was' if k == 1 else 'were'} the same set in >= {conf.level:.0%} of "
                   f"{conf.resamples} bootstrap resamples (stable top-{conf.stable_top_k})")
            return result, Sampling(used, len(order), why, True, tuple(order[:used]))
        if k < 1:
            return result, Sampling(used, len(order), "a table of one row needs no order", True, tuple(order[:used]))
    stable = conf.stable_top_k
    why = (f"every sample used; the top {k} set is not settled (stable top-{stable}): the rows past it are not told "
           "apart by these samples")
    return result, Sampling(used, len(order), why, False, tuple(order[:used]))


def by_sample(result: EngineResult, variant: str, metric: str) -> Mapping[int, float]:
    """``{sample: value}`` of one variant (for ordering samples worst first)."""
    values = result.per_sample(metric)[variant]
    samples = sorted({r["sample"] for r in result.rows if r["variant"] == variant})
    return dict(zip(samples, values))
