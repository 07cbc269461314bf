"""What the latency model prices: the ops a march runs as one (its fused groups), the elements
that cross memory around each group, and each op's precision in a calibrated IR.

**Groups.** The fusion groups ``fuse`` marked (``ir.meta["fusion_groups"]``) when there are any;
else the profile's fusion patterns and composites matched here the way ``fuse`` matches them
(longest first, an op in one group at most), without changing the IR. A Mul or Add by a
per-channel constant that reads a Conv / ConvTranspose / Gemm / MatMul's output straight (no
quantizer between; :mod:`qir.passes.lib.affine`) joins that op's group, as a compiler folds it
into the weights (``fold-bn`` folds it in qir's own models). Every other op is a group of its own.

**Traffic of a group** (element counts; the precision turns them into bytes):

* ``inputs``: activation inputs not produced inside the group (each value once, however many
  members read it), past any calibration node in between;
* ``outputs``: outputs of members read outside the group or that are graph outputs (a value
  passed from one member to the next never reaches memory);
* ``weights``: a GEMM's weight (input 1); ``bias``: its bias (input 2, int32); ``consts``: every
  other constant input, at the op's input precision.

**Precision of an op** (:func:`precisions_of`): its input is the widest mode of the calibration
nodes it reads (an input straight from another op takes that op's output precision, a graph
input that no calibration node quantizes is ``float``); its weight is the mode of the calibration
node on a GEMM's input 1 (``float`` for an unquantized weight, None for an op without one); its
output is the widest mode of the calibration nodes that read its outputs, else its input's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from qir.graph import QIR
from qir.kinds import CalibRole, NodeKind
from qir.passes.lib.affine import joins_linear
from qir.passes.lib.composites import find_composites
from qir.passes.lib.fusion import fusion_groups, match_pattern
from qir.records import CalibRecord, OpRecord
from qir.runtimes.engine.cost import elements, op_flops
from qir.runtimes.march import MarchProfile, OpClass, normalize_dtype, op_class
from qir.runtimes.march.rates import widest

__all__ = ["Group", "Precision", "PrecisionPlan", "fused_units", "build_groups", "precisions_of"]


@dataclass(frozen=True)
class Precision:
    """The precisions an op runs at (profile spellings: int8, int16, fp16, float).

    ``weight`` is None for an op without a weight; ``output`` None means the input's precision.
    """

    input: str
    weight: str | None = None
    output: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "input", normalize_dtype(self.input))
        if self.weight is not None:
            object.__setattr__(self, "weight", normalize_dtype(self.weight))
        object.__setattr__(self, "output", normalize_dtype(self.output) if self.output else self.input)


@dataclass(frozen=True)
class Group:
    """One unit the march runs: its ops (head first), what it computes and the elements it moves."""

    name: str                 # the head op's name
    ops: tuple[str, ...]
    op_type: str              # member types joined with "+": "Conv+Add+Relu"; a composite's kind: "LayerNorm"
    flops: int
    gemm: bool                # the head is a GEMM (it runs on the MAC array)
    inputs: int
    outputs: int
    weights: int
    bias: int
    consts: int
    free: bool                # a lone view op (profile.free_ops): nothing moves


def fused_units(ir: QIR, profile: MarchProfile) -> list[list[OpRecord]]:
    """The ops of ``ir`` in groups, in op order (see the module docstring)."""
    return _units(ir, profile)[0]


def _units(ir: QIR, profile: MarchProfile) -> tuple[list[list[OpRecord]], dict[str, str]]:
    """:func:`fused_units`, and the kind (``LayerNorm``, ``Gelu``) of each composite's head."""
    marked = fusion_groups(ir)
    kinds: dict[str, str] = dict(ir.meta.get("composites") or {}) if marked else {}
    claimed: dict[str, str] = {}
    heads: dict[str, list[OpRecord]] = {}
    if marked:
        for head, members in marked.items():
            heads[head] = [ir.op(m) for m in members]
            claimed.update({m: head for m in members})
    else:
        patterns = sorted((tuple(p) for p in profile.fusions), key=len, reverse=True)
        for op in ir.ops():
            if op.name in claimed:
                continue
            for pattern in patterns:
                members = match_pattern(ir, op, pattern)
                if members and not any(m.name in claimed for m in members):
                    heads[op.name] = members
                    claimed.update({m.name: op.name for m in members})
                    break
        for match in find_composites(ir, profile.composites):
            if not any(m in claimed for m in match.members):
                heads[match.head] = [ir.op(m) for m in match.members]
                claimed.update({m: match.head for m in match.members})
                kinds[match.head] = match.kind
    units: list[list[OpRecord]] = []
    unit_of: dict[str, list[OpRecord]] = {}
    joined: dict[str, str] = {}  # (a per-channel Mul / Add folded into a linear op -> that op)
    for op in ir.ops():
        linear = joins_linear(ir, op, joined) if op.name not in claimed else None
        if linear is not None:
            joined[op.name] = linear
            unit_of[linear].append(op)
            unit_of[op.name] = unit_of[linear]
        elif op.name not in claimed:
            units.append([op])
            unit_of[op.name] = units[-1]
        elif claimed[op.name] == op.name:
            units.append(heads[op.name])
            unit_of.update({m.name: units[-1] for m in units[-1]})
    return units, kinds


def _source(ir: QIR, value: str) -> str:
    """``value`` past the calibration nodes in front of it."""
    producer = ir.producer(value)
    while isinstance(producer, CalibRecord):
        value = producer.input
        producer = ir.producer(value)
    return value


def _leaves(ir: QIR, value: str, members: set[str]) -> bool:
    """Whether ``value`` (or a calibration node's output of it) is a graph output or read by an op
    outside ``members``."""
    if value in ir.outputs:
        return True
    for reader in ir.consumers(value):
        if isinstance(reader, CalibRecord):
            if _leaves(ir, reader.output, members):
                return True
        elif reader.name not in members:
            return True
    return False


def _group(ir: QIR, unit: list[OpRecord], profile: MarchProfile, kind: str | None = None) -> Group:
    names = {op.name for op in unit}
    seen: set[str] = set()
    inputs = outputs = weights = bias = consts = 0
    for op in unit:
        gemm = op_class(op.op_type) is OpClass.GEMM
        for slot, value in enumerate(op.inputs):
            if not value:
                continue
            src = _source(ir, value)
            producer = ir.producer(src)
            if src in seen or (isinstance(producer, OpRecord) and producer.name in names):
                continue
            seen.add(src)
            if ir.value(src).kind is NodeKind.WEIGHT:
                n = elements(ir, src)
                if gemm and slot == 1:
                    weights += n
                elif gemm and slot == 2:
                    bias += n
                else:
                    consts += n
            else:
                inputs += elements(ir, value)
        outputs += sum(elements(ir, o) for o in op.outputs if o and _leaves(ir, o, names))
    head = unit[0]
    return Group(head.name, tuple(op.name for op in unit), kind or "+".join(op.op_type for op in unit),
                 sum(op_flops(ir, op) for op in unit), op_class(head.op_type) is OpClass.GEMM,
                 inputs, outputs, weights, bias, consts,
                 free=len(unit) == 1 and head.op_type in profile.free_ops)


def build_groups(ir: QIR, profile: MarchProfile) -> list[Group]:
    """The :class:`Group` of every unit of :func:`fused_units`."""
    units, kinds = _units(ir, profile)
    return [_group(ir, unit, profile, kinds.get(unit[0].name) if len(unit) > 1 else None) for unit in units]


@dataclass(frozen=True)
class _OpPlan:
    """Where one op's precisions come from: each activation input (a calibration node's name, a
    value another op makes, or None: a float graph input), the calibration node on a GEMM's weight
    (None: none; ``""``: an unquantized weight), and the activation calibration nodes that read
    its outputs."""

    name: str
    acts: tuple[tuple[str, str | None], ...]  # ("cal", name) | ("value", value) | ("float", None)
    weight: str | None
    readers: tuple[str, ...]
    outputs: tuple[str, ...]


class PrecisionPlan:
    """:func:`precisions_of` for many configurations of one IR: the graph is walked once, then
    each configuration (calibration node -> mode) is a pass over the ops with no graph lookups."""

    def __init__(self, ir: QIR) -> None:
        self.own = {c.name: c.mode.value for c in ir.calibrations()}
        self.ops: list[_OpPlan] = []
        for op in ir.ops():
            gemm = op_class(op.op_type) is OpClass.GEMM
            acts: list[tuple[str, str | None]] = []
            weight = None
            for slot, value in enumerate(op.inputs):
                if not value:
                    continue
                producer = ir.producer(value)
                if isinstance(producer, CalibRecord):
                    if producer.role is CalibRole.WEIGHT:
                        weight = producer.name if gemm and slot == 1 else weight
                    else:
                        acts.append(("cal", producer.name))
                elif isinstance(producer, OpRecord):
                    acts.append(("value", value))
                elif ir.value(value).kind is NodeKind.WEIGHT:
                    weight = "" if gemm and slot == 1 else weight
                else:
                    acts.append(("float", None))  # a graph input no calibration node quantizes
            readers = tuple(r.name for o in op.outputs if o for r in ir.consumers(o)
                            if isinstance(r, CalibRecord) and r.role is CalibRole.ACTIVATION)
            self.ops.append(_OpPlan(op.name, tuple(acts), weight, readers, tuple(o for o in op.outputs if o)))
        by_value: dict[str, list[str]] = {}
        for c in ir.calibrations(CalibRole.ACTIVATION):
            by_value.setdefault(c.input, []).append(c.name)
        #: Values read through several calibration nodes (a split: :mod:`qir.split`): their
        #: element count and the nodes.
        self.shared = [(elements(ir, v), tuple(names)) for v, names in by_value.items() if len(names) > 1]

    def requantizes(self, modes: Mapping[str, str] | None = None) -> list[tuple[int, str, str]]:
        """The requantizes a split value costs with the calibration nodes at ``modes``: one
        ``(elements, from, to)`` per narrower mode than the widest of the value's nodes (the NPU
        keeps the value at the widest and converts it for the others)."""
        mode = self.own if not modes else {**self.own, **modes}
        out = []
        for count, names in self.shared:
            got = {mode[n] for n in names}
            wide = widest(sorted(got))
            out.extend((count, wide, m) for m in sorted(got - {wide}))
        return out

    def precisions(self, modes: Mapping[str, str] | None = None) -> dict[str, Precision]:
        """Op name -> :class:`Precision` with the calibration nodes at ``modes`` (the others at
        their own)."""
        mode = self.own if not modes else {**self.own, **modes}
        out_of: dict[str, str] = {}
        result: dict[str, Precision] = {}
        for plan in self.ops:
            acts = [mode[key] if kind == "cal" else (out_of.get(key, "float") if kind == "value" else "float")
                    for kind, key in plan.acts]
            weight = None if plan.weight is None else (mode[plan.weight] if plan.weight else "float")
            precision = widest(acts) if acts else "float"
            output = widest([mode[r] for r in plan.readers]) if plan.readers else precision
            result[plan.name] = p = Precision(precision, weight, output)
            out_of.update({o: p.output for o in plan.outputs})
        return result


def precisions_of(ir: QIR, modes: Mapping[str, str] | None = None) -> dict[str, Precision]:
    """Op name -> the :class:`Precision` it runs at in ``ir`` (see the module docstring), with the
    calibration nodes named in ``modes`` at those modes instead of their own."""
    return PrecisionPlan(ir).precisions(modes)
