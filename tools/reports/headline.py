"""The first lines of a comparison's report: whether the analysis model collapsed an output (and at
which layer the collapse begins), then each model output's score, worst first.

One number hides a broken output: a detector's mean output cosine of 0.999 over all its outputs
can sit beside a class-score output at 0.84, and a cosine of 0 reads like any low score while the
output is all zeros. So the headline scores each output on its own and names a collapse first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from qir.passes.layer_compare import CollapseStart

__all__ = ["OutputScore", "Collapse", "output_scores", "collapse_of", "headline_lines", "best_fix_line"]


@dataclass(frozen=True)
class OutputScore:
    """One model output's output cosine over the searched samples."""

    output: str
    mean: float
    worst: float
    worst_sample: int

    def to_json(self) -> dict[str, Any]:
        return {"output": self.output, "mean_cosine": self.mean, "worst_cosine": self.worst,
                "worst_sample": self.worst_sample}


@dataclass(frozen=True)
class Collapse:
    """The outputs the analysis model collapsed (output -> sample -> how) and the layer, on the
    analysed sample, where the collapse begins (None when the layer table did not run or saw none)."""

    outputs: Mapping[str, Mapping[str, str]]
    begins_at: str | None = None
    begins_how: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"outputs": {k: dict(v) for k, v in self.outputs.items()}, "begins_at": self.begins_at,
                "begins_how": self.begins_how}


def output_scores(values: Mapping[str, Mapping[str, list[float]]]) -> list[OutputScore]:
    """Each output's mean and worst Cosine over the samples (a bad-case report's ``values``; NaN
    samples, left out, do not count), worst mean first."""
    scores = []
    for name, per in values.items():
        finite = [(v, i) for i, v in enumerate(per.get("Cosine", [])) if not math.isnan(v)]
        if finite:
            worst, sample = min(finite)
            scores.append(OutputScore(name, sum(v for v, _ in finite) / len(finite), worst, sample))
    return sorted(scores, key=lambda s: s.mean)


def collapse_of(collapsed: Mapping[str, Mapping[str, str]] | None, start: CollapseStart | None) -> Collapse | None:
    """The collapse a bad-case search found (its report's ``collapsed``: output -> sample -> how),
    with where it begins on the analysed sample (:func:`qir.passes.layer_compare.collapse_start`);
    None when nothing collapsed."""
    if not collapsed and start is None:
        return None
    return Collapse(collapsed or {}, start.layer if start else None, start.describe() if start else None)


def headline_lines(collapse: Collapse | None, scores: list[OutputScore], samples: int) -> list[str]:
    """The headline as text lines: the collapse (if any) first, then the outputs worst first."""
    lines = []
    if collapse is not None:
        for name, per in collapse.outputs.items():
            first = min(per, key=int)
            lines.append(f"COLLAPSE: output {name!r} of the analysis model collapses on {len(per)} of {samples} "
                         f"sample(s) ({', '.join(sorted(per, key=int)[:8])}): on sample {first} it is {per[first]}")
        if collapse.begins_at:
            lines.append(f"COLLAPSE begins at layer {collapse.begins_at} on the analysed sample "
                         f"({collapse.begins_how}); the advice starts there")
    if scores:
        lines.append("outputs, worst first: " + "; ".join(
            f"{s.output} cosine mean {s.mean:.5f}, worst {s.worst:.5f} (sample {s.worst_sample})" for s in scores))
    return lines


def best_fix_line(helping: int, fix: str, where: str, before: float, after: float, settled: bool | None = None) -> str:
    """The headline's line for the best of ``helping`` measured fixes: what, where, its score before
    and after; ``settled``: whether it is the best in 95% of bootstrap resamples (None: not known)."""
    note = "" if settled is None or helping < 2 else "; settled as the best" if settled else \
        "; not settled as the best (another fix may do as well)"
    return (f"best measured fix ({helping} help): {fix} for {where}: {before:.5f} -> {after:.5f} "
            f"({after - before:+.5f}){note}")
