"""Tune's first stage: make int8 better before spending precision.

The repair transforms (``smooth``, ``equalize``: on the float model, before calibration;
``bias-correct`` in both modes: on the calibrated one) each change the model's weights, so
each is tried on a rebuilt model: the calibrated IR's float model (its calibration nodes taken
out, fusions kept), the float transforms, ``insert-calibration`` and ``calibrate`` again with
the method the IR was calibrated with (``ir.meta["calibration"]``) on the calibration data,
then the calibrated transforms. Candidates are scored all-int8 (every unit at its first level,
calibrated thresholds, as the search starts) on the **evaluation** samples against the float
outputs of the model as given (the float transforms keep them; bias correction moves the
float model by design, towards the quantized one, and is judged against the original).

Rules:

0. Nothing is tried when the model as given meets the target all-int8 (there is no precision to
   save), or when qir did not calibrate it (an imported QDQ model: no method to rebuild it with).
1. Each candidate alone; one *helps* when its all-int8 score beats the model as given by more
   than two measurements of one configuration may differ (the target's
   :meth:`~.target.Target.gain` above :meth:`~.target.Target.tolerance` of the model's score: 2%
   of its distance to a perfect match) **and** it keeps what precision can reach: its upper
   bound (every unit at its last integer level, calibrated thresholds) still meets the target
   where the model's did, else is no worse than the model's by more than that tolerance, and a
   transform
   that folds activation quantization's error into the weights (bias-correct's empirical mode)
   must leave the transformed model's float function, against the float model as given, within
   half the target's distance to a perfect match (:func:`_float_reach`): raising those
   activations no longer makes that error up, it adds the correction's own (on the digits
   example with kl calibration, all-int8 0.74 -> 0.91 but the float function 1 -> 0.96, under a
   target of 0.9999). The others keep the float function (smooth, equalize) or correct what
   raising activations does not remove (the weights' own error: bias-correct's default mode).
2. The helpful ones combined greedily, best first: a candidate joins when the combination
   with it beats the combination without it. Two modes of one transform never go together.
3. A candidate (alone, or a combination) that meets the target all-int8 ends the stage: no
   configuration costs less than all-int8, so the other candidates could buy only margin, which
   the target did not ask for (on the ViT-S, ``smooth`` alone meets ``cosine>=0.99,worst>=0.98``
   and the stage then ends before the empirical bias correction's minutes).
4. The best combination (or the model as given, when none helps) is what the precision search
   then works on. Every trial is reported (score, gain, sites changed, seconds; its upper bound
   and float function only where they decide, for a candidate whose all-int8 score gains: the
   float function only for a transform that folds activation error, first, and the upper bound
   only when the function did not already refuse it; NaN otherwise).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from qir.errors import InputError, QirError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.passes.base import get_pass
from qir.passes.lib.repair import float_captures
from qir.passes.lib.repair import float_model as repair_float_model
from qir.passes.manager import parse_pipeline
from qir.passes.tune.target import PERFECT, Score, Target
from qir.passes.tune.verify import float_outputs, sample_values
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.progress import task

__all__ = ["DEFAULT_TRANSFORMS", "KNOWN_TRANSFORMS", "TransformTrial", "TransformStage", "float_model", "rebuild",
           "choose_transforms"]

logger = logging.getLogger(__name__)

#: What tune tries by default, each alone first (rule 1).
DEFAULT_TRANSFORMS = ("smooth", "equalize", "bias-correct", "bias-correct{mode=empirical}")
#: Every transform the stage knows (``round-weights`` where that pass is installed).
KNOWN_TRANSFORMS = ("smooth", "equalize", "bias-correct", "round-weights")
#: Transforms that run on the calibrated model (the others run on the float model before calibration).
AFTER_CALIBRATION = ("bias-correct", "round-weights")
#: A score not measured (its decision did not need it): NaN in the report.
_UNSCORED = Score(float("nan"), ())


@dataclass(frozen=True)
class TransformTrial:
    """One candidate: the transforms (pipeline spellings, in the order they run), its all-int8
    score on the evaluation samples, its gain over the model as given, the sites each transform
    changed, and the seconds it took to build and score; ``error``: why it could not be built."""

    transforms: tuple[str, ...]
    mean: float
    worst: float
    gain: float
    sites: tuple[tuple[str, int], ...] = ()
    seconds: float = 0.0
    error: str | None = None
    float_mean: float = float("nan")  # the transformed float model against the float model as given
    float_worst: float = float("nan")
    upper_mean: float = float("nan")  # at the upper bound (every unit at its last integer level, calibrated thresholds)
    upper_worst: float = float("nan")
    helps: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"transforms": list(self.transforms), "mean": self.mean, "worst": self.worst, "gain": self.gain,
                "float": {"mean": self.float_mean, "worst": self.float_worst},
                "upper_bound": {"mean": self.upper_mean, "worst": self.upper_worst}, "helps": self.helps,
                "sites": dict(self.sites), "seconds": round(self.seconds, 2), **({"error": self.error} if self.error else {})}


@dataclass
class TransformStage:
    """What the stage tried and kept: ``baseline`` (the model as given, all-int8), ``trials``
    (each candidate alone, then the combinations), ``chosen`` (what the search works on; empty:
    the model as given)."""

    baseline: TransformTrial
    trials: list[TransformTrial] = field(default_factory=list)
    chosen: tuple[str, ...] = ()
    seconds: float = 0.0
    skipped: str | None = None  # why no candidate was tried
    stopped: str | None = None  # why the candidates after a trial were not tried (rule 3)
    #: The model as given, run as float on the evaluation samples (its outputs and the target's
    #: values): what verification compares with too (not in the JSON).
    floats: list[dict] | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {"baseline": self.baseline.to_json(), "trials": [t.to_json() for t in self.trials],
                "chosen": list(self.chosen), "seconds": round(self.seconds, 2),
                **({"skipped": self.skipped} if self.skipped else {}),
                **({"stopped": self.stopped} if self.stopped else {})}


def float_model(ir: QIR) -> QIR:
    """:func:`qir.passes.lib.repair.float_model` of the calibrated ``ir`` (its calibration nodes
    taken out, fusions kept), refused where a calibration node makes a graph output (taking it out
    would rename that output)."""
    outputs = [c.name for c in ir.calibrations() if c.output in ir.outputs]
    if outputs:
        raise InputError(f"the calibration node {outputs[0]!r} makes a graph output: its float model would rename "
                         "that output, so the transforms cannot be tried on it")
    return repair_float_model(ir)


def _steps(transforms: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    steps = [step for text in transforms for step in parse_pipeline(text)]
    from qir.passes import _load_passes
    from qir.passes.base import PASSES

    _load_passes()  # (rebuild may be the first to need them)
    unknown = [name for name, _ in steps if name not in KNOWN_TRANSFORMS or name not in PASSES]
    if unknown:
        raise InputError(f"tune: unknown transform {unknown[0]!r}; choose from "
                         f"{', '.join(n for n in KNOWN_TRANSFORMS if n in PASSES)} (options in braces: "
                         "bias-correct{mode=empirical})")
    return steps


def rebuild(ir: QIR, transforms: Sequence[str], calib_data: Any, *, march: str,
            captures: dict[str, np.ndarray] | None = None) -> tuple[QIR, dict[str, int]]:
    """The calibrated ``ir`` rebuilt with ``transforms`` (see the module docstring). Returns it
    and the number of sites each transform changed. The transforms do not measure their own
    all-int8 error (``measure`` off: a report-only figure, which tune's stage measures itself on
    the evaluation data); ``captures``: a mapping in which the float model's values on the first
    calibration sample are kept between calls on one ``ir`` (they are the same for every transform).

    Without a float transform, the calibrated transforms run on a copy of ``ir``. With one, the
    float model is transformed, ``insert-calibration`` puts the calibration nodes back, and only
    those whose value the float transforms changed are calibrated again (as ``ir`` was: its
    method, on ``calib_data``); every other node keeps ``ir``'s state, since the transforms keep
    the float function and its value is the same (checked on the first calibration sample). Float
    transforms that changed no site leave a copy of ``ir`` (nothing is calibrated again)."""
    steps = _steps(transforms)
    before = [(n, o) for n, o in steps if n not in AFTER_CALIBRATION]
    after = [(n, o) for n, o in steps if n in AFTER_CALIBRATION]
    sites: dict[str, int] = {}
    if not before:
        model = ir.clone()
    else:
        original = float_model(ir)
        model = original.clone()
        for name, options in before:
            result = get_pass(name, **{"data": calib_data, "march": march, "measure": False, **options})(model)
            sites[name] = len(result.report.get("changed", []))
        if any(sites.values()):
            _recalibrated(ir, original, model, calib_data, march, captures)
        else:  # (they changed nothing: the calibrated model as given, not calibrated again)
            model = ir.clone()
    for name, options in after:
        result = get_pass(name, **{"data": calib_data, "march": march, "measure": False, **options})(model)
        sites[name] = len(result.report.get("changed", []))
    return model, sites


def _recalibrated(ir: QIR, original: QIR, model: QIR, calib_data: Any, march: str,
                  captures: dict[str, np.ndarray] | None = None) -> None:
    """``model`` (``original``'s float model, transformed) calibrated: its activation nodes on
    values the transforms left as they were take ``ir``'s state, the others are calibrated with
    ``ir``'s method on ``calib_data``."""
    calibration = ir.meta.get("calibration") or {}
    get_pass("insert-calibration", march=march)(model)
    given = {c.name: c for c in ir.calibrations(CalibRole.ACTIVATION)}
    nodes = [c for c in model.calibrations(CalibRole.ACTIVATION)
             if c.name in given and given[c.name].input == c.input and not given[c.name].fixed]
    same = _unchanged(original, model, calib_data, sorted({c.input for c in nodes}), captures)
    kept = [c for c in nodes if c.input in same]
    for c in kept:
        g = given[c.name]
        model.set_calibration(c.name, threshold=g.threshold, axis=g.axis, fixed=True)
        c.meta.update({k: v for k, v in g.meta.items() if k in ("calibration", "histogram")})
    get_pass("calibrate", data=calib_data, method=calibration.get("method", "max"),
             percentile=calibration.get("percentile", 99.99), progress=False)(model)
    for c in kept:
        model.set_calibration(c.name, fixed=False)
    for c in model.calibrations(CalibRole.ACTIVATION):  # (what the user fixed stays fixed, at their threshold)
        if c.name in given and given[c.name].fixed:
            model.set_calibration(c.name, threshold=given[c.name].threshold, axis=given[c.name].axis, fixed=True)
    logger.debug("tune: transforms changed %d of %d calibrated values", len(nodes) - len(kept), len(nodes))


def _unchanged(original: QIR, model: QIR, calib_data: Any, values: Sequence[str],
               captures: dict[str, np.ndarray] | None = None) -> set[str]:
    """``values`` the float ``model`` computes as ``original`` does on the first calibration sample
    (``original``'s taken from ``captures`` where it holds them, and kept there)."""
    if not values:
        return set()
    captures = {} if captures is None else captures
    missing = [v for v in values if v not in captures]
    if missing:
        captures.update(next(float_captures(original, calib_data, missing, limit=1)))
    a, b = captures, next(float_captures(model, calib_data, list(values), limit=1))
    same = set()
    for v in values:
        x, y = np.asarray(a[v], np.float64), np.asarray(b[v], np.float64)
        if x.shape == y.shape and np.allclose(x, y, rtol=1e-5, atol=1e-6 * max(float(np.abs(x).max(initial=0.0)), 1e-12)):
            same.add(v)
    return same


def _configured(ir: QIR, space_of, upper: bool = False) -> QIR:
    """``ir`` all-int8 (every unit at its first level), or at the upper bound (every unit at its
    last integer level), with its calibrated thresholds."""
    space = space_of(ir)
    return space.apply(ir.clone(), space.upper() if upper else space.plain_start())


def _folds_activation_error(transform: str) -> bool:
    """Whether ``transform`` folds the error of activation quantization into the weights
    (bias-correct's empirical mode): raising those activations then no longer makes it up."""
    (name, options), = parse_pipeline(transform)
    return name == "bias-correct" and options.get("mode") == "empirical"


def _float_reach(target: Target) -> Target:
    """What a transformed model's float function must meet: half the target's distance to a
    perfect match (cosine 1, an error 0), on the mean and on the floor, so that precision has the
    other half to spend; the target itself for a metric without a perfect value."""
    perfect = PERFECT.get(target.metric) if isinstance(target.metric, str) else None
    if perfect is None:
        return target
    by = abs(perfect - target.threshold) / 2
    return target.tightened(by, None if target.floor is None else abs(perfect - target.floor) / 2)


def _score(model: QIR, target: Target, samples: Sequence[dict], floats: Sequence[dict], runtime: str,
           level: Level = Level.FAKEQUANT) -> Score:
    rt = get_runtime(runtime, level=level)
    outs = [rt.run(model, check_feeds(model, s), capture=target.values) for s in samples]
    return Score(*sample_values(model, target, floats, outs))


def choose_transforms(ir: QIR, calib_data: Any, samples: Sequence[dict], target: Target, *, march: str, space_of,
                      candidates: Sequence[str] = DEFAULT_TRANSFORMS, runtime: str = Runtime.ORT,
                      progress: bool = True) -> tuple[QIR, TransformStage]:
    """The stage (see the module docstring) on the calibrated ``ir`` (not changed): returns the
    model the search should work on (``ir`` itself when nothing helps) and what was tried.
    ``space_of(ir)`` gives the search's :class:`~.space.Space` of a model (its start levels)."""
    start = time.perf_counter()
    if not ir.calibrations(CalibRole.WEIGHT):
        raise InputError("tune's transforms need a calibrated model with weight calibration nodes")
    floats = float_outputs(ir, samples, target.values)
    captures: dict[str, np.ndarray] = {}  # (the float model's values on a calibration sample: rebuild's)
    on = (target, samples, floats, runtime)
    int8 = _score(_configured(ir, space_of), *on)
    skipped = _skipped(ir, target, int8)
    # (the upper bound decides rule 1 only where candidates are tried)
    upper = _UNSCORED if skipped else _score(_configured(ir, space_of, upper=True), *on)
    exact = Score(*sample_values(ir, target, floats, floats))  # (the model's float function is its own)
    base = TransformTrial((), int8.mean, target.worst(int8.samples)[1], 0.0,
                          float_mean=exact.mean, float_worst=target.worst(exact.samples)[1],
                          upper_mean=upper.mean, upper_worst=target.worst(upper.samples)[1])
    stage = TransformStage(base, floats=floats)
    models: dict[tuple[str, ...], tuple[QIR, Score]] = {(): (ir, int8)}
    if skipped:
        stage.seconds = time.perf_counter() - start
        stage.skipped = skipped
        return ir, stage
    bar = task("tune: transforms", len(candidates), unit="candidates", enabled=progress)

    def trial(transforms: tuple[str, ...], than: Score) -> bool:
        """Build and score ``transforms``; whether they beat ``than`` all-int8 and keep the bound."""
        began = time.perf_counter()
        try:
            model, sites = rebuild(ir, transforms, calib_data, march=march, captures=captures)
            got = int8 if len(transforms) == 1 and not any(sites.values()) else _score(_configured(model, space_of), *on)
            gains = target.gain(got, than) > target.tolerance(than.mean)  # (the bound and function decide only then)
            helps, high, bound = (_keeps_the_bound(model, transforms, on, space_of, upper) if gains
                                  else (False, _UNSCORED, _UNSCORED))
        except (QirError, ValueError) as exc:  # a transform that cannot run here is reported, not fatal
            stage.trials.append(TransformTrial(transforms, float("nan"), float("nan"), float("nan"),
                                               seconds=time.perf_counter() - began, error=str(exc)))
            logger.info("tune: transforms %s could not be tried: %s", ",".join(transforms), exc)
            return False
        stage.trials.append(TransformTrial(transforms, got.mean, target.worst(got.samples)[1], target.gain(got, int8),
                                           tuple(sorted(sites.items())), time.perf_counter() - began,
                                           float_mean=bound.mean, float_worst=target.worst(bound.samples)[1],
                                           upper_mean=high.mean, upper_worst=target.worst(high.samples)[1],
                                           helps=helps))
        models[transforms] = (model, got)
        return helps

    helped = []
    for text in candidates:
        if trial((text,), int8):
            helped.append((target.gain(models[(text,)][1], int8), text))
        bar.update(1)
        if helped and target.met(models[(helped[-1][1],)][1]):  # (rule 3)
            stage.stopped, helped = f"{text} meets the target all-int8: nothing costs less, the rest were not tried", helped[-1:]
            break
    bar.close()
    helped.sort(key=lambda x: -x[0])
    chosen: tuple[str, ...] = (helped[0][1],) if helped else ()
    for _, text in helped[1:]:
        if target.met(models[chosen][1]) or parse_pipeline(text)[0][0] in {parse_pipeline(t)[0][0] for t in chosen}:
            continue  # (rule 3: nothing cheaper to find; one mode of a transform at most)
        combined = _ordered(chosen + (text,), candidates)
        if trial(combined, models[chosen][1]):
            chosen = combined
    stage.chosen, stage.seconds = chosen, time.perf_counter() - start
    logger.info("tune: transforms kept: %s (all-int8 %s -> %s)", ", ".join(chosen) or "none", target.shown(int8),
                target.shown(models[chosen][1]))
    return models[chosen][0], stage


def _keeps_the_bound(model: QIR, transforms: tuple[str, ...], on: tuple, space_of, upper: Score) -> tuple[bool, Score, Score]:
    """Rule 1's second half for a candidate ``model`` that gains: whether it keeps what precision
    can reach (``upper``: the model as given at its upper bound), and its upper bound and float
    function as scored. The float function first, and only for a transform that folds activation
    error (it decides nothing for the others); the upper bound only when the function did not
    refuse it already (NaN where not scored). ``on``: :func:`_score`'s target, samples, floats, runtime."""
    target = on[0]
    function = _UNSCORED
    if any(_folds_activation_error(t) for t in transforms):
        function = _score(model, *on, level=Level.FLOAT)
        if not _float_reach(target).met(function):
            return False, _UNSCORED, function
    high = _score(_configured(model, space_of, upper=True), *on)
    kept = target.met(high) if target.met(upper) else target.gain(high, upper) >= -target.tolerance(upper.mean)
    return kept, high, function


def _skipped(ir: QIR, target: Target, int8: Score) -> str | None:
    """Why the stage tries nothing (rule 0), or None."""
    if target.met(int8):
        return "all-int8 meets the target already"  # (no precision to save)
    if not ir.meta.get("calibration"):
        return ("the model was not calibrated by qir (an imported quantized model): its calibration cannot be rebuilt "
                "around a transform; calibrate the float model with qir, or use qir calibrate --fixes")
    return None


def _ordered(transforms: tuple[str, ...], candidates: Sequence[str]) -> tuple[str, ...]:
    """``transforms`` in the order the pipeline runs them (float ones first, then as listed)."""
    rank = {t: i for i, t in enumerate(candidates)}
    return tuple(sorted(transforms, key=lambda t: (parse_pipeline(t)[0][0] in AFTER_CALIBRATION, rank.get(t, 0))))
