"""Shape, layout, indexing and constant-producing kernels.

Inputs that moved from attributes to inputs across opsets (Split ``split``, Squeeze/Unsqueeze
``axes``, Slice ``starts/ends/axes``, Pad ``pads``, Reshape ``shape``) keep the ONNX name for
both forms: the attribute arrives as a keyword of the same name and binds to the same
parameter, so one signature serves every opset. Layout ops may return views of their input.
"""
from __future__ import annotations

import math

import numpy as np

from qir.runtimes.numpy_ref.registry import kernel


def _ints(values) -> list[int]:
    return [int(v) for v in np.asarray(values).ravel()]


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


@kernel("Concat")
def concat(*inputs, axis):
    return np.concatenate([np.asarray(x) for x in inputs], axis=int(axis))


@kernel("Split", context=("_num_outputs",))
def split(input, split=None, *, axis=0, num_outputs=None, _num_outputs=1):  # noqa: A002
    """Split along ``axis`` into pieces of sizes ``split`` (input from opset 13, attribute
    before). Without sizes: ``num_outputs`` (attribute, opset 18) or the node's output count
    pieces of ceil(dim / n), the last one smaller if dim is not divisible. Returns a tuple."""
    x = np.asarray(input)
    ax = _axis(axis, x.ndim)
    dim = x.shape[ax]
    if split is not None and np.size(split):
        sizes = _ints(split)
        if sum(sizes) != dim:
            raise ValueError(f"Split: sizes {sizes} do not sum to dim {dim}")
    else:
        n = int(num_outputs) if num_outputs else int(_num_outputs)
        chunk = -(-dim // n)
        sizes = [min(chunk, max(0, dim - i * chunk)) for i in range(n)]
    bounds = np.cumsum(sizes)[:-1]
    return tuple(np.split(x, bounds, axis=ax))


@kernel("Slice")
def slice_(data, starts=None, ends=None, axes=None, steps=None):
    """data[starts:ends:steps] on ``axes`` (inputs from opset 10, attributes before).

    Per axis of size d: negative start/end get + d; then with step > 0 start and end are
    clamped to [0, d], with step < 0 start to [0, d - 1] and end to [-1, d - 1] (-1 = before
    the first element). Steps default to 1, axes to 0..len(starts)-1 (negative allowed)."""
    x = np.asarray(data)
    starts = _ints(starts)
    ends = _ints(ends)
    axes = list(range(len(starts))) if axes is None or np.size(axes) == 0 else _ints(axes)
    steps = [1] * len(starts) if steps is None or np.size(steps) == 0 else _ints(steps)
    index = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise ValueError("Slice: step 0")
        a = _axis(a, x.ndim)
        d = x.shape[a]
        s = s + d if s < 0 else s
        e = e + d if e < 0 else e
        if st > 0:
            s = min(max(s, 0), d)
            e = min(max(e, 0), d)
            index[a] = slice(s, e, st)
        else:
            s = min(max(s, 0), d - 1)
            e = min(max(e, -1), d - 1)
            index[a] = slice(s, e if e >= 0 else None, st)
    return x[tuple(index)]


@kernel("Reshape")
def reshape(data, shape=None, *, allowzero=0):
    """Reshape to ``shape``: -1 is inferred; 0 copies the input dim at that position unless
    ``allowzero`` (then 0 is a real zero-size dim)."""
    x = np.asarray(data)
    target = _ints(shape)
    if not allowzero:
        target = [x.shape[i] if v == 0 else v for i, v in enumerate(target)]
    return x.reshape(target)


@kernel("Transpose")
def transpose(data, *, perm=None):
    x = np.asarray(data)
    return np.transpose(x, None if perm is None else [int(p) for p in perm])


@kernel("Flatten")
def flatten(input, *, axis=1):  # noqa: A002
    """2-D (prod(shape[:axis]), prod(shape[axis:])); axis in [-r, r]."""
    x = np.asarray(input)
    axis = int(axis)
    axis = axis + x.ndim if axis < 0 else axis
    lead = math.prod(x.shape[:axis])
    return x.reshape(lead, math.prod(x.shape[axis:]))


@kernel("Squeeze")
def squeeze(data, axes=None):
    """Drop the listed size-1 axes (input from opset 13, attribute before); all size-1 axes
    when none are given."""
    x = np.asarray(data)
    if axes is None or np.size(axes) == 0:
        return np.squeeze(x)
    return np.squeeze(x, axis=tuple(_axis(a, x.ndim) for a in _ints(axes)))


@kernel("Unsqueeze")
def unsqueeze(data, axes=None):
    """Insert size-1 axes at ``axes``, which index the *output* (rank r + len(axes))."""
    x = np.asarray(data)
    out_rank = x.ndim + np.size(axes)
    return np.expand_dims(x, tuple(sorted(_axis(a, out_rank) for a in _ints(axes))))


def _along(data, indices, axis: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``data`` as an array, ``indices`` as int64 with negative ones counted from the end of
    ``axis``, and ``axis`` made non-negative."""
    x = np.asarray(data)
    ax = _axis(axis, x.ndim)
    idx = np.asarray(indices, dtype=np.int64)
    return x, np.where(idx < 0, idx + x.shape[ax], idx), ax


@kernel("Gather")
def gather(data, indices, *, axis=0):
    """np.take along ``axis``; negative indices count from the end. Output rank is
    r + q - 1 (a 0-D index drops the axis)."""
    x, idx, ax = _along(data, indices, axis)
    return np.take(x, idx, axis=ax)


@kernel("GatherElements")
def gather_elements(data, indices, *, axis=0):
    """out[i][j][k] = data[index[i][j][k]][j][k] (for axis 0; likewise on other axes)."""
    x, idx, ax = _along(data, indices, axis)
    return np.take_along_axis(x, idx, axis=ax)


@kernel("GatherND")
def gather_nd(data, indices, *, batch_dims=0):
    """out[b..., i...] = data[b..., indices[b..., i..., :]] with the first ``batch_dims`` axes
    shared between data and indices."""
    x = np.asarray(data)
    idx = np.asarray(indices, dtype=np.int64)
    b = int(batch_dims)
    k = idx.shape[-1]
    batch_shape = x.shape[:b]
    B = math.prod(batch_shape)
    xb = x.reshape((B,) + x.shape[b:])
    ib = idx.reshape((B,) + idx.shape[b:])
    dims = np.asarray(x.shape[b:b + k])
    ib = np.where(ib < 0, ib + dims, ib)
    bidx = np.arange(B).reshape((B,) + (1,) * (ib.ndim - 2))
    out = xb[(bidx,) + tuple(ib[..., j] for j in range(k))]
    return out.reshape(batch_shape + idx.shape[b:-1] + x.shape[b + k:])


_SCATTER_UFUNC = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


@kernel("ScatterND")
def scatter_nd(data, indices, updates, *, reduction="none"):
    """Copy of data with out[indices[i...]] = updates[i...] (or combined with ``reduction``
    add/mul/max/min, duplicates accumulating in order)."""
    out = np.array(data, copy=True)
    idx = np.asarray(indices, dtype=np.int64)
    k = idx.shape[-1]
    dims = np.asarray(out.shape[:k])
    idx = np.where(idx < 0, idx + dims, idx)
    where = tuple(idx[..., j] for j in range(k))
    upd = np.asarray(updates, dtype=out.dtype)
    if reduction == "none":
        out[where] = upd
    else:
        _SCATTER_UFUNC[reduction].at(out, where, upd)
    return out


@kernel("ScatterElements", "Scatter")
def scatter_elements(data, indices, updates, *, axis=0, reduction="none"):
    """Copy of data with out[..., indices[i,j,k], ...] = updates[i,j,k] along ``axis``."""
    out = np.array(data, copy=True)
    ax = _axis(axis, out.ndim)
    idx = np.asarray(indices, dtype=np.int64)
    idx = np.where(idx < 0, idx + out.shape[ax], idx)
    grids = list(np.indices(idx.shape, sparse=True))
    grids[ax] = idx
    where = tuple(grids)
    upd = np.asarray(updates, dtype=out.dtype)
    if reduction == "none":
        out[where] = upd
    else:
        _SCATTER_UFUNC[reduction].at(out, where, upd)
    return out


@kernel("Expand")
def expand(input, shape):  # noqa: A002
    """Bidirectional broadcast of input with ``shape`` (result shape is their broadcast)."""
    x = np.asarray(input)
    target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return np.array(np.broadcast_to(x, target), copy=True)


@kernel("Tile")
def tile(input, repeats):  # noqa: A002
    return np.tile(np.asarray(input), _ints(repeats))


@kernel("Pad")
def pad(data, pads=None, constant_value=None, axes=None, *, mode="constant", value=0.0):
    """Pad (or, with negative pads, crop) each axis: pads = [x1_begin, x2_begin, ...,
    x1_end, x2_end, ...] for ``axes`` (all axes by default; the axes input is opset 18).
    Modes: constant (``constant_value`` input, or ``value`` attribute before opset 11, else
    0), reflect (mirror without repeating the edge), edge, wrap. ``pads`` is an input from
    opset 11 and an attribute before."""
    x = np.asarray(data)
    rank = x.ndim
    p = _ints(pads)
    ax = list(range(rank)) if axes is None or np.size(axes) == 0 else [_axis(a, rank) for a in _ints(axes)]
    if len(p) != 2 * len(ax):
        raise ValueError(f"Pad: {len(p)} pads for {len(ax)} axes")
    begin = [0] * rank
    end = [0] * rank
    for i, a in enumerate(ax):
        begin[a] = p[i]
        end[a] = p[len(ax) + i]
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(zip(begin, end)))
    x = x[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if not any(b or e for b, e in width):
        return np.array(x, copy=True)
    if mode == "constant":
        cv = value if constant_value is None or np.size(constant_value) == 0 else np.asarray(constant_value).ravel()[0]
        return np.pad(x, width, mode="constant", constant_values=np.asarray(cv).astype(x.dtype))
    if mode in ("reflect", "edge", "wrap"):
        return np.pad(x, width, mode=mode)
    raise ValueError(f"Pad: unknown mode {mode!r}")


@kernel("Shape")
def shape(data, *, start=0, end=None):
    """int64 1-D shape, sliced [start:end] with Python clamping (negative from the end)."""
    return np.asarray(np.shape(data)[int(start):None if end is None else int(end)], dtype=np.int64)


@kernel("Size")
def size(data):
    return np.asarray(np.size(data), dtype=np.int64)


@kernel("ConstantOfShape")
def constant_of_shape(input, *, value=None):  # noqa: A002
    """Tensor of shape ``input`` filled with value[0] (a 1-element tensor attribute; default
    float32 0)."""
    v = np.zeros(1, np.float32) if value is None else np.asarray(value)
    return np.full(tuple(_ints(input)), v.ravel()[0], dtype=v.dtype)


@kernel("Constant")
def constant(
    *, value=None, value_float=None, value_floats=None, value_int=None, value_ints=None,
    value_string=None, value_strings=None, sparse_value=None,
):
    """The one given attribute as a tensor: value (tensor), value_float (float32 scalar),
    value_floats (float32 1-D), value_int (int64 scalar), value_ints (int64 1-D), strings."""
    if value is not None:
        return np.array(value, copy=True)
    if value_float is not None:
        return np.asarray(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.asarray(list(value_floats), dtype=np.float32)
    if value_int is not None:
        return np.asarray(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.asarray(list(value_ints), dtype=np.int64)
    if value_string is not None:
        return np.asarray(value_string, dtype=object)
    if value_strings is not None:
        return np.asarray(list(value_strings), dtype=object)
    if sparse_value is not None:
        raise NotImplementedError("Constant with sparse_value is not supported")
    raise ValueError("Constant: no value attribute")


@kernel("Range")
def range_(start, limit, delta):
    """n = max(ceil((limit - start) / delta), 0) elements (the count computed in float64)
    start, start + delta, ... built by repeated addition in the input dtype, as onnxruntime
    does (float32 drift included)."""
    start = np.asarray(start).reshape(())
    dt = start.dtype
    limit = np.asarray(limit, dtype=dt).reshape(())
    delta = np.asarray(delta, dtype=dt).reshape(())
    if np.issubdtype(dt, np.integer):
        s, lim, d = int(start), int(limit), int(delta)
        n = max(-((s - lim) // d), 0)
        return (s + d * np.arange(n, dtype=np.int64)).astype(dt)
    # onnxruntime's count: the operands are widened to double before subtracting
    # (Range(0.1f, 100f, 0.1f) has 999 elements, not the 1000 of float32 arithmetic).
    n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    if n == 0:
        return np.zeros(0, dtype=dt)
    seq = np.full(n, delta, dtype=dt)
    seq[0] = start
    return np.add.accumulate(seq, dtype=dt)


@kernel("DepthToSpace")
def depth_to_space(input, *, blocksize, mode="DCR"):  # noqa: A002
    """(N, C, H, W) -> (N, C/b^2, H b, W b). DCR: channel = (by * b + bx) * C' + c;
    CRD: channel = c * b^2 + by * b + bx."""
    x = np.asarray(input)
    N, C, H, W = x.shape
    b = int(blocksize)
    c = C // (b * b)
    if mode == "DCR":
        t = x.reshape(N, b, b, c, H, W).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(N, c, b, b, H, W).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"DepthToSpace: unknown mode {mode!r}")
    return t.reshape(N, c, H * b, W * b)


@kernel("SpaceToDepth")
def space_to_depth(input, *, blocksize, mode="DCR"):  # noqa: A002
    """(N, C, H, W) -> (N, C b^2, H/b, W/b), the inverse of DepthToSpace in the same ``mode``
    (opset 28): DCR: channel = (by * b + bx) * C + c; CRD: channel = c * b^2 + by * b + bx."""
    x = np.asarray(input)
    N, C, H, W = x.shape
    b = int(blocksize)
    t = x.reshape(N, C, H // b, b, W // b, b)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"SpaceToDepth: unknown mode {mode!r}")
    return t.reshape(N, C * b * b, H // b, W // b)


@kernel("NonZero")
def nonzero(X):
    """int64 (rank, nnz) coordinates of the non-zero elements in row-major order."""
    x = np.asarray(X)
    if x.ndim == 0:  # onnxruntime treats a scalar as shape (1,)
        return np.zeros((1, int(bool(x))), dtype=np.int64)
    return np.asarray(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@kernel("Trilu")
def trilu(input, k=None, *, upper=1):  # noqa: A002
    """Upper (triu) or lower (tril) triangle of the last two dims, diagonal offset k."""
    x = np.asarray(input)
    kk = 0 if k is None or np.size(k) == 0 else int(np.asarray(k).ravel()[0])
    return np.triu(x, kk) if upper else np.tril(x, kk)
