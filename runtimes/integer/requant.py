"""Requantization: an exact integer accumulator ``acc`` times a real ratio ``r`` (e.g.
``s_x·s_w/s_y``), rounded and saturated to an output integer range. Three modes, as a march
profile's ``requant_mode`` names them:

``float``
    ``y = rint(f32(acc) · f32(r))`` in float32, clamped to ``[qmin - zp, qmax - zp]`` first and
    rounded half to even (onnxruntime's ``MlasRequantizeOutput``).
``fixed16`` (``bits`` = the profile's ``requant_multiplier_bits``, 16 by default)
    ``m, e = frexp(r)``; ``M = floor(m·2^(bits-1) + 0.5)`` (``M = 2^(bits-1)`` becomes
    ``2^(bits-2)`` with ``e + 1``); ``n = bits - 1 - e``; ``y = round_shift(acc·M, n)`` with the
    profile's shift rounding (the bayes hbdk3 builder's 16-bit multiplier with 15 fractional bits).
``fixed32``
    gemmlowp / TFLite: ``M0 = round(m·2^31)`` (Q31), ``acc << max(e, 0)``, then
    ``SaturatingRoundingDoublingHighMul`` (``(a·M0 + nudge) / 2^31``, truncating, nudge
    ``±2^30``) and ``RoundingDivideByPOT`` by ``max(-e, 0)`` (half away from zero).

Every function works elementwise on numpy arrays; ``r`` (and the per-channel shift) broadcast
against ``acc``. Integer arithmetic is int64: ``|acc| < 2^47`` keeps ``acc·M`` exact for 16-bit
multipliers (int16×int16 sums of 2^16 terms stay below it).
"""
from __future__ import annotations

import numpy as np

__all__ = ["round_shift", "fixed_multiplier", "requantize", "requantize_pair", "saturate", "REQUANT_MODES"]

REQUANT_MODES = ("float", "fixed16", "fixed32")
_MAX_SHIFT = 62


def saturate(q: np.ndarray, qmin: int, qmax: int) -> np.ndarray:
    """``q`` clamped to ``[qmin, qmax]`` as int32 (never wraps)."""
    return np.clip(q, qmin, qmax).astype(np.int32)


def round_shift(x: np.ndarray, n: np.ndarray | int, mode: str = "half_up") -> np.ndarray:
    """``x / 2^n`` rounded to an integer by ``mode``, for int64 ``x`` and shifts ``n >= 0``
    (``n < 0`` shifts left, exactly).

    ``truncate``: floor (an arithmetic right shift); ``half_up``: ``(x + 2^(n-1)) >> n``;
    ``half_away``: half away from zero; ``half_to_even``: ties to the even result.
    """
    x = np.asarray(x, np.int64)
    n = np.asarray(n, np.int64)
    left = np.maximum(-n, 0)
    n = np.clip(n, 0, _MAX_SHIFT)
    x = np.left_shift(x, left)
    floor = np.right_shift(x, n)
    if mode == "truncate":
        return floor
    rem = x - np.left_shift(floor, n)           # 0 <= rem < 2^n
    half = np.where(n > 0, np.left_shift(np.int64(1), np.maximum(n - 1, 0)), 1)  # n = 0: rem is 0
    if mode == "half_up":
        up = rem >= half
    elif mode == "half_away":
        up = (rem > half) | ((rem == half) & (x >= 0))
    elif mode == "half_to_even":
        up = (rem > half) | ((rem == half) & (floor % 2 == 1))
    else:
        raise ValueError(f"unknown shift rounding {mode!r}")
    return floor + (up & (n > 0))


def fixed_multiplier(ratio: np.ndarray | float, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``(M, e)`` with ``ratio ≈ M · 2^(e - (bits - 1))``: an integer multiplier of ``bits`` bits
    (``2^(bits-2) <= M < 2^(bits-1)`` for a positive ratio) and its binary exponent."""
    m, e = np.frexp(np.asarray(ratio, np.float64))
    top = np.int64(1) << (bits - 1)
    mult = np.floor(m * float(top) + 0.5).astype(np.int64)
    carry = mult == top
    return np.where(carry, top >> 1, mult), np.where(carry, e + 1, e).astype(np.int64)


def _srdhm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32-range values (int64 arithmetic)."""
    ab = a * b
    nudge = np.where(ab >= 0, np.int64(1 << 30), np.int64(1 - (1 << 30)))
    total = ab + nudge
    high = np.where(total >= 0, total >> 31, -((-total) >> 31))  # C division truncates toward 0
    overflow = (a == b) & (a == -(1 << 31))
    return np.where(overflow, np.int64((1 << 31) - 1), high)


def _rounding_divide_by_pot(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: ``x / 2^n`` rounded half away from zero."""
    return round_shift(x, n, "half_away")


def requantize(acc: np.ndarray, ratio: np.ndarray | float, *, mode: str, qmin: int, qmax: int,
               zero_point: np.ndarray | int = 0, bits: int = 16, shift_round: str = "half_up",
               overwrite: bool = False) -> np.ndarray:
    """The output codes (zero point added, saturated to ``[qmin, qmax]``; float32 in ``float``
    mode, int32 otherwise) of the exact accumulator ``acc`` requantized by ``ratio`` (see the
    module docstring for each mode). ``overwrite``: a float32 ``acc`` may hold the codes."""
    zp = np.asarray(zero_point, np.int64)
    if mode == "float":
        # f32(acc)·f32(ratio) in float32 (a float64 acc is cast first), into a fresh array changed in place
        acc = np.asarray(acc)
        ratio = np.asarray(ratio, np.float32)
        if overwrite and acc.dtype == np.float32 and acc.ndim and acc.shape == np.broadcast_shapes(acc.shape, ratio.shape):
            value = np.multiply(acc, ratio, out=acc)
        else:
            value = np.array(np.multiply(acc, ratio, dtype=np.float32), ndmin=1, copy=None)
        if zp.any():
            lo, hi = np.asarray(qmin - zp, np.float32), np.asarray(qmax - zp, np.float32)
            np.clip(value, lo, hi, out=value)
            np.rint(value, out=value)
            value += zp.astype(np.float32)
        else:  # rint and clip commute at integer bounds
            np.rint(value, out=value)
            np.clip(value, np.float32(qmin), np.float32(qmax), out=value)
        return value.reshape(np.shape(acc)) if np.ndim(acc) == 0 else value
    acc = np.asarray(np.rint(acc), np.int64)
    if mode == "fixed16":
        mult, e = fixed_multiplier(ratio, bits)
        y = round_shift(acc * mult, (bits - 1) - e, shift_round)
    elif mode == "fixed32":
        mult, e = fixed_multiplier(ratio, 32)
        shifted = np.clip(np.left_shift(acc, np.maximum(e, 0)), -(1 << 31), (1 << 31) - 1)
        y = _rounding_divide_by_pot(_srdhm(shifted, mult), np.maximum(-e, 0))
    else:
        raise ValueError(f"unknown requant mode {mode!r}; expected one of {REQUANT_MODES}")
    return saturate(y + zp, qmin, qmax)


def requantize_pair(a: np.ndarray, ratio_a: float, b: np.ndarray, ratio_b: float, *, mode: str,
                    qmin: int, qmax: int, zero_point: int = 0, zp_a: int = 0, zp_b: int = 0, bits: int = 16,
                    shift_round: str = "half_up", fused: bool = True) -> np.ndarray:
    """``round((a - zp_a)·ratio_a + (b - zp_b)·ratio_b) + zero_point`` saturated, for integer code
    arrays ``a``, ``b``: the arithmetic of a quantized Add (Sub: pass ``-b`` and ``-zp_b``).

    ``float`` is onnxruntime's QLinearAdd (MLAS, AVX2): the zero points fold into a float32
    constant ``c = zp - fma(ratio_a, zp_a, ratio_b·zp_b)``, a scalar operand's product joins it, and
    the rest accumulate by fused multiply-adds ``fma(a, ratio_a, fma(b, ratio_b, c))``, rounded
    half to even. ``fused=False``: the same in float32 with each product rounded before its sum
    (fewer, narrower passes; equal codes only where checked, :func:`.tables.checked_pair`). Fixed
    modes: both ratios become multipliers at the shift of the larger one (one rescale to a common
    scale, one integer add, one rounding shift).
    """
    if mode == "float":
        a, b = np.asarray(a), np.asarray(b)  # integer-valued, below 2^24: exact in float64 below
        f32 = np.float32
        ra, rb = f32(ratio_a), f32(ratio_b)
        # the compiler contracts ratio_a·zp_a + ratio_b·zp_b into fma(ratio_a, zp_a, ratio_b·zp_b)
        const = f32(f32(zero_point) - _fma(np.int64(zp_a), ra, f32(rb * f32(zp_b))))
        fma = _fma if fused else _mul_add
        if b.size == 1 and a.size > 1:
            value = fma(a, ra, f32(const + f32(f32(b.reshape(())) * rb)))
        elif a.size == 1 and b.size > 1:
            value = fma(b, rb, f32(const + f32(f32(a.reshape(())) * ra)))
        else:
            value = fma(a, ra, fma(b, rb, const))
        value = np.array(value, ndmin=1, copy=None).reshape(np.shape(value))
        np.clip(value, f32(qmin), f32(qmax), out=value)
        return np.rint(value, out=value)  # float32 codes
    a, b = np.asarray(a, np.int64) - zp_a, np.asarray(b, np.int64) - zp_b
    width = bits if mode == "fixed16" else 32
    _, e = fixed_multiplier(max(ratio_a, ratio_b), width)
    n = (width - 1) - int(e)
    ma = np.int64(np.floor(ratio_a * 2.0 ** n + 0.5))
    mb = np.int64(np.floor(ratio_b * 2.0 ** n + 0.5))
    total = a * ma + b * mb
    return saturate(round_shift(total, n, shift_round if mode == "fixed16" else "half_away") + zero_point, qmin, qmax)


def _fma(x: np.ndarray, r: np.float32, c) -> np.ndarray:
    """float32 ``x·r + c`` rounded once (``x`` integers below 2^16: the float64 product is exact)."""
    wide = np.multiply(x, np.float64(r), dtype=np.float64)  # one pass: the cast happens inside the ufunc
    if np.shape(wide) == np.broadcast_shapes(np.shape(wide), np.shape(c)):
        wide += c
    else:  # c is the larger operand (a broadcast bias-like input)
        wide = wide + c
    return wide.astype(np.float32)


def _mul_add(x: np.ndarray, r: np.float32, c) -> np.ndarray:
    """float32 ``x·r + c`` with the product rounded first (into a fresh array, changed in place; a
    zero ``c`` not added: a ``-0.0`` product stays so)."""
    value = np.multiply(x, r, dtype=np.float32)
    if np.ndim(c) == 0 and c == 0:
        return value
    if np.shape(value) == np.broadcast_shapes(np.shape(value), np.shape(c)):
        value += c
    else:
        value = value + c
    return value
