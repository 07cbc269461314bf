"""What a ``qir tune`` run has found so far: the configurations its stages produce, passed from one
stage to the next and summarized into the report (:func:`.report.summarize`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from qir.passes.tune.space import Config
from qir.passes.tune.target import Score, Target

__all__ = ["TuneState"]

Key = tuple[str, Any]  # a change the attribution measures: ("cheap", None), ("unit", i), ("threshold", name)


@dataclass
class TuneState:
    """The search's state. The bounds stage sets the first eight fields; the others are filled by
    the stage named in each comment (None / empty until then)."""

    start: Config  # every unit at its first level, with the clipping fixes kept
    plain_start: Config  # the same without clipping fixes (the calibrated model)
    int16: Config  # all activations int16
    upper: Config  # the better of all-int16 and every unit at its last integer level
    ceiling: Config  # every unit at its last level (fp16; float with allow_float)
    fixes: list[dict[str, Any]]  # the clipping stage's candidates, each with what it kept
    reached: bool | None  # whether ``final`` meets the target (None: not decided by the bounds)
    final: Config  # the result so far
    reference: Config | None = None  # what the search works down from (the reference stage)
    cheap: list[int] = field(default_factory=list)  # units raised with no search (cheap units)
    order: list[int] | None = None  # the ratio search's order of units
    loss: dict[int, float] | None = None  # each unit's sensitivity (the sensitivity stage)
    ratio_config: Config | None = None  # where the ratio search ended
    path: list[tuple[Config, Score]] = field(default_factory=list)  # what pruning went through
    score: Score | None = None  # the result's score at verification
    search_target: Target | None = None  # the target the search met (tightened by an integer-level retry)
    backtracked: dict[str, Any] | None = None  # how far back along pruning's path the result is
    sensitivity_samples: list[int] | None = None  # the samples the sensitivity stage ranked on
    attribution_samples: list[int] | None = None  # the samples the attribution measured on
    gains: dict[Key, float] = field(default_factory=dict)  # each change's gain (the attribution)
    per_image: dict[Key, Any] = field(default_factory=dict)  # each change's per-image loss (the attribution)
    integer_repair: Any = None  # what step 7's search at the integer level found (an .integer_repair.IntegerRepair)
    ranking: Any = None  # the sensitivity order's confidence (a .ranking.SensitivityRanking; the sensitivity stage)

    def cheap_raised(self) -> list[int]:
        """The cheap units ``final`` still has above their start level (pruning may lower some)."""
        return [i for i in self.cheap if self.final.levels[i] > self.plain_start.levels[i]]
