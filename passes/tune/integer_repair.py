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
2. On the :data:`SCREEN_SAMPLES` samples ``R`` scores worst there, each unit ``R`` left below its
   reference level raised alone to it: its gain on the target's margin at the integer level.
3. The units that gain, in order of gain per cost added (:func:`.search.by_loss_per_cost`), raised
   by the ratio search upward from ``R`` (one, two, four, ... then the bracket), every
   configuration scored at the integer level on every sample, as measured, around ``R`` (one
   engine: each configuration re-executes the cones of its raises from ``R``'s cached codes).

The configuration it returns meets the target at the integer level in the engine; the pass then
verifies it as every result is (emitted, re-imported, onnxruntime and the integer level).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from qir.execution import Level, Runtime
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.search import by_loss_per_cost, ratio_search
from qir.passes.tune.space import Config, Space
from qir.passes.tune.state import TuneState
from qir.passes.tune.target import Score, Target
from qir.passes.tune.verify import Verification

__all__ = ["integer_repair", "integer_gaps", "onnxruntime_gaps", "IntegerRepair", "SCREEN_SAMPLES"]

logger = logging.getLogger(__name__)

#: The single raises are ranked on this many evaluation samples, those the result scores worst at
#: the integer level (a ranking orders the search, which measures every step on every sample).
SCREEN_SAMPLES = 2


@dataclass(frozen=True)
class IntegerRepair:
    """What :func:`integer_repair` measured and found."""

    config: Config | None  # the cheapest raise that meets the target there (None: none does)
    raised: list[str]  # the units it raised, by name
    before: Score  # the result's integer-level score in the engine
    after: Score | None  # ``config``'s
    candidates: int  # units the result left below their reference level
    #: ``config`` emitted and verified as every result is, when that failed: its scores in
    #: onnxruntime and at the integer level (``{"onnxruntime": (mean, worst), Level.INTEGER: ...}``).
    failed_verification: dict[str, tuple[float, float]] | None = None

    def to_json(self, target: Target) -> dict[str, Any]:
        return {"raised": self.raised, "candidates": self.candidates, "before": target.judged(self.before),
                "after": None if self.after is None else target.judged(self.after), "found": self.config is not None,
                **({"failed_verification": self.failed_verification} if self.failed_verification else {})}


def integer_repair(ev: Evaluator, space: Space, found: TuneState, *, march: str, progress: bool = False) -> IntegerRepair:
    """The cheapest raise from ``found.final`` that meets ``ev.target`` at ``march``'s integer
    level, searched there (module docstring). ``ev``: the search's evaluator (its samples, store,
    threads and float reference are reused; its scores are fake quantization's)."""
    final = found.final
    reference = found.reference or found.upper
    units = [i for i in space.searchable() if final.levels[i] < reference.levels[i]]
    options = {k: v for k, v in ev.engine_options.items() if k not in ("runtime", "level", "march")}
    make = lambda samples, prefix, floats: Evaluator(  # noqa: E731
        ev.base, space, ev.target, samples, store=ev.store, prefix=prefix, progress=progress, reference=ev.reference,
        floats=floats, runtime=Runtime.NUMPY, level=Level.INTEGER, march=march, **options)
    whole = make(ev.samples, f"integer {march}: ", ev.floats() if ev.reference is not None else None)
    try:
        before = whole.score([final], "integer repair")[0]
        if ev.target.met(before) or not units:
            logger.info("tune: integer repair: the result scores %s at %s's integer level in the engine; %d unit(s) "
                        "below their reference level", ev.target.shown(before), march, len(units))
            return IntegerRepair(final if ev.target.met(before) else None, [], before, before, len(units))
        gains = _single_gains(whole, make, before, final, units, {i: reference.levels[i] for i in units})
        helping = {i: g for i, g in gains.items() if g > 0}
        order = by_loss_per_cost(space, final, {i: reference.levels[i] for i in helping}, helping)
        logger.info("tune: integer repair: %d of %d unit(s) below their reference level gain at the integer level",
                    len(order), len(units))
        met, _, _ = ratio_search(whole, final, order, {i: reference.levels[i] for i in order}, upward=True,
                                 around=final) if order else (None, None, None)
        after = whole.memo.get(met) if met is not None else None
        raised = space.names(i for i in order if met is not None and met.levels[i] != final.levels[i])
        return IntegerRepair(met, raised, before, after, len(units))
    finally:
        ev.calls += whole.calls
        whole.close()


def _single_gains(whole: Evaluator, make, before, final: Config, units: list[int], step: dict[int, int]) -> dict[int, float]:
    """Unit -> the integer level's gain on the target's margin when it alone goes up to ``step``
    from ``final``, on the :data:`SCREEN_SAMPLES` samples ``before`` scores worst."""
    target = whole.target
    picked = target.bad_cases(before.samples, SCREEN_SAMPLES)
    singles = [whole.space.move(final, {i: step[i]}) for i in units]
    if len(picked) == len(before.samples):
        scores = whole.score(singles, "integer repair", final)
        return {i: target.gain(s, before) for i, s in zip(units, scores)}
    floats = [whole.floats()[i] for i in picked] if whole.reference is not None else None
    screen = make([whole.samples[i] for i in picked], f"integer samples {picked}: ", floats)
    try:
        now, *scores = screen.score([final, *singles], "integer repair", final)
        return {i: target.gain(s, now) for i, s in zip(units, scores)}
    finally:
        whole.calls += screen.calls
        screen.close()


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
