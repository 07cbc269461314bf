"""Reductions (Reduce*), ArgMax/ArgMin, TopK, CumSum.

``axes`` is an attribute in early opsets and an input later (ReduceSum from 13, the others
from 18); both arrive as the parameter ``axes`` (the attribute as a keyword of that name).
No axes means all axes, unless ``noop_with_empty_axes`` (then the input is returned).
"""
from __future__ import annotations

import math

import numpy as np

from qir.runtimes.numpy_ref.registry import kernel


def _reduce_axes(x: np.ndarray, axes, noop_with_empty_axes) -> tuple[int, ...] | None:
    """Normalised axes tuple; None means "return the input unchanged"."""
    if axes is None or np.size(axes) == 0:
        return None if noop_with_empty_axes else tuple(range(x.ndim))
    return tuple(sorted({int(a) % x.ndim if x.ndim else 0 for a in np.asarray(axes).ravel()}))


def _make_reduce(name: str, fn, doc: str):
    def k(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        x = np.asarray(data)
        ax = _reduce_axes(x, axes, noop_with_empty_axes)
        if ax is None:
            return x
        with np.errstate(all="ignore"):
            y = fn(x, ax, bool(keepdims))
        y = np.asarray(y)
        return y if y.dtype == x.dtype else y.astype(x.dtype)

    k.__name__ = name
    k.__doc__ = f"ONNX {name}: {doc}, over ``axes`` (keepdims, noop_with_empty_axes)."
    kernel(name)(k)
    return k


def _acc(x):
    """Accumulator dtype: float16 sums in float32, everything else in its own dtype."""
    return np.float32 if x.dtype == np.float16 else x.dtype


def _sum(x, ax, kd):
    return np.sum(x, axis=ax, keepdims=kd, dtype=_acc(x))


def _mean(x, ax, kd):
    if np.issubdtype(x.dtype, np.integer):
        n = math.prod([x.shape[a] for a in ax])
        s = np.sum(x, axis=ax, keepdims=kd, dtype=np.int64)
        return np.trunc(s / n)
    return np.mean(x, axis=ax, keepdims=kd, dtype=_acc(x))


def _lowest(dtype: np.dtype):
    """The identity of a maximum: -inf, the smallest integer, or False."""
    if dtype == np.bool_:
        return False
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _highest(dtype: np.dtype):
    """The identity of a minimum: +inf, the largest integer, or True."""
    if dtype == np.bool_:
        return True
    return np.inf if dtype.kind == "f" else np.iinfo(dtype).max


def _max(x, ax, kd):
    """Maximum; over an empty set the identity (ONNX: -inf, or the type's lowest value)."""
    return np.max(x, axis=ax, keepdims=kd, initial=_lowest(x.dtype))


def _min(x, ax, kd):
    """Minimum; over an empty set the identity (ONNX: +inf, or the type's highest value)."""
    return np.min(x, axis=ax, keepdims=kd, initial=_highest(x.dtype))


def _log_sum_exp(x, ax, kd):
    if x.size == 0:  # log of an empty sum: -inf
        return np.log(np.sum(x, axis=ax, keepdims=kd))
    m = np.max(x, axis=ax, keepdims=True)
    m = np.where(np.isfinite(m), m, np.zeros((), x.dtype))
    s = np.log(np.sum(np.exp(x - m), axis=ax, keepdims=True)) + m
    return s if kd else np.squeeze(s, axis=ax)


_make_reduce("ReduceSum", _sum, "sum")
_make_reduce("ReduceMean", _mean, "arithmetic mean (integer inputs truncate)")
_make_reduce("ReduceMax", _max, "maximum (-inf over an empty set)")
_make_reduce("ReduceMin", _min, "minimum (+inf over an empty set)")
_make_reduce("ReduceProd", lambda x, ax, kd: np.prod(x, axis=ax, keepdims=kd, dtype=x.dtype), "product")
_make_reduce("ReduceL1", lambda x, ax, kd: np.sum(np.abs(x), axis=ax, keepdims=kd, dtype=x.dtype), "sum of |x|")
_make_reduce(
    "ReduceL2",
    lambda x, ax, kd: np.sqrt(np.sum(np.square(x.astype(np.float64) if x.dtype.kind in "iu" else x), axis=ax, keepdims=kd)),
    "sqrt of the sum of squares",
)
_make_reduce("ReduceSumSquare", lambda x, ax, kd: np.sum(np.square(x), axis=ax, keepdims=kd, dtype=x.dtype), "sum of squares")
_make_reduce("ReduceLogSum", lambda x, ax, kd: np.log(np.sum(x, axis=ax, keepdims=kd, dtype=x.dtype)), "log of the sum")
_make_reduce("ReduceLogSumExp", _log_sum_exp, "log(sum(exp(x))) (max-shifted for stability)")


def _arg(x, axis, keepdims, select_last_index, fn):
    x = np.asarray(x)
    axis = int(axis) % x.ndim
    if select_last_index:
        n = x.shape[axis]
        idx = n - 1 - fn(np.flip(x, axis=axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = np.asarray(idx, dtype=np.int64)
    return np.expand_dims(idx, axis) if keepdims else idx


@kernel("ArgMax")
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    """int64 index of the maximum along ``axis``: first occurrence on ties, last with
    select_last_index=1."""
    return _arg(data, axis, keepdims, select_last_index, np.argmax)


@kernel("ArgMin")
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    """int64 index of the minimum along ``axis`` (ties as ArgMax)."""
    return _arg(data, axis, keepdims, select_last_index, np.argmin)


@kernel("TopK")
def topk(X, K=None, *, axis=-1, largest=1, sorted=1, k=None):  # noqa: A002
    """(values, int64 indices) of the K largest (or smallest) elements along ``axis``, in
    descending (ascending) order; equal values keep the lower index first (onnxruntime's
    order). A stable sort is used, so the order is the same for sorted=0. K is an input from
    opset 10 and the ``k`` attribute before."""
    x = np.asarray(X)
    k = int(np.asarray(K if K is not None else k).ravel()[0])
    axis = int(axis) % x.ndim
    n = x.shape[axis]
    if largest:
        # stable ascending sort of the reversed array, read backwards: descending values,
        # ties in increasing original index
        order = np.argsort(np.flip(x, axis=axis), axis=axis, kind="stable")
        order = n - 1 - np.flip(order, axis=axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


@kernel("CumSum")
def cumsum(x, axis, *, exclusive=0, reverse=0):
    """Running sum along ``axis`` (an input tensor); exclusive shifts by one (first = 0);
    reverse accumulates from the end."""
    x = np.asarray(x)
    ax = int(np.asarray(axis).ravel()[0]) % x.ndim
    y = np.flip(x, axis=ax) if reverse else x
    out = np.cumsum(y, axis=ax, dtype=x.dtype)
    if exclusive:
        head = np.zeros_like(np.take(out, [0], axis=ax))
        out = np.concatenate([head, np.take(out, np.arange(x.shape[ax] - 1), axis=ax)], axis=ax)
    return np.flip(out, axis=ax) if reverse else out
