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

A kernel returns None where it does not apply (the numpy interpreter's kernel then runs).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from qir.runtimes.numpy_ref.kernels.resize import _original_coords, _resize_shapes

__all__ = ["ORT_FLOAT_KERNELS", "bilinear"]

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


#: op type -> onnxruntime's float kernel (same signature as the numpy interpreter's).
ORT_FLOAT_KERNELS: dict[str, Callable] = {"Resize": bilinear}
