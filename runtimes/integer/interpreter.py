"""The integer level of the numpy runtime: what an NPU computes, per a march profile.

It runs the numpy interpreter's execution plan (:func:`qir.runtimes.numpy_ref.interpreter.
execution_plan`) with values that are either float arrays or :class:`QTensor` codes:

* a calibration node in an integer mode quantizes a float value (``quant_round``), passes codes
  with its own parameters through, and rescales codes with other parameters; in ``fp16`` it
  rounds the (dequantized) value to IEEE half; in ``float`` it dequantizes (its implied clip
  kept);
* an op whose inputs are codes runs its integer kernel (:mod:`.kernels`) when the march computes
  it in integer (``profile.integer_ops``). Its output is requantized straight into the
  parameters of the calibration node(s) that read it (the *target*: every reader an integer
  calibration node with the same parameters; a Relu/Clip between is applied on the codes), as a
  fused NPU kernel does. A value read only through data-movement ops (Split, Concat, Slice, ...)
  takes the widest scale it reaches through them, the scale sharing a march's compiler does
  across such ops; with no target the output stays high precision. A constant operand of an
  Add/Sub/Mul (HardSwish's ``x + 3``) is quantized like a calibrated one, per tensor at ``max|c|``;
* any other op runs its float kernel on dequantized inputs (reported once per run: what a real
  NPU hands to the CPU; Softmax-like composites are emulated in float by design). On the ``ort``
  profile the float kernels are onnxruntime's where their rounding differs (:mod:`.ort_float`).

Graph outputs and captured values come back dequantized (float32), so results compare with the
fake-quant and float levels directly. :attr:`IntegerRuntime.last_stats` holds the run's
accumulator overflows and float fallbacks.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

import numpy as np

from qir import once
from qir.calibration import QRANGE
from qir.errors import QirError
from qir.execution import DEFAULT_MARCH, Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import check_capture, check_feeds
from qir.runtimes.integer.arithmetic import Arithmetic, IntegerStats
from qir.runtimes.integer.coded import TABLE_OPS, coded_op
from qir.runtimes.integer.kernels import FLOAT_COMPOSITES, INTEGER_KERNELS, OpCall
from qir.runtimes.integer.ort_float import ORT_FLOAT_KERNELS
from qir.runtimes.integer.qtensor import Coded, QParams, QTensor, dequantize, materialize, params_of
from qir.runtimes.march import MarchProfile, get_profile
from qir.runtimes.march.ort import ORT
from qir.runtimes.numerics import apply_calibration
from qir.runtimes.numpy_ref.interpreter import ExecutionPlan, PlanStep, assign_frees, execution_error, execution_plan

__all__ = ["IntegerPlan", "IntegerRuntime", "requant_targets", "derived_plan"]

REPORTED = "integer level: fallbacks and overflows"  # :mod:`qir.once` topic: logged once per process

#: Ops between a producer and the calibration node it is requantized into that act on codes
#: without arithmetic (clamps, data movement), looked through when finding the target.
#: Data-movement ops a march's compiler shares one scale across (§2.4 "TRANS"): a value read only
#: through them is requantized into the widest of the scales it reaches (:func:`requant_targets`).
_SHARED_SCALE_OPS = ("Concat", "Split", "Slice", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
                     "Identity", "MaxPool", "Gather", "DepthToSpace", "SpaceToDepth")
#: Elementwise ops whose constant operand is quantized like a calibrated one (:func:`_quantized_constants`).
_CONSTANT_OPERAND_OPS = ("Add", "Sub", "Mul")
_LOOK_THROUGH = ("Relu", "Clip", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity")


@dataclass
class IntegerPlan:
    base: ExecutionPlan
    targets: dict[str, QParams]                   # op name -> the parameters its output is requantized into
    params: dict[str, QParams]                    # integer calibration node name -> its parameters
    weights: dict[str, QTensor]                   # weight calibration node name -> its codes
    fused: dict[str, str]                         # GEMM name -> the Add fused into its accumulator
    constants: frozenset[str] = frozenset()       # constant operands of Add/Sub/Mul
    constant_codes: dict = field(default_factory=dict)  # (constant, mode) -> its codes
    unfused: ExecutionPlan | None = None          # the plan before the fusions (None: base)
    own_targets: dict[str, QParams] = field(default_factory=dict)  # targets before the fusions
    fusable: dict[str, str] = field(default_factory=dict)  # GEMM name -> the Add fused when it has a target


def _readers(ir: QIR, value: str, records: Mapping[str, CalibRecord] | None) -> list:
    """The readers of ``value``, calibration nodes as ``records`` has them (a configuration of
    ``ir``'s calibration nodes; None: ``ir``'s own)."""
    readers = ir.consumers(value)
    if records is None:
        return readers
    return [records.get(r.name, r) if isinstance(r, CalibRecord) else r for r in readers]


def _common_params(ir: QIR, value: str, records: Mapping[str, CalibRecord] | None = None) -> QParams | None:
    """The parameters every reader of ``value`` quantizes it to, when all readers are integer
    calibration nodes with the same per-tensor parameters (and ``value`` is not a graph output)."""
    readers = _readers(ir, value, records)
    if not readers or value in ir.outputs or not all(
            isinstance(r, CalibRecord) and r.mode in (CalibMode.INT8, CalibMode.INT16) for r in readers):
        return None
    params = [params_of(r) for r in readers]
    return params[0] if all(p.same_as(params[0]) and p.per_tensor for p in params) else None


def _target(ir: QIR, value: str, records: Mapping[str, CalibRecord] | None = None) -> QParams | None:
    """The target of ``value``: its readers' common parameters, or those found by following a
    chain of single-reader :data:`_LOOK_THROUGH` ops."""
    while True:
        found = _common_params(ir, value, records)
        readers = ir.consumers(value)
        if found is not None or value in ir.outputs or len(readers) != 1:
            return found
        reader = readers[0]
        if not isinstance(reader, OpRecord) or reader.op_type not in _LOOK_THROUGH or len(reader.outputs) != 1:
            return None
        value = reader.outputs[0]


#: Real ranges within this share of the widest count as the same range (int8 and int16 of one
#: threshold differ by their asymmetric end: 255/127 against 65535/32767 of it).
SAME_RANGE = 0.01


def _widest(found: list[QParams]) -> QParams:
    """Of per-tensor parameters, the one whose real range is widest (the others rescale from it
    without clipping what it holds); of ranges the same but for :data:`SAME_RANGE`, the finest
    (a value split into int8 and int16 copies of one range is made at int16 and requantized to
    int8 for the other, as an NPU does: :mod:`qir.split`)."""
    def width(p: QParams) -> float:
        lo, hi = p.qrange
        return (hi - lo) * float(np.asarray(p.scale))
    top = max(width(p) for p in found)
    return min((p for p in found if width(p) >= top * (1 - SAME_RANGE)), key=lambda p: float(np.asarray(p.scale)))


def _shared_target(ir: QIR, value: str, seen: set[str],
                   records: Mapping[str, CalibRecord] | None = None) -> list[QParams] | None:
    """The parameters ``value``'s codes are rescaled into downstream when it reaches integer
    calibration nodes only through data-movement ops (Concat, Split, Slice, Reshape, MaxPool, ...:
    :data:`_SHARED_SCALE_OPS`), as a march's compiler shares one scale across them (the
    data-movement ops that keep their input's scale); None when any path reaches something else (a
    compute op reading it unquantized, a graph output)."""
    if value in seen:
        return []
    seen.add(value)
    readers = _readers(ir, value, records)
    if value in ir.outputs or not readers:
        return None
    found: list[QParams] = []
    for r in readers:
        if isinstance(r, CalibRecord) and r.mode in (CalibMode.INT8, CalibMode.INT16) and params_of(r).per_tensor:
            found.append(params_of(r))
            continue
        if not isinstance(r, OpRecord) or r.op_type not in _SHARED_SCALE_OPS:
            return None
        for out in (o for o in r.outputs if o):
            more = _shared_target(ir, out, seen, records)
            if more is None:
                return None
            found += more
    return found


def requant_targets(ir: QIR, ops: Iterable[OpRecord] | None = None,
                    records: Mapping[str, CalibRecord] | None = None) -> dict[str, QParams]:
    """``{op name: the parameters its output is requantized into}`` (see the module docstring):
    the common parameters of its readers (:func:`_target`), else the widest of those its value
    reaches through data-movement ops (:func:`_shared_target`); over ``ops`` (default: all), with
    the calibration nodes as ``records`` has them (default: ``ir``'s own)."""
    targets: dict[str, QParams] = {}
    for rec in ir.ops() if ops is None else ops:
        if len(rec.outputs) == 1 and rec.outputs[0]:
            found = _target(ir, rec.outputs[0], records)
            if found is None and (rec.op_type == "Concat" or rec.op_type not in _SHARED_SCALE_OPS):
                shared = _shared_target(ir, rec.outputs[0], set(), records)
                found = _widest(shared) if shared else None
            if found is not None:
                targets[rec.name] = found
    return targets


def _fusable_adds(ir: QIR, profile: MarchProfile, keep: frozenset[str]) -> dict[str, str]:
    """``{GEMM name: Add name}`` where the march fuses the Add into the GEMM's accumulator (a
    ``(GEMM, Add, ...)`` pattern in ``profile.fusions``) once the Add has a target: the GEMM output
    is read by that Add only and nothing observes it (the graph's structure alone decides this)."""
    heads = {p[0] for p in profile.fusions if len(p) > 1 and p[1] == "Add"}
    fused = {}
    for rec in ir.ops():
        if rec.op_type not in heads:
            continue
        out = rec.outputs[0] if rec.outputs else ""
        readers = ir.consumers(out) if out else []
        if len(readers) == 1 and out not in keep and isinstance(readers[0], OpRecord) \
                and readers[0].op_type == "Add" and readers[0].inputs.count(out) == 1:
            fused[rec.name] = readers[0].name
    return fused


def _fuse_steps(base: ExecutionPlan, fused: dict[str, str], keep: frozenset[str]) -> ExecutionPlan:
    """The plan with each fused GEMM moved to its Add's place, reading the Add's other operand as
    a fourth input (bias slot padded) and writing the Add's output; the Add step removed."""
    by_name = {step.rec.name: step for step in base.steps}
    adds = {add: gemm for gemm, add in fused.items()}
    steps: list[PlanStep] = []
    for step in base.steps:
        name = step.rec.name
        if name in fused:
            continue
        if name in adds:
            g = by_name[adds[name]]
            other = next(v for v in step.inputs if v != g.outputs[0])
            inputs = tuple(g.inputs) + ("",) * (3 - len(g.inputs)) + (other,)
            steps.append(PlanStep(g.rec, g.fn, g.kwargs, inputs, tuple(step.outputs)))
            continue
        steps.append(PlanStep(step.rec, step.fn, step.kwargs, step.inputs, step.outputs))
    assign_frees(steps, base.weights, keep)
    return ExecutionPlan(steps, base.weights)


def _integer_plan(ir: QIR, keep: frozenset[str], arith: Arithmetic, reuse: IntegerPlan | None = None) -> IntegerPlan:
    """The integer plan of ``ir``; ``reuse``: the plan of a configuration of the same graph (a
    traced reference), from which the parts the calibration changes leave alone are taken."""
    if reuse is not None:
        return derived_plan(ir, {c.name: c for c in ir.calibrations()}, keep, arith, reuse)
    base = execution_plan(ir, keep, fold_batchnorm=True)
    params = {c.name: params_of(c) for c in ir.calibrations() if c.mode in (CalibMode.INT8, CalibMode.INT16)}
    weights = {c.name: replace(arith.quantize(ir.weight_array(c.input), params[c.name]), weight=True)
               for c in ir.calibrations(CalibRole.WEIGHT) if c.name in params and ir.value(c.input).data is not None}
    targets = requant_targets(ir)
    constants = frozenset(v for rec in ir.ops() if rec.op_type in _CONSTANT_OPERAND_OPS for v in rec.inputs
                          if v and ir.value(v).data is not None and np.dtype(ir.value(v).dtype or "float32").kind == "f")
    return _fused_plan(keep, base, targets, params, weights, constants, _fusable_adds(ir, arith.profile, keep))


def _fused_plan(keep, base: ExecutionPlan, targets: dict, params: dict, weights: dict, constants: frozenset[str],
                fusable: dict[str, str]) -> IntegerPlan:
    own = dict(targets)
    fused = {gemm: add for gemm, add in fusable.items() if add in targets}
    for gemm, add in fused.items():
        targets[gemm] = targets[add]
    return IntegerPlan(_fuse_steps(base, fused, keep) if fused else base, targets, params, weights, fused,
                       constants, unfused=base, own_targets=own, fusable=fusable)


def _calibration_key(rec: CalibRecord) -> tuple:
    arrays = (rec.scale, rec.zero_point, rec.threshold)
    return (rec.mode, rec.axis, rec.implied_clip, tuple(None if a is None else np.asarray(a).tobytes() for a in arrays))


def derived_plan(ir: QIR, records: Mapping[str, CalibRecord], keep: frozenset[str], arith: Arithmetic,
                 ref: IntegerPlan) -> IntegerPlan:
    """The plan of a configuration of ``ref``'s graph ``ir`` whose calibration nodes are
    ``records`` (``{name: record}``, every calibration node; the IR itself is not read for them):
    ``ref``'s steps with those records, parameters and weight codes recomputed for the changed
    calibration nodes only, requantization targets for the ops whose value reaches them (through
    the ops :func:`requant_targets` looks through), the fusions decided again."""
    old = {step.rec.name: step.rec for step in ref.unfused.steps if isinstance(step.rec, CalibRecord)}
    changed = [rec for n, rec in records.items()
               if n not in old or (old[n] is not rec and _calibration_key(old[n]) != _calibration_key(rec))]
    params, weights = dict(ref.params), dict(ref.weights)
    for c in changed:
        params.pop(c.name, None)
        weights.pop(c.name, None)
        if c.mode in (CalibMode.INT8, CalibMode.INT16):
            params[c.name] = params_of(c)
            if c.role is CalibRole.WEIGHT and ir.value(c.input).data is not None:
                weights[c.name] = replace(arith.quantize(ir.weight_array(c.input), params[c.name]), weight=True)
    affected, todo = {}, [c.input for c in changed]
    while todo:
        rec = ir.producer(todo.pop())
        if isinstance(rec, OpRecord) and rec.name not in affected:
            affected[rec.name] = rec
            if rec.op_type in _LOOK_THROUGH or rec.op_type in _SHARED_SCALE_OPS:
                todo.extend(v for v in rec.inputs if v)
    targets = {n: t for n, t in ref.own_targets.items() if n not in affected}
    targets.update(requant_targets(ir, affected.values(), records))
    steps = [PlanStep(records[step.rec.name], step.fn, step.kwargs, step.inputs, step.outputs, step.free)
             if isinstance(step.rec, CalibRecord) and records[step.rec.name] is not step.rec else step
             for step in ref.unfused.steps]
    return _fused_plan(keep, ExecutionPlan(steps, ref.unfused.weights), targets, params, weights, ref.constants,
                       ref.fusable)


def _quantized_constants(rec: OpRecord, args: list, plan: IntegerPlan, arith: Arithmetic) -> list:
    """``args`` with each constant operand of an Add/Sub/Mul whose other operand is codes
    quantized per tensor in that operand's dtype, symmetric with threshold ``max|c|`` (what a
    max calibration gives it; a scalar is then exact: its code is ``±qmax``)."""
    mode = next(a.params.mode for a in args if isinstance(a, QTensor))
    out = list(args)
    for k, (value, a) in enumerate(zip(rec.inputs, args)):
        if value not in plan.constants or isinstance(a, QTensor):
            continue
        key = (value, mode)
        if key not in plan.constant_codes:
            c = np.asarray(a, np.float32)
            peak = float(np.abs(c).max()) if c.size else 0.0
            scale = np.float32(peak / QRANGE[mode][1] if peak > 0 else 1.0)
            plan.constant_codes[key] = arith.quantize(c, QParams(mode, np.asarray(scale), np.zeros((), np.int64)))
        out[k] = plan.constant_codes[key]
    return out


class IntegerRuntime:
    """The integer level (see the module docstring).

    Args:
        march: a profile name or :class:`MarchProfile` whose arithmetic to emulate.
        float_ops: names of ops to run in float on dequantized inputs whatever the march computes
            in integer (as ``DequantizeLinear -> op -> QuantizeLinear``): where a runtime's graph
            optimizer left a group unfused (:func:`.against_ort.ort_float_ops` reads them from
            onnxruntime's optimized graph). Not reported as fallbacks.
    """

    name = Runtime.NUMPY
    level = Level.INTEGER

    def __init__(self, march: str | MarchProfile = DEFAULT_MARCH, *, float_ops: Iterable[str] = ()) -> None:
        self.profile = get_profile(march)
        self.float_ops = frozenset(float_ops)
        self.last_stats: IntegerStats | None = None

    @staticmethod
    def warn_once(arith: Arithmetic) -> None:
        """Log the run's fallbacks, once per distinct set per process, and its overflows when a
        node overflows that no run reported before (runs of one model on many samples overflow in
        about the same nodes, each sample a few of its own: one warning, not one per sample)."""
        stats, profile = arith.stats, arith.profile
        fallback = (profile.name, tuple((op, tuple(n)) for op, n in sorted(stats.float_fallback.items())))
        overflows = {(profile.name, profile.acc_bits, profile.acc_overflow, n) for n in stats.overflows}
        reported = once.said(REPORTED)
        new_fallback, new_overflow = fallback not in reported, not overflows <= reported
        reported.update({fallback} | overflows)
        if new_fallback or new_overflow:
            arith.report(overflows=new_overflow, fallbacks=new_fallback)

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *, capture: Iterable[str] = (),
            forced: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Execute ``ir`` at the integer level; returns outputs and captured values (float32).

        ``forced``: ``{integer calibration node name: float value}`` used instead of what the run
        computed there (quantized into the node's parameters). Forcing every node to the values of
        a fake-quant run makes each op compute from exactly the fake-quant inputs, so what then
        differs at a node is the deviation its own segment introduces. A captured forced node
        returns what the run computed there, before forcing."""
        feeds = check_feeds(ir, feeds)
        captured = check_capture(ir, capture)
        forced = dict(forced or {})
        for name in forced:
            if ir.calibration(name).mode not in (CalibMode.INT8, CalibMode.INT16):
                raise QirError(f"forced value for {name!r}: only integer calibration nodes can be forced")
        keep = frozenset(ir.outputs) | frozenset(captured)
        arith = Arithmetic(self.profile)
        plan = self.plan(ir, keep, arith)
        computed: dict[str, Any] = {}  # forced nodes' own results
        env: dict[str, Any] = dict(plan.base.weights)
        env.update(feeds)
        for step in plan.base.steps:
            args = [env[v] if v else None for v in step.inputs]
            if step.fn is None and step.rec.name in forced:
                if step.rec.output in keep:
                    computed[step.rec.output] = self.step(step, args, plan, arith)[0]
                args = [forced[step.rec.name]]
            for name, value in zip(step.outputs, self.step(step, args, plan, arith)):
                if name:
                    env[name] = value
            for name in step.free:
                del env[name]
        self.finish(arith)
        env.update(computed)
        return {name: np.asarray(dequantize(env[name])) for name in (*ir.outputs, *captured)}

    def plan(self, ir: QIR, keep: frozenset[str], arith: Arithmetic, reuse: IntegerPlan | None = None) -> IntegerPlan:
        """The integer plan of ``ir`` keeping ``keep`` (cached on the IR; ``reuse``: a plan of the
        same graph whose quantized weights serve where their parameters are the same)."""
        return ir.cached(("integer-plan", keep, self.profile), lambda: _integer_plan(ir, keep, arith, reuse))

    def step(self, step: PlanStep, args: list, plan: IntegerPlan, arith: Arithmetic) -> tuple:
        """The outputs of one step of ``plan`` on ``args`` (an error names the node)."""
        rec = step.rec
        try:
            if step.fn is None:
                result = self._calibration(rec, args[0], plan, arith)
            else:
                result = self._op(rec, step.fn, step.kwargs, args, plan, arith)
        except QirError:
            raise
        except Exception as exc:
            raise execution_error(rec, [dequantize(a) for a in args], exc) from exc
        return result if type(result) is tuple else (result,)

    def finish(self, arith: Arithmetic) -> None:
        """Record and report a run's statistics."""
        self.last_stats = arith.stats
        self.warn_once(arith)

    @staticmethod
    def _calibration(rec: CalibRecord, x, plan: IntegerPlan, arith: Arithmetic):
        if rec.name in plan.weights:
            return plan.weights[rec.name]
        x = materialize(x)
        params = plan.params.get(rec.name)
        if params is not None:
            return arith.rescale(x, params) if isinstance(x, QTensor) else arith.quantize(x, params)
        return apply_calibration(rec, dequantize(x))  # fp16 round trip / float (implied clip kept)

    def _op(self, rec: OpRecord, fn, kwargs: dict, args: list, plan: IntegerPlan, arith: Arithmetic):
        if rec.name in self.float_ops:
            args = [dequantize(a) for a in args]
        else:
            coded = any(type(a) is Coded for a in args)  # (a float tensor kept per code: :mod:`.coded`)
            quantized = any(isinstance(a, QTensor) for a in args)
            if quantized:
                if rec.op_type in _CONSTANT_OPERAND_OPS:
                    args = _quantized_constants(rec, args, plan, arith)
                kernel = INTEGER_KERNELS.get(rec.op_type)
                if kernel is not None and self.profile.computes_in_integer(rec.op_type):
                    # (the kernels of TABLE_OPS decline a Coded input as they decline any float one; others see its tensor)
                    given = args if not coded or rec.op_type in TABLE_OPS else [materialize(a) for a in args]
                    result = kernel(OpCall(rec, given, kwargs, fn, plan.targets.get(rec.name), arith))
                    if result is not None:
                        return result
                arith.stats.fell_back(rec.op_type, rec.name,
                                      composite=rec.op_type in FLOAT_COMPOSITES or "composite" in rec.meta)
            if quantized or coded:  # (in float: once per code where it can, else on the tensors)
                result = self._per_code(rec, fn, kwargs, args, plan)
                if result is not None:
                    return result
                args = [dequantize(a) for a in args]
        if rec.name in plan.fused:  # a GEMM with its Add fused, in float: the GEMM, then the Add
            return fn(*args[:3], **kwargs) + args[3]
        if self.profile.name == ORT.name and rec.op_type in ORT_FLOAT_KERNELS:  # onnxruntime's own float arithmetic
            result = ORT_FLOAT_KERNELS[rec.op_type](*args, **kwargs)
            if result is not None:
                return result
        return fn(*args, **kwargs)

    def _per_code(self, rec: OpRecord, fn, kwargs: dict, args: list, plan: IntegerPlan):
        """The float op of ``rec`` once per code of its quantized (or Coded) input
        (:func:`.coded.coded_op`), where :meth:`_op` would compute it in float on tensors and it
        is elementwise; None elsewhere. A constant operand that was quantized beside codes (an
        Add/Sub/Mul constant) counts as its dequantized value, as the tensor path takes it."""
        if rec.op_type not in TABLE_OPS or rec.name in plan.fused \
                or (self.profile.name == ORT.name and rec.op_type in ORT_FLOAT_KERNELS):
            return None
        args = [dequantize(a) if isinstance(a, QTensor) and v in plan.constants else a for v, a in zip(rec.inputs, args)]
        return coded_op(fn, args, kwargs)
