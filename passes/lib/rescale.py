"""Exact per-channel rescaling, shared by ``smooth`` and ``equalize``: make an activation's channels
``x_j / s_j`` by changing the constants of the ops that produce it, and make the GEMMs that read it
compensate by multiplying their weights' input channels by ``s_j`` (``s > 0``).

Producers that absorb ``1/s`` exactly (the value's channel axis must be the one named):

1. ``Mul(a, c)`` with ``c`` constant: ``c / s`` (a layer scale, a LayerNorm's final scale).
2. ``Add(a, c)`` with ``c`` constant: ``c / s``, and ``a`` must become ``a / s`` in turn (a
   decomposed LayerNorm's ``... Mul, Add`` tail; a bias after a MatMul).
3. ``LayerNormalization`` (channel axis last): its scale and bias ``/ s``.
4. ``BatchNormalization`` (axis 1): its scale and bias ``/ s``.
5. ``Conv`` (axis 1) / ``ConvTranspose`` (group 1, axis 1): output channels of the weight and the
   bias ``/ s``; ``Gemm`` / ``MatMul`` with a constant weight (last axis): its output columns and
   Gemm's constant ``C`` ``/ s``.
6. ``Relu``, ``LeakyRelu``, ``PRelu`` are positively homogeneous, ``f(x / s) = f(x) / s``: the
   division moves on to their input.

Every value on the way must be read by the next op only (Shape readers aside) and must not be a
graph output; a constant read elsewhere too is copied, not changed in place.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from qir.graph import QIR
from qir.kinds import NodeKind
from qir.naming import fresh_name
from qir.passes.lib.repair import scale_along
from qir.records import OpRecord

__all__ = ["Edit", "divide_channels", "divided_values", "multiply_input_channels", "input_channel_absmax", "apply_edits",
           "channel_axis", "HOMOGENEOUS", "only_reader",
           "power_of_two"]

logger = logging.getLogger(__name__)

HOMOGENEOUS = ("Relu", "LeakyRelu", "PRelu")


@dataclass
class Edit:
    """New contents for the constant in input ``slot`` of op ``op``."""

    op: str
    slot: int
    array: np.ndarray


def _const(ir: QIR, name: str) -> np.ndarray | None:
    return ir.weight_array(name) if name and ir.value(name).kind is NodeKind.WEIGHT else None


def only_reader(ir: QIR, value: str) -> OpRecord | None:
    """The one op reading ``value`` (Shape ops aside), or None (several, a calibration node, a
    graph output)."""
    if value in ir.outputs:
        return None
    readers = [r for r, _ in ir.uses(value) if not (isinstance(r, OpRecord) and r.op_type == "Shape")]
    if len({r.name for r in readers}) != 1 or len(readers) != 1 or not isinstance(readers[0], OpRecord):
        return None
    return readers[0]


def _rank(ir: QIR, value: str) -> int | None:
    shape = ir.value(value).shape
    return None if shape is None else len(shape)


def _times_along(array: np.ndarray, factor: np.ndarray, axis: int, rank: int) -> np.ndarray | None:
    """``array`` (broadcast against a rank-``rank`` tensor) times ``factor`` along ``axis``, kept at
    its own rank where it can be; None when its size on that axis is neither 1 nor ``len(factor)``."""
    if array.ndim > rank:
        return None
    full = array.reshape((1,) * (rank - array.ndim) + array.shape)
    if full.shape[axis] not in (1, len(factor)):
        return None
    out = full.astype(np.float64) * scale_along(factor, axis, rank)
    while out.ndim > max(array.ndim, 1) and out.shape[0] == 1:
        out = out[0]
    return out.astype(array.dtype)


def divide_channels(ir: QIR, value: str, axis: int, s: np.ndarray) -> list[Edit] | str:
    """Edits making ``value`` become ``value / s`` along ``axis`` (module docstring), or the
    reason it cannot be done exactly."""
    walked = _walk(ir, value, axis, s)
    return walked if isinstance(walked, str) else walked[0]


def divided_values(ir: QIR, value: str, axis: int, channels: int) -> list[str] | str:
    """The values :func:`divide_channels` divides by ``s`` (``channels`` factors) on its way up:
    ``value`` itself, then each input a homogeneous op or an ``Add`` passes the division on to
    (every value computed between ``value`` and the constants that absorb it), or the reason it
    cannot be done."""
    walked = _walk(ir, value, axis, np.ones(channels))
    return walked if isinstance(walked, str) else walked[1]


def _walk(ir: QIR, value: str, axis: int, s: np.ndarray) -> tuple[list[Edit], list[str]] | str:
    """``(edits, values divided)`` for :func:`divide_channels`, or the reason it cannot be done exactly."""
    inv = 1.0 / np.asarray(s, np.float64)
    edits: list[Edit] = []
    v, path = value, [value]
    while True:
        rank = _rank(ir, v)
        op = ir.producer(v)
        if rank is None:
            return f"the rank of {v!r} is unknown"
        if op is None:
            return f"{v!r} is a graph input or a constant: nothing before it can absorb 1/s"
        if not isinstance(op, OpRecord):
            return f"{v!r} is the output of calibration node {op.name!r}; run this before insert-calibration"
        ax = axis % rank
        step = _divide_op(ir, op, ax, rank, inv)
        if isinstance(step, str):
            return f"produced by {op.op_type} {op.name!r}: {step}"
        more, upstream = step
        edits += more
        if upstream is None:
            return edits, path
        if only_reader(ir, upstream) is not op:
            return f"{upstream!r} (before {op.op_type} {op.name!r}) is read elsewhere too"
        v = upstream
        path.append(v)


def _divide_op(ir: QIR, op: OpRecord, ax: int, rank: int, inv: np.ndarray):
    """``(edits, upstream value or None)`` for one producer, or a reason."""
    t, ins = op.op_type, op.inputs
    if t in HOMOGENEOUS:
        return [], ins[0]
    if t in ("Mul", "Add") and len(ins) == 2:
        consts = [i for i in (0, 1) if _const(ir, ins[i]) is not None]
        if len(consts) != 1:
            return "it needs exactly one constant input"
        new = _times_along(_const(ir, ins[consts[0]]), inv, ax, rank)
        if new is None:
            return "its constant does not broadcast per channel"
        return [Edit(op.name, consts[0], new)], (ins[1 - consts[0]] if t == "Add" else None)
    if t == "LayerNormalization":
        return _divide_affine(ir, op, (1, 2), ax == rank - 1, -1, inv, "the channel axis is not the last")
    if t == "BatchNormalization":
        return _divide_affine(ir, op, (1, 2), ax == 1, 0, inv, "the channel axis is not 1")
    if t in ("Conv", "ConvTranspose"):
        if ax != 1 or (t == "ConvTranspose" and int(op.attrs.get("group", 1)) != 1):
            return "only axis 1 (and group 1 for ConvTranspose)"
        return _divide_weight_bias(ir, op, 0 if t == "Conv" else 1, 2, inv)
    if t in ("Gemm", "MatMul"):
        if ax != rank - 1:
            return "the channel axis is not the last"
        w = _const(ir, ins[1]) if len(ins) > 1 else None
        if w is None or w.ndim < 2:
            return "its weight is not a constant matrix"
        w_axis = 0 if t == "Gemm" and op.attrs.get("transB", 0) else w.ndim - 1
        return _divide_weight_bias(ir, op, w_axis, 2 if t == "Gemm" else None, inv)
    return "it cannot absorb 1/s exactly"


def _divide_affine(ir: QIR, op: OpRecord, slots, ok: bool, axis: int, inv: np.ndarray, why: str):
    if not ok:
        return why
    edits = []
    for slot in slots:
        if slot >= len(op.inputs) or not op.inputs[slot]:
            continue
        c = _const(ir, op.inputs[slot])
        if c is None or c.ndim == 0 or c.shape[axis] != len(inv):
            return f"input {slot} is not a constant vector of the channels"
        edits.append(Edit(op.name, slot, (c * scale_along(inv, axis, c.ndim)).astype(c.dtype)))
    return edits, None


def _divide_weight_bias(ir: QIR, op: OpRecord, w_axis: int, bias_slot: int | None, inv: np.ndarray):
    w = _const(ir, op.inputs[1])
    if w is None or w.shape[w_axis] != len(inv):
        return "its weight is not a constant with one slice per channel"
    edits = [Edit(op.name, 1, (w * scale_along(inv, w_axis, w.ndim)).astype(w.dtype))]
    if bias_slot is not None and len(op.inputs) > bias_slot and op.inputs[bias_slot]:
        b = _const(ir, op.inputs[bias_slot])
        new = None if b is None else _times_along(b, inv, b.ndim - 1 if b.ndim else 0, max(b.ndim, 1))
        if new is None:
            return "its bias is not a constant per channel"
        edits.append(Edit(op.name, bias_slot, new))
    return edits, None


def channel_axis(ir: QIR, op: OpRecord) -> int | None:
    """The channel axis of a GEMM's activation input (slot 0) that :func:`multiply_input_channels`
    scales: Conv 1, MatMul/Gemm (no transA) the last; None for other ops or a non-constant weight."""
    if len(op.inputs) < 2 or _const(ir, op.inputs[1]) is None or _const(ir, op.inputs[0]) is not None:
        return None
    rank = _rank(ir, op.inputs[0])
    if op.op_type == "Conv" and rank and rank >= 3:
        return 1
    if op.op_type == "MatMul" and rank and rank >= 2 and _const(ir, op.inputs[1]).ndim == 2:
        return rank - 1
    if op.op_type == "Gemm" and not op.attrs.get("transA", 0):
        return 1
    return None


def _input_multiplier(ir: QIR, op: OpRecord, s: np.ndarray) -> np.ndarray:
    """An array that, times the weight, scales the weight entries reading input channel j by s_j."""
    w = _const(ir, op.inputs[1])
    s = np.asarray(s, np.float64)
    if op.op_type == "Conv":
        groups = int(op.attrs.get("group", 1))
        out_ch, per_group = w.shape[0], w.shape[1]
        group_of_out = np.arange(out_ch) // (out_ch // groups)
        mult = s[group_of_out[:, None] * per_group + np.arange(per_group)[None, :]]
        return mult.reshape(mult.shape + (1,) * (w.ndim - 2))
    if op.op_type == "Gemm" and op.attrs.get("transB", 0):
        return s[None, :]
    return s[:, None]


def multiply_input_channels(ir: QIR, op: OpRecord, s: np.ndarray) -> Edit:
    """The weight of ``op`` (a GEMM, :func:`channel_axis` not None) with input channel j times s_j."""
    w = _const(ir, op.inputs[1])
    return Edit(op.name, 1, (w * _input_multiplier(ir, op, s)).astype(w.dtype))


def input_channel_absmax(ir: QIR, op: OpRecord) -> np.ndarray:
    """max |W| over the weight entries of ``op`` that read each input channel."""
    w = np.abs(_const(ir, op.inputs[1]).astype(np.float64))
    if op.op_type == "Conv":
        groups = int(op.attrs.get("group", 1))
        per_out = w.reshape(w.shape[0], w.shape[1], -1).max(axis=2)  # (O, C/g)
        return per_out.reshape(groups, w.shape[0] // groups, w.shape[1]).max(axis=1).reshape(-1)
    if op.op_type == "Gemm" and op.attrs.get("transB", 0):
        return w.max(axis=0)
    return w.max(axis=1)


def power_of_two(s: np.ndarray) -> np.ndarray:
    """Each factor rounded to the nearest power of two (in log scale): scaling a float by it is
    exact, so a rescaled model computes the same float numbers as the original."""
    return np.exp2(np.round(np.log2(np.asarray(s, np.float64))))


def apply_edits(ir: QIR, edits: list[Edit]) -> None:
    """Write each edit's array: in place when only that op reads the constant (once), else as a
    new constant for that op's slot (also where the slot was empty: a new bias)."""
    for e in edits:
        op = ir.op(e.op)
        current = op.inputs[e.slot] if e.slot < len(op.inputs) else ""
        if current and len(ir.uses(current)) == 1 and current not in ir.outputs:
            ir.set_weight(current, e.array)
            continue
        name = fresh_name(f"{current}.{op.name}" if current else f"{op.name}.bias",
                          {v.name for v in ir.values()})
        ir.add_weight(name, e.array)
        ir.set_input(op.name, e.slot, name)
