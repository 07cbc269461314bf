"""The report of ``qir tune`` (JSON data; :mod:`qir.tools.reports.tune` writes the files).

``summarize`` turns what the search found into: the target and whether it was reached; the
scores (mean, worst sample, margin, cost) of the calibrated start configuration, the start with
its clipping fixes, the upper bound, all-int16, the ceiling, the reference the search worked down
from (the upper bound, else the ceiling), and the final configuration; the
final FLOP-weighted cost against the start and against all-int16; each score's standard error
(how far the mean on other samples may be); the changes with their reason
and measured gain; the clipping fixes; every configuration tried (``history``) with the indices
of its Pareto front (no other configuration both cheaper and better); the calibration nodes per
mode and the GEMM ops per precision of the result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from qir.passes.base import Report
from qir.passes.lib.latency import Bound
from qir.passes.tune.evaluator import Evaluator
from qir.passes.tune.space import TUNE_LEVELS, Config, Space
from qir.passes.tune.state import TuneState
from qir.passes.tune.verify import Unseen, Verification
from qir.runtimes.march import MarchProfile, OpClass, op_class

__all__ = ["summarize", "pareto", "standard_error", "ScoreSummary", "FinalScore", "TuneReport"]


@dataclass(frozen=True)
class ScoreSummary(Report):
    """A configuration in the report: the target's numbers (:class:`~.target.Judged`'s), the
    mean's standard error, its cost, FLOP-weighted cost and estimated time (µs), and its units per
    level."""

    mean: float
    worst: float
    worst_sample: int | None
    margin: float
    meets: bool
    standard_error: float
    cost: float
    flop_cost: float
    time_us: float
    levels: dict[str, int]


@dataclass(frozen=True)
class FinalScore(ScoreSummary):
    """The result's :class:`ScoreSummary` with its cost and FLOP-weighted cost against the start
    and against all-int16 (None where that is 0)."""

    cost_vs_start: float | None = None
    cost_vs_int16: float | None = None
    flop_cost_vs_start: float | None = None
    flop_cost_vs_int16: float | None = None


@dataclass
class TuneReport(Report):
    """The report of ``qir tune`` (see the module docstring; ``tune_report.json`` is its
    :meth:`to_json`). :func:`summarize` fills the fields up to ``configurations``; the pass adds
    the transforms stage, the splits, the target searched for when it was tightened, how far the
    result ``backtracked``, the search at the integer level (``integer_repair``), the
    ``verification``, the result on ``unseen`` samples and the ``seconds`` it took;
    :func:`qir.tools.tune.tune` the reproducing ``commands`` and the ``files`` written. Those are
    left out of the JSON while None."""

    optional = ("reference", "transforms", "split", "search_target", "backtracked", "integer_repair", "verification",
                "unseen", "seconds", "commands", "files")

    target: str
    metric: str
    threshold: float
    direction: str
    worst_floor: float | None
    march: str
    allow_float: bool
    reached: bool
    samples: int
    units: int
    searchable_units: int
    calibrated: ScoreSummary
    start: ScoreSummary
    upper_bound: ScoreSummary
    all_int16: ScoreSummary
    ceiling: ScoreSummary | None
    reference: ScoreSummary | None
    final: FinalScore
    price: str
    time_ms: dict[str, float]
    ratio_search: dict[str, Any]
    attribution_samples: list[int] | None
    changes: list[dict[str, Any]]
    clipping: list[dict[str, Any]]
    sensitivity: dict[str, Any] | None
    calibration_modes: dict[str, int]
    gemm_ops: dict[str, int]
    raised: int
    history: list[dict[str, Any]]
    pareto: list[int]
    engine_calls: int
    configurations: int
    transforms: dict[str, Any] | None = None
    split: dict[str, list[str]] | None = None
    search_target: str | None = None
    backtracked: dict[str, Any] | None = None
    integer_repair: dict[str, Any] | None = None
    #: unit -> the weight mode its GEMMs' weights kept: a repair fitted them there (:attr:`.Space.tied`)
    weight_tied: dict[str, str] | None = None
    verification: Verification | None = None
    unseen: Unseen | None = None
    seconds: float | None = None
    commands: list[str] | None = None
    files: list[str] | None = None


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of ``values`` (NaN skipped): sample standard deviation over
    the square root of their number; NaN with fewer than two. The mean of other samples from the
    same source differs from this one by about that much (more for a configuration the search
    picked for its mean on these samples)."""
    finite = np.array([v for v in values if v == v], dtype=np.float64)
    return float(finite.std(ddof=1) / math.sqrt(len(finite))) if len(finite) > 1 else math.nan


def _score(ev: Evaluator, config: Config, kind: type[ScoreSummary] = ScoreSummary, **more: float | None) -> ScoreSummary:
    score = ev.memo[config]
    return kind(**ev.target.judged(score), standard_error=standard_error(score.samples),
                cost=ev.space.cost(config), flop_cost=ev.space.flop_cost(config), time_us=ev.space.time_us(config),
                levels=ev.space.describe(config), **more)


def pareto(history: list[dict], higher_is_better: bool) -> list[int]:
    """Indices of the entries no other entry beats on both cost (lower) and mean (better)."""
    sign = 1 if higher_is_better else -1
    points = [(h["cost"], sign * h["mean"]) for h in history]
    front = []
    for i, (c, m) in enumerate(points):
        if m != m:
            continue
        if not any((c2 <= c and m2 >= m) and (c2 < c or m2 > m) for c2, m2 in points if m2 == m2):
            front.append(i)
    return front


def _changes(ev: Evaluator, found: TuneState) -> list[dict[str, Any]]:
    """One row per raised unit (its fixed threshold, if any, shown with it), one for the cheap
    units together (``nodes``: their names), and one per fixed threshold of a unit left at its
    start level (``reason`` ``integer level``: raised by the search at the integer level, step 7); ``gain``:
    the loss when it alone is undone;
    ``per_image``: the same with each sample's change counted as a loss, as the search counts it
    (a raise whose mean gain is about nothing can still keep single images from moving far)."""
    space, final, start = ev.space, found.final, found.plain_start
    order, ratio = found.order or [], found.ratio_config
    rank = {i: r + 1 for r, i in enumerate(order)}
    thresholds = dict(final.thresholds)
    clip = {f["node"]: f for f in found.fixes}
    cheap = found.cheap_raised()
    rows = []
    if cheap:
        levels = sorted({f"{space.units[i].levels[start.levels[i]]} -> {space.units[i].levels[final.levels[i]]}" for i in cheap})
        rows.append({"node": f"{len(cheap)} cheap unit(s)", "nodes": space.names(cheap), "change": ", ".join(levels),
                     "reason": "cheap", "gain": found.gains[("cheap", None)],
                     "per_image": found.per_image[("cheap", None)]})
    repair = found.integer_repair  # (its raises, when the result is its configuration)
    by_repair = set(repair.raised) if repair is not None and repair.config == final else set()
    for i in space.raised(final, start):
        if i in cheap:
            continue
        u = space.units[i]
        level = u.levels[final.levels[i]]
        at = f" @ threshold {thresholds[u.name]:.6g}" if u.name in thresholds else ""
        rows.append({"node": u.name, "change": f"{u.levels[start.levels[i]]} -> {level}{at}",
                     "reason": "integer level" if u.name in by_repair else
                     "rounding" if ratio is not None and final.levels[i] <= ratio.levels[i] else "interaction",
                     "gain": found.gains[("unit", i)], "per_image": found.per_image[("unit", i)],
                     "sensitivity_rank": rank.get(i),
                     "threshold_gain": found.gains.get(("threshold", u.name)),
                     "weights": list(u.weights) if TUNE_LEVELS[level][1] not in (None, "int8") else []})
    raised = {space.units[i].name for i in space.raised(final, start)}
    for name, threshold in final.thresholds:
        if name in raised:
            continue
        f = clip.get(name, {})
        rows.append({"node": name, "change": f"threshold {f.get('old_threshold', 0.0):.6g} -> {threshold:.6g}",
                     "reason": "clipping", "gain": found.gains[("threshold", name)],
                     "per_image": found.per_image[("threshold", name)], "threshold": threshold,
                     "clip_sqnr_db": f.get("clip_sqnr_db")})
    return sorted(rows, key=lambda r: -r["gain"])


def _gemm_precisions(ev: Evaluator, config: Config) -> dict[str, int]:
    """GEMM ops per ``input x weight`` precision under ``config``."""
    modes = ev.space.modes(config)
    ir = ev.base
    out: dict[str, int] = {}
    for op in ir.ops():
        if op_class(op.op_type) is not OpClass.GEMM:
            continue
        got = []
        for v in op.inputs[:2]:
            rec = ir.producer(v) if v else None
            got.append(modes.get(rec.name, rec.mode.value) if rec is not None and rec.kind.value == "calibration"
                       else "float")
        key = " x ".join(got)
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _measured_groups(space: Space, config: Config) -> int:
    """How many of ``config``'s fused groups a latency table priced (0 without one)."""
    return space.estimate(config).count(Bound.MEASURED) if space.latency.table is not None else 0


def summarize(ev: Evaluator, found: TuneState, profile: MarchProfile, allow_float: bool) -> TuneReport:
    """The report (see the module docstring)."""
    space, target, final = ev.space, ev.target, found.final
    history = [{k: v for k, v in h.items() if k != "config"} for h in ev.history]
    for h, entry in zip(history, ev.history):
        h["final"] = entry["config"] == final
    costs = {"start": space.cost(found.plain_start), "int16": space.cost(found.int16), "final": space.cost(final)}
    flops = {k: space.flop_cost(c) for k, c in (("start", found.plain_start), ("int16", found.int16), ("final", final))}
    modes = space.modes(final)
    calib_modes: dict[str, int] = {}
    for c in ev.base.calibrations():
        m = modes.get(c.name, c.mode.value)
        calib_modes[m] = calib_modes.get(m, 0) + 1
    order, ratio = found.order or [], found.ratio_config
    return TuneReport(
        target=target.text, metric=target.metric if isinstance(target.metric, str) else target.text,
        threshold=target.threshold, direction=target.op, worst_floor=target.floor,
        march=profile.name, allow_float=allow_float, reached=bool(found.reached),
        samples=len(ev.samples), units=len(space.units), searchable_units=len(space.searchable()),
        calibrated=_score(ev, found.plain_start), start=_score(ev, found.start),
        upper_bound=_score(ev, found.upper),
        all_int16=_score(ev, found.int16),
        ceiling=_score(ev, found.ceiling) if found.ceiling in ev.memo else None,  # (measured where needed)
        reference=_score(ev, found.reference) if found.reference is not None else None,
        final=_score(ev, final, FinalScore, cost_vs_start=costs["final"] / costs["start"] if costs["start"] else None,
                     cost_vs_int16=costs["final"] / costs["int16"] if costs["int16"] else None,
                     flop_cost_vs_start=flops["final"] / flops["start"] if flops["start"] else None,
                     flop_cost_vs_int16=flops["final"] / flops["int16"] if flops["int16"] else None),
        price=space.price,
        time_ms={"all_int8": space.time_us(found.plain_start) / 1000.0, "all_int16": space.time_us(found.int16) / 1000.0,
                 "final": space.time_us(final) / 1000.0, "measured_groups": _measured_groups(space, final)},
        ratio_search={"units": len(order), "raised": sum(ratio.levels[i] > 0 for i in order) if ratio is not None else None,
                      "ratio": sum(ratio.levels[i] > 0 for i in order) / len(order) if ratio is not None and order else None,
                      "cheap": len(found.cheap),
                      "cheap_kept": len(found.cheap_raised()),
                      "sensitivity_samples": found.sensitivity_samples},
        attribution_samples=found.attribution_samples,
        changes=_changes(ev, found), clipping=found.fixes,
        sensitivity=found.ranking.to_json() if found.ranking is not None else None,
        calibration_modes=dict(sorted(calib_modes.items())), gemm_ops=_gemm_precisions(ev, final),
        raised=len(space.raised(final, found.plain_start)),
        history=history, pareto=pareto(history, target.higher_is_better),
        engine_calls=ev.calls, configurations=len(history), weight_tied=dict(space.tied) or None,
    )
