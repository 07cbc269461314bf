"""How settled a ranking is: a bootstrap over the samples a ranked table was measured on.

Every ranked table qir prints (node and op sensitivity, the advisor's fixes, tune's sensitivity
stage) orders rows by a mean over samples. :func:`rank_confidence` takes each row's per-sample
values (already computed by the run; nothing is run again) and resamples the samples with
replacement, the same draw for every row (paired: a hard image is hard for every row):

- per row, the mean and its 95% percentile interval over the resampled means;
- per row, its rank interval: the 2.5th and 97.5th percentiles of its rank over the resamples
  (rank 1 the first row; tied rows share the best rank of the tie);
- for the table, ``stable_top_k``: the largest k (below the number of rows: all rows are
  trivially the same set) whose top-k set, in the order given, is the same set in at least 95%
  of the resamples, a set counting as the same only when each of its rows is strictly ahead of
  every row outside it (two equal rows never split a set). 0 when no k is.

A row is named as *the* cause only when it is the stable top-1 (:meth:`Ranking.settled`); a row
inside the stable top-k is *among* the causes. With one sample there is nothing to resample: the
intervals are the point and ``stable_top_k`` is None (unknown).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Ranking", "RowConfidence", "rank_confidence", "RESAMPLES", "LEVEL", "SEED"]

RESAMPLES = 1000  # bootstrap resamples
LEVEL = 0.95  # the intervals' coverage, and the share of resamples a stable top-k set needs
SEED = 0  # the resampling is seeded: the same values give the same intervals


@dataclass(frozen=True)
class RowConfidence:
    """One row: its mean over samples, the 95% bootstrap interval of that mean, its rank (1: the
    first row) and rank interval."""

    name: str
    mean: float
    low: float
    high: float
    rank: int
    rank_low: int
    rank_high: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "mean": self.mean, "low": self.low, "high": self.high, "rank": self.rank,
                "rank_low": self.rank_low, "rank_high": self.rank_high}


@dataclass(frozen=True)
class Ranking:
    """A ranked table's confidence (see the module docstring). ``stable``: per k (1..rows-1), the
    share of resamples whose top-k set is the table's."""

    rows: tuple[RowConfidence, ...]
    samples: int
    stable_top_k: int | None
    resamples: int = RESAMPLES
    level: float = LEVEL
    stable: tuple[float, ...] = field(default=(), repr=False)

    def row(self, name: str) -> RowConfidence:
        return next(r for r in self.rows if r.name == name)

    def settled(self, k: int) -> bool:
        """The table's top-``k`` set is the same in at least ``level`` of the resamples."""
        return 0 < k <= len(self.stable) and self.stable[k - 1] >= self.level

    def named_alone(self, name: str) -> bool:
        """``name`` may be called *the* cause: it is the first row and the top-1 is settled."""
        return bool(self.rows) and self.rows[0].name == name and self.settled(1)

    def in_stable_set(self, name: str) -> bool:
        return bool(self.stable_top_k) and any(r.name == name for r in self.rows[:self.stable_top_k])

    def summary(self) -> str:
        """One line: the stable top-k and what it rests on."""
        if self.stable_top_k is None:
            return f"{self.samples} sample(s): no interval (a ranking on one sample cannot say how settled it is)"
        return (f"stable top-{self.stable_top_k} (the same set in >= {self.level:.0%} of {self.resamples} bootstrap "
                f"resamples of {self.samples} samples)")

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "resamples": self.resamples, "samples": self.samples,
                "stable_top_k": self.stable_top_k, "rows": [r.to_json() for r in self.rows]}


def _resampled_means(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(resamples, rows): each row's NaN-skipping mean under each resample's sample counts."""
    finite = np.isfinite(values)
    weights = counts @ finite.T.astype(np.float64)
    sums = counts @ np.where(finite, values, 0.0).T
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weights > 0, sums / np.where(weights > 0, weights, 1.0), np.nan)


def _ranks(badness: np.ndarray) -> np.ndarray:
    """(resamples, rows): 1 + the number of rows strictly ahead (more to blame) in that resample."""
    ordered = np.sort(badness, axis=1)
    out = np.empty(badness.shape, dtype=np.int64)
    n = badness.shape[1]
    for b in range(badness.shape[0]):
        out[b] = n - np.searchsorted(ordered[b], badness[b], side="right") + 1
    return out


def _stable_shares(badness: np.ndarray) -> np.ndarray:
    """Per k in 1..rows-1, the share of resamples in which the first k rows (in the table's order)
    are each strictly ahead of every other row."""
    ahead = np.minimum.accumulate(badness, axis=1)[:, :-1]  # the least to blame among the first k
    behind = np.maximum.accumulate(badness[:, ::-1], axis=1)[:, ::-1][:, 1:]  # the most to blame of the rest
    return np.mean(ahead > behind, axis=0)


def rank_confidence(per_sample: Mapping[str, Sequence[float]], *, descending: bool, resamples: int = RESAMPLES,
                    level: float = LEVEL, seed: int = SEED) -> Ranking:
    """The confidence of a table whose rows are ``per_sample``'s keys in their order, each row's
    values one per sample (the same samples, in the same order, for every row; NaN: not scored on
    that sample). ``descending``: the row with the largest mean ranks first (else the smallest).
    Rows scoring NaN everywhere rank last."""
    names = list(per_sample)
    values = np.array([np.asarray(per_sample[n], dtype=np.float64) for n in names], dtype=np.float64)
    values = values.reshape(len(names), -1) if names else np.zeros((0, 0))  # (no rows: nothing ranked)
    n = values.shape[1]
    finite = np.isfinite(values)
    means = np.array([float(v[f].mean()) if f.any() else math.nan for v, f in zip(values, finite)])
    sign = 1.0 if descending else -1.0
    if n < 2 or not names:
        point = _ranks(np.nan_to_num(sign * means, nan=-np.inf)[None, :])[0] if names else []
        rows = tuple(RowConfidence(nm, m, m, m, int(r), int(r), int(r)) for nm, m, r in zip(names, means, point))
        return Ranking(rows, n, None, resamples, level)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples).astype(np.float64)
    boot = _resampled_means(values, counts)
    badness = np.nan_to_num(sign * boot, nan=-np.inf)  # larger: more to blame (ranked earlier)
    ranks = _ranks(badness)
    point = _ranks(np.nan_to_num(sign * means, nan=-np.inf)[None, :])[0]
    tail = (1.0 - level) / 2 * 100
    with warnings.catch_warnings():  # (a row NaN on every sample: NaN interval)
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanpercentile(boot, [tail, 100 - tail], axis=0)
    rank_low, rank_high = np.percentile(ranks, [tail, 100 - tail], axis=0, method="nearest")
    shares = _stable_shares(badness) if len(names) > 1 else np.zeros(0)
    ok = [k + 1 for k, s in enumerate(shares) if s >= level]
    rows = tuple(RowConfidence(nm, float(m), float(lo), float(hi), int(p), int(rl), int(rh))
                 for nm, m, lo, hi, p, rl, rh in zip(names, means, low, high, point, rank_low, rank_high))
    return Ranking(rows, n, max(ok) if ok else 0, resamples, level, tuple(float(s) for s in shares))
