"""Resize (opset 10-19+) and Upsample, nearest / linear / cubic, N-dimensional and separable.

Coordinates are computed in float32 with onnxruntime's formula order so that nearest-mode
rounding ties fall exactly where onnxruntime's do. For every output index x on an axis with
scale s (given, or out/in when ``sizes`` is given), input length L and output length R:

* half_pixel:           (x + 0.5) / s - 0.5
* pytorch_half_pixel:   (x + 0.5) / s - 0.5 if R > 1 else 0
* align_corners:        x * (L - 1) / (R' - 1) if R > 1 else 0, where R' is the resized length
                        ONNX's reference divides by: s L (not rounded) when ``scales`` is given,
                        R when ``sizes`` is
* asymmetric:           x / s
* tf_half_pixel_for_nn: (x + 0.5) / s
* tf_crop_and_resize:   start (L - 1) + x (end - start)(L - 1) / (R - 1) if R > 1 else
                        0.5 (start + end)(L - 1); samples outside [0, L - 1] give
                        ``extrapolation_value``
* half_pixel_symmetric: L/2 (1 - R / (s L)) + (x + 0.5) / s - 0.5

An axis whose scale is exactly 1 maps identically, and an output the same shape as the input
is a copy (onnxruntime's rules). Interpolation is separable (one axis after the other):

* nearest: index = round_prefer_floor | round_prefer_ceil | floor | ceil of the coordinate,
  clamped to [0, L - 1]; an axis whose index map is "repeat every element k times" (integer
  up-scaling in most modes) is done with k block copies instead of a gather;
* linear: coordinate clamped to [0, L - 1], i1 = floor, i2 = min(i1 + 1, L - 1),
  y = x[i1] (i2 - c) + x[i2] (c - i1) (0.5 / 0.5 at the last element);
* cubic: Keys kernel with coefficient ``cubic_coeff_a`` over taps floor(c) - 1 .. floor(c) + 2
  (indices clamped to the edge; with ``exclude_outside`` the outside taps get weight 0 and the
  rest are renormalised);
* ``antialias`` (linear and cubic, on axes that shrink): the kernel stretched by 1 / scale
  (:func:`_antialias_taps`, as ONNX's reference computes it).

Output size from scales is trunc(s * L) in float32; from sizes with
keep_aspect_ratio_policy not_larger/not_smaller, one scale (min/max of out/in over the axes)
is used and out = round(s * L).
"""
from __future__ import annotations

import math

import numpy as np

from qir.runtimes.numpy_ref.kernels import _parallel
from qir.runtimes.numpy_ref.registry import kernel

_F = np.float32


def _present(t) -> bool:
    return t is not None and np.size(t) > 0


def _original_coords(mode: str, out_len: int, in_len: int, scale, roi_start, roi_end,
                     resized_len: float | None = None) -> np.ndarray:
    """Input coordinate (float32) of each output index on one axis; ``resized_len``: the
    (unrounded) length align_corners divides by, when it is not ``out_len``."""
    x = np.arange(out_len, dtype=_F)
    s = _F(scale)
    L = _F(in_len)
    R = _F(out_len)
    half = _F(0.5)
    if mode == "half_pixel":
        return (x + half) / s - half
    if mode == "asymmetric":
        return x / s
    if mode == "pytorch_half_pixel":
        return (x + half) / s - half if out_len > 1 else np.zeros(out_len, _F)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / s
    if mode == "align_corners":
        if out_len == 1:
            return np.zeros(out_len, _F)
        if resized_len is not None and resized_len != out_len:  # scales whose s L is not whole
            return (np.arange(out_len) * (in_len - 1.0) / (resized_len - 1.0)).astype(_F)
        return (x * (L - _F(1))) / (R - _F(1))
    if mode == "tf_crop_and_resize":
        rs, re = _F(roi_start), _F(roi_end)
        if out_len > 1:
            return rs * (L - _F(1)) + (x * (re - rs) * (L - _F(1))) / (R - _F(1))
        return np.full(out_len, 0.5 * (float(rs) + float(re)) * (float(L) - 1.0), dtype=_F)
    if mode == "half_pixel_symmetric":
        adjustment = R / (s * L)
        offset = (L / _F(2)) * (_F(1) - adjustment)
        return (np.float64(offset) + (x.astype(np.float64) + 0.5) / np.float64(s) - 0.5).astype(_F)
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _round_half_away(c: np.ndarray) -> np.ndarray:
    a = np.abs(c)
    f = np.floor(a)
    return np.copysign(f + (a - f >= _F(0.5)), c)


def _nearest_index(c: np.ndarray, nearest_mode: str, downsample: bool) -> np.ndarray:
    if nearest_mode == "round_prefer_floor":
        tie = c == np.trunc(c) + _F(0.5)
        r = np.where(tie, np.floor(c), _round_half_away(c))
    elif nearest_mode == "round_prefer_ceil":
        r = _round_half_away(c)
    elif nearest_mode == "floor":
        r = np.floor(c)
    elif nearest_mode == "ceil":
        r = np.ceil(c)
    elif nearest_mode == "simple":  # Resize-10 / Upsample
        r = np.ceil(c) if downsample else np.trunc(c)
    else:
        raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r}")
    return r.astype(np.int64)


def _cubic_coeffs(s: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic weights (T, 4) of the taps floor-1 .. floor+2 for fractional offsets s."""
    s = s.astype(np.float64)
    a = float(_F(a))
    p1 = s + 1
    q = 1 - s
    q1 = 2 - s
    w0 = ((a * p1 - 5 * a) * p1 + 8 * a) * p1 - 4 * a
    w1 = ((a + 2) * s - (a + 3)) * s * s + 1
    w2 = ((a + 2) * q - (a + 3)) * q * q + 1
    w3 = ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a
    return np.stack([w0, w1, w2, w3], axis=1)


def _axis_order(in_shape, out_shape, axes) -> list[int]:
    """Order in which to resample ``axes`` (separable passes): ascending or descending,
    whichever moves fewer elements, a gather along the last (contiguous) axis counting 4x
    (it is an element-wise gather, the others copy whole rows). Only rounding can differ."""
    axes = list(axes)
    last = len(in_shape) - 1

    def cost(order):
        shape = list(in_shape)
        total = 0
        for ax in order:
            shape[ax] = int(out_shape[ax])
            total += math.prod(shape) * (4 if ax == last else 1)
        return total

    asc, desc = sorted(axes), sorted(axes, reverse=True)
    return desc if cost(desc) < cost(asc) else asc


def _apply_taps(y: np.ndarray, axis: int, idx: np.ndarray, w: np.ndarray) -> np.ndarray:
    """out[..., o, ...] = sum_t w[o, t] * y[..., idx[o, t], ...] along ``axis``."""
    bshape = [1] * y.ndim
    bshape[axis] = -1
    out = np.take(y, np.ascontiguousarray(idx[:, 0]), axis=axis)
    out *= w[:, 0].astype(y.dtype).reshape(bshape)
    term = _parallel.scratch("resize_term", out.shape, out.dtype)  # reused: no fresh pages
    for t in range(1, idx.shape[1]):
        np.take(y, np.ascontiguousarray(idx[:, t]), axis=axis, out=term)
        term *= w[:, t].astype(y.dtype).reshape(bshape)
        out += term
    return out


def _resize(
    X, scales_full, out_shape, roi_full, mode, ctm, nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value,
    lengths=None, antialias=0,
):
    X = np.asarray(X)
    lengths = lengths or [None] * X.ndim
    if tuple(out_shape) == X.shape:
        return X.copy()
    rank = X.ndim
    extrapolate = ctm == "tf_crop_and_resize"
    outside = []  # (axis, bool mask over the output positions) for tf_crop_and_resize
    if mode == "nearest":
        gathers, repeats = [], {}
        for ax in range(rank):
            L, R = X.shape[ax], int(out_shape[ax])
            if scales_full[ax] == _F(1.0) and L == R:
                continue
            if scales_full[ax] == _F(1.0):
                idx = np.minimum(np.arange(R), L - 1)
            else:
                c = _original_coords(ctm, R, L, scales_full[ax], roi_full[ax], roi_full[rank + ax], lengths[ax])
                if extrapolate:
                    outside.append((ax, (c < 0) | (c > _F(L - 1))))
                idx = np.clip(_nearest_index(c, nearest_mode, scales_full[ax] < 1), 0, L - 1)
            k = R // L if L else 0
            if k >= 1 and R == k * L and np.array_equal(idx, np.repeat(np.arange(L), k)):
                repeats[ax] = k
            else:
                gathers.append((ax, idx))
        y = X
        gather_idx = dict(gathers)
        for ax in _axis_order(X.shape, out_shape, gather_idx):
            y = np.take(y, gather_idx[ax], axis=ax)
        for ax in sorted(repeats, reverse=True):
            y = _repeat_axis(y, ax, repeats[ax])
        if y is X:
            y = X.copy()
    elif mode in ("linear", "cubic"):
        y = X
        work_dtype = X.dtype if np.issubdtype(X.dtype, np.floating) else np.float32
        y = y.astype(work_dtype, copy=False)
        for ax in _axis_order(X.shape, out_shape, range(rank)):
            L, R = X.shape[ax], int(out_shape[ax])
            if scales_full[ax] == _F(1.0) and L == R:
                continue  # identity axis (onnxruntime uses c = x here)
            if scales_full[ax] == _F(1.0):
                c = np.arange(R, dtype=_F)
            else:
                c = _original_coords(ctm, R, L, scales_full[ax], roi_full[ax], roi_full[rank + ax], lengths[ax])
            if extrapolate:
                outside.append((ax, (c < 0) | (c > _F(L - 1))))
            if antialias and scales_full[ax] < _F(1.0):
                idx, w = _antialias_taps(c, L, float(scales_full[ax]), mode, cubic_coeff_a, exclude_outside)
            elif mode == "linear":
                cc = np.clip(c, _F(0), _F(L - 1))
                i1 = np.minimum(cc.astype(np.int64), L - 1)
                i2 = np.minimum(i1 + 1, L - 1)
                d1 = np.abs(cc - i1.astype(_F))
                d2 = np.abs(cc - i2.astype(_F))
                same = i1 == i2
                d1[same] = 0.5
                d2[same] = 0.5
                idx = np.stack([i1, i2], axis=1)
                w = np.stack([d2, d1], axis=1)
            else:
                base = np.floor(c).astype(np.int64)
                w = _cubic_coeffs(c - np.floor(c), cubic_coeff_a)
                raw = base[:, None] + np.arange(-1, 3)[None, :]
                if exclude_outside:
                    w = np.where((raw < 0) | (raw >= L), 0.0, w)
                    w = w / w.sum(axis=1, keepdims=True)
                idx = np.clip(raw, 0, L - 1)
            y = _apply_taps(y, ax, idx, w)
        if y is X:
            y = X.copy()
        if y.dtype != X.dtype:  # integer input: interpolate in float32, truncate (onnxruntime NCHW)
            y = np.trunc(y).astype(X.dtype)
    else:
        raise ValueError(f"Resize: unknown mode {mode!r}")
    if outside and any(m.any() for _, m in outside):
        mask = np.zeros(y.shape, dtype=bool)
        for ax, m in outside:
            shp = [1] * rank
            shp[ax] = -1
            mask |= m.reshape(shp)
        y = np.where(mask, np.asarray(extrapolation_value, dtype=y.dtype), y)
    return y


def _antialias_taps(c: np.ndarray, L: int, scale: float, mode: str, a: float,
                    exclude_outside) -> tuple[np.ndarray, np.ndarray]:
    """(indices, weights) of antialiased down-sampling on one axis, as ONNX's reference computes
    them: the linear (triangle) or cubic (Keys) kernel stretched by 1 / scale, so each output
    averages every input it covers; n = 2 - 2 start taps (start = floor(-1 / scale) + 1, or
    floor(-2 / scale) + 1 for cubic) around the coordinate, weights normalised to sum 1,
    indices clamped to the edge (or, with ``exclude_outside``, outside taps weighted 0)."""
    c = c.astype(np.float64)
    base = np.floor(c)
    ratio = np.where(c == base, 1.0, c - base)  # an exact integer counts from the pixel on its left
    start = int(np.floor((-2.0 if mode == "cubic" else -1.0) / scale) + 1)
    n = 2 - 2 * start
    t = np.abs((np.arange(start, start + n)[None, :] - ratio[:, None]) * scale)
    if mode == "cubic":
        a = float(_F(a))
        w = np.where(t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
                     np.where(t < 2, ((a * t - 5 * a) * t + 8 * a) * t - 4 * a, 0.0))
    else:
        w = np.clip(1 - t, 0, 1)
    w = w / w.sum(axis=1, keepdims=True)
    pad = -(-n // 2)
    padded = c + pad
    p = np.floor(padded)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p.astype(np.int64) + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= L), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, L - 1), w


def _repeat_axis(y: np.ndarray, axis: int, k: int) -> np.ndarray:
    """np.repeat(y, k, axis) as k strided block copies into a (..., L, k, ...) buffer (much
    faster than np.repeat / broadcast copies for small k)."""
    if k == 1:
        return y
    shape = y.shape
    out = np.empty(shape[: axis + 1] + (k,) + shape[axis + 1:], dtype=y.dtype)
    for j in range(k):
        out[(slice(None),) * (axis + 1) + (j,)] = y
    return out.reshape(shape[:axis] + (shape[axis] * k,) + shape[axis + 1:])


def _resize_shapes(X, scales, sizes, roi, axes, policy):
    """(per-axis float32 scales, output shape, per-axis roi [starts..., ends...])."""
    rank = X.ndim
    axes = list(range(rank)) if axes is None or len(axes) == 0 else [int(a) % rank for a in axes]
    roi_full = [0.0] * rank + [1.0] * rank
    if _present(roi):
        r = np.asarray(roi, np.float32).ravel()
        if len(r) == 2 * rank and len(axes) == rank:
            roi_full = [float(v) for v in r]
        else:
            for i, ax in enumerate(axes):
                roi_full[ax] = float(r[i])
                roi_full[rank + ax] = float(r[len(axes) + i])
    scales_full = [_F(1.0)] * rank
    if _present(scales):
        s = np.asarray(scales, np.float32).ravel()
        for i, ax in enumerate(axes if len(s) != rank else range(rank)):
            scales_full[ax] = _F(s[i])
        out = [int(scales_full[i] * _F(X.shape[i])) for i in range(rank)]
        return scales_full, out, roi_full
    if not _present(sizes):
        raise ValueError("Resize: one of scales or sizes must be given")
    z = np.asarray(sizes, np.int64).ravel()
    out = list(X.shape)
    for i, ax in enumerate(axes if len(z) != rank else range(rank)):
        out[ax] = int(z[i])
    for i in range(rank):
        scales_full[i] = _F(1.0) if X.shape[i] == 0 else _F(out[i]) / _F(X.shape[i])
    if policy in ("not_larger", "not_smaller"):
        chosen = [scales_full[ax] for ax in axes]
        s = min(chosen) if policy == "not_larger" else max(chosen)
        for i in range(rank):
            if i in axes:
                scales_full[i] = s
                out[i] = int(_round_half_away(np.asarray(s * _F(X.shape[i]), _F)))  # std::round
            else:
                scales_full[i] = _F(1.0)
                out[i] = X.shape[i]
    elif policy != "stretch":
        raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
    return scales_full, out, roi_full


@kernel("Resize", context=("_opset",))
def resize(
    X,
    roi=None,
    scales=None,
    sizes=None,
    *,
    mode="nearest",
    coordinate_transformation_mode="half_pixel",
    nearest_mode="round_prefer_floor",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    antialias=0,
    axes=None,
    keep_aspect_ratio_policy="stretch",
    _opset=13,
):
    """ONNX Resize; inputs (X, roi, scales, sizes), empty tensors meaning absent. Opset 10
    (inputs X, scales) uses asymmetric coordinates and onnxruntime's legacy nearest rounding
    (ceil when down-sampling, truncation otherwise). See the module docstring for the maths."""
    X = np.asarray(X)
    if _opset < 11:
        scales, roi, sizes = roi, None, None
        coordinate_transformation_mode = "asymmetric"
        nearest_mode = "simple"
    scales_full, out, roi_full = _resize_shapes(X, scales, sizes, roi, axes, keep_aspect_ratio_policy)
    lengths = [float(s) * n for s, n in zip(scales_full, X.shape)] if _present(scales) else None
    return _resize(
        X, scales_full, out, roi_full, mode, coordinate_transformation_mode, nearest_mode,
        cubic_coeff_a, exclude_outside, extrapolation_value, lengths, antialias and mode != "nearest",
    )


@kernel("Upsample")
def upsample(X, scales=None, *, mode="nearest"):
    """Upsample (opsets 7-9): Resize with asymmetric coordinates and legacy nearest rounding;
    scales is an input (opset 9) or the ``scales`` attribute (opset 7) arriving as keyword."""
    X = np.asarray(X)
    scales_full, out, roi_full = _resize_shapes(X, np.asarray(scales, np.float32), None, None, None, "stretch")
    return _resize(X, scales_full, out, roi_full, mode, "asymmetric", "simple", -0.75, 0, 0.0)
