"""A per-channel affine after a linear op: a ``Mul`` or ``Add`` by a constant that scales or
shifts each output channel of a Conv / ConvTranspose / Gemm / MatMul alike (a batch norm written
out; PPLCNetV3's learnable affine block, a ViT's layer scale or a MatMul's bias).

A compiler folds it into the op's weights and bias (onnxruntime's graph optimizer does, with its
ConvMulFusion and ConvAddFusion): ``fold-bn`` folds it in the IR, and the latency model prices one
left in a model (a peer's, where no quantizer sits between) as part of the op's group.

The constant broadcasts along the output channels only when, its shape aligned to the output's
from the right, it has no more dimensions than the output and every dimension is 1 except
(possibly) the channel axis's, which is the channel count: axis 1 of a Conv or ConvTranspose's
``N, C, ...`` output, the last axis of a Gemm or MatMul's.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from qir.graph import QIR
from qir.kinds import CalibRole, NodeKind
from qir.records import CalibRecord, OpRecord

__all__ = ["LINEAR_OPS", "LAST_AXIS_OPS", "per_channel", "constant_of", "joins_linear"]

#: Ops whose output channels a per-channel affine folds into.
LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
#: Those whose channels are the output's last axis (the others: axis 1).
LAST_AXIS_OPS = ("Gemm", "MatMul")


def per_channel(shape: Sequence[int], count: int, rank: int, last: bool) -> bool:
    """Whether a constant of ``shape`` broadcasts along the channel axis only of an output of
    ``rank`` dimensions (-1: unknown, then only a scalar or a 1-D constant along the last axis) and
    ``count`` channels (see the module docstring)."""
    size = 1
    for d in shape:
        size *= int(d)
    if (rank < 0 and len(shape) > 1) or len(shape) > max(rank, 1) or size not in (1, count):
        return False
    if size == 1:
        return True
    axis = len(shape) - 1 if last else len(shape) - (rank - 1)
    return 0 <= axis < len(shape) and int(shape[axis]) == count


def constant_of(ir: QIR, value: str) -> str | None:
    """The constant behind ``value`` (itself, or the weight a weight calibration node reads), else None."""
    if not value or value in ir.inputs:
        return None
    producer = ir.producer(value)
    if isinstance(producer, CalibRecord) and producer.role is CalibRole.WEIGHT:
        value = producer.input
    elif producer is not None:
        return None
    return value if ir.value(value).kind is NodeKind.WEIGHT else None


def joins_linear(ir: QIR, op: OpRecord, joined: Mapping[str, str]) -> str | None:
    """The name of the linear op whose group ``op`` joins, when ``op`` is a Mul / Add by a
    per-channel constant that reads a linear op's output straight (no quantizer between; the value
    read by ``op`` alone and not a graph output) or the output of an op ``joined`` already maps to
    its linear op; else None. Channels and rank come from the value's shape (unknown: no join)."""
    if op.op_type not in ("Mul", "Add") or op.domain or len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    consts = [constant_of(ir, v) for v in op.inputs]
    if sum(c is not None for c in consts) != 1:
        return None
    const = next(c for c in consts if c is not None)
    x = op.inputs[consts.index(None)]
    producer = ir.producer(x)
    if not isinstance(producer, OpRecord) or x in ir.outputs or len(ir.consumers(x)) != 1:
        return None
    linear = ir.op(joined[producer.name]) if producer.name in joined else producer
    if linear.op_type not in LINEAR_OPS or linear.domain:
        return None
    shape = ir.value(x).shape
    if not shape or not all(isinstance(d, int) for d in shape):
        return None
    last = linear.op_type in LAST_AXIS_OPS
    count = shape[-1] if last else shape[1] if len(shape) > 1 else -1
    data = ir.value(const).data
    return linear.name if data is not None and per_channel(data.shape, count, len(shape), last) else None
