"""Execution helpers for the numpy kernels: a small shared thread pool for the few kernels
whose numpy calls are compute-bound (transcendental elementwise functions, depthwise
convolution blocks), and per-thread reusable scratch buffers for large temporaries.

numpy releases the GIL inside ufunc loops, so splitting a large array into contiguous chunks
and running one chunk per thread scales on multi-core machines. Chunking never changes
results: every element is computed by the same ufunc loop either way. The thread count is
``QIR_NUMPY_THREADS`` (default: the CPU count, at most 4); 1 disables threading.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import numpy as np

# Arrays smaller than this (elements) are processed on the calling thread.
MIN_PARALLEL_SIZE = 1 << 16

_pool: ThreadPoolExecutor | None = None
_pool_size = 0


def num_threads() -> int:
    env = os.environ.get("QIR_NUMPY_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            pass
    return max(1, min(os.cpu_count() or 1, 4))


def _get_pool(n: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    if _pool is None or _pool_size != n:
        _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="qir-numpy")
        _pool_size = n
    return _pool


def run_all(fn: Callable, items: Sequence) -> None:
    """Call fn(item) for every item, spread over the pool (the caller runs the first one)."""
    n = num_threads()
    if n == 1 or len(items) < 2:
        for it in items:
            fn(it)
        return
    pool = _get_pool(n)
    futures = [pool.submit(fn, it) for it in items[1:]]
    fn(items[0])
    for f in futures:
        f.result()


def unary(fn: Callable[[np.ndarray, np.ndarray], None], x: np.ndarray, dtype=None) -> np.ndarray:
    """out = fn applied elementwise: ``fn(src, dst)`` must write its result for ``src`` into
    ``dst`` (same shape). Large contiguous inputs are split into one chunk per thread."""
    x = np.asarray(x)
    out = np.empty(x.shape, dtype=dtype or x.dtype)
    n = num_threads()
    if n == 1 or x.size < MIN_PARALLEL_SIZE or not x.flags.c_contiguous:
        fn(x, out)
        return out
    xf = x.reshape(-1)
    of = out.reshape(-1)
    bounds = np.linspace(0, x.size, n + 1).astype(np.int64)
    run_all(lambda i: fn(xf[bounds[i]:bounds[i + 1]], of[bounds[i]:bounds[i + 1]]), list(range(n)))
    return out


_local = threading.local()


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A reusable, uninitialised work buffer of ``shape``/``dtype`` private to the calling
    thread and to ``name`` (e.g. the im2col columns). Reusing it avoids paying fresh-page
    faults for a large temporary on every call. The caller must not keep or return it."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = {}
    buf = buffers.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = buffers[name] = np.empty(max(nbytes, 1), dtype=np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)
