"""The accuracy target of ``qir tune``: a metric, a direction and a threshold, met by the *mean*
over the evaluation samples.

A target is written ``METRIC>=VALUE`` or ``METRIC<=VALUE``: ``"cosine>=0.99"``,
``"mse<=1e-3"``, ``"sqnr-db>=30"``. ``METRIC`` is a :mod:`qir.metrics` name (or ``cosine`` /
``cos`` for ``cosine-similarity``), measured between the float model's outputs and the tuned
model's, and the direction must be the metric's better one (``cosine<=0.99`` is refused). In
Python the metric may also be a task metric: ``(fn, ">=", 0.95)`` or ``(fn, 0.95)`` (then
higher is better), where ``fn(outputs, index)`` scores the model's outputs (``{name: array}``)
on evaluation sample ``index`` (e.g. ``float(outputs["logits"].argmax() == labels[index])``:
the mean is the accuracy).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from qir import metrics as qmetrics
from qir.errors import InputError

__all__ = ["Target", "parse_target", "SYNTAX"]

ALIASES = {"cosine": "cosine-similarity", "cos": "cosine-similarity"}
SYNTAX = ("write METRIC>=VALUE or METRIC<=VALUE, e.g. 'cosine>=0.99' or 'mse<=1e-3' (metrics: cosine, "
          + ", ".join(qmetrics.METRICS) + "); in Python also (fn, '>=', value) with fn(outputs, index) -> float")
_TEXT = re.compile(r"^\s*([A-Za-z][\w-]*)\s*(>=|<=)\s*(\S+)\s*$")
#: The value a metric takes for a perfect match (cosine 1, errors 0); SQNR has none (infinite).
_PERFECT = {"cosine-similarity": 1.0, "mse": 0.0, "mre": 0.0, "l1": 0.0, "atol": 0.0, "chebyshev": 0.0, "kl": 0.0}


@dataclass(frozen=True)
class Target:
    """``metric op threshold``: ``metric`` a :mod:`qir.metrics` name or a callable
    ``fn(outputs, index) -> float``; ``op`` ``>=`` (higher is better) or ``<=``."""

    metric: str | Callable[[dict, int], float]
    op: str
    threshold: float

    @property
    def text(self) -> str:
        name = self.metric if isinstance(self.metric, str) else getattr(self.metric, "__name__", "task metric")
        return f"{name}{self.op}{self.threshold:.10g}"

    @property
    def higher_is_better(self) -> bool:
        return self.op == ">="

    def met(self, value: float) -> bool:
        """Whether ``value`` (a mean over samples) meets the target; NaN never does."""
        return value == value and (value >= self.threshold if self.higher_is_better else value <= self.threshold)

    def margin(self, value: float) -> float:
        """How far ``value`` is on the good side of the threshold (negative: it misses)."""
        return value - self.threshold if self.higher_is_better else self.threshold - value

    def gain(self, new: float, old: float) -> float:
        """How much better ``new`` is than ``old`` (negative: worse); NaN counts as the worst."""
        worst = -math.inf if self.higher_is_better else math.inf
        new, old = (worst if v != v else v for v in (new, old))
        if new == old:
            return 0.0
        return (new - old) if self.higher_is_better else (old - new)

    def better(self, a: float, b: float) -> bool:
        return self.gain(a, b) > 0

    def worst(self, values: Sequence[float]) -> tuple[int | None, float]:
        """The index and value of the worst sample (NaN entries skipped)."""
        finite = [(i, v) for i, v in enumerate(values) if v == v]
        if not finite:
            return None, math.nan
        pick = min if self.higher_is_better else max
        return pick(finite, key=lambda iv: iv[1])

    def tightened(self, by: float) -> Target:
        """The same target ``by`` (>= 0) further on the good side."""
        return Target(self.metric, self.op, self.threshold + by if self.higher_is_better else self.threshold - by)

    def tolerance(self, value: float) -> float:
        """How far two measurements of one configuration may differ and still agree (verification):
        1% of the distance to a perfect match (cosine 1, an error 0), else (SQNR, a task metric)
        0.1% of the value, at least 1e-9."""
        perfect = _PERFECT.get(self.metric) if isinstance(self.metric, str) else None
        scale = abs(value - perfect) * 0.01 if perfect is not None else abs(value) * 1e-3
        return max(scale, 1e-9)


def parse_target(target: Any) -> Target:
    """A :class:`Target` from ``"cosine>=0.99"``, ``(fn, ">=", 0.9)``, ``(fn, 0.9)`` or a Target;
    anything else is an InputError that gives the syntax."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        m = _TEXT.match(target)
        try:
            threshold = float(m.group(3)) if m else math.nan
        except ValueError:
            threshold = math.nan
        if not m or not math.isfinite(threshold):
            raise InputError(f"cannot read the target {target!r}; {SYNTAX}")
        return _checked(m.group(1), m.group(2), threshold)
    if isinstance(target, (tuple, list)) and len(target) in (2, 3):
        metric, op, threshold = (target[0], ">=", target[1]) if len(target) == 2 else target
        if not (callable(metric) or isinstance(metric, str)) or op not in (">=", "<=") or not _number(threshold):
            raise InputError(f"cannot read the target {target!r}; {SYNTAX}")
        return _checked(metric, op, float(threshold))
    raise InputError(f"cannot read the target {target!r}; {SYNTAX}")


def _number(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _checked(metric: str | Callable, op: str, threshold: float) -> Target:
    if callable(metric):
        return Target(metric, op, threshold)
    name = ALIASES.get(metric.lower(), metric.lower())
    if name not in qmetrics.METRICS:
        raise InputError(f"unknown metric {metric!r} in the target; {SYNTAX}")
    better = ">=" if qmetrics.BETTER[name] == "max" else "<="
    if op != better:
        raise InputError(f"{name} is better when {'higher' if better == '>=' else 'lower'}: write "
                         f"'{metric}{better}{threshold:g}'")
    return Target(name, op, threshold)
