"""Cost-balanced shards: which worker evaluates which variants (pure functions).

Rules:

1. **Step cost.** A step costs the seconds the engine measured for it in a reference pass, when
   it has measured every step (:attr:`.reference.ReferenceCache.step_cost`); otherwise its
   predicted work (:func:`step_work`), in GEMM FLOPs: the FLOPs of its Conv, ConvTranspose,
   MatMul and Gemm ops (:func:`.cost.op_flops`); 16 per element its other ops write (they are
   memory-bound: reading and writing an element takes about as long as 16 FLOPs of a
   convolution); 2 per element of a calibration step (fake quantization); and 2·10⁶ for the call
   (about 20 µs at the ~100 GFLOP/s one core does in a convolution). The weights are what a
   least-squares fit of the step times of YOLOv8n, PP-OCRv4 det and the PP-OCR classifier gives
   on one onnxruntime core (8-38, 0.2-3.6 and 1-3·10⁶), rounded; FLOPs alone miss a small
   model's call overhead and a large one's memory-bound ops.
2. **Variant cost.** A variant re-executes its cone (:meth:`.plan.Plan.cone`): its predicted
   cost is the sum of the step costs over the cone. A variant run whole (the integer level)
   costs every step. Cones differ by orders of magnitude: a change at the first layer re-runs
   the whole model, one at the last layer a few ops.
3. **LPT** (longest processing time first, Graham 1969): variants sorted by cost, largest first
   (ties: the lower index first), each given to the worker with the least load so far (ties: the
   lower worker number), found with a heap. Its makespan (the largest load) is at most
   ``(4/3 - 1/(3m))`` times the best possible with ``m`` workers, and at least the larger of the
   largest cost and the total over ``m``.
4. **Even split.** The baseline LPT is measured against: equal counts per worker, contiguous
   (``np.array_split`` order), or strided (item ``i`` to worker ``i mod m``, as torch's
   ``DistributedSampler`` deals samples). Samples of the bad-case search cost the same, so they
   are split evenly.
"""
from __future__ import annotations

import heapq
from typing import Iterable, Sequence

import numpy as np

from qir.graph import QIR
from qir.records import OpRecord
from qir.runtimes.engine.cost import elements, op_flops
from qir.runtimes.engine.plan import Plan

__all__ = ["step_work", "step_costs", "variant_costs", "lpt", "even_split", "loads", "makespan", "GEMM_OPS",
           "ELEMENT_WORK", "QUANTIZE_WORK", "CALL_WORK"]


GEMM_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
ELEMENT_WORK = 16  # an element another op writes, in GEMM FLOPs (memory-bound work)
QUANTIZE_WORK = 2  # an element a calibration step fake-quantizes, in GEMM FLOPs
CALL_WORK = 2e6  # the call of a step itself, in GEMM FLOPs (~20 us at ~100 GFLOP/s)


def step_work(ir: QIR, plan: Plan) -> np.ndarray:
    """Each step's predicted work in GEMM FLOPs (rule 1): its GEMMs' FLOPs, :data:`ELEMENT_WORK`
    per element its other ops write, :data:`QUANTIZE_WORK` per element a calibration step
    fake-quantizes, and :data:`CALL_WORK` for the call."""
    work = np.full(len(plan.steps), CALL_WORK, np.float64)
    for i, step in enumerate(plan.steps):
        if step.calib is not None:
            work[i] += QUANTIZE_WORK * elements(ir, step.calib.input)
            continue
        for rec in step.records:
            if isinstance(rec, OpRecord):
                work[i] += op_flops(ir, rec) * (1 if rec.op_type in GEMM_OPS else ELEMENT_WORK)
    return work


def step_costs(work: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
    """The cost of each step (rule 1): ``measured`` seconds when given for every step, else its
    predicted ``work`` (:func:`step_work`)."""
    if measured is not None and len(measured) == len(work) and np.all(np.isfinite(measured)):
        return np.asarray(measured, np.float64)
    return np.asarray(work, np.float64)


def variant_costs(plan: Plan, costs: np.ndarray, changed: Sequence[Iterable[str]], *, whole: bool = False) -> np.ndarray:
    """The predicted cost of each variant given by the calibration nodes it ``changed`` (rule 2):
    the sum of ``costs`` over its cone, or over every step with ``whole`` (variants run whole)."""
    costs = np.asarray(costs, np.float64)
    if whole:
        return np.full(len(changed), float(costs.sum()))
    return np.array([float(costs[plan.cone(plan.start_steps(names))].sum()) for names in changed], np.float64)


def lpt(costs: Sequence[float], workers: int) -> list[list[int]]:
    """The indices of ``costs`` assigned to ``workers`` workers longest first (rule 3): one list
    per worker (empty when there are fewer items than workers), each in ascending order."""
    workers = max(1, int(workers))
    shards: list[list[int]] = [[] for _ in range(workers)]
    heap = [(0.0, w) for w in range(workers)]
    for i in sorted(range(len(costs)), key=lambda i: (-float(costs[i]), i)):
        load, w = heapq.heappop(heap)
        shards[w].append(i)
        heapq.heappush(heap, (load + float(costs[i]), w))
    return [sorted(s) for s in shards]


def even_split(count: int, workers: int, *, strided: bool = False) -> list[list[int]]:
    """``range(count)`` in ``workers`` lists of equal size (within one) (rule 4): contiguous runs,
    or with ``strided`` every ``workers``-th item."""
    workers = max(1, int(workers))
    if strided:
        return [list(range(w, count, workers)) for w in range(workers)]
    return [a.tolist() for a in np.array_split(np.arange(count), workers)]


def loads(costs: Sequence[float], shards: Sequence[Sequence[int]]) -> list[float]:
    """The total cost of each shard."""
    return [float(sum(float(costs[i]) for i in shard)) for shard in shards]


def makespan(costs: Sequence[float], shards: Sequence[Sequence[int]]) -> float:
    """The largest shard load: when the last worker finishes, all work running at once."""
    return max(loads(costs, shards), default=0.0)
