"""Integer kernels: how each op computes on codes at the integer level.

A kernel takes an :class:`OpCall` (the node, its inputs - :class:`QTensor` or float arrays -, its
attributes, the float kernel of the op, and ``target``: the parameters of the calibration node
its output is requantized into, or None) and returns the outputs, or ``None`` when it does not
apply (an input is float, per-channel where it must be per-tensor, an attribute it does not
model): the interpreter then runs the op in float on dequantized inputs and reports it.

* GEMM (Conv, ConvTranspose, MatMul, Gemm): ``acc = Σ (x - zp_x)(w - zp_w)`` exactly - float32
  BLAS when ``max|x| · max_c Σ_k |w[c,k]| < 2^24`` bounds every partial sum (so each is exact),
  else float64 (exact below 2^53) -, ``+ round(b / (s_x·s_w))`` (and, for a Conv+Add the march fuses, the Add's other
  operand in accumulator units), the accumulator rule, then requantized by
  ``s_x·s_w / s_y`` per output channel; with no target, the high-precision output
  ``acc·s_x·s_w`` in float32.
* Add / Sub: ``(a - zp_a)·s_a/s_y ± (b - zp_b)·s_b/s_y`` (:func:`.requant.requantize_pair`);
  Mul: ``(a - zp_a)(b - zp_b)`` requantized by ``s_a·s_b/s_y``.
* Concat: each input rescaled to the output's parameters.
* Data movement (Reshape, Transpose, Slice, MaxPool, nearest Resize, ...): codes pass through
  unchanged with their parameters (per-tensor only).
* Relu / Clip: integer clamps at the codes of the bounds.
* GlobalAveragePool / AveragePool (no padding): the integer window sum requantized by
  ``s_x / (k·s_y)``.
* Unary nonlinear ops (Sigmoid, Tanh, HardSwish, Exp, Erf, ...): a table over every input code,
  ``T[q] = quantize_y(f(dequantize_x(q)))`` (256 entries for int8, 65536 for int16; the int16
  segment LUT is :mod:`.segment_lut`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from qir.calibration import along_axis
from qir.errors import QirError
from qir.records import OpRecord
from qir.runtimes.integer import tables
from qir.runtimes.integer.arithmetic import Arithmetic
from qir.runtimes.integer.qtensor import QParams, QTensor
from qir.runtimes.integer.tables import params_key

__all__ = ["OpCall", "INTEGER_KERNELS", "FLOAT_COMPOSITES", "IntegerDtypeError"]

_EXACT_F32 = 2.0 ** 24


class IntegerDtypeError(QirError):
    """A dtype combination the march does not allow at an op (e.g. int8 activation × int16 weight)."""


@dataclass
class OpCall:
    rec: OpRecord
    args: list
    kwargs: dict[str, Any]
    float_fn: Callable
    target: QParams | None
    arith: Arithmetic


def _per_tensor(*values) -> bool:
    return all(isinstance(v, QTensor) and v.params.per_tensor for v in values)


# --------------------------------------------------------------------------------------- GEMM
_OUT_AXIS = {"Conv": 1, "ConvTranspose": 1, "MatMul": -1, "Gemm": -1}


def _weight_axis(call: OpCall, w: QTensor) -> int:
    """The axis of ``w`` that is the output channel."""
    op = call.rec.op_type
    if op == "Conv":
        return 0
    if op == "ConvTranspose":
        return 1
    if op == "Gemm":
        return 0 if call.kwargs.get("transB", 0) else 1
    return w.codes.ndim - 1


def _check_pair(call: OpCall, x: QTensor, w: QTensor, weight_is_constant: bool) -> None:
    profile = call.arith.profile
    pair = (x.params.dtype, w.params.dtype)
    allowed = profile.allows_gemm(*pair) if weight_is_constant else profile.allows_matmul(*pair)
    if not allowed:
        raise IntegerDtypeError(
            f"node {call.rec.name!r} ({call.rec.op_type}) takes {pair[0]} × {pair[1]}, which march "
            f"{profile.name!r} does not allow (allowed: "
            f"{list(profile.gemm_dtype_pairs if weight_is_constant else profile.matmul_act_act_pairs)}); "
            "change one side's mode with qir set-mode")


def gemm(call: OpCall):
    x, w = call.args[0], call.args[1]
    if not isinstance(x, QTensor) or not isinstance(w, QTensor) or not x.params.per_tensor:
        return None
    if call.rec.op_type == "Gemm" and (call.kwargs.get("alpha", 1.0) != 1.0 or call.kwargs.get("transA", 0)):
        return None
    axis = _weight_axis(call, w)
    if not w.params.per_tensor and w.params.axis % w.codes.ndim != axis:
        return None
    _check_pair(call, x, w, weight_is_constant=w.weight or call.rec.op_type != "MatMul")
    # every partial sum of output channel c is at most max|x| · Σ_k |w[c, k]|; max|x| from the
    # code range where that bounds it below 2^24, else from the data
    xc, wc = x.centered(np.float32), w.centered(np.float32)
    l1 = _channel_l1(w, wc, axis)
    qmin, qmax = x.params.qrange
    zp = int(x.params.zero_point)
    bound = max(zp - qmin, qmax - zp) * l1
    if bound >= _EXACT_F32 and xc.size:
        bound = max(float(xc.max()), -float(xc.min()), 0.0) * l1
    if bound >= _EXACT_F32:
        xc, wc = xc.astype(np.float64), wc.astype(np.float64)  # integers below 2^24: the cast is exact
    acc = np.asarray(call.float_fn(xc, wc, **call.kwargs))
    out_axis = _OUT_AXIS[call.rec.op_type] % acc.ndim
    w_scale = w.params.scale
    acc_scale = (np.float32(x.params.scale) * w_scale).astype(np.float32)  # s_x·s_w in float32
    shaped = along_axis(acc_scale, out_axis, acc.ndim)
    bias = call.args[2] if len(call.args) > 2 else None
    if bias is not None:
        bias = bias.dequantize() if isinstance(bias, QTensor) else np.asarray(bias)
        if call.rec.op_type == "Gemm":
            bias = bias * call.kwargs.get("beta", 1.0)
        codes = call.arith.bias_codes(along_axis(bias, out_axis, acc.ndim) if bias.ndim == 1 else bias, shaped)
        acc, bound = _exact_sum(acc, codes, bound)
    if len(call.args) > 3 and call.args[3] is not None:  # an Add fused into the accumulator
        acc, bound = _exact_sum(acc, _in_accumulator(call.args[3], shaped), bound)
    acc = call.arith.accumulate(call.rec.name, acc, bound)
    if call.target is None:
        return (acc * shaped).astype(np.float32)
    ratio = along_axis((acc_scale / np.float32(call.target.scale)).astype(np.float32), out_axis, acc.ndim)
    return call.arith.requant(acc, ratio, call.target, overwrite=True)  # acc: this kernel's own array


def _channel_l1(w: QTensor, wc: np.ndarray, axis: int) -> float:
    """``max_c Σ_k |w[c, k] - zp|`` over output channels ``c`` along ``axis`` (kept with a weight's codes)."""
    key = ("l1", axis)
    if key in w.memo:
        return w.memo[key]
    l1 = float(np.abs(np.moveaxis(wc, axis, 0)).reshape(wc.shape[axis], -1).sum(1).max(initial=0))
    if w.weight:
        w.memo[key] = l1
    return l1


def _exact_sum(acc: np.ndarray, addend: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """``acc + addend`` exactly (``acc``, the caller's own array, reused where it can): in float32
    while ``bound`` (a bound on ``|acc|``) plus ``max|addend|`` stays below 2^24, else in float64
    (exact below 2^53); and that bound on the sum."""
    bound += float(np.abs(addend).max(initial=0))
    if acc.dtype == np.float32 and bound < _EXACT_F32:
        addend = addend.astype(np.float32, copy=False)
        if acc.ndim and acc.shape == np.broadcast_shapes(acc.shape, addend.shape):
            return np.add(acc, addend, out=acc), bound
        return acc + addend, bound
    return acc.astype(np.float64, copy=False) + addend, bound


def _in_accumulator(addend, acc_scale: np.ndarray) -> np.ndarray:
    """A fused Add's other operand in accumulator units: ``rint(e·s_e / (s_x·s_w))`` in float64
    (the int32 "sumin" path of a fused Conv+Add; its rescale arithmetic is assumed)."""
    if isinstance(addend, QTensor):
        scale, _ = addend.params.broadcast(addend.codes.ndim)
        real = addend.centered(np.float64) * np.float64(scale)
    else:
        real = np.asarray(addend, np.float64)
    return np.rint(real / np.asarray(acc_scale, np.float64))


# --------------------------------------------------------------------------------- elementwise
def add_sub(call: OpCall):
    a, b = call.args[:2]
    if call.target is None or not _per_tensor(a, b) or not call.target.per_tensor:
        return None
    return call.arith.requant_pair(a, b, call.target, subtract=call.rec.op_type == "Sub")


def mul(call: OpCall):
    a, b = call.args[:2]
    if call.target is None or not _per_tensor(a, b) or not call.target.per_tensor:
        return None
    # products of int8 codes (below 2^16 even in a uint8 frame) are exact in float32, int16 ones in float64
    wide = np.float64 if "int16" in (a.params.dtype, b.params.dtype) else np.float32
    acc = a.centered(wide) * b.centered(wide)
    ratio = np.float32(np.float32(a.params.scale) * np.float32(b.params.scale)) / np.float32(call.target.scale)
    return call.arith.requant(acc, np.float32(ratio), call.target, overwrite=True)


def concat(call: OpCall):
    if call.target is None or not _per_tensor(*call.args) or not call.target.per_tensor:
        return None
    parts = [call.arith.rescale(a, call.target).codes for a in call.args]
    return QTensor(np.concatenate(parts, axis=call.kwargs["axis"]), call.target)


# ------------------------------------------------------------------------------ data movement
def passthrough(call: OpCall):
    """Codes move unchanged (exact in float32 below 2^24); other inputs (shapes, indices) are
    plain arrays."""
    x, rest = call.args[0], call.args[1:]
    if not _per_tensor(x) or any(isinstance(a, QTensor) for a in rest):
        return None
    if call.rec.op_type in ("Resize", "Upsample") and call.kwargs.get("mode", "nearest") != "nearest":
        return None
    result = call.float_fn(x.codes.astype(np.float32, copy=False), *rest, **call.kwargs)
    outs = result if type(result) is tuple else (result,)
    if call.rec.op_type == "MaxPool":  # the optional Indices output is not a value
        return (QTensor(np.asarray(outs[0], np.float32), x.params), *outs[1:])
    wrapped = tuple(QTensor(np.asarray(o, np.float32), x.params) for o in outs)
    return wrapped if type(result) is tuple else wrapped[0]


def clamp(call: OpCall):
    """Relu / Clip on codes: ``clip(q, Q(lo), Q(hi))`` equals quantizing the clipped value,
    since quantization is monotonic and ``Q(DQ(q)) = q``. With a target of other parameters the
    codes are rescaled into it first, so that the bounds are quantized on the output's grid
    (clamping ``clip(x, 0, 6)`` at a coarse input scale would cut at the nearest input step,
    5.85 for a step of 0.65)."""
    x = call.args[0]
    if not _per_tensor(x):
        return None
    fresh = call.target is not None and call.target.per_tensor and not x.params.same_as(call.target)
    if fresh:
        x = call.arith.rescale(x, call.target)
    if call.rec.op_type == "Relu":
        lo, hi = 0.0, None
    else:
        lo = call.args[1] if len(call.args) > 1 and call.args[1] is not None else call.kwargs.get("min")
        hi = call.args[2] if len(call.args) > 2 and call.args[2] is not None else call.kwargs.get("max")
        if isinstance(lo, QTensor) or isinstance(hi, QTensor):
            return None
    bounds = [None if v is None else int(call.arith.quantize(np.asarray(v, np.float32), x.params).codes)
              for v in (lo, hi)]
    if all(b is None for b in bounds):
        return x
    # codes the rescale made are this kernel's own: clipped in place
    out = x.codes if fresh and x.codes.ndim and x.codes.dtype.kind == "f" else None
    return QTensor(np.clip(x.codes, *(None if b is None else x.codes.dtype.type(b) for b in bounds), out=out),
                   x.params)


# ------------------------------------------------------------------------------------ pooling
def average_pool(call: OpCall):
    x = call.args[0]
    if call.target is None or not _per_tensor(x) or not call.target.per_tensor:
        return None
    if call.rec.op_type == "GlobalAveragePool":
        count = math.prod(x.codes.shape[2:])
        acc = x.centered(np.int64).reshape(*x.codes.shape[:2], -1).sum(-1).reshape(*x.codes.shape[:2],
                                                                                  *([1] * (x.codes.ndim - 2)))
    else:
        if any(call.kwargs.get("pads") or ()) or call.kwargs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID") \
                or call.kwargs.get("ceil_mode", 0):
            return None
        count = math.prod(call.kwargs["kernel_shape"])
        acc = np.rint(np.asarray(call.float_fn(x.centered(np.float64), **call.kwargs)) * count)
    ratio = np.float32(x.params.scale) / np.float32(np.float32(call.target.scale) * np.float32(count))
    return call.arith.requant(call.arith.accumulate(call.rec.name, acc), ratio, call.target)


# ------------------------------------------------------------------------------- lookup tables
def table_lookup(call: OpCall):
    """A unary nonlinear op as a table over every input code (see the module docstring)."""
    x = call.args[0]
    if call.target is None or not _per_tensor(x) or any(a is not None for a in call.args[1:]):
        return None
    qmin, qmax = x.params.qrange

    def codes(c: np.ndarray) -> np.ndarray:
        domain = np.arange(qmin, qmax + 1, dtype=np.int32)
        table = call.arith.lut(QTensor(domain, x.params), partial(call.float_fn, **call.kwargs), call.target)
        return table[c.astype(np.intp) - qmin]

    attrs = _attrs_key(call.kwargs)
    if attrs is None:  # an attribute that is not a plain value: no table kept
        return QTensor(codes(x.codes), call.target)
    key = ("lut", call.arith.key, call.rec.op_type, call.float_fn, attrs, params_key(x.params), params_key(call.target))
    return QTensor(tables.unary(key, codes, x.codes, (qmin, qmax), always=True), call.target)


_PLAIN = (int, float, str, bool, type(None), np.generic)


def _attrs_key(kwargs: dict) -> tuple | None:
    """Attributes as a key (each value by type and repr: ``-0.0`` is not ``0.0``), or None when one
    is not a plain scalar (an array, whose repr may be cut short)."""
    if not all(isinstance(v, _PLAIN) for v in kwargs.values()):
        return None
    return tuple((k, type(v).__name__, repr(v)) for k, v in sorted(kwargs.items()))


def softmax(call: OpCall):
    """Softmax with ``softmax_mode = exp_table`` (onnxruntime's QLinearSoftmax): per row,
    ``e = f32(exp((q - max(q) + shift)·s_x))`` (``shift = max(0, logf(FLT_MAX / D) - 5) / s_x``, the
    logarithm and the division in float32),
    ``sum`` accumulated in float32 in order, ``y = rint(f32(e·floor(1/s_y)) / sum) + zp``."""
    x = call.args[0]
    if call.arith.profile.softmax_mode != "exp_table" or call.target is None or not _per_tensor(x) \
            or not call.target.per_tensor:
        return None
    opset = call.kwargs.get("_opset", 13)
    axis = call.kwargs.get("axis", -1 if opset >= 13 else 1) % x.codes.ndim
    if opset < 13:  # the input is viewed as 2-D: [N, D] from the axis on
        rows = x.codes.reshape(math.prod(x.codes.shape[:axis]), -1)
    else:
        rows = np.moveaxis(x.codes, axis, -1)
    d = rows.shape[-1]
    s_x = float(np.float32(x.params.scale))
    # log(FLT_MAX / D): a float32 division and a float32 log (``log`` of a float in C++ is logf)
    log_room = float(np.float32(math.log(np.float32(np.finfo(np.float32).max) / np.float32(d))))
    shift = max(0.0, log_room - 5.0) / s_x
    e = np.exp(((rows - rows.max(-1, keepdims=True)).astype(np.float64) + shift) * s_x).astype(np.float32)
    total = np.add.accumulate(e, axis=-1, dtype=np.float32)[..., -1:]
    y_scale = np.float32(math.floor(1.0 / float(np.float32(call.target.scale))))
    qmin, qmax = call.target.qrange
    codes = np.clip(np.rint((e * y_scale) / total).astype(np.int64) + int(call.target.zero_point), qmin, qmax)
    codes = codes.reshape(x.codes.shape) if opset < 13 else np.moveaxis(codes, -1, axis)
    return QTensor(codes.astype(np.int32), call.target)


_TABLE_OPS = ("Sigmoid", "Tanh", "Exp", "Log", "Reciprocal", "Sqrt", "Erf", "Gelu", "HardSigmoid", "HardSwish",
              "Softplus", "Softsign", "Elu", "Selu", "Celu", "Mish", "LeakyRelu", "Sin", "Cos", "Atan", "Neg",
              "Abs", "ThresholdedRelu")
_PASSTHROUGH_OPS = ("Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather",
                    "Identity", "Dropout", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "MaxPool",
                    "GlobalMaxPool", "Resize", "Upsample", "ReduceMax", "ReduceMin")

#: op type -> integer kernel.
INTEGER_KERNELS: dict[str, Callable[[OpCall], Any]] = {
    **{op: gemm for op in _OUT_AXIS},
    "Add": add_sub, "Sub": add_sub, "Mul": mul, "Concat": concat, "Softmax": softmax,
    "Relu": clamp, "Clip": clamp,
    "AveragePool": average_pool, "GlobalAveragePool": average_pool,
    **{op: passthrough for op in _PASSTHROUGH_OPS},
    **{op: table_lookup for op in _TABLE_OPS},
}

#: Ops the integer level emulates in float by design (composites of LUTs and integer ops on a
#: real NPU, whose decomposition is not public): dequantize, compute, requantize; reported, but
#: not as a CPU fallback.
FLOAT_COMPOSITES = ("Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization",
                    "GroupNormalization", "ReduceMean", "Div", "Pow", "ReduceSum", "ReduceL2")
