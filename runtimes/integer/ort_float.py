"""onnxruntime's float kernels where their arithmetic differs from the numpy interpreter's, for
the ops onnxruntime runs as ``DequantizeLinear -> op -> QuantizeLinear`` (the groups its QDQ
fusion leaves alone, :func:`.against_ort.ort_float_ops`): what the integer level of the ``ort``
profile computes there, so the QuantizeLinear after them sees onnxruntime's float value bit for
bit.

* Resize, ``linear`` over the last two axes of a 4-D tensor (onnxruntime's ``UpsampleBilinear``
  on x86): per output pixel, four float32 coefficients ``dx2·dy2``, ``dx1·dy2``, ``dx2·dy1``,
  ``dx1·dy1`` and ``((c11·X11 + c21·X21) + c12·X12) + c22·X22`` in float32, in that order
  (``dx1 = |x - x1|``, ``dx2 = |x - x2|``, 0.5 each at the last column); the numpy
  interpreter interpolates one axis after the other, which rounds differently. Checked against
  onnxruntime 1.32's CPU session (``tests/runtimes/integer/test_against_ort.py``).
* MatMul (MLAS SGEMM, ``MlasSgemmOperation``): K is cut into slices of ``StrideK`` (128; doubled
  while ``N < K`` and ``StrideN / 2 >= N``, ``StrideN`` from 128 down to 16); within a slice each
  output accumulates ``fma(a[m, k], b[k, n], acc)`` from zero in the order of k (the kernel's one
  accumulator per output), and each slice's sum is added to the output, ``C = C + acc``. The
  numpy interpreter's BLAS sums in another order: on ViT-S's 197x384x384 products that changes
  about 9 in 10 float32 results (by an ulp), and an int8 quantizer after them by one code now and
  then, which a transformer's LayerNorm spreads to whole tokens. The fused multiply-add is
  emulated in float64 (the product of two float32 is exact there; one rounding to float32 after
  the add, differing from a true fma only where the float64 sum lands on a float32 tie). A
  single-row A (MLAS's M = 1 kernel) is left to the numpy interpreter.
* ConvTranspose (``ConvTranspose::DoConvTranspose``): the columns ``Wᵀ·X`` by that SGEMM (A
  transposed: K slices of 128 whatever N), then col2im adding the kernel taps into a zeroed
  output in the order of the taps, then the bias; the numpy interpreter's col2im has that order,
  its GEMM not.

A kernel returns None where it does not apply (the numpy interpreter's kernel then runs).
"""
from __future__ import annotations

import itertools
from typing import Callable

import numpy as np

from qir.runtimes.numpy_ref.kernels.conv import convtranspose_geometry, tap_slices
from qir.runtimes.numpy_ref.kernels.resize import _original_coords, _resize_shapes

__all__ = ["ORT_FLOAT_KERNELS", "bilinear", "conv_transpose", "sgemm"]

_F = np.float32
_COORDINATES = ("half_pixel", "pytorch_half_pixel", "asymmetric", "align_corners")


def _taps(out_len: int, in_len: int, scale, mode: str):
    """(x1, x2, dx1, dx2) along one axis, as onnxruntime's SetupUpsampleBilinear computes them."""
    c = np.clip(_original_coords(mode, out_len, in_len, scale, 0.0, 1.0), _F(0), _F(in_len - 1))
    i1 = np.minimum(c.astype(np.int64), in_len - 1)
    i2 = np.minimum(i1 + 1, in_len - 1)
    d1, d2 = np.abs(c - i1.astype(_F)), np.abs(c - i2.astype(_F))
    same = i1 == i2
    d1[same], d2[same] = _F(0.5), _F(0.5)
    return i1, i2, d1.astype(_F), d2.astype(_F)


def bilinear(X, roi=None, scales=None, sizes=None, *, mode="nearest", coordinate_transformation_mode="half_pixel",
             antialias=0, axes=None, keep_aspect_ratio_policy="stretch", _opset=13, **_ignored):
    """onnxruntime's bilinear Resize (module docstring), or None where it does not apply."""
    X = np.asarray(X)
    if mode != "linear" or X.ndim != 4 or X.dtype != _F or antialias or _opset < 11 \
            or coordinate_transformation_mode not in _COORDINATES or keep_aspect_ratio_policy != "stretch":
        return None
    scales_full, out, _ = _resize_shapes(X, scales, sizes, roi, axes, keep_aspect_ratio_policy)
    if list(out[:2]) != list(X.shape[:2]) or (out[2], out[3]) == X.shape[2:]:
        return None
    y1, y2, dy1, dy2 = _taps(out[2], X.shape[2], scales_full[2], coordinate_transformation_mode)
    x1, x2, dx1, dx2 = _taps(out[3], X.shape[3], scales_full[3], coordinate_transformation_mode)
    top, bottom = X[:, :, y1], X[:, :, y2]
    ty, by = dy2[:, None], dy1[:, None]
    y = (dx2 * ty) * top[..., x1]
    y += (dx1 * ty) * top[..., x2]
    y += (dx2 * by) * bottom[..., x1]
    y += (dx1 * by) * bottom[..., x2]
    return y


def _stride_k(n: int, k: int, trans_a: bool = False) -> int:
    """MLAS SGEMM's K slice for an output of N columns (``MlasSgemmOperation``)."""
    stride_n, stride_k = 128, 128
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    elif not trans_a:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return stride_k


def sgemm(A, B, *, _trans_a: bool = False, **_ignored):
    """onnxruntime's float MatMul (module docstring), or None where it does not apply;
    ``_trans_a``: MLAS called with A transposed (its K slicing differs)."""
    A, B = np.asarray(A), np.asarray(B)
    if A.dtype != _F or B.dtype != _F or A.ndim < 2 or B.ndim < 2 or A.shape[-2] == 1 or A.shape[-1] != B.shape[-2]:
        return None
    k_total, n = A.shape[-1], B.shape[-1]
    stride = _stride_k(n, k_total, _trans_a)
    a, b = A.astype(np.float64), B.astype(np.float64)
    out = None
    for k0 in range(0, k_total, stride):
        acc = np.zeros(np.broadcast_shapes(A.shape[:-1] + (1,), B.shape[:-2] + (1, n)), _F)
        for k in range(k0, min(k_total, k0 + stride)):
            acc = (a[..., :, k:k + 1] * b[..., k:k + 1, :] + acc).astype(_F)
        out = acc if out is None else out + acc
    return out


def conv_transpose(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, output_padding=None,
                   output_shape=None, pads=None, strides=None, **_ignored):
    """onnxruntime's float ConvTranspose (module docstring), or None where it does not apply."""
    X, W = np.asarray(X), np.asarray(W)
    if X.dtype != _F or W.dtype != _F or X.ndim < 3:
        return None
    n_sp, (batch, channels), groups = X.ndim - 2, X.shape[:2], int(group)
    per_group, out_per_group, taps = channels // groups, W.shape[1], W.shape[2:]
    in_sp = X.shape[2:]
    dil, st = list(dilations or [1] * n_sp), list(strides or [1] * n_sp)
    out_sp, pb, _ = convtranspose_geometry(in_sp, taps, st, dil, output_padding, pads, auto_pad, output_shape)
    w = W.reshape(groups, per_group, -1).transpose(0, 2, 1)
    cols = sgemm(np.ascontiguousarray(w), X.reshape(batch, groups, per_group, -1), _trans_a=True)
    if cols is None:
        return None
    cols = cols.reshape((batch, groups * out_per_group) + tuple(taps) + tuple(in_sp))
    span = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(in_sp, st, taps, dil)]
    buf = np.zeros((batch, groups * out_per_group) + tuple(max(a, b + o) for a, b, o in zip(span, pb, out_sp)), _F)
    every = (slice(None), slice(None))
    for offs in itertools.product(*[range(k) for k in taps]):
        buf[every + tap_slices(offs, dil, st, in_sp)] += cols[every + offs]
    y = np.ascontiguousarray(buf[every + tuple(slice(b, b + o) for b, o in zip(pb, out_sp))])
    if B is not None:
        y += np.asarray(B, _F).reshape((1, -1) + (1,) * n_sp)
    return y


#: op type -> onnxruntime's float kernel (same signature as the numpy interpreter's).
ORT_FLOAT_KERNELS: dict[str, Callable] = {"Resize": bilinear, "MatMul": sgemm, "ConvTranspose": conv_transpose}
