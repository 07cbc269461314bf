"""Matrix products: MatMul, Gemm, Einsum."""
from __future__ import annotations

import numpy as np

from qir.runtimes.numpy_ref.registry import kernel


@kernel("MatMul")
def matmul(a, b):
    """numpy.matmul semantics (batched, broadcast batch dims, 1-D operands promoted)."""
    return np.matmul(a, b)


@kernel("Gemm")
def gemm(A, B, C=None, *, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=1):
    """Y = alpha * A' @ B' + beta * C, with A' = A.T if transA, B' = B.T if transB and C
    broadcast unidirectionally to (M, N). Scalars are cast to the input dtype. (The
    ``broadcast`` attribute of opsets < 7 is accepted; broadcasting is always on.)"""
    A = np.asarray(A)
    B = np.asarray(B)
    a = A.T if transA else A
    b = B.T if transB else B
    y = np.matmul(a, b)
    dt = y.dtype
    if alpha != 1.0:
        y *= np.asarray(alpha, dtype=dt)
    if C is not None and np.size(C) and beta != 0.0:
        c = np.asarray(C)
        if beta != 1.0:
            c = c * np.asarray(beta, dtype=c.dtype)
        y += c.astype(dt, copy=False)
    return y


@kernel("Einsum")
def einsum(*inputs, equation):
    """numpy.einsum with the ONNX equation (spaces removed); bfloat16 operands (which numpy
    cannot contract) are contracted in float32 and the result rounded back to bfloat16."""
    arrays = [np.asarray(x) for x in inputs]
    narrow = arrays[0].dtype if arrays and arrays[0].dtype.name == "bfloat16" else None
    if narrow is not None:
        arrays = [x.astype(np.float32) for x in arrays]
    out = np.asarray(np.einsum(equation.replace(" ", ""), *arrays))
    return out.astype(narrow) if narrow is not None else out
