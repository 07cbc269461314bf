"""A march profile's integer arithmetic, bound once per run: quantize, rescale, requantize,
the accumulator's width and overflow rule, and what happened (the :class:`IntegerStats`).

Every kernel of the integer level goes through one :class:`Arithmetic`, so the profile is read
in one place:

* ``quant_round`` rounds float -> int (a calibration node on a float value);
* ``requant_mode`` / ``requant_multiplier_bits`` / ``requant_shift_round`` requantize integer
  accumulators (:mod:`.requant`); ``high_precision_qpp`` keeps ``float`` requantization;
* ``acc_bits`` / ``acc_overflow`` bound the accumulators: ``warn`` and ``ignore`` keep the exact
  sum (``warn`` reports it), ``saturate`` clamps it, ``wrap`` wraps it two's-complement;
* ``bias_round`` rounds a float bias to the accumulator's scale.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from qir.runtimes.integer import tables
from qir.runtimes.integer.qtensor import QParams, QTensor
from qir.runtimes.integer.requant import requantize, requantize_pair, saturate
from qir.runtimes.integer.tables import params_key
from qir.runtimes.march import MarchProfile, rounding_function

__all__ = ["Arithmetic", "IntegerStats"]

logger = logging.getLogger(__name__)


@dataclass
class IntegerStats:
    """What one integer-level run did besides computing: accumulator overflows per node (count of
    elements past ``acc_bits``), the ops that ran in float (``{op_type: [node names]}``) and the
    ops emulated in float by design (Softmax & co. composites)."""

    overflows: Counter = field(default_factory=Counter)
    float_fallback: dict[str, list[str]] = field(default_factory=dict)
    float_composite: dict[str, list[str]] = field(default_factory=dict)

    def fell_back(self, op_type: str, name: str, *, composite: bool = False) -> None:
        (self.float_composite if composite else self.float_fallback).setdefault(op_type, []).append(name)


class Arithmetic:
    """The integer arithmetic of ``profile`` (see the module docstring)."""

    def __init__(self, profile: MarchProfile) -> None:
        self.profile = profile
        self.mode = "float" if profile.high_precision_qpp else profile.requant_mode
        self.bits = profile.requant_multiplier_bits
        self.shift_round = profile.requant_shift_round
        self.quant_round = rounding_function(profile.quant_round)
        self.bias_round = rounding_function(profile.bias_round)
        self.acc_range = (-(2 ** (profile.acc_bits - 1)), 2 ** (profile.acc_bits - 1) - 1)
        self.stats = IntegerStats()
        self.key = tables.profile_key(profile)  # the profile in the keys of :mod:`.tables`

    # -- float -> codes --------------------------------------------------------------------
    def quantize(self, x: np.ndarray, params: QParams) -> QTensor:
        """``clip(round(x / s) + zp)``, in float32 and in the order fake quantization uses."""
        x = np.asarray(x, np.float32)
        scale, zp = params.broadcast(x.ndim)
        q = np.asarray(np.divide(x, scale, dtype=np.float32))  # (a 0-d input gives a scalar: made an array)
        if self.quant_round is np.rint:
            np.rint(q, out=q)
        else:
            q = np.array(self.quant_round(q), dtype=np.float32, copy=None, ndmin=0)
        if np.any(zp):
            q += zp
        qmin, qmax = params.qrange
        np.clip(q, np.float32(qmin), np.float32(qmax), out=q)
        if q.size and np.isnan(np.add.reduce(q, axis=None)):  # NaN becomes qmin instead of garbage (as fmax would)
            q[np.isnan(q)] = qmin
        return QTensor(q, params)

    # -- codes -> codes ----------------------------------------------------------------------
    def requant(self, acc: np.ndarray, ratio: np.ndarray | float, params: QParams, *,
                overwrite: bool = False) -> QTensor:
        """Requantize an exact accumulator at scale ``s_acc`` into ``params`` (``ratio = s_acc / s``);
        ``overwrite``: ``acc`` is the caller's own, to be reused for the codes where it can."""
        qmin, qmax = params.qrange
        _, zp = params.broadcast(np.ndim(acc))
        codes = requantize(acc, ratio, mode=self.mode, qmin=qmin, qmax=qmax, zero_point=zp, bits=self.bits,
                           shift_round=self.shift_round, overwrite=overwrite)
        return QTensor(codes, params)

    def requant_pair(self, a: QTensor, b: QTensor, params: QParams, *, subtract: bool = False) -> QTensor:
        """``a ± b`` requantized into per-tensor ``params`` (:func:`.requant.requantize_pair`), in
        the target's integer frame (uint8 for an imported unsigned quantizer: onnxruntime folds
        the zero points into a float constant, so the frame changes its rounding). ``float``
        mode: in float32 without the fused multiply-add where that gives the same codes on every
        code pair (:func:`.tables.checked_pair`); fixed modes: through a table where one pays."""
        def exact(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self._pair_codes(x, a.params, y, b.params, params, subtract, fused=True)

        def fast(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return self._pair_codes(x, a.params, y, b.params, params, subtract, fused=False)

        key = ("pair", self.key, params_key(a.params), params_key(b.params), params_key(params), subtract)
        if self.mode == "float":
            return QTensor(tables.checked_pair(key, exact, fast, a.codes, a.params.qrange, b.codes, b.params.qrange),
                           params)
        found = tables.pair(key, exact, a.codes, a.params.qrange, b.codes, b.params.qrange)
        return QTensor(exact(a.codes, b.codes) if found is None else found, params)

    def _pair_codes(self, a: np.ndarray, pa: QParams, b: np.ndarray, pb: QParams, params: QParams,
                    subtract: bool, fused: bool) -> np.ndarray:
        qmin, qmax = params.qrange
        s_y = np.float32(params.scale)
        sign, frame = (-1, 0) if subtract else (1, params.frame)
        codes = requantize_pair(
            a + frame if frame else a, float(np.float32(pa.scale) / s_y),
            (sign * b + frame) if frame or subtract else b, float(np.float32(pb.scale) / s_y),
            mode=self.mode,
            qmin=qmin + frame, qmax=qmax + frame, zero_point=int(params.zero_point) + frame,
            zp_a=int(pa.zero_point) + frame, zp_b=sign * int(pb.zero_point) + frame, bits=self.bits,
            shift_round=self.shift_round, fused=fused)
        return codes - frame if frame else codes

    def rescale(self, q: QTensor, params: QParams) -> QTensor:
        """``q`` in other parameters. ``float`` mode: quantize its dequantized value (what a
        Q(DQ(x)) pair computes); fixed modes: requantize ``codes - zp`` by ``s_in / s_out``."""
        if q.params.same_as(params):
            return q
        if self.mode == "float":
            def exact(c: np.ndarray) -> np.ndarray:
                return self.quantize(QTensor(c, q.params).dequantize(), params).codes

            if not (q.params.per_tensor and params.per_tensor and self.quant_round is np.rint and q.codes.ndim):
                return QTensor(exact(q.codes), params)
            key = ("rescale", self.key, params_key(q.params), params_key(params))
            return QTensor(tables.checked_unary(key, exact, lambda c: _rescaled(c, q.params, params), q.codes,
                                                q.params.qrange), params)
        s_in, _ = q.params.broadcast(q.codes.ndim)
        s_out, _ = params.broadcast(q.codes.ndim)
        return self.requant(q.centered(np.int64), np.float64(s_in) / np.float64(s_out), params)

    def lut(self, domain: QTensor, fn: Callable[[np.ndarray], np.ndarray], params: QParams) -> np.ndarray:
        """The table of a unary op ``fn`` (its attributes bound) over the codes ``domain``: ``quantize(f(dequantize(q)))``
        (``lut_mode`` ``float``, and every int8 table); int16 inputs with ``lut_mode`` ``segment``
        use the segmented LUT of :mod:`.segment_lut`."""
        if self.profile.lut_mode == "segment" and domain.params.dtype == "int16":
            from qir.runtimes.integer.segment_lut import segment_table

            return segment_table(domain, fn, params, self.profile.lut_int16)
        y = np.asarray(fn(domain.dequantize()), np.float32)
        return self.quantize(y, params).codes

    # -- accumulators ------------------------------------------------------------------------
    def bias_codes(self, bias: np.ndarray, acc_scale: np.ndarray) -> np.ndarray:
        """A float bias at the accumulator's scale ``s_x·s_w``, rounded. The bias joins the
        accumulator, so it follows the accumulator's rule: saturated to the accumulator's width
        where the profile saturates or wraps it, exact where it keeps the exact sum (``warn`` /
        ``ignore``; :meth:`accumulate` reports a sum past the width). With int16 x int16, ``s_x·s_w``
        is small enough that a bias of 0.1 takes more than 31 bits: saturating it there while the
        products add up exactly turned dual-int16 YOLOv8n's output cosine from 0.99999 to 0.990."""
        q = self.bias_round(np.asarray(bias, np.float64) / np.asarray(acc_scale, np.float64))
        if self.profile.acc_overflow in ("saturate", "wrap"):
            return saturate(q, *self.acc_range).astype(np.int64)
        return q.astype(np.int64)

    def accumulate(self, node: str, acc: np.ndarray, bound: float | None = None) -> np.ndarray:
        """``acc`` (exact) under the profile's accumulator width and overflow rule (``bound``: a
        bound on ``|acc|``, within the width: nothing to check)."""
        lo, hi = self.acc_range
        if bound is not None and bound <= min(-lo, hi):
            return acc
        if acc.size == 0 or (acc.min() >= lo and acc.max() <= hi):
            return acc
        over = int(np.count_nonzero((acc < lo) | (acc > hi)))
        self.stats.overflows[node] += over
        rule = self.profile.acc_overflow
        if rule == "saturate":
            return np.clip(acc, lo, hi)
        if rule == "wrap":
            span = float(hi) - float(lo) + 1
            return np.mod(acc - lo, span) + lo
        return acc

    def report(self, overflows: bool = True, fallbacks: bool = True) -> None:
        """Log what the run did that a user must know (its overflows, its float fallbacks)."""
        stats = self.stats
        if overflows and stats.overflows and self.profile.acc_overflow != "ignore":
            worst = ", ".join(f"{n} ({c})" for n, c in stats.overflows.most_common(5))
            logger.warning("accumulator overflow past %d bits (%s) in %d node(s): %s", self.profile.acc_bits,
                           self.profile.acc_overflow, len(stats.overflows), worst)
        if fallbacks and stats.float_fallback:
            ops = "; ".join(f"{op} ({len(names)}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                            for op, names in sorted(stats.float_fallback.items()))
            logger.warning("integer level (%s): these ops read quantized values but ran in float (no integer kernel "
                           "in this march, or an output the calibrated model leaves unquantized, such as a graph "
                           "output), as an NPU would hand them to the CPU: %s", self.profile.name, ops)


def _rescaled(codes: np.ndarray, src: QParams, dst: QParams) -> np.ndarray:
    """float32 ``rint((q - zp)·(s_in/s_out)) + zp'`` clipped: one rounding less than
    ``quantize(dequantize(q))`` (equal codes only where checked, :func:`.tables.checked_unary`)."""
    zp_in, zp_out = int(src.zero_point), int(dst.zero_point)
    ratio = np.float32(np.float32(src.scale) / np.float32(dst.scale))
    value = np.multiply(codes - np.float32(zp_in) if zp_in else codes, ratio, dtype=np.float32)
    np.rint(value, out=value)
    if zp_out:
        value += np.float32(zp_out)
    qmin, qmax = dst.qrange
    return np.clip(value, np.float32(qmin), np.float32(qmax), out=value)
