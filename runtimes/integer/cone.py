"""Cone re-execution at the integer level: a variant re-runs only the steps it changes and
those downstream of them, reading everything else from a reference run's codes.

A *trace* (:func:`trace`) is one whole integer run of a reference configuration that keeps every
value (codes or float) and its plan. A variant (the same graph with other calibration modes or
parameters) runs its own integer plan (:func:`run_cone`) where a step is *changed* when it does
not compute what the reference's step computes from the same inputs:

* a calibration step whose parameters, mode or quantized weight differ;
* an op whose requantization target differs (a changed calibration node changes how the op
  *before* it rounds: the integer level requantizes a GEMM straight into its reader's
  parameters), whose fused Add differs, or whose inputs or outputs differ (a fusion the
  variant makes or unmakes).

The cone is the changed steps and every step that reads a value a cone step wrote; the other
steps' values are the reference's, bit for bit, so the variant's results equal a whole run of
the variant (``tests/runtimes/integer/test_cone.py``). The cone of a (variant, trace) pair is
computed once and cached on the variant's IR: it serves every sample.

A variant can also be given as its calibration records over the traced model's graph, with no IR
of its own (``records``, :func:`.interpreter.derived_plan`; its plan and cone then kept in a
``memo`` the caller holds with the variant): what makes a variant cheap when only a few of its
nodes differ from the reference, the records it shares with the traced model being the same
objects, which tells them unchanged at a glance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from qir.graph import QIR
from qir.records import CalibRecord
from qir.runtimes.base import check_capture, check_feeds
from qir.runtimes.integer.arithmetic import Arithmetic, IntegerStats
from qir.runtimes.integer.interpreter import IntegerPlan, IntegerRuntime, derived_plan
from qir.runtimes.integer.qtensor import QParams, dequantize
from qir.runtimes.march import MarchProfile

__all__ = ["IntegerTrace", "ConeMemo", "trace", "run_cone"]


@dataclass
class IntegerTrace:
    """One whole integer run kept value by value: the plan it ran, every value, its statistics."""

    plan: IntegerPlan
    keep: frozenset[str]
    env: dict[str, Any]
    stats: IntegerStats
    key: int = field(default_factory=lambda: id(object()))


@dataclass
class ConeMemo:
    """A variant's integer plan (derived from ``reference``, a trace's plan, for ``profile`` and
    ``keep``) and its cone over each trace (by the trace's key), kept with the variant."""

    reference: IntegerPlan | None = None
    profile: MarchProfile | None = None
    keep: frozenset[str] | None = None
    plan: IntegerPlan | None = None
    cones: dict[int, list[bool]] = field(default_factory=dict)


def _keep(ir: QIR, capture: Iterable[str]) -> frozenset[str]:
    return frozenset(ir.outputs) | frozenset(check_capture(ir, capture))


def trace(rt: IntegerRuntime, ir: QIR, feeds: Mapping[str, np.ndarray], capture: Iterable[str] = ()) -> IntegerTrace:
    """A whole integer run of ``ir`` keeping every value (``capture`` as :meth:`IntegerRuntime.run`
    takes it: the variants traced against it must capture the same values)."""
    keep = _keep(ir, capture)
    arith = Arithmetic(rt.profile)
    plan = rt.plan(ir, keep, arith)
    env: dict[str, Any] = dict(plan.base.weights)
    env.update(check_feeds(ir, feeds))
    for step in plan.base.steps:
        outs = rt.step(step, [env[v] if v else None for v in step.inputs], plan, arith)
        env.update((name, value) for name, value in zip(step.outputs, outs) if name)
    rt.finish(arith)
    return IntegerTrace(plan, keep, env, arith.stats)


def _same_params(a: QParams | None, b: QParams | None) -> bool:
    return a is b or ((a is None) == (b is None) and (a is None or a.same_as(b)))


def _calibration_key(rec: CalibRecord) -> tuple:
    arrays = (rec.scale, rec.zero_point, rec.threshold)
    return (rec.mode, rec.axis, rec.implied_clip, rec.input, rec.output,
            tuple(None if a is None else np.asarray(a).tobytes() for a in arrays))


def _changed(name: str, variant: IntegerPlan, reference: IntegerPlan, step, ref_step) -> bool:
    """Whether ``step`` of the variant computes otherwise than ``ref_step`` of the reference."""
    if ref_step is None or step.inputs != ref_step.inputs or step.outputs != ref_step.outputs \
            or type(step.rec) is not type(ref_step.rec):
        return True
    if isinstance(step.rec, CalibRecord):
        if step.rec is not ref_step.rec and _calibration_key(step.rec) != _calibration_key(ref_step.rec):
            return True
        if not _same_params(variant.params.get(name), reference.params.get(name)):
            return True
        mine, theirs = variant.weights.get(name), reference.weights.get(name)
        return mine is not theirs and (
            (mine is None) != (theirs is None) or (mine is not None and not np.array_equal(mine.codes, theirs.codes)))
    return (not _same_params(variant.targets.get(name), reference.targets.get(name))
            or variant.fused.get(name) != reference.fused.get(name)
            or (step.rec is not ref_step.rec and step.rec.attrs != ref_step.rec.attrs))


def cone(variant: IntegerPlan, reference: IntegerPlan) -> list[bool]:
    """Per step of ``variant``: whether it re-runs (changed, or reads a value a re-run step wrote)."""
    by_name = {step.rec.name: step for step in reference.base.steps}
    dirty: set[str] = set()
    marks = []
    for step in variant.base.steps:
        name = step.rec.name
        run = any(v in dirty for v in step.inputs if v) or _changed(name, variant, reference, step, by_name.get(name))
        if run:
            dirty.update(v for v in step.outputs if v)
        marks.append(run)
    return marks


def run_cone(rt: IntegerRuntime, ir: QIR, feeds: Mapping[str, np.ndarray], ref: IntegerTrace,
             capture: Iterable[str] = (), *, records: Mapping[str, CalibRecord] | None = None,
             memo: ConeMemo | None = None) -> dict[str, np.ndarray]:
    """What :meth:`IntegerRuntime.run` returns for ``ir`` (a variant of the traced model) on the
    traced sample ``feeds``, re-running only its cone over ``ref`` (module docstring). The run's
    statistics (``rt.last_stats``) are the cone's plus the reference's outside it.

    ``records``: the variant is the traced model's graph ``ir`` with these calibration records
    (``{name: record}``, every calibration node; those it shares with the traced model best the
    same objects), its plan and cone kept in ``memo`` (held with the variant)."""
    captured = check_capture(ir, capture)
    keep = _keep(ir, captured)
    if keep != ref.keep:
        raise ValueError("a cone run must keep the values its trace kept (same outputs and capture)")
    arith = Arithmetic(rt.profile)
    if records is None:
        plan = rt.plan(ir, keep, arith, reuse=ref.plan)
        marks = ir.cached(("integer-cone", ref.key, keep, rt.profile), lambda: cone(plan, ref.plan))
    else:
        memo = ConeMemo() if memo is None else memo
        if memo.plan is None or memo.reference is not ref.plan or memo.profile is not rt.profile or memo.keep != keep:
            memo.reference, memo.profile, memo.keep = ref.plan, rt.profile, keep
            memo.plan, memo.cones = derived_plan(ir, records, keep, arith, ref.plan), {}
        plan = memo.plan
        if ref.key not in memo.cones:
            memo.cones[ref.key] = cone(plan, ref.plan)
        marks = memo.cones[ref.key]
    overlay: dict[str, Any] = {}

    def read(v: str):
        return overlay[v] if v in overlay else ref.env[v]

    rerun = set()
    for step, run in zip(plan.base.steps, marks):
        if run:
            rerun.add(step.rec.name)
            outs = rt.step(step, [read(v) if v else None for v in step.inputs], plan, arith)
            overlay.update((name, value) for name, value in zip(step.outputs, outs) if name)
    _merge_stats(arith.stats, ref.stats, rerun)
    rt.last_stats = arith.stats
    rt.warn_once(arith)
    return {name: np.asarray(dequantize(read(name))) for name in (*ir.outputs, *captured)}


def _merge_stats(stats: IntegerStats, reference: IntegerStats, rerun: set[str]) -> None:
    """``stats`` of the cone plus the reference's for the steps outside it."""
    for node, count in reference.overflows.items():
        if node not in rerun:
            stats.overflows[node] += count
    for mine, theirs in ((stats.float_fallback, reference.float_fallback),
                         (stats.float_composite, reference.float_composite)):
        for op_type, names in theirs.items():
            kept = [n for n in names if n not in rerun]
            if kept:
                mine.setdefault(op_type, []).extend(kept)
