"""Convolution kernels (Conv, ConvTranspose) for any number of spatial dims, plus shared
padding helpers used by the pooling kernels.

Everything stays in the input dtype (float32 in, float32 BLAS out); no float64 upcast.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from qir.runtimes.numpy_ref.kernels import _parallel
from qir.runtimes.numpy_ref.registry import kernel

# Upper bound, in bytes, of one im2col buffer; larger convolutions are done in row bands.
_IM2COL_BYTES = 8 << 20
# Target size, in bytes, of one depthwise accumulator block (channels processed together).
_DW_BLOCK_BYTES = 1 << 20
# Depthwise convolutions whose im2col buffer is at most this big use im2col + one batched
# matmul: on small feature maps that beats K multiply-adds (2-3x measured, 5x5 taps on 3x96).
_DW_IM2COL_BYTES = 4 << 20


def _ints(value, n: int, default: int) -> list[int]:
    if value is None or len(value) == 0:
        return [default] * n
    return [int(v) for v in value]


def _plain_pointwise(X, W, group, strides, pads, dilations, auto_pad) -> bool:
    """True for a 1x1 (any rank), stride-1, unpadded, ungrouped conv (dilations are moot)."""
    if int(group) != 1 or X.ndim < 3 or W.ndim != X.ndim or W.shape[1] != X.shape[1]:
        return False
    if any(k != 1 for k in W.shape[2:]):
        return False
    if strides is not None and any(s != 1 for s in strides):
        return False
    return not any(pads or ()) and (auto_pad or "NOTSET") in ("NOTSET", "VALID")


def resolve_pads(in_spatial, kernel_extent, strides, pads, auto_pad: str, ceil_mode: int = 0):
    """Begin/end pads of a Conv/Pool node.

    ``kernel_extent`` is the dilated kernel size (k - 1) * d + 1. For SAME_UPPER/SAME_LOWER the
    output is ceil(in / stride) and the total pad max(0, (out - 1) * stride + extent - in) is
    split in half, the odd element going at the end (UPPER) or the beginning (LOWER). VALID
    means no padding; NOTSET uses ``pads`` = [x1_begin, x2_begin, ..., x1_end, x2_end, ...].
    """
    n = len(in_spatial)
    auto_pad = auto_pad or "NOTSET"
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, ext, s in zip(in_spatial, kernel_extent, strides):
            out = -(-size // s)
            total = max(0, (out - 1) * s + ext - size)
            small, large = total // 2, total - total // 2
            if auto_pad == "SAME_UPPER":
                begin.append(small)
                end.append(large)
            else:
                begin.append(large)
                end.append(small)
        return begin, end
    if auto_pad == "VALID":
        return [0] * n, [0] * n
    if auto_pad != "NOTSET":
        raise ValueError(f"unknown auto_pad {auto_pad!r}")
    p = _ints(pads, 2 * n, 0)
    return p[:n], p[n:]


def pad_constant(x: np.ndarray, begin, end, value=0, scratch: str | None = None) -> np.ndarray:
    """x with ``begin``/``end`` elements of ``value`` added on each spatial axis (axes 2..).
    Returns x itself (no copy) when every pad is zero. With ``scratch`` the result lives in
    that per-thread reusable buffer (only the border is filled; the caller must not keep it)."""
    if not any(begin) and not any(end):
        return x
    shape = x.shape[:2] + tuple(s + b + e for s, b, e in zip(x.shape[2:], begin, end))
    interior = (slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(begin, x.shape[2:]))
    if scratch is None:
        out = np.full(shape, value, dtype=x.dtype) if value != 0 else np.zeros(shape, dtype=x.dtype)
    else:
        out = _parallel.scratch(scratch, shape, x.dtype)
        for i, (b, e) in enumerate(zip(begin, end)):
            lead = (slice(None),) * (2 + i)
            out[lead + (slice(0, b),)] = value
            out[lead + (slice(shape[2 + i] - e, shape[2 + i]),)] = value
    out[interior] = x
    return out


def _place(dst: np.ndarray, src: np.ndarray, begin) -> None:
    """dst[:, :, begin_i : begin_i + len_i, ...] = src and zero everywhere else (spatial axes
    from 2), touching every element of dst once."""
    for i, (b, size) in enumerate(zip(begin, src.shape[2:])):
        lead = (slice(None),) * (2 + i)
        dst[lead + (slice(0, b),)] = 0
        dst[lead + (slice(b + size, None),)] = 0
    dst[(slice(None), slice(None)) + tuple(slice(b, b + size) for b, size in zip(begin, src.shape[2:]))] = src


def tap_slices(offsets, dilations, strides, out_spatial):
    """Spatial slices selecting, for every output position, the input element under kernel
    tap ``offsets``: start o*d, step s, count out."""
    return tuple(
        slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, s, n in zip(offsets, dilations, strides, out_spatial)
    )


@kernel("Conv")
def conv(X, W, B=None, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """N-d grouped convolution (cross-correlation), Y[n, m] = sum_{c,k} W[m, c, k] X[n, g*Cg+c, o*s + k*d].

    Three paths, all on the zero-padded input Xp (no pad copy when pads are zero):

    * pointwise (all kernel dims 1): Y = W(G, Mg, Cg) @ Xp[..., ::s](N, G, Cg, L) - one matmul;
    * depthwise (Cg == 1, G == C, M = C * mult) on large maps: for each kernel tap,
      Y += Xp_tap * W[:, tap], where Xp_tap is a contiguous shifted view of (a stride phase
      of) Xp; no im2col (small maps take the general path: fewer, larger numpy calls);
    * general: im2col - an ``as_strided`` view of Xp shaped (N, G, Cg, k1..kn, o1..on) is
      copied to cols (N, G, Cg*K, L) (row order c, k1..kn = W's layout), then one batched
      matmul W(G, Mg, Cg*K) @ cols. Large inputs are processed in bands of output rows so the
      cols buffer stays under a few MB.
    """
    X = np.asarray(X)
    W = np.asarray(W)
    if W.dtype != X.dtype:
        W = W.astype(X.dtype)
    if _plain_pointwise(X, W, group, strides, pads, dilations, auto_pad):
        # the most common conv in mobile nets: one matmul, no geometry to work out
        N, C = X.shape[:2]
        y = np.matmul(W.reshape(W.shape[0], C), X.reshape(N, C, -1)).reshape((N, W.shape[0]) + X.shape[2:])
        if B is not None:
            y += np.asarray(B, dtype=X.dtype).reshape((1, -1) + (1,) * (X.ndim - 2))
        return y
    n = X.ndim - 2
    N, C = X.shape[:2]
    M, Cg = W.shape[:2]
    G = int(group)
    if C != Cg * G or M % G:
        raise ValueError(f"Conv: X has {C} channels, W {W.shape} with group={G}")
    Mg = M // G
    ks = W.shape[2:]
    dil = _ints(dilations, n, 1)
    st = _ints(strides, n, 1)
    ext = [(k - 1) * d + 1 for k, d in zip(ks, dil)]
    pb, pe = resolve_pads(X.shape[2:], ext, st, pads, auto_pad)
    out_sp = tuple((s + b + e - x) // t + 1 for s, b, e, x, t in zip(X.shape[2:], pb, pe, ext, st))
    if any(o <= 0 for o in out_sp):
        raise ValueError(f"Conv: empty output {out_sp} for input {X.shape}, kernel {ks}")
    L = math.prod(out_sp)
    K = math.prod(ks)
    bias = None if B is None else np.asarray(B, dtype=X.dtype).reshape((1, M) + (1,) * n)

    if K == 1:
        xp = pad_constant(X, pb, pe)
        xs = xp[(slice(None), slice(None)) + tuple(slice(None, (o - 1) * t + 1, t) for o, t in zip(out_sp, st))]
        if G == 1:
            y = np.matmul(W.reshape(M, C), xs.reshape(N, C, L))
        else:
            y = np.matmul(W.reshape(G, Mg, Cg), xs.reshape(N, G, Cg, L))
    elif Cg == 1 and G == C and N * C * K * L * X.itemsize > _DW_IM2COL_BYTES:
        y = _depthwise(X, pb, pe, W.reshape(C, Mg, K), ks, dil, st, out_sp)
        if not y.flags.c_contiguous:  # crop the padded-row grid, adding the bias on the way
            out = np.empty(y.shape, dtype=y.dtype)
            if bias is None:
                np.copyto(out, y)
            else:
                np.add(y, bias, out=out)
            return out
    else:
        y = _im2col_conv(pad_constant(X, pb, pe, scratch="conv_pad"), W.reshape(G, Mg, Cg * K), G, Cg, ks, dil, st,
                         out_sp)
    y = y.reshape((N, M) + out_sp)
    if bias is not None:
        y += bias
    return y


def _depthwise(X, pb, pe, w, ks, dil, st, out_sp):
    """Depthwise conv by accumulation over the K kernel taps; w is (C, mult, K).

    Every tap is read as a *contiguous* shifted window of a flattened image, so each tap costs
    one multiply and one add over the output with unit-stride inner loops:

    * the zero-padded input Xp (spatial sizes P) is split into its prod(s) stride phases
      Xq[r] = Xp[..., r1::s1, r2::s2, ...] (sizes Q = ceil(P / s); just Xp when s = 1), each
      with one spare zero row at the bottom;
    * tap k reads input o*s + k*d = (o + q)*s + r with r = k*d mod s, q = k*d div s, i.e.
      element o + q of phase r; on the flattened phase that is Xq_flat[r][off : off + L] with
      off = sum q_i prod(Q_{i+1}..Q_n), if the output is computed on the grid
      (o1, Q2, ..., Qn) - full phase rows, the columns beyond o_i being dropped at the end.

    Channels are processed in blocks so a block's accumulator stays in cache (blocks run on the
    shared thread pool; each output element is still summed in tap order).
    """
    N, C = X.shape[:2]
    mult = w.shape[1]
    n = len(out_sp)
    P = [s + b + e for s, b, e in zip(X.shape[2:], pb, pe)]
    Q = [-(-p // s) for p, s in zip(P, st)]
    Qx = [Q[0] + 1] + Q[1:]  # one spare zero row keeps the last windows in bounds
    phases = list(itertools.product(*[range(s) for s in st]))
    if len(phases) == 1:
        xq = pad_constant(X, pb, [pe[0] + 1] + list(pe[1:]), scratch="conv_pad")
    else:
        # phase r of the padded input, straight from X: phase element j is X[j*s + r - pb]
        xq = _parallel.scratch("conv_phases", (N, C, len(phases)) + tuple(Qx), X.dtype)
        for p, r in enumerate(phases):
            first = [-(-(b - ri) // si) if b > ri else 0 for b, ri, si in zip(pb, r, st)]
            src = X[(slice(None), slice(None)) + tuple(
                slice(j * si + ri - b, None, si) for j, ri, si, b in zip(first, r, st, pb))]
            count = [min(c, q - j) for c, q, j in zip(src.shape[2:], Q, first)]
            src = src[(slice(None), slice(None)) + tuple(slice(0, c) for c in count)]
            _place(xq[:, :, p], src, first)
    xq = xq.reshape(N, C, len(phases), -1)
    fs = [math.prod(Qx[i + 1:]) for i in range(n)]
    L = out_sp[0] * fs[0]
    grid = (out_sp[0],) + tuple(Qx[1:])
    taps = []
    for offs in itertools.product(*[range(k) for k in ks]):
        a = [k * d for k, d in zip(offs, dil)]
        phase = phases.index(tuple(v % s for v, s in zip(a, st)))
        taps.append((phase, sum((v // s) * f for v, s, f in zip(a, st, fs))))
    out = np.empty((N, C, mult, L), dtype=X.dtype)
    blk = max(1, _DW_BLOCK_BYTES // max(1, N * mult * L * X.itemsize))
    if out.size >= _parallel.MIN_PARALLEL_SIZE:  # at least one block per thread
        blk = min(blk, -(-C // _parallel.num_threads()))

    def block(c0):
        c1 = min(C, c0 + blk)
        o = out[:, c0:c1]
        tmp = _parallel.scratch("depthwise_tmp", o.shape, o.dtype)
        for t, (phase, off) in enumerate(taps):
            v = xq[:, c0:c1, phase:phase + 1, off:off + L]
            wt = w[c0:c1, :, t].reshape(1, c1 - c0, mult, 1)
            if t == 0:
                np.multiply(v, wt, out=o)
            else:
                np.multiply(v, wt, out=tmp)
                o += tmp

    _parallel.run_all(block, list(range(0, C, blk)))
    out = out.reshape((N, C * mult) + grid)
    if grid != tuple(out_sp):
        out = out[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_sp)]
    return out


def _im2col_conv(xp, w, G, Cg, ks, dil, st, out_sp):
    """im2col + batched matmul, in bands along the first output spatial axis."""
    N = xp.shape[0]
    K = math.prod(ks)
    Mg = w.shape[1]
    rest = math.prod(out_sp[1:])
    row_bytes = N * G * Cg * K * rest * xp.itemsize
    band = max(1, min(out_sp[0], _IM2COL_BYTES // max(1, row_bytes)))
    sN, sC = xp.strides[:2]
    sS = xp.strides[2:]
    win_strides = tuple(d * s for d, s in zip(dil, sS))
    out_strides = tuple(t * s for t, s in zip(st, sS))
    y = np.empty((N, G, Mg, out_sp[0], rest), dtype=xp.dtype)
    for r0 in range(0, out_sp[0], band):
        rows = min(band, out_sp[0] - r0)
        sub = xp[:, :, r0 * st[0]:]
        view = as_strided(
            sub,
            shape=(N, G, Cg) + tuple(ks) + (rows,) + tuple(out_sp[1:]),
            strides=(sN, Cg * sC, sC) + win_strides + out_strides,
            writeable=False,
        )
        cols = _parallel.scratch("im2col", (N, G, Cg * K, rows * rest), xp.dtype)
        np.copyto(cols.reshape(view.shape), view)
        yb = np.matmul(w, cols)
        if band == out_sp[0]:
            return yb
        y[:, :, :, r0:r0 + rows] = yb.reshape(N, G, Mg, rows, rest)
    return y


def convtranspose_geometry(in_spatial, ks, st, dil, output_padding, pads, auto_pad, output_shape):
    """Output size and begin/end pads of ConvTranspose, following onnxruntime.

    Full (uncropped) length per axis: F = s (in - 1) + op + (k - 1) d + 1, and out = F - pb - pe.
    If ``output_shape`` is given (its last n entries are the spatial sizes), total =
    max(0, F - out) is split as the ONNX spec says: SAME_UPPER puts the odd element at the end
    (pb = total // 2), anything else (NOTSET, SAME_LOWER) at the beginning. With SAME_UPPER /
    SAME_LOWER and no output_shape, out = in * s and total = max(0, F - out) is split the same
    way. An output longer than F is zero-extended at the end.
    """
    n = len(in_spatial)
    op = _ints(output_padding, n, 0)
    auto_pad = auto_pad or "NOTSET"
    if output_shape is not None and len(output_shape):
        target = [int(v) for v in output_shape][-n:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(in_spatial, st)]
    else:
        target = None
    full = [s * (i - 1) + p + (k - 1) * d + 1 for i, s, p, k, d in zip(in_spatial, st, op, ks, dil)]
    if target is None:
        if auto_pad == "VALID":
            pb, pe = [0] * n, [0] * n
        else:
            p = _ints(pads, 2 * n, 0)
            pb, pe = p[:n], p[n:]
        return [f - b - e for f, b, e in zip(full, pb, pe)], pb, pe
    pb, pe = [], []
    for f, t in zip(full, target):
        total = max(0, f - t)
        if auto_pad == "SAME_UPPER":
            pb.append(total // 2)
            pe.append(total - total // 2)
        else:
            pb.append(total - total // 2)
            pe.append(total // 2)
    return target, pb, pe


@kernel("ConvTranspose")
def conv_transpose(
    X,
    W,
    B=None,
    *,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    """N-d grouped transposed convolution (the gradient of Conv w.r.t. its input).

    W is (C, M/G, k...). One batched matmul gives the columns
    cols[n, g, (m, k), i] = sum_c W[g*Cg + c, m, k] X[n, g*Cg + c, i], then col2im scatters
    every kernel tap with a strided slice: full[n, m, i*s + k*d] += cols[n, m, k, i]. The full
    result is cropped by the begin pads to the output size (zero-extended where output_padding
    or output_shape reach past it).
    """
    X = np.asarray(X)
    W = np.asarray(W)
    if W.dtype != X.dtype:
        W = W.astype(X.dtype)
    n = X.ndim - 2
    N, C = X.shape[:2]
    G = int(group)
    Cg = C // G
    Mg = W.shape[1]
    M = Mg * G
    ks = tuple(W.shape[2:])
    K = math.prod(ks)
    in_sp = X.shape[2:]
    Lin = math.prod(in_sp)
    dil = _ints(dilations, n, 1)
    st = _ints(strides, n, 1)
    out_sp, pb, pe = convtranspose_geometry(in_sp, ks, st, dil, output_padding, pads, auto_pad, output_shape)

    w = W.reshape(G, Cg, Mg * K).transpose(0, 2, 1)
    cols = np.matmul(w, X.reshape(N, G, Cg, Lin)).reshape((N, M) + ks + tuple(in_sp))
    span = [(i - 1) * s + (k - 1) * d + 1 for i, s, k, d in zip(in_sp, st, ks, dil)]
    buf_sp = tuple(max(sp, b + o) for sp, b, o in zip(span, pb, out_sp))
    buf = np.zeros((N, M) + buf_sp, dtype=cols.dtype)
    for offs in itertools.product(*[range(k) for k in ks]):
        buf[(slice(None), slice(None)) + tap_slices(offs, dil, st, in_sp)] += cols[(slice(None), slice(None)) + offs]
    y = buf[(slice(None), slice(None)) + tuple(slice(b, b + o) for b, o in zip(pb, out_sp))]
    if y.shape != buf.shape:
        y = np.ascontiguousarray(y)
    if B is not None:
        y += np.asarray(B, dtype=y.dtype).reshape((1, M) + (1,) * n)
    return y
