"""``fold-bn``: fold BatchNormalization into the Conv / ConvTranspose / Gemm before it."""
from __future__ import annotations

import logging

from qir.graph import QIR
from qir.kinds import NodeKind
from qir.naming import fresh_name
from qir.passes.base import Pass, PassResult, register_pass
from qir.records import OpRecord
from qir.runtimes.numerics import fold_batchnorm

__all__ = ["FoldBatchNormPass"]

logger = logging.getLogger(__name__)


@register_pass
class FoldBatchNormPass(Pass):
    """Fold ``y = BatchNormalization(Op(x, W, B))`` into ``y = Op(x, W', B')``.

    With a = scale / sqrt(var + eps): W' = W * a along the output-channel axis and
    B' = (B - mean) * a + beta (B = 0 when the op has no bias). The output-channel axis of W is
    0 for Conv, 1 for ConvTranspose (group 1 only), and for Gemm 0 if transB else 1 (Gemm's
    ``alpha``/``beta`` are folded too, leaving alpha·A·B' + 1·C').

    A pair folds when (1) the op's output is read only by the BatchNormalization and is not a
    graph output, (2) W, B and the BN parameters are constants, (3) BN is in inference mode
    with unused extra outputs. A weight shared with another node is copied, not changed in
    place. The BN's readers then read the op's output; the op keeps its name, and
    ``ir.meta["value_aliases"]`` maps its output to the BN output's name (the same quantity in
    the unfolded model: layer comparisons match them).
    """

    name = "fold-bn"

    def run(self, ir: QIR) -> PassResult:
        folded = []
        for bn in ir.ops("BatchNormalization"):
            op = self._foldable(ir, bn)
            if op is not None:
                self._fold(ir, op, bn)
                folded.append({"batchnorm": bn.name, "into": op.name})
        if folded:
            logger.info("folded %d BatchNormalization node(s)", len(folded))
        return PassResult(ir, bool(folded), {"folded": folded})

    @staticmethod
    def _foldable(ir: QIR, bn: OpRecord) -> OpRecord | None:
        x = bn.inputs[0]
        op = ir.producer(x)
        if not isinstance(op, OpRecord) or op.domain or op.op_type not in ("Conv", "ConvTranspose", "Gemm"):
            return None
        if op.op_type == "ConvTranspose" and int(op.attrs.get("group", 1)) != 1:
            return None
        if x in ir.outputs or len(ir.uses(x)) != 1 or bn.attrs.get("training_mode"):
            return None
        if any(o and (ir.uses(o) or o in ir.outputs) for o in bn.outputs[1:]):
            return None
        constants = [v for v in (*op.inputs[1:], *bn.inputs[1:5]) if v]
        if len(op.inputs) < 2 or not all(ir.value(v).kind is NodeKind.WEIGHT for v in constants):
            return None
        return op

    @staticmethod
    def _fold(ir: QIR, op: OpRecord, bn: OpRecord) -> None:
        w_name = op.inputs[1]
        b_name = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] else None
        weight = ir.weight_array(w_name)
        bias = ir.weight_array(b_name) if b_name else None
        if op.op_type == "Gemm":
            axis = 0 if op.attrs.get("transB", 0) else 1
            alpha, beta = float(op.attrs.get("alpha", 1.0)), float(op.attrs.get("beta", 1.0))
            weight = weight * weight.dtype.type(alpha)
            bias = None if bias is None else bias * bias.dtype.type(beta)
            op.attrs.update(alpha=1.0, beta=1.0)
            op.attr_types.update(alpha=1, beta=1)  # AttributeProto.FLOAT
        else:
            axis = 0 if op.op_type == "Conv" else 1
        new_w, new_b = fold_batchnorm(weight, bias, *(ir.weight_array(n) for n in bn.inputs[1:5]),
                                      epsilon=bn.attrs.get("epsilon", 1e-5), axis=axis)
        _write_weight(ir, op, 1, w_name, new_w, f"{op.name}.weight")
        _write_weight(ir, op, 2, b_name, new_b, f"{op.name}.bias")
        ir.replace_uses(bn.outputs[0], op.outputs[0])
        # a new dict: clones share the old one
        ir.meta["value_aliases"] = {**ir.meta.get("value_aliases", {}), op.outputs[0]: bn.outputs[0]}
        ir.remove_node(bn.name)
        for v in bn.inputs[1:5]:
            if v and not ir.uses(v) and v not in ir.outputs:
                ir.remove_value(v)


def _write_weight(ir: QIR, op: OpRecord, slot: int, current: str | None, array, fallback: str) -> None:
    """Give ``op`` input ``slot`` the new array: in place if only ``op`` reads it, else a copy."""
    if current is not None and len(ir.uses(current)) == 1 and current not in ir.outputs:
        ir.set_weight(current, array)
        return
    name = fresh_name(fallback, {v.name for v in ir.values()})
    ir.add_weight(name, array)
    ir.set_input(op.name, slot, name)
    if current is not None and not ir.uses(current) and current not in ir.outputs:
        ir.remove_value(current)
