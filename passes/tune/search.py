"""The three searches of ``qir tune`` over configurations of a :class:`~.tune_space.Space`, each
scoring its candidates in batches through an :class:`~.tune_eval.Evaluator` (one engine call per
batch: the candidates of a round are rows of the same batched calls).

- :func:`ratio_search`: the tuning guide's binary search on the int16 ratio. Units are raised in
  the order given (loss per cost); ``config(k)`` raises the first ``k``. Each round scores ``points`` values of
  ``k`` spread over the open bracket ``(lo, hi)`` (``lo`` misses the target, ``hi`` meets it), so
  the bracket shrinks ``points + 1``-fold per call instead of twofold.
- :func:`greedy`: forward selection with lazy re-scoring. A move raises one unit one level; its
  priority is its gain on the metric per unit of added cost. Priorities start from the units'
  sensitivities; each round re-measures only the ``batch`` best (stale) moves on the current
  configuration, since sensitivities interact, and accepts the best measured one (or the
  cheapest that meets the target, which ends the search).
- :func:`prune`: backward pruning. Every raised unit one level lower alone gives its loss (or its
  sensitivity stands for it until measured); units
  go down in order of cost saved per loss, as many per call as the target's margin allows, and
  it ends when each remaining unit, measured on the final configuration, would miss the target
  one level down (or after ``max_rounds`` calls). Every configuration it returns was measured
  to meet the target, counting each sample's change as a loss (:func:`changes_as_losses`).
"""
from __future__ import annotations

import logging
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.space import Config, Space
from qir.passes.tune.target import Score, Target

__all__ = ["ratio_search", "greedy", "prune", "spread", "changes_as_losses", "per_image_loss", "by_loss_per_cost"]

logger = logging.getLogger(__name__)


def _as_measured(score: Score) -> Score:
    return score


def spread(lo: int, hi: int, points: int) -> list[int]:
    """Up to ``points`` integers spread evenly over the open interval ``(lo, hi)``."""
    return sorted({lo + round((hi - lo) * j / (points + 1)) for j in range(1, points + 1)} - {lo, hi})


def by_loss_per_cost(space: Space, base: Config, step: Mapping[int, int], loss: Mapping[int, float]) -> list[int]:
    """The units of ``loss`` (unit -> the metric lost when it stays at its ``base`` level instead of
    ``step``) ordered by that loss per unit of cost its raise adds, highest first: AIMET's Pareto
    order. A raise that costs next to nothing (an elementwise op beside the convolutions) goes
    first whatever its loss; a costly one only when its loss pays for it. (Ordered by loss alone,
    a large convolution that loses a little more than a cheap Add is raised before it, and the
    binary search pays for it.) Ties keep ``loss``'s order."""
    added = space.added_costs(base, {i: step[i] for i in loss})
    floor = 1e-9 * max(space.cost(base), 1.0)
    return sorted(loss, key=lambda i: -max(loss[i], 0.0) / max(added[i], floor))


def ratio_search(ev: Evaluator, base: Config, order: Sequence[int], step: Mapping[int, int], *,
                 points: int = 7, counted: Callable[[Score], Score] = _as_measured,
                 upward: bool = False, around: Config | None = None,
                 parent: Score | None = None) -> tuple[Config | None, Config, int | None]:
    """The smallest ``k`` whose ``config(k)`` (``base`` with ``order[:k]`` raised to their ``step``
    level) meets the target: ``(config(k) or None, the largest failing config below it, k)``.
    ``base`` itself must miss the target. ``counted``: the score a configuration counts at
    against the target (default: as measured). ``upward``: the bracket is found from below first
    (``k`` = 1, 2, 4, ... one at a time), for a ``base`` that likely needs few raises: a probe in the
    middle can miss where fewer raises meet (the counted score is not monotone in ``k``).
    ``around``: the configuration every call is scored around (default: the bracket's lower end,
    a new engine reference each round; a fixed one builds one, where that costs more than cones).
    ``parent``: the score ``counted`` counts changes from (no sample counts better than there),
    so that a configuration's miss is decided on the samples that settle it
    (:meth:`.Evaluator.meets`); its configurations are then measured one at a time."""
    def config(k: int) -> Config:
        return ev.space.move(base, {i: max(base.levels[i], step[i]) for i in order[:k]})

    def meeting(ks: Sequence[int], lo: int) -> list[int]:
        near = around if around is not None else config(lo)
        if parent is not None:
            return [k for k in ks if ev.meets(config(k), "ratio search", near, counted, parent)]
        return [k for k, s in zip(ks, ev.score([config(k) for k in ks], "ratio search", near)) if ev.target.met(counted(s))]

    n = len(order)
    lo, hi = 0, None
    k = 1
    while upward and k < n:
        if meeting([k], lo):
            hi = k
            break
        lo, k = k, 2 * k
    ks = sorted(set(spread(0, n, points - 1)) | {n}) if not upward else (spread(lo, hi, points) if hi else [n])
    while ks:
        met = meeting(ks, lo)
        if met:
            hi = min(met)
            lo = max([lo] + [k for k in ks if k < hi])
        else:
            lo = max(ks)
        logger.info("tune: ratio search: %s met at %s of %d units", "target" if met else "nothing", met or ks, n)
        if hi is None:
            return None, config(n), None
        ks = spread(lo, hi, points)
    return config(hi), config(lo), hi


def greedy(ev: Evaluator, config: Config, prior: Mapping[int, float], *, allowed: Callable[[int, int], bool],
           batch: int = 8, max_rounds: int = 200, stage: str = "greedy", budget: float = math.inf,
           counted: Callable[[Score], Score] = _as_measured) -> Config:
    """Raise units one level at a time until ``config`` meets the target (see the module
    docstring); ``prior``: unit -> an estimate of its gain (its sensitivity), ``allowed(unit,
    level)``: whether that move may be made; ``budget``: the cost of a configuration known to
    meet the target (the search stops once no move can stay cheaper). Returns the last
    configuration (it may miss the target when no move helps any more, the budget is spent or
    ``max_rounds`` is reached). ``counted``: as in :func:`ratio_search`."""
    space, target = ev.space, ev.target
    priority: dict[int, float] = {}
    current = config
    for _ in range(max_rounds):
        score = ev.score([current], stage)[0]
        if target.met(counted(score)):
            break
        moves = [i for i in range(len(space.units))
                 if current.levels[i] + 1 < len(space.units[i].levels) and allowed(i, current.levels[i] + 1)]
        if not moves:
            break
        cost = space.cost(current)
        added = {i: max(c, 1e-9) for i, c in space.added_costs(current, {i: current.levels[i] + 1 for i in moves}).items()}
        moves = [i for i in moves if cost + added[i] < budget]
        if not moves:
            break  # every way on costs more than what already meets the target
        ranked = sorted(moves, key=lambda i: -priority.get(i, prior.get(i, 0.0) / added[i]))
        tried = ranked[:batch]
        configs = [space.move(current, {i: current.levels[i] + 1}) for i in tried]
        scores = ev.score(configs, stage, config)  # (around where it started: one engine for every round)
        for i, s in zip(tried, scores):
            priority[i] = target.gain(s, score) / added[i]
        meeting = [(added[i], c) for i, c, s in zip(tried, configs, scores) if target.met(counted(s))]
        if meeting:
            return min(meeting, key=lambda m: m[0])[1]
        best = max(tried, key=lambda i: priority[i])
        if priority[best] > 0:
            current = space.move(current, {best: current.levels[best] + 1})
            priority.pop(best)  # its next level is a new move
        elif len(tried) == len(moves):
            break  # no move helps
    return current


#: ``screen(current, configs) -> (score of current, scores of configs)``: single losses measured on
#: fewer samples (the bad cases of ``current``), an estimate.
Screen = Callable[[Config, Sequence[Config]], tuple[Score, list[Score]]]


def changes_as_losses(target: Target, parent: Score, child: Score, counted: Score | None = None) -> Score:
    """``child`` (a configuration with some units lower than ``parent``, both as measured) as it
    counts: ``counted`` (``parent`` as it counts; default ``parent``) less each sample's change
    from ``parent`` to ``child``, up or down, as a loss of its size. More quantization noise makes
    no sample better in expectation: where a lowering improves a sample it is chance (errors
    happening to cancel), and chance that moved one sample up can move another, unseen, down as
    far. So a lowering's risk to an image the search did not see is its mean absolute change, and
    unlike the mean change's standard error that does not shrink with more samples: the search
    protects each image, not only the mean. (On PP-OCRv4 det, int8 at the stem's output raised
    one of 16 evaluation images by 0.016 and lowered none by more than 0.007, mean change about 0;
    on 16 other images it lowered one by 0.062. Charged two standard errors of its mean change
    instead, it was lowered when tuning on those 16 images, and that image scored 0.934.) NaN
    stays NaN."""
    sign = 1.0 if target.higher_is_better else -1.0
    base = counted if counted is not None else parent
    values = tuple(b - sign * abs(p - c) if p == p and c == c else math.nan
                   for b, p, c in zip(base.samples, parent.samples, child.samples))
    kept = [v for v in values if v == v]
    return Score(float(np.mean(kept)) if kept else math.nan, values)


def per_image_loss(target: Target, parent: Score, child: Score) -> float:
    """How much worse ``child`` is than ``parent`` with each sample's change, up or down, counted
    as a loss (:func:`changes_as_losses`): the mean absolute change of the samples."""
    return target.gain(parent, changes_as_losses(target, parent, child))


def _single_losses(ev: Evaluator, current: Score, config: Config, units: Sequence[int], stage: str,
                   judge: Callable[[Score, Score, Score], Score], screen: Screen | None = None) -> dict[int, float]:
    """Unit -> the metric lost when it alone goes one level down from ``config`` (counted at
    ``current``; inf: that misses the target), measured in one call on every sample, or estimated
    on ``screen``'s (never inf then: a few samples cannot say whether the target is met).
    ``judge(counted parent, measured parent, child)``: the score a lowered configuration counts at."""
    space, target = ev.space, ev.target
    singles = [space.move(config, {i: config.levels[i] - 1}) for i in units]
    if screen is not None:
        now, scores = screen(config, singles)
        return {i: target.gain(now, judge(now, now, s)) for i, s in zip(units, scores)}
    measured = ev.score([config], stage)[0]
    judged = [judge(current, measured, s) for s in ev.score(singles, stage, config)]
    return {i: target.gain(current, s) if target.met(s) else math.inf for i, s in zip(units, judged)}


def _prefix_sizes(losses: Sequence[float], margin: float, fractions: Sequence[float] = (0.5, 0.75, 1.0)) -> set[int]:
    """For each fraction, the longest prefix of ``losses`` whose sum (a negative loss counted as
    none) is within that fraction of ``margin``."""
    total, longest = 0.0, {}
    for n, value in enumerate(losses, 1):
        total += max(value, 0.0)
        longest.update({f: n for f in fractions if total <= f * margin})
    return set(longest.values())


def prune(ev: Evaluator, config: Config, floor: Config, *, stage: str = "pruning", batch: int = 8,
          recheck: float = 2.0, prior: Mapping[int, float] | None = None, max_rounds: int = 200,
          screen: Screen | None = None, as_measured: bool = False,
          counted: Callable[[Score], Score] = _as_measured, path: list[tuple[Config, Score]] | None = None) -> Config:
    """Lower raised units while the target holds (see the module docstring); ``config`` must meet
    the target, and units never go below their ``floor`` level. Each unit's loss one level down is
    measured alone; units are then lowered in order of cost saved per loss, as many at a time as
    the target's margin predicts (a few prefix sizes around it, measured largest first until one
    meets the target: that one is kept). A loss measured before other units went down is stale:
    when the first unit of the order misses, the first ``batch`` are measured again. It ends when every
    remaining unit misses the target one level down, as measured on the final configuration for
    each unit whose last measured loss was within ``recheck`` times the margin left (losses add up
    about independently, so one well beyond it cannot fit; ``math.inf``: measure them all).
    A lowered configuration counts at :func:`changes_as_losses` of the one it was lowered from
    (each sample's change a loss), unless ``as_measured``: so the target is met with every sample
    as in ``config`` less the size of its change since (the changes of the steps add up to at
    least that), without luck on some samples paying for losses on others. ``counted``: the score
    ``config`` itself counts at (it may be lowered from a configuration before it too).
    ``prior``: unit -> an estimate of its loss (its sensitivity), taken as a stale loss instead of
    measuring every raised unit first. ``screen``: unknown and stale losses are measured there
    first (fewer samples, a cheaper estimate), on every sample only when the units it lets through miss;
    the end is then "every remaining unit misses by its estimate or its measure". A miss is decided on
    the samples that settle it (:meth:`.Evaluator.meets`). ``max_rounds`` bounds the engine calls (the
    configuration reached by then is returned: it meets the target like every one before it). ``path``:
    a list each configuration it lowers to is appended to, with the score it counts at."""
    space, target = ev.space, ev.target

    def judge(counted_parent: Score, parent: Score, child: Score) -> Score:
        return child if as_measured else changes_as_losses(target, parent, child, counted_parent)

    current = config
    now = counted(ev.score([current], stage)[0])  # `current` as it counts
    raised = space.raised(current, floor)
    loss = {i: prior[i] for i in raised if prior is not None and i in prior}
    unknown = [i for i in raised if i not in loss]
    fresh: set[int] = set()  # losses measured on `current`, on every sample
    screened: set[int] = set()  # estimated on `current` by the screen
    if unknown:
        loss.update(_single_losses(ev, now, current, unknown, stage, judge, screen))
        (screened if screen is not None else fresh).update(unknown)
    for _ in range(max_rounds):
        margin = target.margin(now)
        order = [i for i in space.raised(current, floor) if loss.get(i, math.inf) <= margin]
        if not order:  # measure again the stale losses that may still fit (and the unknown ones)
            stale = [i for i in space.raised(current, floor)
                     if i not in fresh | screened and loss.get(i, -math.inf) <= recheck * margin]
            if not stale:
                return current
            loss.update(_single_losses(ev, now, current, stale, stage, judge, screen))
            (screened if screen is not None else fresh).update(stale)
            continue
        saving = {i: -c for i, c in space.added_costs(current, {i: current.levels[i] - 1 for i in order}).items()}
        order.sort(key=lambda i: -saving[i] / max(loss[i], 1e-12))
        count = len(order)  # the sizes the losses predict, and a few shares of the order in case they are stale
        sizes = sorted({1, count, count // 2 or 1, count // 4 or 1, *_prefix_sizes([loss[i] for i in order], margin)},
                       reverse=True)

        def lowered(n: int) -> Config:
            return space.move(current, {i: current.levels[i] - 1 for i in order[:n]})

        measured = ev.score([current], stage)[0]
        for n in sizes:  # the largest that meets: a smaller one is measured only when it misses (each runs whole)
            hopeful = as_measured or ev.meets(lowered(n), stage, current, lambda s: judge(now, measured, s), measured)
            if hopeful and target.met(judged := judge(now, measured, ev.score([lowered(n)], stage, current)[0])):
                break
        else:  # stale or estimated losses were too hopeful: measure the first few again
            again = [i for i in order[:batch] if i not in fresh]
            if not again:  # (a fresh loss within the margin meets the target alone: cannot happen)
                loss[order[0]] = math.inf
                continue
            loss.update(_single_losses(ev, now, current, again, stage, judge))
            fresh.update(again)
            continue
        current, now, fresh, screened = lowered(n), judged, set(), set()
        if path is not None:
            path.append((current, now))
        for i in order[:n]:
            loss.pop(i)  # its next level down is not measured yet
        logger.info("tune: pruning: %d unit(s) one level lower, %d raised", n, len(space.raised(current, floor)))
    return current
