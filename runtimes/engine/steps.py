"""The step path: a variant's cone re-executed step by step over the reference cache.

A variant re-executes only its cone (:meth:`.plan.Plan.cone`), reading everything else from
the reference cache (:mod:`.reference`, kept step by step). Values leave memory after their last
reader in the cone. This is how every variant runs on the numpy runtime, and on onnxruntime
the variants the batched rows cannot take (a weight calibration node changed, a switch that
failed its check); there a segment of the cone that holds no change runs as one call when the
first reference pass measured that to be cheaper.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from qir.records import CalibRecord
from qir.runtimes.engine.reference import ReferenceCache
from qir.runtimes.numerics import apply_calibration

__all__ = ["run_steps", "variant_constants"]


def variant_constants(ref: ReferenceCache, changes: Mapping[str, CalibRecord]) -> dict[str, np.ndarray]:
    """The weight-calibration outputs with the variant's ``changes`` (the reference's elsewhere)."""
    constants = dict(ref.constants)
    for rec in changes.values():
        if rec.output in constants:
            constants[rec.output] = apply_calibration(rec, ref.ir.weight_array(rec.input), ref.rounding)
    return constants


def run_steps(ref: ReferenceCache, changes: Mapping[str, CalibRecord],
              compare: Sequence[str]) -> tuple[dict[str, np.ndarray], int, int]:
    """``compare`` values of a variant given by its ``changes``, its cone re-executed step by
    step on a step-level reference (segments of the cone that hold no change as one call
    where that is cheaper). Returns the values and the steps and segments run."""
    plan = ref.plan
    start = plan.start_steps(changes)
    cone = plan.cone(start)
    constants = variant_constants(ref, changes)
    overlay: dict[str, np.ndarray] = {}
    steps_run = segments_run = 0
    read = ref.reader(overlay, changes, constants)

    for k, (lo, hi) in enumerate(plan.segments):
        idx = np.flatnonzero(cone[lo:hi]) + lo
        if not idx.size:
            continue
        whole = ref.segment_cost.get(k)
        if (whole is not None and not any(lo <= i < hi for i in start)
                and whole < float(ref.step_cost[idx].sum())):
            overlay.update(ref.runner.run_segment(k, read))
            segments_run += 1
        else:
            for i in idx:
                overlay.update(ref.step(int(i), read, changes, constants))
                for v in plan.steps[i].inputs:  # free what no later step reads
                    if plan.last_reader.get(v) == i and v not in compare:
                        overlay.pop(v, None)
            steps_run += int(idx.size)
        for v in [v for v in overlay if plan.last_reader.get(v, -1) < hi and v not in compare]:
            del overlay[v]
    return {v: read(v) for v in compare}, steps_run, segments_run
