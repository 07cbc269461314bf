"""The layers ``round-weights`` rounds, each seen as a batch of small GEMMs on rows of its input.

A layer is a Conv (1-D or 2-D, grouped and depthwise included), a Gemm (no ``transA``) or a
MatMul with a constant 2-D weight, whose weight (input 1) is a constant behind an int8 WEIGHT
calibration node read by that op only, and whose input 0 is an activation. Its output at one
position is ``W_g · row_g`` per group g, where a row is the input patch that position reads
(Conv: ``C/g · kh · kw`` values at one output pixel; Gemm/MatMul: one row of the input), so the
output error of a rounding is measured on a subsample of rows with plain matrix products:
:attr:`Layer.gemm` turns the weight (in its own shape) into ``(groups, out/groups, K)`` and
:func:`rows` draws the rows of an input tensor.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qir.calibration import along_axis, calib_scale
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.records import CalibRecord, OpRecord

__all__ = ["Layer", "find_layers", "rows", "OP_TYPES"]

OP_TYPES = ("Conv", "Gemm", "MatMul")


@dataclass
class Layer:
    """One layer to round: its op, weight calibration node, float weight, the per-element scale of
    its int8 grid (``threshold / 127`` broadcast to the weight's shape) and its GEMM view."""

    op: OpRecord
    cal: CalibRecord
    weight: np.ndarray
    scale: np.ndarray
    groups: int
    threshold: np.ndarray

    def scale_for(self, threshold: np.ndarray) -> np.ndarray:
        """The per-element scale of the int8 grid a calibration ``threshold`` gives, computed as
        the runtimes compute it (``float32(threshold) / 127``)."""
        s = np.asarray(threshold, np.float32) / np.float32(127)
        return np.broadcast_to(along_axis(s, self.cal.axis, self.weight.ndim), self.weight.shape).astype(np.float32)

    def gemm(self, w):
        """``w`` (the weight's shape; numpy or torch) as ``(groups, out/groups, K)``."""
        t = self.op.op_type
        if t == "Conv":
            return w.reshape(self.groups, w.shape[0] // self.groups, -1)
        if t == "Gemm" and self.op.attrs.get("transB", 0):
            return w.reshape(1, *w.shape)
        return w.T.reshape(1, w.shape[1], w.shape[0])

    @property
    def out_axis(self) -> int:
        """The weight's output-channel axis."""
        return 0 if self.op.op_type == "Conv" or (self.op.op_type == "Gemm" and self.op.attrs.get("transB", 0)) else 1

    @property
    def row_size(self) -> tuple[int, int, int]:
        """``(groups, out/groups, K)``."""
        return tuple(self.gemm(self.weight).shape)


def find_layers(ir: QIR, op_types: tuple[str, ...]) -> tuple[list[Layer], list[tuple[str, str]]]:
    """The layers of ``ir`` (module docstring), and ``(op, reason)`` for each GEMM left out."""
    layers, skipped = [], []
    for op in ir.ops():
        if op.op_type not in op_types or op.domain or len(op.inputs) < 2:
            continue
        cal = ir.producer(op.inputs[1])
        if not isinstance(cal, CalibRecord) or cal.role is not CalibRole.WEIGHT:
            continue
        if ir.value(cal.input).kind is not NodeKind.WEIGHT or ir.value(op.inputs[0]).kind is NodeKind.WEIGHT:
            continue
        why = _unfit(ir, op, cal)
        if why:
            skipped.append((op.name, why))
            continue
        w = np.asarray(ir.weight_array(cal.input), np.float32)
        scale = np.broadcast_to(along_axis(calib_scale(cal), cal.axis, w.ndim), w.shape).astype(np.float32)
        th = np.asarray(cal.threshold if cal.scale is None else calib_scale(cal) * np.float32(127), np.float32)
        groups = int(op.attrs.get("group", 1)) if op.op_type == "Conv" else 1
        layers.append(Layer(op, cal, w, scale, groups, th))
    return layers, skipped


def _unfit(ir: QIR, op: OpRecord, cal: CalibRecord) -> str | None:
    """Why ``op`` cannot be rounded here, or None."""
    if cal.mode is not CalibMode.INT8:
        return f"its weight is quantized as {cal.mode.value}, not int8: nothing to choose"
    if cal.zero_point is not None and np.any(np.asarray(cal.zero_point) != 0):
        return "its weight quantizer is asymmetric (an imported zero point)"
    if len(ir.uses(cal.input)) != 1 or len(ir.uses(cal.output)) != 1:
        return "its weight is shared with other nodes"
    w = ir.weight_array(cal.input)
    out_axis = 0 if op.op_type == "Conv" or (op.op_type == "Gemm" and op.attrs.get("transB", 0)) else 1
    if cal.axis is not None and cal.axis % w.ndim != out_axis:
        return "its weight is quantized per channel along an axis other than the output channels"
    x_shape = ir.value(op.inputs[0]).shape
    if op.op_type == "Conv":
        if w.ndim not in (3, 4) or not x_shape or len(x_shape) != w.ndim:
            return "only 1-D and 2-D convolutions of a known input rank"
        if op.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
            return "auto_pad SAME_* is not supported; give explicit pads"
    elif op.op_type == "Gemm" and op.attrs.get("transA", 0):
        return "a Gemm with transA"
    elif w.ndim != 2 or not x_shape:
        return "its weight is not a matrix, or the rank of its input is unknown"
    return None


def rows(layer: Layer, x: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` rows (fewer when the input has fewer) drawn without replacement from input ``x``:
    ``(count, groups, K)``, in the order of the GEMM view's K."""
    op = layer.op
    if op.op_type != "Conv":
        flat = x.reshape(-1, x.shape[-1])
        pick = np.sort(rng.choice(len(flat), size=min(count, len(flat)), replace=False))
        return flat[pick][:, None, :].astype(np.float32)
    return _conv_rows(layer, x, count, rng)


def _conv_rows(layer: Layer, x: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    op, w = layer.op, layer.weight
    if w.ndim == 3:  # 1-D: as 2-D with a height of 1
        x, kernel = x[:, :, None, :], (1, w.shape[2])
        strides, dil = [1, *op.attrs.get("strides", [1])], [1, *op.attrs.get("dilations", [1])]
        p = list(op.attrs.get("pads", [0, 0]))
        pads = [0, p[0], 0, p[1]]
    else:
        kernel = w.shape[2:]
        strides, dil = list(op.attrs.get("strides", [1, 1])), list(op.attrs.get("dilations", [1, 1]))
        pads = list(op.attrs.get("pads", [0, 0, 0, 0]))
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    out_h = (h + pads[0] + pads[2] - dil[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    out_w = (wd + pads[1] + pads[3] - dil[1] * (kernel[1] - 1) - 1) // strides[1] + 1
    total = n * out_h * out_w
    pick = np.sort(rng.choice(total, size=min(count, total), replace=False))
    b, rest = np.divmod(pick, out_h * out_w)
    oh, ow = np.divmod(rest, out_w)
    hi = oh[:, None] * strides[0] + np.arange(kernel[0])[None, :] * dil[0]  # (R, kh)
    wi = ow[:, None] * strides[1] + np.arange(kernel[1])[None, :] * dil[1]  # (R, kw)
    patches = xp[b[:, None, None, None], np.arange(c)[None, :, None, None], hi[:, None, :, None], wi[:, None, None, :]]
    return patches.reshape(len(pick), layer.groups, -1).astype(np.float32)
