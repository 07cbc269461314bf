"""Composite ops an exporter spells out op by op, found so a march can run each as one unit.

ONNX before opset 17 has no LayerNormalization, and exporters write GELU with ``Erf``; PyTorch's
exporter gives, per LayerNorm and per GELU, a small graph:

* **LayerNorm** (over the last axis)::

      m = ReduceMean(x); d = Sub(x, m); v = ReduceMean(Pow(d, 2)); s = Sqrt(Add(v, eps))
      y = Div(d, s)  [then Mul(y, gamma)]  [then Add(., beta)]

* **GELU** (erf form)::

      y = Mul(Mul(x, Add(Erf(Div(x, sqrt 2)), 1)), 0.5)   (the two Muls in either order)

* **HardSwish** (Paddle's and older PyTorch exporters' form, or with ONNX's HardSigmoid)::

      y = Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6)   (or Mul by 1/6)
      y = Mul(x, HardSigmoid(x))

* **SiLU** (swish; YOLOv8's activation)::

      y = Mul(x, Sigmoid(x))

An NPU compiler maps each to one kernel: a LayerNorm built from int16 lookup tables and integer
arithmetic (``horizon-semantics.md`` §2.4: "Softmax/Div/LayerNorm ... are composed of int16 LUTs
and integer ops"; the plugin's default ``GEMMToLayerNormInt16Template``), a GELU, HardSwish or SiLU
as one lookup table (each a function of one input; OpenVINO's HSwishFusion and onnxruntime's QNN
EP fuse the HardSwish forms the same way): the values between its ops never reach memory at int8.
Rules:

1. A match starts at the op that reads the composite's input and ends at the op that writes its
   output; every value between two members is read only by members (through at most one
   calibration node) and is not a graph output, else there is no match.
2. Constants (eps, the exponent 2, sqrt 2, 1, 0.5, gamma, beta) are weights, read directly or
   through a weight calibration node; their values are not checked beyond their being constant
   (an edited eps or a smoothed gamma is still a LayerNorm).
3. A GELU, HardSwish or SiLU takes in the Muls and Adds by a scalar constant that follow it: a
   function of one input followed by a scalar affine is still one, and one table.
4. Members are listed in topological order, the output op last (what
   :func:`qir.passes.lib.fusion.unit_of` expects of a fusion group).
"""
from __future__ import annotations

from dataclasses import dataclass

from qir.graph import QIR
from qir.kinds import CalibRole
from qir.passes.lib.affine import constant_of
from qir.passes.lib.fusion import META_KEY
from qir.records import CalibRecord, OpRecord
from qir.runtimes.march.profile import COMPOSITE_KINDS

__all__ = ["Composite", "find_composites"]


@dataclass(frozen=True)
class Composite:
    """One match: ``kind`` (one of ``COMPOSITE_KINDS``) and its member ops, output op last."""

    kind: str
    members: tuple[str, ...]

    @property
    def head(self) -> str:
        return self.members[0]


def _source(ir: QIR, value: str) -> str:
    """``value`` before an activation calibration node, if one writes it."""
    producer = ir.producer(value)
    if isinstance(producer, CalibRecord) and producer.role is CalibRole.ACTIVATION:
        return producer.input
    return value


def _constant(ir: QIR, value: str) -> bool:
    """``value`` is a constant, read directly or through a weight calibration node (rule 2)."""
    return constant_of(ir, value) is not None


def _made_by(ir: QIR, value: str, op_type: str) -> OpRecord | None:
    producer = ir.producer(_source(ir, value))
    if isinstance(producer, OpRecord) and producer.op_type == op_type and not producer.domain \
            and META_KEY not in producer.meta and len(producer.outputs) == 1:
        return producer
    return None


def _readers(ir: QIR, op: OpRecord) -> list[OpRecord | CalibRecord]:
    """The nodes reading ``op``'s output, past one activation calibration node."""
    value = op.outputs[0]
    readers = ir.consumers(value)
    if len(readers) == 1 and isinstance(readers[0], CalibRecord) and readers[0].role is CalibRole.ACTIVATION:
        return ir.consumers(readers[0].output)
    return readers


def _other(ir: QIR, op: OpRecord, value_source: str) -> str | None:
    """The input of two-input ``op`` that is not (a calibrated copy of) ``value_source``."""
    if len(op.inputs) != 2:
        return None
    a, b = (_source(ir, v) for v in op.inputs)
    if a == value_source:
        return op.inputs[1]
    if b == value_source:
        return op.inputs[0]
    return None


def _single_reader(ir: QIR, op: OpRecord, op_type: str) -> OpRecord | None:
    readers = _readers(ir, op)
    if len(readers) == 1 and isinstance(readers[0], OpRecord) and readers[0].op_type == op_type \
            and META_KEY not in readers[0].meta and not readers[0].domain and len(readers[0].outputs) == 1:
        return readers[0]
    return None


def _closed(ir: QIR, members: list[OpRecord]) -> bool:
    """Rule 1: every member but the last writes a value that only members read."""
    names = {m.name for m in members}
    for m in members[:-1]:
        value = m.outputs[0]
        if value in ir.outputs or any(r.name not in names for r in _readers(ir, m)):
            return False
        readers = ir.consumers(value)
        if len(readers) == 1 and isinstance(readers[0], CalibRecord) and readers[0].output in ir.outputs:
            return False
    return True


def _last_axis_mean(ir: QIR, op: OpRecord | None) -> bool:
    """``op`` is a ReduceMean over the last axis (``-1``, or ``rank - 1`` where the rank is known)
    that keeps its dimensions."""
    if op is None or len(op.inputs) != 1:  # (axes as an input: opset 18; not matched)
        return False
    axes, shape = op.attrs.get("axes"), ir.value(op.inputs[0]).shape
    last = [-1] + ([len(shape) - 1] if shape else [])
    return axes is not None and len(axes) == 1 and int(axes[0]) in last and op.attrs.get("keepdims", 1) == 1


def _layer_norm(ir: QIR, sub: OpRecord) -> list[OpRecord] | None:
    """The LayerNorm whose ``Sub(x, ReduceMean(x))`` is ``sub``, or None."""
    if len(sub.inputs) != 2:
        return None
    x = _source(ir, sub.inputs[0])
    mean = _made_by(ir, sub.inputs[1], "ReduceMean")
    if not _last_axis_mean(ir, mean) or _source(ir, mean.inputs[0]) != x:
        return None
    centred = _readers(ir, sub)
    readers = {r.op_type: r for r in centred if isinstance(r, OpRecord)}
    if len(centred) != 2 or set(readers) != {"Pow", "Div"}:
        return None
    pow_, div = readers["Pow"], readers["Div"]
    if _source(ir, pow_.inputs[0]) != sub.outputs[0] or not _constant(ir, pow_.inputs[1]):
        return None
    var = _single_reader(ir, pow_, "ReduceMean")
    if not _last_axis_mean(ir, var):
        return None
    add = _single_reader(ir, var, "Add")
    if add is None or not _constant(ir, _other(ir, add, var.outputs[0]) or ""):
        return None
    sqrt = _single_reader(ir, add, "Sqrt")
    if sqrt is None or len(div.inputs) != 2 or _source(ir, div.inputs[0]) != sub.outputs[0] \
            or _source(ir, div.inputs[1]) != sqrt.outputs[0]:
        return None
    members = [mean, sub, pow_, var, add, sqrt, div]
    for op_type in ("Mul", "Add"):  # the affine part, where it follows
        nxt = _single_reader(ir, members[-1], op_type)
        if nxt is None or not _constant(ir, _other(ir, nxt, members[-1].outputs[0]) or ""):
            break
        members.append(nxt)
    return members if _closed(ir, members) else None


def _gelu(ir: QIR, div: OpRecord) -> list[OpRecord] | None:
    """The erf-form GELU whose ``Div(x, sqrt 2)`` is ``div``, or None."""
    if len(div.inputs) != 2 or not _constant(ir, div.inputs[1]):
        return None
    x = _source(ir, div.inputs[0])
    erf = _single_reader(ir, div, "Erf")
    add = erf and _single_reader(ir, erf, "Add")
    if add is None or not _constant(ir, _other(ir, add, erf.outputs[0]) or ""):
        return None
    first = _single_reader(ir, add, "Mul")
    if first is None:
        return None
    other = _other(ir, first, add.outputs[0])
    if other is None:
        return None
    second = _single_reader(ir, first, "Mul")
    if second is None:
        return None
    # x * (1 + erf), then * 0.5 (the form ``(x * 0.5) * (1 + erf)`` is left unmatched)
    if _source(ir, other) != x or not _constant(ir, _other(ir, second, first.outputs[0]) or ""):
        return None
    members = _scalar_tail(ir, [div, erf, add, first, second])
    return members if _closed(ir, members) else None


def _scalar_tail(ir: QIR, members: list[OpRecord]) -> list[OpRecord]:
    """``members`` of a function of one input (GELU, HardSwish, SiLU: one lookup table) with the
    Muls and Adds by a scalar constant that follow it: still a function of one input,
    the same table (rule 3; PPLCNetV3's learnable affine block after its HardSwish)."""
    while True:
        readers = _readers(ir, members[-1])
        nxt = readers[0] if len(readers) == 1 else None
        if not (isinstance(nxt, OpRecord) and nxt.op_type in ("Mul", "Add") and not nxt.domain
                and META_KEY not in nxt.meta and len(nxt.outputs) == 1):
            return members
        other = _other(ir, nxt, members[-1].outputs[0])
        const = constant_of(ir, other) if other is not None else None
        if const is None or ir.value(const).data is None or ir.value(const).data.size != 1:
            return members
        members = [*members, nxt]


def _hard_swish(ir: QIR, op: OpRecord) -> list[OpRecord] | None:
    """The HardSwish that starts at ``op``: ``Add(x, 3)``, ``Clip(0, 6)``, ``Mul`` by x, then
    ``Div`` by 6 or ``Mul`` by 1/6; or ``HardSigmoid(x)`` then ``Mul`` by x; else None."""
    if op.op_type == "HardSigmoid":
        x, members = _source(ir, op.inputs[0]), [op]
    else:
        constants = [v for v in op.inputs if _constant(ir, v)]
        if len(op.inputs) != 2 or len(constants) != 1:
            return None
        x = _source(ir, next(v for v in op.inputs if v not in constants))
        clip = _single_reader(ir, op, "Clip")
        if clip is None or not all(_constant(ir, v) for v in clip.inputs[1:] if v):
            return None
        members = [op, clip]
    mul = _single_reader(ir, members[-1], "Mul")
    other = mul and _other(ir, mul, members[-1].outputs[0])
    if other is None or _source(ir, other) != x:
        return None
    members.append(mul)
    if op.op_type != "HardSigmoid":  # (then the division by 6)
        scale = _single_reader(ir, mul, "Div") or _single_reader(ir, mul, "Mul")
        divisor = scale and _other(ir, scale, mul.outputs[0])
        if divisor is None or not _constant(ir, divisor) or (
                scale.op_type == "Div" and _source(ir, scale.inputs[0]) != mul.outputs[0]):
            return None
        members.append(scale)
    members = _scalar_tail(ir, members)
    return members if _closed(ir, members) else None


def _silu(ir: QIR, sigmoid: OpRecord) -> list[OpRecord] | None:
    """The SiLU (swish) ``Mul(x, Sigmoid(x))`` whose Sigmoid is ``sigmoid``, or None."""
    mul = _single_reader(ir, sigmoid, "Mul")
    other = mul and _other(ir, mul, sigmoid.outputs[0])
    if other is None or _source(ir, other) != _source(ir, sigmoid.inputs[0]):
        return None
    members = _scalar_tail(ir, [sigmoid, mul])
    return members if _closed(ir, members) else None


def find_composites(ir: QIR, kinds: tuple[str, ...] = COMPOSITE_KINDS) -> list[Composite]:
    """Every match of ``kinds`` in ``ir`` that overlaps no fusion group, in topological order."""
    found: list[Composite] = []
    taken: set[str] = set()
    order = {r.name: i for i, r in enumerate(ir.ops())}
    for op in ir.ops():
        if op.domain or META_KEY in op.meta or op.name in taken:
            continue
        members = None
        if "LayerNorm" in kinds and op.op_type == "Sub":
            members, kind = _layer_norm(ir, op), "LayerNorm"
        elif "Gelu" in kinds and op.op_type == "Div":
            members, kind = _gelu(ir, op), "Gelu"
        elif "HardSwish" in kinds and op.op_type in ("Add", "HardSigmoid"):
            members, kind = _hard_swish(ir, op), "HardSwish"
        elif "Silu" in kinds and op.op_type == "Sigmoid":
            members, kind = _silu(ir, op), "Silu"
        if members and not taken & {m.name for m in members}:
            members = sorted(members, key=lambda m: order[m.name])
            taken |= {m.name for m in members}
            found.append(Composite(kind, tuple(m.name for m in members)))
    return found
