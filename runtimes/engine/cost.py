"""Operation counts, and the *cone floor*: the least work any "change one node, re-run what it
affects" analysis must do.

FLOPs per general node (multiply and add counted separately):

- Conv: ``2 · |Y| · C_in/group · k_h·k_w`` (``|Y|`` = output elements);
- ConvTranspose: ``2 · |X| · C_out/group · k_h·k_w``;
- MatMul and Gemm: ``2 · |Y| · K`` (K the reduced dimension of the first input);
- anything else: ``|Y|`` summed over outputs (one operation per element written).

Unknown shapes count 0. The cone floor of a list of variants is
``Σ_i (FLOPs of the general nodes downstream of variant i's changed nodes / all FLOPs) · F``
with ``F`` the time of one full forward: an analysis that re-executes exactly the cones, at
full-model speed, takes that long.
"""
from __future__ import annotations

import numpy as np

from qir.graph import QIR
from qir.records import OpRecord
from qir.runtimes.engine.plan import Plan

__all__ = ["elements", "op_flops", "step_flops", "cone_fraction"]


def elements(ir: QIR, value: str) -> int:
    """Elements of ``value`` (0 when its shape is not static)."""
    shape = ir.value(value).shape if value and ir.has_value(value) else None
    if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
        return 0
    return int(np.prod(shape, dtype=np.int64))


def op_flops(ir: QIR, op: OpRecord) -> int:
    """FLOPs of one general node (see the module docstring)."""
    out = elements(ir, op.outputs[0]) if op.outputs else 0
    w_shape = ir.value(op.inputs[1]).shape if len(op.inputs) > 1 and op.inputs[1] else None
    known = w_shape is not None and all(isinstance(d, int) for d in w_shape)
    if op.op_type == "Conv" and known:
        return 2 * out * int(np.prod(w_shape[1:], dtype=np.int64))
    if op.op_type == "ConvTranspose" and known:
        return 2 * elements(ir, op.inputs[0]) * int(np.prod(w_shape[1:], dtype=np.int64))
    if op.op_type in ("MatMul", "Gemm"):
        a_shape = ir.value(op.inputs[0]).shape
        if a_shape and isinstance(a_shape[-1], int) and isinstance(a_shape[0], int):
            k = a_shape[0] if op.op_type == "Gemm" and op.attrs.get("transA") else a_shape[-1]
            return 2 * out * int(k)
    return sum(elements(ir, o) for o in op.outputs if o)


def step_flops(ir: QIR, plan: Plan) -> np.ndarray:
    """FLOPs of each step of ``plan`` (calibration steps count 0)."""
    return np.array([sum(op_flops(ir, r) for r in s.records if isinstance(r, OpRecord)) for s in plan.steps],
                    dtype=np.float64)


def cone_fraction(plan: Plan, flops: np.ndarray, changed: list[str]) -> float:
    """Share of all FLOPs downstream of the calibration nodes ``changed``."""
    total = float(flops.sum()) or 1.0
    return float(flops[plan.cone(plan.start_steps(changed))].sum()) / total
