"""The numpy reference interpreter: a value-environment loop over the IR's topological order.

Each running node reads its inputs from the environment, calls its kernel (general nodes: the
kernel table in :mod:`.registry`; calibration nodes: :func:`qir.runtimes.numerics.apply_calibration`
at level ``fakequant``, pass-through at level ``float``) and writes its outputs back. A value is
dropped from the environment after its last reader unless it is a graph output or captured, so
peak memory is the live set, not the whole model. A failing kernel raises an ExecutionError
naming the node and the shapes it was given.

The execution plan (kernel lookups, attribute dictionaries, last-use positions) is built once
per IR version and capture set and cached on the IR.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from qir.errors import ExecutionError, InputError, QirError, UnsupportedOpError
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import CalibRecord, OpRecord

from ..base import LEVELS, check_capture, check_feeds
from ..numerics import apply_calibration
from .registry import lookup

__all__ = ["NumpyRuntime", "missing_kernels"]

logger = logging.getLogger(__name__)


@dataclass
class _Step:
    rec: OpRecord | CalibRecord
    fn: Callable[..., Any] | None  # None for calibration nodes
    kwargs: dict[str, Any]
    free: tuple[str, ...]  # values whose last reader is this step


def missing_kernels(ir: QIR) -> dict[str, list[str]]:
    """``{op_type: [node names]}`` of general nodes with no numpy kernel."""
    missing: dict[str, list[str]] = {}
    for rec in ir.ops():
        if lookup(rec.op_type, rec.domain) is None:
            missing.setdefault(rec.op_type if not rec.domain else f"{rec.domain}::{rec.op_type}",
                               []).append(rec.name)
    return missing


def _plan(ir: QIR, keep: frozenset[str]) -> list[_Step]:
    missing = missing_kernels(ir)
    if missing:
        desc = "; ".join(f"{op} (nodes {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                         for op, names in sorted(missing.items()))
        raise UnsupportedOpError(f"the numpy runtime has no kernel for {desc}; "
                                 "run this model with the ort runtime (--runtime ort)")
    order = ir.runnables()
    last_use: dict[str, int] = {}
    for i, rec in enumerate(order):
        for v in rec.inputs:
            if v:
                last_use[v] = i
    frees: dict[int, list[str]] = {}
    for v, i in last_use.items():
        if v not in keep and ir.value(v).kind is not NodeKind.WEIGHT:
            frees.setdefault(i, []).append(v)
    steps = []
    for i, rec in enumerate(order):
        if isinstance(rec, CalibRecord):
            steps.append(_Step(rec, None, {}, tuple(frees.get(i, ()))))
            continue
        spec = lookup(rec.op_type, rec.domain)
        kwargs = dict(rec.attrs)
        if "_opset" in spec.context:
            kwargs["_opset"] = ir.opset_imports.get(rec.domain or "", ir.opset)
        if "_num_outputs" in spec.context:
            kwargs["_num_outputs"] = len(rec.outputs)
        # outputs nobody reads are dropped right away (e.g. unused Split branches)
        dead_outputs = [o for o in rec.outputs if o not in last_use and o not in keep]
        steps.append(_Step(rec, spec.fn, kwargs, tuple(frees.get(i, ())) + tuple(dead_outputs)))
    return steps


class NumpyRuntime:
    """The reference interpreter (see the module docstring).

    Args:
        level: ``fakequant`` (default) applies calibration nodes; ``float`` ignores them.
    """

    name = "numpy"

    def __init__(self, level: str = "fakequant") -> None:
        if level not in LEVELS:
            raise InputError(f"unknown level {level!r}; the numpy runtime runs {list(LEVELS)}")
        self.level = level

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *,
            capture: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """Execute ``ir``; returns graph outputs and captured values by name."""
        feeds = check_feeds(ir, feeds)
        captured = check_capture(ir, capture)
        keep = frozenset(ir.outputs) | frozenset(captured)
        steps = ir.cached(("numpy-plan", keep), lambda: _plan(ir, keep))
        env: dict[str, Any] = {w.name: w.data for w in ir.weights()}
        env.update(feeds)
        quantize = self.level == "fakequant"
        for step in steps:
            rec = step.rec
            args = [env[v] if v else None for v in rec.inputs]
            try:
                if step.fn is None:
                    result = apply_calibration(rec, args[0]) if quantize else args[0]
                else:
                    result = step.fn(*args, **step.kwargs)
            except QirError:
                raise
            except Exception as exc:
                shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
                raise ExecutionError(f"while executing node {rec.name!r} "
                                     f"({getattr(rec, 'op_type', 'calibration')}) on inputs "
                                     f"({shapes}): {type(exc).__name__}: {exc}") from exc
            outs = result if isinstance(result, tuple) else (result,)
            if len(outs) < len(rec.outputs):
                raise ExecutionError(f"node {rec.name!r} ({rec.op_type}) produced {len(outs)} "
                                     f"outputs, the model expects {len(rec.outputs)}")
            for name, value in zip(rec.outputs, outs):
                if name:
                    env[name] = value
            for name in step.free:
                env.pop(name, None)
        return {name: np.asarray(env[name]) for name in (*ir.outputs, *captured)}
