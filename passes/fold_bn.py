"""``fold-bn``: fold BatchNormalization, and Mul / Add by per-channel constants (a batch norm
spelled out), into the Conv / ConvTranspose / Gemm / MatMul before it."""
from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np

from qir.graph import QIR
from qir.naming import fresh_name
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.affine import LAST_AXIS_OPS, constant_of, per_channel
from qir.records import OpRecord
from qir.runtimes.numerics import batchnorm_affine, fold_affine

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

    A **per-channel affine** written as ``Mul`` and ``Add`` by constants folds the same way (a
    BatchNormalization with mean 0 and variance 1): ``y = Op(x) * a`` gives W' = W * a, B' = B * a;
    ``y = Op(x) + c`` gives B' = B + c (a bias made where the op has none). Exporters write it for
    PPLCNetV3's learnable affine block (Conv, then Mul and Add by scalars) and a ViT's layer scale
    (MatMul, its bias Add, then Mul by a vector). A compiler folds it, as onnxruntime's own graph
    optimizer does (its ConvMulFusion and ConvAddFusion); left unfolded, qir would put a quantizer
    on each step and the latency model would price each step as an op. It folds when (1) the
    constant broadcasts along the output channels only (a scalar, or the channel count along the
    channel axis: 1 for Conv / ConvTranspose, the last for Gemm / MatMul, and no wider rank than
    the output's), (2) the value between is read only by the Mul / Add and neither is a graph
    output, (3) the op's weights are constants. A MatMul (constant 2-D B) has no bias slot: a Mul
    folds into B, and with an Add by a constant after it (its bias) a later Mul folds into B and
    that constant, a later Add into that constant. Chains fold step by step (Conv, Mul, Add).
    """

    name = "fold-bn"

    def run(self, ir: QIR) -> PassResult:
        folded = []
        for bn in ir.ops("BatchNormalization"):
            op = self._foldable(ir, bn)
            if op is not None:
                self._fold(ir, op, bn)
                folded.append({"batchnorm": bn.name, "into": op.name})
        affine = []
        for op in list(ir.ops()):  # (topological order: a chain's second step sees the first folded)
            site = _affine_site(ir, op) if op.op_type in ("Mul", "Add") and not op.domain else None
            if site is not None:
                _fold_affine(ir, op, site)
                affine.append({op.op_type.lower(): op.name, "into": site.linear.name})
        if folded or affine:
            logger.info("folded %d BatchNormalization node(s) and %d per-channel Mul/Add", len(folded), len(affine))
        return PassResult(ir, bool(folded or affine), {"folded": folded, "affine": affine})

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
        if len(op.inputs) < 2 or not all(_constant(ir, v) for v in constants):
            return None
        return op

    @staticmethod
    def _fold(ir: QIR, op: OpRecord, bn: OpRecord) -> None:
        a, shift = batchnorm_affine(*(ir.weight_array(n) for n in bn.inputs[1:5]), bn.attrs.get("epsilon", 1e-5))
        axis, count, _ = _channels(ir, op)
        _scale_weights(ir, op, axis, count, a, shift, make_bias=True)
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


def _constant(ir: QIR, value: str) -> bool:
    """``value`` is a constant read directly (not through a calibration node: a calibrated weight
    is not folded)."""
    return constant_of(ir, value) == value


def _single_read(ir: QIR, value: str) -> bool:
    return value not in ir.outputs and len(ir.uses(value)) == 1


def _channels(ir: QIR, op: OpRecord) -> tuple[int, int, int] | None:
    """``(axis of W, channel count, output rank or -1 unknown)`` of a linear op whose output
    channels a per-channel constant can fold into, else None."""
    if op.domain or len(op.inputs) < 2 or not all(_constant(ir, v) for v in op.inputs[1:] if v):
        return None
    shape = ir.weight_array(op.inputs[1]).shape
    if op.op_type == "Conv":
        return 0, shape[0], len(shape)
    if op.op_type == "ConvTranspose" and int(op.attrs.get("group", 1)) == 1:
        return 1, shape[1], len(shape)
    if op.op_type == "Gemm":
        axis = 0 if op.attrs.get("transB", 0) else 1
        return axis, shape[axis], 2
    if op.op_type == "MatMul" and len(shape) == 2:
        rank = ir.value(op.outputs[0]).shape
        return 1, shape[1], len(rank) if rank is not None else -1
    return None


class _Site(NamedTuple):
    """Where a Mul / Add by a per-channel constant folds: the linear op, its weight's channel axis
    and channel count, the MatMul's bias Add (None: none) and the slot of its constant, and the
    slot of the constant in the Mul / Add."""

    linear: OpRecord
    axis: int
    count: int
    bias: OpRecord | None
    bias_slot: int
    slot: int


def _affine_site(ir: QIR, op: OpRecord) -> _Site | None:
    """Where the Mul / Add ``op`` folds (:class:`_Site`), else None."""
    if len(op.inputs) != 2 or len(op.outputs) != 1 or op.outputs[0] in ir.outputs:
        return None
    slots = [i for i, v in enumerate(op.inputs) if _constant(ir, v)]
    if len(slots) != 1 or not _single_read(ir, op.inputs[1 - slots[0]]):
        return None
    k = ir.weight_array(op.inputs[slots[0]])
    producer = ir.producer(op.inputs[1 - slots[0]])
    if not isinstance(producer, OpRecord) or producer.domain:
        return None
    bias, bias_slot = None, -1
    if producer.op_type == "Add" and producer.outputs[0] not in ir.outputs:  # MatMul's bias Add, then this op
        inner = [i for i, v in enumerate(producer.inputs) if _constant(ir, v)]
        made = ir.producer(producer.inputs[1 - inner[0]]) if len(inner) == 1 and len(producer.inputs) == 2 else None
        if not (isinstance(made, OpRecord) and made.op_type == "MatMul" and _single_read(ir, made.outputs[0])):
            return None
        bias, bias_slot, producer = producer, inner[0], made
    elif producer.op_type == "MatMul" and op.op_type == "Add":
        return None  # (that Add is the MatMul's bias: nowhere to fold it)
    found = _channels(ir, producer)
    if found is None or not np.issubdtype(k.dtype, np.floating):
        return None
    axis, count, rank = found
    if not per_channel(k.shape, count, rank, last=producer.op_type in LAST_AXIS_OPS):
        return None
    if bias is not None:
        c = ir.weight_array(bias.inputs[bias_slot])
        if not np.issubdtype(c.dtype, np.floating) or not per_channel(c.shape, count, rank, last=True):
            return None
    return _Site(producer, axis, count, bias, bias_slot, slots[0])


def _fold_affine(ir: QIR, op: OpRecord, site: _Site) -> None:
    """Fold ``op`` (Mul / Add by the constant in ``site.slot``) into ``site``'s linear op (and its
    bias Add)."""
    k = ir.weight_array(op.inputs[site.slot]).reshape(-1)
    scale = k if op.op_type == "Mul" else np.ones(1)
    shift = k if op.op_type == "Add" else np.zeros(1)
    if op.op_type == "Mul" or site.bias is None:
        shift_w = shift if site.bias is None else np.zeros(1)
        _scale_weights(ir, site.linear, site.axis, site.count, scale, shift_w, make_bias=bool(np.any(shift_w)))
    if site.bias is not None:
        c = ir.weight_array(site.bias.inputs[site.bias_slot])
        folded = (np.asarray(c, np.float64).reshape(-1) * scale + shift) * np.ones(site.count)
        _write_weight(ir, site.bias, site.bias_slot, site.bias.inputs[site.bias_slot], folded.reshape(
            (1,) * (c.ndim - 1) + (site.count,) if c.ndim else (site.count,)).astype(c.dtype), f"{site.bias.name}.bias")
    last = site.bias if site.bias is not None else site.linear
    ir.replace_uses(op.outputs[0], last.outputs[0])
    ir.meta["value_aliases"] = {**ir.meta.get("value_aliases", {}), last.outputs[0]: op.outputs[0]}
    constant = op.inputs[site.slot]
    ir.remove_node(op.name)
    if not ir.uses(constant) and constant not in ir.outputs:
        ir.remove_value(constant)


def _scale_weights(ir: QIR, op: OpRecord, axis: int, count: int, scale, shift, make_bias: bool) -> None:
    """W' = W * scale along ``axis``; B' = B * scale + shift (B made where the op has none and
    ``make_bias``; a MatMul has no bias slot and is given a zero shift). Gemm's ``alpha`` and
    ``beta`` are folded first."""
    w_name = op.inputs[1]
    b_name = op.inputs[2] if len(op.inputs) > 2 and op.inputs[2] else None
    weight = ir.weight_array(w_name)
    bias = ir.weight_array(b_name) if b_name else None
    if op.op_type == "Gemm":
        alpha, beta = float(op.attrs.get("alpha", 1.0)), float(op.attrs.get("beta", 1.0))
        weight = weight * weight.dtype.type(alpha)
        bias = None if bias is None else bias * bias.dtype.type(beta)
        op.attrs.update(alpha=1.0, beta=1.0)
        op.attr_types.update(alpha=1, beta=1)  # AttributeProto.FLOAT
    new_w, new_b = fold_affine(weight, bias, np.broadcast_to(scale, (count,)), np.broadcast_to(shift, (count,)), axis)
    _write_weight(ir, op, 1, w_name, new_w, f"{op.name}.weight")
    if op.op_type != "MatMul" and (b_name or make_bias):
        _write_weight(ir, op, 2, b_name, new_b, f"{op.name}.bias")
