"""The reference cache: the reference configuration's values of one sample, and reading them.

The reference configuration runs once per sample, step by step (:mod:`.plan`); every value
crossing a step boundary is kept in a :class:`.cache.ValueCache` (``memory_budget`` bytes,
spilled to disk past it). Fake-quantized values are kept as their integer codes where memory
is short (:class:`.cache.ValueCache`); the float input of an integer quantizer is not kept at
all but recomputed from its producer by the one variant that needs it. Samples are processed
one at a time, so the cache holds one sample. When only batched variants read it, the reference
runs segment by segment instead and keeps just the values crossing segments.

The first step-by-step pass also measures what each step costs, and runs each onnxruntime
segment once to check it against its steps and time it (the step path runs a segment whole
where that is cheaper).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from qir.calibration import QRANGE, along_axis, calib_scale
from qir.graph import QIR
from qir.records import CalibRecord
from qir.runtimes.base import check_feeds
from qir.runtimes.engine.cache import ValueCache
from qir.runtimes.engine.plan import Plan
from qir.runtimes.engine.runners import Read
from qir.runtimes.engine.variants import change_key
from qir.runtimes.numerics import apply_calibration

__all__ = ["ReferenceCache", "StepCosts", "values_to_recompute"]


@dataclass
class StepCosts:
    """What a first step-level reference pass timed (:meth:`.engine.Engine.measured_costs`): the
    seconds per step (``steps``), per checked segment (``segments``: segment index -> seconds), and
    the ``plan``'s segments they were timed on (another plan's costs are not adopted)."""

    steps: np.ndarray
    segments: dict[int, float]
    plan: list[tuple[int, int]]

logger = logging.getLogger(__name__)


def _scale_of(rec: CalibRecord, ir: QIR) -> np.ndarray:
    """The scale of an integer-mode calibration node, shaped to broadcast over its value."""
    shape = ir.value(rec.input).shape
    return along_axis(calib_scale(rec), rec.axis, len(shape) if shape is not None else 0)


def values_to_recompute(plan: Plan, code_scale: Mapping[int, np.ndarray]) -> dict[str, int]:
    """``{value: producing step}`` for values that only integer-mode calibration nodes read
    (the steps of ``code_scale``, in the reference): the cache keeps only the quantized values
    (as codes where memory is short), and a variant that needs the float value (it changes that
    node) recomputes it from its producer."""
    readers: dict[str, list[int]] = {}
    for step in plan.steps:
        for v in step.inputs:
            readers.setdefault(v, []).append(step.index)
    out = {}
    for step in plan.steps:
        if step.calib is not None:
            continue
        for v in step.outputs:
            rs = readers.get(v, [])
            if rs and v not in plan.kept and all(i in code_scale for i in rs):
                out[v] = step.index
    return out


class ReferenceCache:
    """The reference configuration (calibration ``records``, weight-calibration ``constants``)
    of the current sample in ``cache``, and how variants read it and run one step over it.

    ``level`` says how the current sample was run (``steps``, ``segments``, or ``""`` before
    the first), ``sample`` which one (``(index, feeds)``). ``step_cost`` (seconds per step) and
    ``segment_cost`` (per checked segment) are measured by the first step-by-step pass."""

    def __init__(self, ir: QIR, plan: Plan, runner, records: Mapping[str, CalibRecord],
                 constants: Mapping[str, np.ndarray], rounding: str, cache: ValueCache) -> None:
        self.ir, self.plan, self.runner = ir, plan, runner
        self.records, self.constants, self.rounding = records, constants, rounding
        self.cache = cache
        # integer-mode calibration steps -> scale: their outputs are cached as codes
        self.code_scale = {s.index: _scale_of(records[s.calib.name], ir) for s in plan.steps
                           if s.calib is not None and records[s.calib.name].mode in QRANGE}
        self.recomputable = values_to_recompute(plan, self.code_scale)
        self.producer = {o: step.index for step in plan.steps for o in step.outputs}
        self.level, self.sample = "", None
        self.step_cost: np.ndarray | None = None
        self.segment_cost: dict[int, float] = {}

    def load(self, s: int, sample: Mapping[str, np.ndarray], pool=None, steps: bool = True) -> None:
        """Run the reference on sample ``s`` into the cache, step by step (every value crossing a
        step kept; what step-by-step variants read) or, with ``steps=False``, segment by segment
        (only values crossing segments; what batched variants read)."""
        cache = self.cache
        cache.clear()
        for name, array in check_feeds(self.ir, sample).items():
            cache.put(name, array)
        self.level, self.sample = ("steps" if steps else "segments"), (s, sample)
        if steps:
            self._load_steps(pool)
            return
        read = self.reader()
        for k in range(len(self.plan.segments)):
            for name, array in self.runner.run_segment(k, read).items():
                cache.put(name, array, self.code_scale.get(self.producer.get(name)))

    def reader(self, overlay: dict[str, np.ndarray] | None = None, changes: Mapping[str, CalibRecord] | None = None,
               constants: Mapping[str, np.ndarray] | None = None) -> Read:
        """``read(value)``: the variant's value (in ``overlay``), else the cached reference, else
        (a value the cache does not keep) recomputed from its producer step with the variant's
        ``changes`` and ``constants``. Without arguments: the reference itself."""
        overlay = {} if overlay is None else overlay
        changes = changes or {}
        constants = self.constants if constants is None else constants
        cache = self.cache

        def read(v: str) -> np.ndarray:
            if v in overlay:
                return overlay[v]
            producer = self.recomputable.get(v)
            if producer is None or v in cache:
                return cache.get(v)
            return self.step(producer, read, changes, constants)[v]

        return read

    def step(self, i: int, read: Read, changes: Mapping[str, CalibRecord],
             constants: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs of step ``i`` with the variant's ``changes`` (a calibration step computed
        here, an op step by the runner with the weight-calibration modes as its session key)."""
        step = self.plan.steps[i]
        calib = step.calib
        if calib is not None:
            rec = changes.get(calib.name) or self.records[calib.name]
            return {calib.output: apply_calibration(rec, read(calib.input), self.rounding)}
        key = tuple((w, change_key(changes[w])) for w in step.weight_calibs if w in changes)
        return self.runner.run_step(i, read, constants, key)

    def _load_steps(self, pool=None) -> None:
        """The reference, step by step, into the cache (the sample's inputs are there); the first
        time, step costs are timed and segments checked (:meth:`_calibrate_costs`)."""
        cache, plan = self.cache, self.plan
        timing = self.step_cost is None
        if timing and pool is not None and hasattr(self.runner, "prepare"):  # build sessions in parallel
            list(pool.map(self.runner.prepare, range(len(plan.steps))))
        transient: dict[str, np.ndarray] = {}  # recomputable values, until their last reader ran
        read = self.reader(transient)
        costs = np.zeros(len(plan.steps))
        for step in plan.steps:
            t0 = time.perf_counter()
            outs = self.step(step.index, read, {}, self.constants)
            costs[step.index] = time.perf_counter() - t0
            scale = self.code_scale.get(step.index)
            for name, array in outs.items():
                if name in self.recomputable:
                    transient[name] = array
                else:
                    cache.put(name, array, scale)
            for name in step.inputs:
                if name in transient and plan.last_reader.get(name) == step.index:
                    del transient[name]
        if timing:
            self._calibrate_costs(costs, pool)

    def _calibrate_costs(self, costs: np.ndarray, pool=None) -> None:
        """Step costs as timed in the first reference pass (sessions were built beforehand; a
        session's first run is slower, which only biases the choice toward whole segments);
        each segment run once to warm it up and check it against the cached step outputs,
        then timed."""
        read = self.reader()
        self.step_cost = costs
        if not getattr(self.runner, "segments", False):
            return

        def same(k: int) -> bool:  # warm-up run, checked against the steps and let go
            outs = self.runner.run_segment(k, read)
            bad = [v for v, a in outs.items() if not np.array_equal(a, read(v), equal_nan=True)]
            if bad:
                logger.info("segment %d differs from its steps at %s; running its steps one by one", k, bad[0])
            return not bad

        ks = range(len(self.plan.segments))
        for k, ok in list(zip(ks, pool.map(same, ks) if pool else map(same, ks))):
            if ok:  # timed alone, like the steps
                t0 = time.perf_counter()
                self.runner.run_segment(k, read)
                self.segment_cost[k] = time.perf_counter() - t0
