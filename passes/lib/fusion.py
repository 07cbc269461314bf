"""Fusion groups marked by the ``fuse`` pass: which ops run as one unit, and the chain matcher
that finds a march's fusion patterns (Conv+Relu, Conv+Add+Relu, ...)."""
from __future__ import annotations

from qir.graph import QIR
from qir.records import CalibRecord, OpRecord

META_KEY = "fusion"


def fusion_groups(ir: QIR) -> dict[str, list[str]]:
    """``{head op: [member ops in order]}`` of the groups marked by ``fuse``."""
    return ir.meta.get("fusion_groups", {})


def unit_of(ir: QIR, op: OpRecord) -> list[OpRecord]:
    """The ops that run as one with ``op`` when it ends a fusion group (the group, in order),
    else ``[op]``."""
    group = fusion_groups(ir).get(op.meta.get(META_KEY, ""), [])
    return [ir.op(m) for m in group] if group and group[-1] == op.name else [op]


def unit_type(ir: QIR, op: OpRecord) -> str:
    """``op``'s type, its composite's kind (``LayerNorm``, ``Gelu``: ``fuse`` rule 3) when it ends
    one, or its fusion group's types joined with ``+`` (``Conv+Relu``)."""
    unit = unit_of(ir, op)
    kind = ir.meta.get("composites", {}).get(unit[0].name) if len(unit) > 1 else None
    return kind or "+".join(o.op_type for o in unit)


def inside_fusion(ir: QIR, value: str) -> bool:
    """True if ``value`` runs between two ops of one fusion group (the NPU never materializes
    it, so it must not be quantized)."""
    producer = ir.producer(value)
    if not isinstance(producer, OpRecord) or META_KEY not in producer.meta:
        return False
    group = producer.meta[META_KEY]
    return any(isinstance(r, OpRecord) and r.meta.get(META_KEY) == group for r in ir.consumers(value))


def match_pattern(ir: QIR, head: OpRecord, pattern: tuple[str, ...]) -> list[OpRecord] | None:
    """The ops of ``pattern`` (a chain of op types) starting at ``head``, or None (rule 1)."""
    if head.op_type != pattern[0] or head.domain:
        return None
    members = [head]
    for op_type in pattern[1:]:
        value = _through_calibrations(ir, members[-1].outputs[0])
        readers = ir.consumers(value)
        if (len(members[-1].outputs) != 1 or value in ir.outputs or members[-1].outputs[0] in ir.outputs
                or len(readers) != 1 or not isinstance(readers[0], OpRecord)
                or readers[0].op_type != op_type or META_KEY in readers[0].meta):
            return None
        members.append(readers[0])
    return members


def _through_calibrations(ir: QIR, value: str) -> str:
    """The value the next op actually reads: past a single calibration node, if there is one."""
    readers = ir.consumers(value)
    if len(readers) == 1 and isinstance(readers[0], CalibRecord):
        return readers[0].output
    return value
