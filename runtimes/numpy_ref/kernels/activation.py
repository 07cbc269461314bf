"""Activation kernels: pointwise nonlinearities, Clip, Softmax family, Hardmax.

All keep the input dtype; float32 stays float32 (constants are cast to the input dtype so numpy
does not promote to float64).
"""
from __future__ import annotations

import math

import numpy as np

from qir.runtimes.numpy_ref.kernels import _parallel
from qir.runtimes.numpy_ref.kernels.elementwise import erf_array
from qir.runtimes.numpy_ref.registry import kernel


def _c(value, x: np.ndarray):
    """A scalar constant in x's dtype (keeps float32 arithmetic in float32)."""
    return np.asarray(value, dtype=x.dtype)


def _extremes(x: np.ndarray):
    """(lowest, highest) of x's dtype: -inf/inf for floats, iinfo bounds for integers.
    np.clip with two explicit scalar bounds is numpy's fast (SIMD) path."""
    if np.issubdtype(x.dtype, np.floating):
        return _c(-np.inf, x), _c(np.inf, x)
    info = np.iinfo(x.dtype)
    return _c(info.min, x), _c(info.max, x)


def _positive_part(x):
    return np.clip(x, _c(0, x), _extremes(x)[1])


def _negative_part(x):
    return np.clip(x, _extremes(x)[0], _c(0, x))


@kernel("Relu")
def relu(x):
    """max(x, 0) (NaN propagates)."""
    return _positive_part(np.asarray(x))


@kernel("LeakyRelu")
def leaky_relu(x, *, alpha=0.01):
    """x if x >= 0 else alpha * x, as max(x, 0) + alpha * min(x, 0) (exact: one term is 0)."""
    x = np.asarray(x)
    y = _negative_part(x)
    y *= _c(alpha, x)
    y += _positive_part(x)
    return y


@kernel("PRelu")
def prelu(x, slope):
    """x if x >= 0 else slope * x, as max(x, 0) + slope * min(x, 0); slope broadcasts
    unidirectionally to x (e.g. (C, 1, 1))."""
    x = np.asarray(x)
    y = _negative_part(x)
    y *= np.asarray(slope, dtype=x.dtype)
    y += _positive_part(x)
    return y


def _sigmoid_into(src, dst):
    np.negative(src, out=dst)
    with np.errstate(over="ignore"):
        np.exp(dst, out=dst)
    dst += _c(1, dst)
    np.reciprocal(dst, out=dst)


@kernel("Sigmoid")
def sigmoid(x):
    """1 / (1 + exp(-x)) in x's dtype, in place in the output buffer (exp overflow to inf
    gives the correct limit 0); large inputs are split across threads."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"Sigmoid needs a float tensor, got {x.dtype}")
    return _parallel.unary(_sigmoid_into, x)


@kernel("Tanh")
def tanh(x):
    x = np.asarray(x)
    return _parallel.unary(lambda a, o: np.tanh(a, out=o), x)


@kernel("HardSigmoid")
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    """max(0, min(1, alpha * x + beta))."""
    x = np.asarray(x)
    t = x * _c(alpha, x)
    t += _c(beta, x)
    return np.clip(t, _c(0, x), _c(1, x), out=t)


@kernel("HardSwish")
def hard_swish(x):
    """x * max(0, min(1, x / 6 + 0.5)) (HardSigmoid with alpha = 1/6, beta = 0.5)."""
    x = np.asarray(x)
    t = x * _c(1.0 / 6.0, x)
    t += _c(0.5, x)
    np.clip(t, _c(0, x), _c(1, x), out=t)
    t *= x
    return t


@kernel("Clip")
def clip(x, min=None, max=None):  # noqa: A002 - ONNX input and attribute names
    """min(max(x, lo), hi). Bounds are inputs from opset 11 (``None``/empty = unbounded) and
    ``min``/``max`` attributes before (they arrive as the same keywords); if lo > hi the result
    is hi."""
    x = np.asarray(x)
    low, high = _extremes(x)
    if min is not None and np.size(min):
        low = np.asarray(min, dtype=x.dtype).reshape(())
    if max is not None and np.size(max):
        high = np.asarray(max, dtype=x.dtype).reshape(())
    out = np.maximum(x, low)  # two ufuncs: np.clip's Python wrapper costs more on small maps
    return np.minimum(out, high, out=out)


@kernel("Elu")
def elu(x, *, alpha=1.0):
    """x if x > 0 else alpha * (exp(x) - 1)."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):
        return np.where(x > 0, x, _c(alpha, x) * np.expm1(np.minimum(x, _c(0, x))))


@kernel("Celu")
def celu(x, *, alpha=1.0):
    """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    x = np.asarray(x)
    a = _c(alpha, x)
    return np.maximum(x, _c(0, x)) + np.minimum(_c(0, x), a * np.expm1(np.minimum(x, _c(0, x)) / a))


@kernel("Selu")
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """gamma * (x if x > 0 else alpha * (exp(x) - 1))."""
    x = np.asarray(x)
    neg = _c(alpha, x) * np.expm1(np.minimum(x, _c(0, x)))
    return _c(gamma, x) * np.where(x > 0, x, neg)


@kernel("ThresholdedRelu")
def thresholded_relu(x, *, alpha=1.0):
    x = np.asarray(x)
    return np.where(x > _c(alpha, x), x, _c(0, x))


@kernel("Softplus")
def softplus(x):
    """log(1 + exp(x)), overflow-safe via logaddexp(0, x)."""
    x = np.asarray(x)
    return np.logaddexp(_c(0, x), x)


@kernel("Softsign")
def softsign(x):
    x = np.asarray(x)
    return x / (_c(1, x) + np.abs(x))


@kernel("Mish")
def mish(x):
    """x * tanh(softplus(x))."""
    x = np.asarray(x)
    return x * np.tanh(np.logaddexp(_c(0, x), x))


@kernel("Gelu")
def gelu(x, *, approximate="none"):
    """approximate='none': 0.5 x (1 + erf(x / sqrt 2)) (erf in float64);
    approximate='tanh': 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = np.asarray(x)
    if approximate == "none":
        y = 0.5 * x.astype(np.float64) * (1.0 + erf_array(x.astype(np.float64) * np.sqrt(0.5)))
        return y.astype(x.dtype)
    if approximate == "tanh":
        inner = _c(np.sqrt(2.0 / np.pi), x) * (x + _c(0.044715, x) * x * x * x)
        return _c(0.5, x) * x * (_c(1, x) + np.tanh(inner))
    raise ValueError(f"Gelu: unknown approximate={approximate!r}")


def _softmax_axes(x: np.ndarray, axis, opset: int):
    """Return (array to normalise, normalisation axis, original shape).

    Opset < 13: coerce to 2-D (prod(shape[:axis]), prod(shape[axis:])) and normalise rows;
    default axis 1. Opset >= 13: normalise along ``axis`` only; default -1.
    """
    if opset < 13:
        axis = 1 if axis is None else int(axis)
        axis = axis + x.ndim if axis < 0 else axis
        lead = math.prod(x.shape[:axis])
        return x.reshape(lead, -1), 1
    axis = -1 if axis is None else int(axis)
    return x, axis


@kernel("Softmax", context=("_opset",))
def softmax(x, *, axis=None, _opset=13):
    """exp(x - max) / sum(exp(x - max)) along ``axis`` (see ``_softmax_axes`` for opset < 13)."""
    x = np.asarray(x)
    v, ax = _softmax_axes(x, axis, _opset)
    t = v - v.max(axis=ax, keepdims=True)
    np.exp(t, out=t)
    t /= t.sum(axis=ax, keepdims=True)
    return t.reshape(x.shape)


@kernel("LogSoftmax", context=("_opset",))
def log_softmax(x, *, axis=None, _opset=13):
    """(x - max) - log(sum(exp(x - max))) along ``axis`` (opset < 13: 2-D coercion)."""
    x = np.asarray(x)
    v, ax = _softmax_axes(x, axis, _opset)
    t = v - v.max(axis=ax, keepdims=True)
    t -= np.log(np.exp(t).sum(axis=ax, keepdims=True))
    return t.reshape(x.shape)


@kernel("Hardmax", context=("_opset",))
def hardmax(x, *, axis=None, _opset=13):
    """1 at the first maximum along ``axis``, 0 elsewhere (opset < 13: 2-D coercion)."""
    x = np.asarray(x)
    v, ax = _softmax_axes(x, axis, _opset)
    idx = np.argmax(v, axis=ax)
    out = np.zeros_like(v)
    np.put_along_axis(out, np.expand_dims(idx, ax), _c(1, x), axis=ax)
    return out.reshape(x.shape)
