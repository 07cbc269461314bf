"""The accuracy target of ``qir tune``: a metric, a direction and a threshold, met by the *mean*
over the evaluation samples, and optionally a floor every sample must meet.

A target is written ``METRIC>=VALUE`` or ``METRIC<=VALUE``: ``"cosine>=0.99"``,
``"mse<=1e-3"``, ``"sqnr-db>=30"``. ``METRIC`` is a :mod:`qir.metrics` name (or ``cosine`` /
``cos`` for ``cosine-similarity``), measured between the float model's outputs and the tuned
model's, and the direction must be the metric's better one (``cosine<=0.99`` is refused). In
Python the metric may also be a task metric: ``(fn, ">=", 0.95)`` or ``(fn, 0.95)`` (then
higher is better), where ``fn(outputs, index)`` scores the model's outputs (``{name: array}``)
on evaluation sample ``index`` (e.g. ``float(outputs["logits"].argmax() == labels[index])``:
the mean is the accuracy).

``@VALUE[,VALUE...]`` at the end scores only those values, model outputs or any activation
(``"cosine>=0.99@/model.22/Sigmoid_output_0"``: a detector's class scores, which the mean over
its one concatenated output hides); by default every model output counts.

``"cosine>=0.99,worst>=0.98"`` adds a floor: the worst sample must also reach 0.98 (a mean can
hide one image that a configuration ruins; in Python ``(fn, ">=", 0.95, 0.9)``). The target
then judges a :class:`Score` by its *margin*, the smaller of the two: ``min(mean - 0.99, worst -
0.98)`` (for ``<=`` metrics the other way round); it is met when the margin is at least 0, and
one score is better than another by the difference of their margins. A NaN sample misses a
floor.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from qir import metrics as qmetrics
from qir.errors import InputError, did_you_mean
from qir.passes.base import Report

__all__ = ["Score", "Judged", "Target", "parse_target", "SYNTAX", "PERFECT"]

ALIASES = {"cosine": "cosine-similarity", "cos": "cosine-similarity"}
SYNTAX = ("write METRIC>=VALUE or METRIC<=VALUE, e.g. 'cosine>=0.99' or 'mse<=1e-3' (metrics: cosine, "
          + ", ".join(qmetrics.METRICS) + "), optionally with a floor for every sample: 'cosine>=0.99,worst>=0.98'; "
          "and/or only some values: 'cosine>=0.99@scores' (model outputs or activations, comma-separated); "
          "in Python also (fn, '>=', value) or (fn, '>=', value, worst) with fn(outputs, index) -> float")
_TEXT = re.compile(r"^\s*([A-Za-z][\w-]*)\s*(>=|<=)\s*([^\s,]+)\s*(?:,\s*worst\s*(>=|<=)\s*(\S+)\s*)?$", re.IGNORECASE)
#: The value a metric takes for a perfect match (cosine 1, errors 0); SQNR has none (infinite).
#: The value of each metric at a perfect match.
PERFECT = {"cosine-similarity": 1.0, "mse": 0.0, "mre": 0.0, "l1": 0.0, "atol": 0.0, "chebyshev": 0.0, "kl": 0.0}


@dataclass(frozen=True)
class Score:
    """A configuration on the evaluation samples: the mean over them and each sample's value."""

    mean: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class Judged(Report):
    """A :class:`Score` as the reports show it (:meth:`Target.judged`): the mean, the worst
    sample's value and index (None: every sample NaN), the margin and whether it meets the target."""

    mean: float
    worst: float
    worst_sample: int | None
    margin: float
    meets: bool


@dataclass(frozen=True)
class Target:
    """``metric op threshold`` on the mean, and ``floor`` (None: none) on every sample: ``metric``
    a :mod:`qir.metrics` name or a callable ``fn(outputs, index) -> float``; ``op`` ``>=``
    (higher is better) or ``<=``."""

    metric: str | Callable[[dict, int], float]
    op: str
    threshold: float
    floor: float | None = None
    values: tuple[str, ...] = ()  # the values scored; () for the model's outputs

    @property
    def text(self) -> str:
        name = self.metric if isinstance(self.metric, str) else getattr(self.metric, "__name__", "task metric")
        return (f"{name}{self.op}{self.threshold:.10g}" + (f",worst{self.op}{self.floor:.10g}" if self.floor is not None
                                                           else "") + (f"@{','.join(self.values)}" if self.values else ""))

    def compared(self, ir) -> list[str]:
        """The values a score compares: the target's, each checked to be a value of ``ir`` (one
        clear error with the closest names otherwise), or the model's outputs."""
        for name in self.values:
            if not ir.has_value(name):
                raise InputError(did_you_mean(name, [v.name for v in ir.activations()], "value")
                                 + " in the target's @VALUE (a model output or any activation of the model)")
        return list(self.values) or list(ir.outputs)

    @property
    def higher_is_better(self) -> bool:
        return self.op == ">="

    def _above(self, value: float, bound: float) -> float:
        return value - bound if self.higher_is_better else bound - value

    def margin(self, score: Score) -> float:
        """How far ``score`` is on the good side of the target (negative: it misses; NaN: a NaN
        mean, or a NaN sample under a floor): the mean's distance to the threshold, or the
        worst sample's to the floor when that is smaller."""
        margin = self._above(score.mean, self.threshold)
        if self.floor is None:
            return margin
        if any(v != v for v in score.samples):
            return math.nan
        worst = self.worst(score.samples)[1]
        return min(margin, self._above(worst, self.floor)) if worst == worst else margin

    def misses_floor(self, values: Sequence[float]) -> bool:
        """Whether some sample of ``values`` misses the floor (a NaN one does); never without one."""
        if self.floor is None:
            return False
        worst = self.worst(values)[1]
        return any(v != v for v in values) or self._above(worst, self.floor) < 0

    def met(self, score: Score) -> bool:
        """Whether ``score`` meets the target; NaN never does."""
        margin = self.margin(score)
        return margin == margin and margin >= 0

    def standing(self, score: Score) -> float:
        """The margin for ranking scores: NaN counts as the worst (-inf)."""
        margin = self.margin(score)
        return margin if margin == margin else -math.inf

    def gain(self, new: Score, old: Score) -> float:
        """How much better ``new`` is than ``old``: the difference of their margins (negative:
        worse); NaN counts as the worst."""
        a, b = self.standing(new), self.standing(old)
        return 0.0 if a == b else a - b

    def shown(self, score: Score) -> str:
        """``score`` in a line of text: its mean, and its worst sample when the target has a floor."""
        return f"{score.mean:.6g}" + (f" (worst {self.worst(score.samples)[1]:.6g})" if self.floor is not None else "")

    def judged(self, score: Score) -> Judged:
        """``score`` as the reports show it: its mean, worst sample, margin and whether it meets the target."""
        worst_sample, worst = self.worst(score.samples)
        return Judged(score.mean, worst, worst_sample, self.margin(score), self.met(score))

    def worst(self, values: Sequence[float]) -> tuple[int | None, float]:
        """The index and value of the worst sample (NaN entries skipped)."""
        finite = [(i, v) for i, v in enumerate(values) if v == v]
        if not finite:
            return None, math.nan
        pick = min if self.higher_is_better else max
        return pick(finite, key=lambda iv: iv[1])

    def worst_first(self, values: Sequence[float]) -> list[int]:
        """Every index of ``values``, the worst sample first (NaN entries first of all: a sample
        that could not be measured is not taken as a good one); ties in sample order."""
        sign = 1.0 if self.higher_is_better else -1.0
        return sorted(range(len(values)), key=lambda i: sign * values[i] if values[i] == values[i] else -math.inf)

    def bad_cases(self, values: Sequence[float], n: int | None) -> list[int]:
        """The indices of the ``n`` samples of ``values`` that score worst, in sample order (NaN
        entries skipped); every index when ``n`` is None or leaves none out."""
        worst_first = [i for i in self.worst_first(values) if values[i] == values[i]]
        return sorted(worst_first[:n]) if n is not None and 0 < n < len(worst_first) else list(range(len(values)))

    def tightened(self, by: float, floor_by: float | None = None) -> Target:
        """The same target ``by`` (>= 0) further on the good side, its floor ``floor_by`` (default:
        ``by`` too)."""
        sign = 1.0 if self.higher_is_better else -1.0
        floor_by = by if floor_by is None else floor_by
        return Target(self.metric, self.op, self.threshold + sign * by,
                      None if self.floor is None else self.floor + sign * floor_by, self.values)

    def tolerance(self, value: float) -> float:
        """How far two measurements of one configuration may differ and still agree (verification):
        2% of the distance to a perfect match (cosine 1, an error 0), else (SQNR, a task metric)
        0.1% of the value, at least 1e-9. Two correct runs of one configuration differ where float
        sums are ordered differently (the search writes GlobalAveragePool as ReduceMean, the
        emitted model keeps it): a value that lands on a rounding tie in one and not the other
        moves one quantization step, and int8 layers after it carry that on. On PP-OCRv4 det with
        36 int8 GEMMs this came to 1.0% of the distance to cosine 1; a wrong mode or scale in
        the emitted model moves it by far more."""
        perfect = PERFECT.get(self.metric) if isinstance(self.metric, str) else None
        scale = abs(value - perfect) * 0.02 if perfect is not None else abs(value) * 1e-3
        return max(scale, 1e-9)


def parse_target(target: Any) -> Target:
    """A :class:`Target` from ``"cosine>=0.99"``, ``"cosine>=0.99,worst>=0.98"``, ``(fn, ">=",
    0.9)``, ``(fn, ">=", 0.9, 0.8)``, ``(fn, 0.9)`` or a Target; anything else is an InputError
    that gives the syntax."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        text, at, names = target.partition("@")
        values = tuple(n.strip() for n in names.split(",") if n.strip())
        if at and not values:
            raise InputError(f"the target {target!r} names no value after '@'; {SYNTAX}")
        return replace(_parse_text(text, target), values=values)
    if isinstance(target, (tuple, list)) and len(target) in (2, 3, 4):
        metric, op, threshold, *floor = (target[0], ">=", target[1]) if len(target) == 2 else target
        numbers = [_number(x) for x in (threshold, *floor)]
        if not (callable(metric) or isinstance(metric, str)) or op not in (">=", "<=") or None in numbers:
            raise InputError(f"cannot read the target {target!r}; {SYNTAX}")
        return _checked(metric, op, numbers[0], numbers[1] if floor else None)
    raise InputError(f"cannot read the target {target!r}; {SYNTAX}")


def _parse_text(text: str, target: str) -> Target:
    """The metric, direction, threshold and floor of a written target (``target``: as given, for errors)."""
    m = _TEXT.match(text)
    values = [_number(m.group(3)), _number(m.group(5)) if m.group(5) else 0.0] if m else []
    if not m or None in values:
        raise InputError(f"cannot read the target {target!r}; {SYNTAX}")
    if m.group(4) and m.group(4) != m.group(2):
        raise InputError(f"the worst-sample floor of {target!r} must have the direction of the target "
                         f"({m.group(2)}): write 'worst{m.group(2)}{m.group(5)}'")
    return _checked(m.group(1), m.group(2), values[0], values[1] if m.group(5) else None)


def _number(x: Any) -> float | None:
    """``x`` as a finite float, or None."""
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _checked(metric: str | Callable, op: str, threshold: float, floor: float | None) -> Target:
    if callable(metric):
        return Target(metric, op, threshold, floor)
    name = ALIASES.get(metric.lower(), metric.lower())
    if name not in qmetrics.METRICS:
        raise InputError(f"unknown metric {metric!r} in the target; {SYNTAX}")
    better = ">=" if qmetrics.BETTER[name] == "max" else "<="
    if op != better:
        raise InputError(f"{name} is better when {'higher' if better == '>=' else 'lower'}: write "
                         f"'{metric}{better}{threshold:g}'")
    if floor is not None and Target(name, op, threshold)._above(threshold, floor) < 0:
        raise InputError(f"the worst-sample floor ({floor:g}) is stricter than the mean's threshold ({threshold:g}): "
                         "a floor is what every sample must reach, the mean is held higher")
    return Target(name, op, threshold, floor)
