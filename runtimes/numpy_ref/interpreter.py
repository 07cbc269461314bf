"""The numpy reference interpreter: a value-environment loop over the IR's topological order.

Each running node reads its inputs from the environment, calls its kernel (general nodes: the
kernel table in :mod:`.registry`; calibration nodes: :func:`qir.runtimes.numerics.apply_calibration`
at level ``fakequant``, pass-through at level ``float`` — except that an imported node's
``implied_clip``, an activation its quantizer replaced, is still applied) and writes its
outputs back. A value is
dropped from the environment after its last reader unless it is a graph output or captured, so
peak memory is the live set, not the whole model. A failing kernel raises an ExecutionError
naming the node and the shapes it was given.

The execution plan (kernel lookups, attribute dictionaries, last-use positions) is built once
per IR version and capture set and cached on the IR. Like onnxruntime, the plan folds a
BatchNormalization into the Conv before it when nothing can observe the value between them
(``fold_batchnorm=False`` turns this off); every other node runs as written.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from qir.errors import ExecutionError, InputError, QirError, UnsupportedOpError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import LEVELS, check_capture, check_feeds
from qir.runtimes.numerics import ROUNDING, apply_calibration, apply_implied_clip, fold_batchnorm
from qir.runtimes.numpy_ref.registry import lookup
from qir.runtimes.support import check_supported

__all__ = ["NumpyRuntime", "missing_kernels", "execution_plan", "assign_frees", "run_op", "execute_step", "ExecutionPlan",
           "PlanStep", "execution_error"]

logger = logging.getLogger(__name__)


@dataclass
class PlanStep:
    rec: OpRecord | CalibRecord
    fn: Callable[..., Any] | None  # None for calibration nodes
    kwargs: dict[str, Any]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    free: tuple[str, ...] = ()  # values whose last reader is this step (dropped after it)


@dataclass
class ExecutionPlan:
    steps: list[PlanStep]
    weights: dict[str, np.ndarray]  # the initial environment: weight arrays by name


def missing_kernels(ir: QIR) -> dict[str, list[str]]:
    """``{op_type: [node names]}`` of general nodes with no numpy kernel."""
    missing: dict[str, list[str]] = {}
    for rec in ir.ops():
        if lookup(rec.op_type, rec.domain) is None:
            missing.setdefault(rec.op_type if not rec.domain else f"{rec.domain}::{rec.op_type}",
                               []).append(rec.name)
    return missing


def _foldable_batchnorms(ir: QIR, keep: frozenset[str]) -> dict[str, OpRecord]:
    """``{conv name: the BatchNormalization folded into it}``.

    A pair folds when the Conv's output is read only by the BatchNormalization, is not a graph
    output, and the Conv weights and BN parameters are all constants. What is captured does
    not matter (a captured Conv output is computed by an extra unfolded Conv), so every value
    downstream is bit-identical whatever a caller captures.
    """
    def constant(*names: str) -> bool:
        return all(not n or ir.value(n).kind is NodeKind.WEIGHT for n in names)

    pairs: dict[str, OpRecord] = {}
    for bn in ir.ops("BatchNormalization"):
        x = bn.inputs[0]
        conv = ir.producer(x)
        if (isinstance(conv, OpRecord) and conv.op_type == "Conv" and not conv.domain
                and x not in ir.outputs and len(ir.uses(x)) == 1 and not bn.attrs.get("training_mode")
                and all(not o or not ir.uses(o) and o not in keep for o in bn.outputs[1:])
                and constant(*conv.inputs[1:], *bn.inputs[1:])):
            pairs[conv.name] = bn
    return pairs


def _fold_batchnorm(ir: QIR, conv: OpRecord, bn: OpRecord) -> tuple[np.ndarray, np.ndarray]:
    bias = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
    return fold_batchnorm(ir.weight_array(conv.inputs[1]), None if bias is None else ir.weight_array(bias),
                          *(ir.weight_array(n) for n in bn.inputs[1:5]),
                          epsilon=bn.attrs.get("epsilon", 1e-5), axis=0)


def _kernel_kwargs(ir: QIR, rec: OpRecord, context: tuple[str, ...]) -> dict[str, Any]:
    kwargs = dict(rec.attrs)
    if "_opset" in context:
        kwargs["_opset"] = ir.opset_imports.get(rec.domain or "", ir.opset)
    if "_num_outputs" in context:
        kwargs["_num_outputs"] = len(rec.outputs)
    return kwargs


def run_op(ir: QIR, rec: OpRecord, args: list[np.ndarray | None]) -> tuple[np.ndarray, ...]:
    """One general node of ``ir`` on the given input arrays (``None`` for an omitted optional
    input), as the interpreter runs it; returns its outputs in order."""
    spec = lookup(rec.op_type, rec.domain)
    if spec is None:
        raise UnsupportedOpError(f"the numpy runtime has no kernel for {rec.op_type} (node {rec.name!r})")
    try:
        result = spec.fn(*args, **_kernel_kwargs(ir, rec, spec.context))
    except QirError:
        raise
    except Exception as exc:
        raise execution_error(rec, args, exc) from exc
    return tuple(np.asarray(r) for r in result) if type(result) is tuple else (np.asarray(result),)


def execution_plan(ir: QIR, keep: frozenset[str], fold_batchnorm: bool) -> ExecutionPlan:
    """Kernel calls in topological order (BatchNorms folded where unobservable, ``keep`` values
    observable), with the step after which each value is dead. What the runtime refuses
    (:func:`qir.runtimes.support.check_supported`, ops without a kernel) is refused first."""
    check_supported(ir, Runtime.NUMPY)
    missing = missing_kernels(ir)
    if missing:
        desc = "; ".join(f"{op} (nodes {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                         for op, names in sorted(missing.items()))
        raise UnsupportedOpError(f"the numpy runtime has no kernel for {desc}; "
                                 "run this model with the ort runtime (--runtime ort)")
    weights = {w.name: w.data for w in ir.weights()}
    folds = _foldable_batchnorms(ir, keep) if fold_batchnorm else {}
    folded_away = {bn.name for bn in folds.values()}
    steps: list[PlanStep] = []
    for rec in ir.runnables():
        if isinstance(rec, CalibRecord):
            steps.append(PlanStep(rec, None, {}, rec.inputs, rec.outputs))
            continue
        if rec.name in folded_away:
            continue
        spec = lookup(rec.op_type, rec.domain)
        kwargs = _kernel_kwargs(ir, rec, spec.context)
        inputs, outputs = rec.inputs, rec.outputs
        if rec.name in folds:
            bn = folds[rec.name]
            if rec.outputs[0] in keep:  # the captured pre-BatchNorm value, computed as written
                steps.append(PlanStep(rec, spec.fn, dict(kwargs), tuple(rec.inputs), tuple(rec.outputs)))
            w_name, b_name = f"{rec.name}.bn_folded.weight", f"{rec.name}.bn_folded.bias"
            weights[w_name], weights[b_name] = _fold_batchnorm(ir, rec, bn)
            inputs, outputs = (rec.inputs[0], w_name, b_name), bn.outputs[:1]
        steps.append(PlanStep(rec, spec.fn, kwargs, tuple(inputs), tuple(outputs)))
    assign_frees(steps, weights, keep)
    return ExecutionPlan(steps, weights)


def assign_frees(steps: list[PlanStep], weights: Mapping[str, np.ndarray], keep: frozenset[str]) -> None:
    """Set each step's ``free``: the values whose last reader it is (outputs nobody reads are
    dropped at once), except weights and ``keep``."""
    last_use: dict[str, int] = {}
    for i, step in enumerate(steps):
        for v in step.inputs:
            if v and v not in weights:
                last_use[v] = i
    frees: dict[int, list[str]] = {}
    for v, i in last_use.items():
        if v not in keep:
            frees.setdefault(i, []).append(v)
    for i, step in enumerate(steps):
        dead = [o for o in step.outputs if o and o not in last_use and o not in keep]
        step.free = tuple(frees.get(i, ())) + tuple(dead)


class NumpyRuntime:
    """The reference interpreter (see the module docstring).

    Args:
        level: ``fakequant`` (default) applies calibration nodes; ``float`` ignores them. (The
            ``integer`` level is :class:`qir.runtimes.integer.IntegerRuntime`, which
            ``get_runtime("numpy", level="integer")`` returns.)
        rounding: fake-quant rounding, ``half_to_even`` (default), ``half_up`` or ``half_away``.
        fold_batchnorm: execute Conv→BatchNormalization pairs whose intermediate value is not
            observed as one Conv with folded weights, as onnxruntime does (default); False
            runs every op as written.
    """

    name = Runtime.NUMPY

    def __init__(self, level: str = Level.FAKEQUANT, rounding: str = "half_to_even",
                 fold_batchnorm: bool = True) -> None:
        if level not in LEVELS:
            raise InputError(f"unknown level {level!r}; the numpy runtime runs {list(LEVELS)}")
        if level == Level.INTEGER:
            raise InputError("the integer level is qir.runtimes.integer.IntegerRuntime "
                             "(get_runtime('numpy', level='integer', march=...))")
        if rounding not in ROUNDING:
            raise InputError(f"unknown rounding {rounding!r}; choose {sorted(ROUNDING)}")
        self.level = level
        self.rounding = rounding
        self.fold_batchnorm = fold_batchnorm

    def _plan(self, ir: QIR, keep: frozenset[str]) -> ExecutionPlan:
        return ir.cached(("numpy-plan", keep, self.fold_batchnorm), lambda: execution_plan(ir, keep, self.fold_batchnorm))

    def prepare(self, ir: QIR) -> None:
        """Build (and cache) the plan :meth:`run` without captures uses: what the runtime
        refuses (:func:`execution_plan`) is refused before anything runs."""
        self._plan(ir, frozenset(ir.outputs))

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *,
            capture: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """Execute ``ir``; returns graph outputs and captured values by name."""
        feeds = check_feeds(ir, feeds)
        captured = check_capture(ir, capture)
        keep = frozenset(ir.outputs) | frozenset(captured)
        plan = self._plan(ir, keep)
        env: dict[str, Any] = dict(plan.weights)
        env.update(feeds)
        quantize = self.level == Level.FAKEQUANT
        for step in plan.steps:
            execute_step(step, env, quantize=quantize, rounding=self.rounding)
            for name in step.free:
                del env[name]
        return {name: np.asarray(env[name]) for name in (*ir.outputs, *captured)}


def execute_step(step: PlanStep, env: dict[str, np.ndarray], *, quantize: bool = True, rounding: str = "half_to_even") -> None:
    """One step of an :func:`execution_plan` on ``env`` (value name -> array), its outputs stored
    there: a calibration node fake-quantizes (``quantize``; else only its implied clip), an op
    runs its kernel. The step's dead values are left for the caller to drop."""
    rec = step.rec
    args = [env[v] if v else None for v in step.inputs]
    try:
        if step.fn is None:
            result = apply_calibration(rec, args[0], rounding) if quantize else apply_implied_clip(rec, args[0])
        else:
            result = step.fn(*args, **step.kwargs)
    except QirError:
        raise
    except Exception as exc:
        raise execution_error(rec, args, exc) from exc
    if type(result) is tuple:
        if len(result) < len(step.outputs):
            raise ExecutionError(f"node {rec.name!r} ({rec.op_type}) produced {len(result)} "
                                 f"outputs, the model expects {len(step.outputs)}")
        for name, value in zip(step.outputs, result):
            if name:
                env[name] = value
    else:
        env[step.outputs[0]] = result


def execution_error(rec: OpRecord | CalibRecord, args: list, exc: Exception) -> ExecutionError:
    shapes = ", ".join("None" if a is None else f"{a.dtype}{list(a.shape)}" for a in args)
    op = getattr(rec, "op_type", "calibration")
    return ExecutionError(f"while executing node {rec.name!r} ({op}) on inputs ({shapes}): "
                          f"{type(exc).__name__}: {exc}")
