"""Normalization kernels: BatchNormalization (inference), LayerNormalization,
InstanceNormalization, GroupNormalization, LpNormalization."""
from __future__ import annotations

import numpy as np

from qir.runtimes.numpy_ref.registry import kernel


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    """(1, C, 1, ..., 1) for broadcasting a per-channel vector over x."""
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


@kernel("BatchNormalization", context=("_num_outputs",))
def batch_normalization(
    X, scale, B, input_mean, input_var, *, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1,
    is_test=None, consumed_inputs=None, _num_outputs=1,
):
    """Inference: Y = X * a + b per channel (axis 1) with a = scale / sqrt(var + eps) and
    b = B - mean * a, both computed in float64 on the small per-channel vectors (two passes
    over X; the same folded form onnxruntime uses when it fuses BatchNormalization)."""
    if training_mode:
        raise NotImplementedError("BatchNormalization with training_mode=1 (batch statistics) is not supported")
    X = np.asarray(X)
    dt = X.dtype
    a = np.asarray(scale, np.float64) / np.sqrt(np.asarray(input_var, np.float64) + float(epsilon))
    b = np.asarray(B, np.float64) - np.asarray(input_mean, np.float64) * a
    shape = _channel_shape(X) if X.ndim >= 2 else (-1,)
    y = X * a.astype(dt).reshape(shape)
    y += b.astype(dt).reshape(shape)
    if _num_outputs > 1:
        # Opsets < 14 may declare (unused in inference) running-stat outputs: pass the inputs on.
        extra = (np.asarray(input_mean), np.asarray(input_var), np.asarray(input_mean), np.asarray(input_var))
        return (y,) + extra[: _num_outputs - 1]
    return y


@kernel("LayerNormalization", context=("_num_outputs",))
def layer_normalization(X, Scale, B=None, *, axis=-1, epsilon=1e-5, stash_type=1, _num_outputs=1):
    """Normalise over the trailing axes [axis, rank): Y = (X - mean) * inv_std * Scale + B with
    inv_std = 1 / sqrt(var + eps), var the biased variance (two-pass, in float32 or wider).
    Optional outputs Mean and InvStdDev have shape X.shape[:axis] + (1,) * (rank - axis)."""
    X = np.asarray(X)
    axis = int(axis) % X.ndim if X.ndim else 0
    axes = tuple(range(axis, X.ndim))
    work = np.float64 if X.dtype == np.float64 else np.float32
    x = X.astype(work, copy=False)
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(np.square(d), axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + np.asarray(epsilon, work))
    y = d * inv_std
    y *= np.asarray(Scale, work)
    if B is not None:
        y += np.asarray(B, work)
    y = y.astype(X.dtype, copy=False)
    if _num_outputs == 1:
        return y
    return (y, mean.astype(np.float32), inv_std.astype(np.float32))[:_num_outputs]


@kernel("InstanceNormalization")
def instance_normalization(X, scale, B, *, epsilon=1e-5):
    """Per (n, c): Y = (X - mean) / sqrt(var + eps) * scale[c] + B[c] over the spatial axes."""
    X = np.asarray(X)
    axes = tuple(range(2, X.ndim))
    mean = X.mean(axis=axes, keepdims=True)
    d = X - mean
    var = np.mean(np.square(d), axis=axes, keepdims=True)
    y = d / np.sqrt(var + np.asarray(epsilon, X.dtype))
    y *= np.asarray(scale, X.dtype).reshape(_channel_shape(X))
    y += np.asarray(B, X.dtype).reshape(_channel_shape(X))
    return y.astype(X.dtype, copy=False)


@kernel("GroupNormalization", context=("_opset",))
def group_normalization(X, scale, bias, *, num_groups, epsilon=1e-5, stash_type=1, _opset=21):
    """The channels (axis 1) in ``num_groups`` groups; each (n, group) normalised over its
    channels and spatial positions (biased variance, in float32 or wider), then
    Y = normalised * scale + bias per channel (opset 21) or per group (opset 18, deprecated)."""
    X = np.asarray(X)
    n, c, g = X.shape[0], X.shape[1], int(num_groups)
    work = np.float64 if X.dtype == np.float64 else np.float32
    x = X.astype(work, copy=False).reshape(n, g, -1)
    d = x - x.mean(axis=2, keepdims=True)
    var = np.mean(np.square(d), axis=2, keepdims=True)
    y = (d / np.sqrt(var + np.asarray(epsilon, work))).reshape(X.shape)
    scale, bias = np.asarray(scale, work), np.asarray(bias, work)
    if _opset < 21:  # one scale and bias per group
        scale, bias = np.repeat(scale, c // g), np.repeat(bias, c // g)
    y = y * scale.reshape(_channel_shape(X)) + bias.reshape(_channel_shape(X))
    return y.astype(X.dtype, copy=False)


@kernel("LpNormalization")
def lp_normalization(X, *, axis=-1, p=2):
    """X / ||X||_p along ``axis`` (p in {1, 2}); a zero norm gives 0."""
    X = np.asarray(X)
    if p == 1:
        norm = np.abs(X).sum(axis=axis, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.square(X).sum(axis=axis, keepdims=True))
    else:
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
    with np.errstate(all="ignore"):
        y = np.where(norm == 0, np.zeros((), X.dtype), X / norm)
    return y.astype(X.dtype, copy=False)
