"""Step 7's repair when only the integer level misses: a search at the integer level itself.

Fake quantization rounds each op's float result once; the march's integer arithmetic rounds
inside the op too (requantization's fixed-point multiplier, a lookup table for HardSwish or
Sigmoid, an int32 accumulator). Ops left at int8 add those departures up, and a configuration the
search met the target with in fake quantization can miss it at the integer level. A search priced
by time leaves many elementwise ops at int8 (they are not free any more), and there the gap is
largest: on PP-OCRv4 det (nash-e, ``cosine>=0.99,worst>=0.98``) the worst evaluation image scored
0.9815 in fake quantization and 0.9720 at the integer level. Tightening the target by that gap
asks the fake-quant search for a floor beyond its own upper bound; the departure sits in a few
units the fake-quant search cannot see.

So the repair measures at the level that missed: an :class:`~.evaluator.Evaluator` whose engine
runs the march's integer level (numpy, re-executing each variant's cone from cached integer codes).

1. The result ``R`` at the integer level on every evaluation sample (what verification saw).
2. Where the integer arithmetic departs by itself: the ``consistency`` pass
   (:class:`~qir.passes.consistency.ConsistencyPass`) on ``R``, on the :data:`SCREEN_SAMPLES`
   samples ``R`` scores worst there, gives each quantized value the share of its codes that its
   own segment computes differently from fake quantization (``own_differ``). Fake quantization
   met the target, so what misses is made there; the units ``R`` left below their reference level
   are taken in rounds, most departing first: :data:`FIRST_ROUND` units, then twice as many, ...,
   the units that depart not at all last (no more than :data:`FIRST_ROUND` units: one round, and
   no comparison). (Ranking every unit alone was 133 of 193 CPU s on the
   ViT-S, 200 units; the one raise that met the target departs second most.)
3. Each round: on those samples, each new unit raised alone to its reference level, its gain on
   the target's margin at the integer level; the units that gain so far, in order of gain per cost
   added (:func:`.search.by_loss_per_cost`), raised by the ratio search upward from ``R`` (one,
   two, four, ... then the bracket), every configuration scored at the integer level on every
   sample, as measured, around ``R`` (one engine: each configuration re-executes the cones of its
   raises from ``R``'s cached codes). The first round that meets the target ends the search.

The configuration it returns meets the target at the integer level in the engine; the pass then
verifies it as every result is (emitted, re-imported, onnxruntime and the integer level).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.consistency import ConsistencyPass
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.search import by_loss_per_cost, ratio_search
from qir.passes.tune.space import Config, Space
from qir.passes.tune.state import TuneState
from qir.passes.tune.target import Score, Target
from qir.passes.tune.verify import Verification

__all__ = ["integer_repair", "integer_gaps", "onnxruntime_gaps", "IntegerRepair", "SCREEN_SAMPLES", "FIRST_ROUND"]

logger = logging.getLogger(__name__)

#: The single raises are ranked on this many evaluation samples, those the result scores worst at
#: the integer level (a ranking orders the search, which measures every step on every sample).
SCREEN_SAMPLES = 2

#: The first round's units, the most departing (each later round twice the one before).
FIRST_ROUND = 8


@dataclass(frozen=True)
class IntegerRepair:
    """What :func:`integer_repair` measured and found."""

    config: Config | None  # the cheapest raise that meets the target there (None: none does)
    raised: list[str]  # the units it raised, by name, in the order of the search (gain per cost)
    before: Score  # the result's integer-level score in the engine
    after: Score | None  # ``config``'s
    candidates: int  # units the result left below their reference level
    ranked: int = 0  # of them, those raised alone (the rounds searched)
    #: of them, those whose own segment departs from fake quantization (None: not measured, as
    #: one round took them all or the comparison failed)
    departing: int | None = None
    #: ``config`` emitted and verified as every result is, when that failed: its scores in
    #: onnxruntime and at the integer level (``{"onnxruntime": (mean, worst), Level.INTEGER: ...}``).
    failed_verification: dict[str, tuple[float, float]] | None = None

    def to_json(self, target: Target) -> dict[str, Any]:
        return {"raised": self.raised, "candidates": self.candidates, "ranked": self.ranked, "departing": self.departing,
                "before": target.judged(self.before),
                "after": None if self.after is None else target.judged(self.after), "found": self.config is not None,
                **({"failed_verification": self.failed_verification} if self.failed_verification else {})}


def integer_repair(ev: Evaluator, space: Space, found: TuneState, *, march: str, progress: bool = False) -> IntegerRepair:
    """The cheapest raise from ``found.final`` that meets ``ev.target`` at ``march``'s integer
    level, searched there (module docstring). ``ev``: the search's evaluator (its samples, store,
    threads and float reference are reused; its scores are fake quantization's)."""
    final = found.final
    reference = found.reference or found.upper
    units = [i for i in space.searchable() if final.levels[i] < reference.levels[i]]
    step = {i: reference.levels[i] for i in units}
    options = {k: v for k, v in ev.engine_options.items() if k not in ("runtime", "level", "march")}
    make = lambda samples, prefix, floats: Evaluator(  # noqa: E731
        ev.base, space, ev.target, samples, store=ev.store, prefix=prefix, progress=progress, reference=ev.reference,
        floats=floats, runtime=Runtime.NUMPY, level=Level.INTEGER, march=march, **options)
    whole = make(ev.samples, f"integer {march}: ", ev.floats())
    screens: list[Evaluator] = []
    try:
        before = whole.score([final], "integer repair", final)[0]  # (around it: the search's engine traces it once)
        if ev.target.met(before) or not units:
            logger.info("tune: integer repair: the result scores %s at %s's integer level in the engine; %d unit(s) "
                        "below their reference level", ev.target.shown(before), march, len(units))
            return IntegerRepair(final if ev.target.met(before) else None, [], before, before, len(units))
        picked = ev.target.bad_cases(before.samples, SCREEN_SAMPLES)
        departing = _departures(ev.base, space, final, [ev.samples[i] for i in picked], march, units) \
            if len(units) > FIRST_ROUND else None  # (one round takes them all)
        gains = _SingleGains(whole, make, picked, final, step, screens)
        met, order = None, []
        for batch in _rounds(list(departing or ()), [i for i in units if i not in (departing or ())]):
            helping = {i: g for i, g in gains.measure(batch).items() if g > 0}
            searched, order = order, by_loss_per_cost(space, final, {i: step[i] for i in helping}, helping)
            logger.info("tune: integer repair: %d of %d unit(s) ranked (%s depart at the integer level), %d gain",
                        len(gains.gains), len(units), "not measured" if departing is None else len(departing), len(order))
            if order and order != searched:  # (a round that adds no gaining unit has nothing new to search)
                met, _, _ = ratio_search(whole, final, order, {i: step[i] for i in order}, upward=True, around=final)
            if met is not None:
                break
        after = whole.memo.get(met) if met is not None else None
        raised = space.names(i for i in order if met is not None and met.levels[i] != final.levels[i])
        return IntegerRepair(met, raised, before, after, len(units), len(gains.gains),
                             None if departing is None else len(departing))
    finally:
        for e in screens:
            whole.calls += e.calls
            e.close()
        ev.calls += whole.calls
        whole.close()


def _departures(base: QIR, space: Space, final: Config, samples: list[dict], march: str,
                units: list[int]) -> dict[int, float] | None:
    """Unit -> the share of its codes its own segment computes differently from fake quantization
    under ``final`` on ``samples`` (``consistency``'s ``own_differ``), for the units of ``units``
    that depart at all, most departing first. None when the comparison fails (every sample's
    fake-quantized values hold NaN or Inf, or anything else): the departures only order the
    search, so the rounds then rank every unit at once rather than stop the tune."""
    try:
        report = ConsistencyPass(samples, march=march).compare(space.apply(base.clone(), final))
    except Exception as exc:  # noqa: BLE001 - an order lost, not a result: said, and every unit ranked
        logger.warning("tune: integer repair: no departures to rank by (%s: %s); every unit is ranked",
                       type(exc).__name__, exc)
        return None
    share = {space.index[r.node]: r.own_differ for r in report.rows if r.node in space.index and r.own_differ > 0}
    return dict(sorted(((i, share[i]) for i in units if i in share), key=lambda kv: -kv[1]))


def _rounds(first: list[int], last: list[int]):
    """``first`` in rounds of :data:`FIRST_ROUND`, twice as many, ...; then ``last`` whole."""
    size, k = FIRST_ROUND, 0
    while k < len(first):
        yield first[k:k + size]
        k, size = k + size, 2 * size
    if last:
        yield last


class _SingleGains:
    """Unit -> the integer level's gain on the target's margin when it alone goes up to ``step``
    from ``final``, on the samples ``picked`` (all of ``whole``'s: measured there), kept across rounds."""

    def __init__(self, whole: Evaluator, make, picked: list[int], final: Config, step: dict[int, int],
                 opened: list[Evaluator]) -> None:
        self.whole, self.final, self.step, self.gains = whole, final, step, {}
        self.screen = whole
        if len(picked) < len(whole.samples):
            floats = [whole.floats()[i] for i in picked]
            self.screen = make([whole.samples[i] for i in picked], f"integer samples {picked}: ", floats)
            opened.append(self.screen)
        self.now = self.screen.score([final], "integer repair", final)[0]

    def measure(self, units: list[int]) -> dict[int, float]:
        """The gains of ``units`` added to those measured before; all of them."""
        singles = [self.whole.space.move(self.final, {i: self.step[i]}) for i in units]
        scores = self.screen.score(singles, "integer repair", self.final) if singles else []
        self.gains.update({i: self.whole.target.gain(s, self.now) for i, s in zip(units, scores)})
        return dict(self.gains)


def integer_gaps(target: Target, checked: Verification | None) -> tuple[float, float] | None:
    """How much worse the integer level scores than fake quantization, on the mean and on the
    worst sample (each at least 0: a target is tightened only where the integer level loses),
    when verification failed only there (None otherwise: it passed, or failed for another
    reason). One gap of the margins would move both by whichever loses more: a floor missed by
    one image would raise the mean's threshold as far."""
    integer = (checked or {}).get(Level.INTEGER)
    if not integer or integer["meets"] or not checked["onnxruntime_agrees"]:
        return None
    return _gaps(target, (checked["mean"], checked["worst"]), (integer["mean"], integer["worst"]))


def onnxruntime_gaps(target: Target, checked: Verification | None, searched: Score | None) -> tuple[float, float] | None:
    """How much worse the emitted model scores in onnxruntime than the search measured it
    (``searched``), on the mean and on the worst sample (each at least 0), when it misses the
    target there while the search met it; None otherwise (it passed, a calibration node did not
    come back, or the search had not met the target). A result picked at the target's edge can
    miss by a hair: the engine and the emitted graph round a few values on the other side of a tie
    (on PP-OCRv4 det at 320x320, 0.98998 against 0.99)."""
    if not checked or checked["meets"] or checked["roundtrip"] or searched is None or not target.met(searched):
        return None
    return _gaps(target, (searched.mean, target.worst(searched.samples)[1]), (checked["mean"], checked["worst"]))


def _gaps(target: Target, better: tuple[float, float], worse: tuple[float, float]) -> tuple[float, float] | None:
    """How much ``worse`` (mean, worst sample) scores below ``better``, each at least 0 and the
    worst sample's 0 without a floor; None when neither loses."""
    sign = 1.0 if target.higher_is_better else -1.0
    gaps = [sign * (b - w) for b, w in zip(better, worse)]
    gaps = [g if g > 0 and math.isfinite(g) else 0.0 for g in gaps]
    if target.floor is None:
        gaps[1] = 0.0
    return (gaps[0], gaps[1]) if any(gaps) else None
