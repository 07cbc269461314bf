"""``fuse``: mark the march's fusion groups (Conv+Relu, Conv+Add+Relu, ...) and composites (a
spelled-out LayerNorm or GELU) and keep them whole."""
from __future__ import annotations

import logging

from qir.graph import QIR
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.affine import joins_linear
from qir.passes.lib.composites import find_composites
from qir.passes.lib.fusion import META_KEY, fusion_groups, match_pattern
from qir.records import CalibRecord, OpRecord
from qir.runtimes.march import get_profile

__all__ = ["FusePass"]

logger = logging.getLogger(__name__)


@register_pass
class FusePass(Pass):
    """Find the march's fusion patterns and mark each match as one group.

    Rules:

    1. A pattern is a chain of op types from the march profile (longest first), e.g.
       Conv→Add→Relu: each op's output must be read only by the next op of the chain and must
       not be a graph output (for Add, the chain value may be either input).
    2. A Mul or Add by a per-channel constant that reads a Conv / ConvTranspose / Gemm / MatMul's
       output straight (:mod:`qir.passes.lib.affine`) joins that op's group (made where the op
       has none): a MatMul's bias Add, which ``fold-bn`` cannot fold (a MatMul has no bias
       slot), and any affine ``fold-bn`` was not run to fold: on a march that fuses Gemm+Add,
       which runs a Linear with its bias as one GEMM and writes its output once.
    3. Then the march's ``composites`` (:mod:`qir.passes.lib.composites`: a LayerNorm or an
       erf-form GELU written op by op), each matched as one group, its members in topological
       order, the op writing its output last; ``ir.meta["composites"]`` maps each group's head to
       its kind, and each member's ``meta["composite"]`` holds it (the integer level reports the
       members it emulates in float as a composite, not as a CPU fallback).
    4. Every member gets ``meta["fusion"] = <head op name>``; the groups are listed in
       ``ir.meta["fusion_groups"]``. Ops keep their names; the graph does not change shape.
    5. Calibration nodes on values inside a group are removed: the fused kernel never writes
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
        if ("Gemm", "Add") in patterns:  # (rule 2: the march runs a Linear with its Add as one)
            removed += self._join_affines(ir, groups)
        composites = dict(ir.meta.get("composites", {}))
        for match in find_composites(ir, self.profile.composites):
            members = [ir.op(m) for m in match.members]
            for m in members:
                m.meta[META_KEY] = match.head
                m.meta["composite"] = match.kind
            groups[match.head] = list(match.members)
            composites[match.head] = match.kind
            removed += self._drop_inner_calibrations(ir, members)
        if composites:
            ir.meta["composites"] = composites
        added = len(groups) - len(fusion_groups(ir))
        ir.meta["fusion_groups"] = groups
        modified = bool(added or removed)
        if added:
            ir.touch()
        logger.info("fuse (%s): %d group(s), %d inner calibration node(s) removed",
                    self.profile.name, len(groups), len(removed))
        return PassResult(ir, modified, {"groups": groups, "composites": composites, "removed_calibrations": removed})

    def _join_affines(self, ir: QIR, groups: dict[str, list[str]]) -> list[str]:
        """Rule 2: a Mul / Add by a per-channel constant after a linear op joins its group."""
        removed: list[str] = []
        joined: dict[str, str] = {}
        for op in ir.ops():
            linear = joins_linear(ir, op, joined) if META_KEY not in op.meta else None
            if linear is None:
                continue
            head = ir.op(linear).meta.get(META_KEY, linear)
            members = groups.get(head, [linear])
            if members[-1] not in {p.name for v in op.inputs if isinstance(p := ir.producer(v), OpRecord)}:
                continue  # (it reads a value inside a group, not the group's output)
            joined[op.name] = linear
            groups[head] = [*members, op.name]
            for m in groups[head]:
                ir.op(m).meta[META_KEY] = head
            removed += self._drop_inner_calibrations(ir, [ir.op(m) for m in groups[head]])
        return removed

    @staticmethod
    def _drop_inner_calibrations(ir: QIR, members: list[OpRecord]) -> list[str]:
        removed = []
        for op in members[:-1]:
            for cal in [r for r in ir.consumers(op.outputs[0]) if isinstance(r, CalibRecord)]:
                ir.replace_uses(cal.output, cal.input)
                ir.remove_node(cal.name)
                removed.append(cal.name)
        return removed


