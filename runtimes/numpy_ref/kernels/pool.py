"""Pooling kernels: MaxPool, AveragePool, LpPool, GlobalAveragePool, GlobalMaxPool, GlobalLpPool.

Window reductions are separable: a max (or sum) over a k1 x k2 window equals the max over k1
of the max over k2, also with strides and dilations, so each spatial axis is reduced in turn
with one numpy call per tap on strided slices - never a Python loop over pixels.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from qir.runtimes.numpy_ref.kernels.conv import _ints, pad_constant, resolve_pads
from qir.runtimes.numpy_ref.registry import kernel


def pool_geometry(in_spatial, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """(out sizes, begin pads, end pads, extra end pads) of a pooling node.

    out = floor((in + pb + pe - ext) / s) + 1, ext = (k - 1) d + 1; with ceil_mode the
    division rounds up, but (as onnxruntime and PyTorch do) a last window that would start
    inside the end padding is dropped: if (out - 1) s >= in + pb then out -= 1. ``extra`` is
    the padding beyond pe that ceil-mode windows overhang (never counted as padding).
    """
    n = len(in_spatial)
    ks = [int(k) for k in kernel_shape]
    st = _ints(strides, n, 1)
    dil = _ints(dilations, n, 1)
    ext = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    pb, pe = resolve_pads(in_spatial, ext, st, pads, auto_pad)
    out, extra = [], []
    for size, b, e, x, s in zip(in_spatial, pb, pe, ext, st):
        span = size + b + e - x
        if ceil_mode:
            o = -(-span // s) + 1
            if (o - 1) * s >= size + b:
                o -= 1
        else:
            o = span // s + 1
        out.append(o)
        extra.append(max(0, (o - 1) * s + x - (size + b + e)))
    return out, pb, pe, extra, ks, st, dil


def _reduce_axis(y, axis, k, d, s, out, op):
    """y reduced along ``axis`` over taps: res[o] = op_{j<k} y[o*s + j*d]."""

    def tap(j):
        idx = [slice(None)] * y.ndim
        idx[axis] = slice(j * d, j * d + (out - 1) * s + 1, s)
        return y[tuple(idx)]

    res = tap(0).copy()
    for j in range(1, k):
        op(res, tap(j), out=res)
    return res


def _lowest(dtype):
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return -np.inf
    return np.iinfo(dtype).min


@kernel("MaxPool", context=("_num_outputs",))
def max_pool(
    X,
    *,
    kernel_shape,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    pads=None,
    storage_order=0,
    strides=None,
    _num_outputs=1,
):
    """Max over each (dilated, strided) window; padding never wins (it is -inf / dtype min).

    The optional Indices output holds the flat index of the maximum in X (first maximum in
    window scan order), row-major over (N, C, spatial...) or, with storage_order=1, with the
    spatial dims column-major.
    """
    X = np.asarray(X)
    out, pb, pe, extra, ks, st, dil = pool_geometry(X.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xp = pad_constant(X, pb, [e + x for e, x in zip(pe, extra)], value=_lowest(X.dtype), scratch="pool_pad")
    y = xp
    for i in range(len(out)):
        y = _reduce_axis(y, 2 + i, ks[i], dil[i], st[i], out[i], np.maximum)
    if y is xp:
        y = xp.copy()
    if _num_outputs > 1:
        return y, _max_pool_indices(X, xp, out, pb, ks, st, dil, storage_order)
    return y


def _max_pool_indices(X, xp, out, pb, ks, st, dil, storage_order):
    n = len(out)
    N, C = X.shape[:2]
    sN, sC = xp.strides[:2]
    sS = xp.strides[2:]
    view = as_strided(
        xp,
        shape=(N, C) + tuple(out) + tuple(ks),
        strides=(sN, sC) + tuple(t * s for t, s in zip(st, sS)) + tuple(d * s for d, s in zip(dil, sS)),
        writeable=False,
    )
    flat = view.reshape((N, C) + tuple(out) + (-1,))
    arg = np.argmax(flat, axis=-1)
    taps = np.unravel_index(arg, tuple(ks))
    coords = []
    for i in range(n):
        o = np.arange(out[i]).reshape((1, 1) + tuple(out[i] if j == i else 1 for j in range(n)))
        coords.append(o * st[i] - pb[i] + taps[i] * dil[i])
    spatial = X.shape[2:]
    if storage_order:
        sp_idx = np.ravel_multi_index(tuple(reversed(coords)), tuple(reversed(spatial)))
    else:
        sp_idx = np.ravel_multi_index(tuple(coords), spatial)
    nc = (np.arange(N).reshape((N, 1) + (1,) * n) * C + np.arange(C).reshape((1, C) + (1,) * n))
    return (nc * math.prod(spatial) + sp_idx).astype(np.int64)


def _window_counts(size, b, e, k, d, s, out, include_pad):
    """Per-axis number of window taps that fall inside X (or inside X plus its explicit pads
    when ``include_pad``); ceil-mode overhang beyond the pads never counts."""
    lo, hi = (-b, size + e) if include_pad else (0, size)
    pos = np.arange(out)[:, None] * s - b + np.arange(k)[None, :] * d
    return ((pos >= lo) & (pos < hi)).sum(axis=1)


@kernel("AveragePool")
def average_pool(
    X,
    *,
    kernel_shape,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    pads=None,
    strides=None,
):
    """Mean over each window: separable sum of the zero-padded input divided by the number of
    counted taps, the outer product of per-axis counts (taps inside X, or inside X and its
    pads with count_include_pad=1; ceil-mode overhang is never counted)."""
    X = np.asarray(X)
    out, pb, pe, extra, ks, st, dil = pool_geometry(X.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xp = pad_constant(X, pb, [e + x for e, x in zip(pe, extra)], scratch="pool_pad")
    y = xp
    for i in range(len(out)):
        y = _reduce_axis(y, 2 + i, ks[i], dil[i], st[i], out[i], np.add)
    if y is xp:
        y = xp.copy()
    count = np.ones((), dtype=np.int64)
    for i, size in enumerate(X.shape[2:]):
        c = _window_counts(size, pb[i], pe[i], ks[i], dil[i], st[i], out[i], count_include_pad)
        count = np.multiply.outer(count, c)
    y /= count.astype(y.dtype)
    return y


@kernel("LpPool")
def lp_pool(X, *, kernel_shape, auto_pad="NOTSET", ceil_mode=0, dilations=None, p=2, pads=None, strides=None):
    """(sum over the window of |x|^p)^(1/p), zero padding."""
    X = np.asarray(X)
    out, pb, pe, extra, ks, st, dil = pool_geometry(X.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xp = pad_constant(np.abs(X) ** np.asarray(p, X.dtype), pb, [e + x for e, x in zip(pe, extra)])
    y = xp
    for i in range(len(out)):
        y = _reduce_axis(y, 2 + i, ks[i], dil[i], st[i], out[i], np.add)
    return (y ** np.asarray(1.0 / p, X.dtype)).astype(X.dtype)


@kernel("GlobalAveragePool")
def global_average_pool(X):
    """Mean over all spatial axes, keeping them as size-1 dims: one pairwise sum over the
    flattened spatial axis, divided by its length."""
    X = np.asarray(X)
    acc = np.float32 if X.dtype == np.float16 else X.dtype
    N, C = X.shape[:2]
    total = np.add.reduce(X.reshape(N, C, -1), axis=-1, dtype=acc)
    mean = total / np.asarray(math.prod(X.shape[2:]), dtype=acc)
    return mean.astype(X.dtype, copy=False).reshape((N, C) + (1,) * (X.ndim - 2))


@kernel("GlobalMaxPool")
def global_max_pool(X):
    X = np.asarray(X)
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)


@kernel("GlobalLpPool")
def global_lp_pool(X, *, p=2):
    X = np.asarray(X)
    s = (np.abs(X) ** np.asarray(p, X.dtype)).sum(axis=tuple(range(2, X.ndim)), keepdims=True)
    return (s ** np.asarray(1.0 / p, X.dtype)).astype(X.dtype)
