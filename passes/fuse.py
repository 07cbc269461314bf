"""``fuse``: mark the march's fusion groups (Conv+Relu, Conv+Add+Relu, ...) and keep them whole."""
from __future__ import annotations

import logging

from qir.graph import QIR
from qir.records import CalibRecord, OpRecord

from ..runtimes.profiles import get_profile
from .base import Pass, PassResult, register_pass

__all__ = ["FusePass", "fusion_groups", "inside_fusion", "match_pattern", "unit_of", "unit_type"]

logger = logging.getLogger(__name__)

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
    """``op``'s type, or its fusion group's types joined with ``+`` (``Conv+Relu``)."""
    return "+".join(o.op_type for o in unit_of(ir, op))


def inside_fusion(ir: QIR, value: str) -> bool:
    """True if ``value`` runs between two ops of one fusion group (the NPU never materializes
    it, so it must not be quantized)."""
    producer = ir.producer(value)
    if not isinstance(producer, OpRecord) or META_KEY not in producer.meta:
        return False
    group = producer.meta[META_KEY]
    return any(isinstance(r, OpRecord) and r.meta.get(META_KEY) == group for r in ir.consumers(value))


@register_pass
class FusePass(Pass):
    """Find the march's fusion patterns and mark each match as one group.

    Rules:

    1. A pattern is a chain of op types from the march profile (longest first), e.g.
       Conv→Add→Relu: each op's output must be read only by the next op of the chain and must
       not be a graph output (for Add, the chain value may be either input).
    2. Every member gets ``meta["fusion"] = <head op name>``; the groups are listed in
       ``ir.meta["fusion_groups"]``. Ops keep their names; the graph does not change shape.
    3. Calibration nodes on values inside a group are removed: the fused kernel never writes
       those values, so quantizing them would emulate an error the NPU does not make.
       ``insert-calibration`` skips such values too.
    """

    name = "fuse"

    def __init__(self, march: str = "generic") -> None:
        self.profile = get_profile(march)
        self.options = {"march": self.profile.name}

    def run(self, ir: QIR) -> PassResult:
        patterns = sorted((tuple(p) for p in self.profile.fusions), key=len, reverse=True)
        groups = dict(fusion_groups(ir))
        removed = []
        for op in ir.ops():
            if META_KEY in op.meta:
                continue
            for pattern in patterns:
                members = match_pattern(ir, op, pattern)
                if members:
                    for m in members:
                        m.meta[META_KEY] = op.name
                    groups[op.name] = [m.name for m in members]
                    removed += self._drop_inner_calibrations(ir, members)
                    break
        added = len(groups) - len(fusion_groups(ir))
        ir.meta["fusion_groups"] = groups
        modified = bool(added or removed)
        if added:
            ir.touch()
        logger.info("fuse (%s): %d group(s), %d inner calibration node(s) removed",
                    self.profile.name, len(groups), len(removed))
        return PassResult(ir, modified, {"groups": groups, "removed_calibrations": removed})

    @staticmethod
    def _drop_inner_calibrations(ir: QIR, members: list[OpRecord]) -> list[str]:
        removed = []
        for op in members[:-1]:
            for cal in [r for r in ir.consumers(op.outputs[0]) if isinstance(r, CalibRecord)]:
                ir.replace_uses(cal.output, cal.input)
                ir.remove_node(cal.name)
                removed.append(cal.name)
        return removed


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
