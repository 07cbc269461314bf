"""Float ops on one quantized value evaluated once per code (:class:`~.qtensor.Coded`).

An op the march does not compute in integer runs in float on dequantized codes (GELU's ``Erf``
chain on nash, emulated in float by design). Where such an op is elementwise and reads one
per-tensor quantized value (and constants of one element), each element of its output depends
on that element's code alone: an int8 input has 256 codes and an int16 one 65536, while the
tensor may have hundreds of thousands of elements. :func:`coded_op` computes the op on one entry
per code (a :class:`~.qtensor.Coded`); the next such op works on that table, and the first reader
of any other kind gets the tensor by one gather.

Each entry is computed by the same numpy operations, on the same dtypes, as the elements it
stands for, so the gathered tensor is the one the ops compute element by element (checked bit
for bit on the ViT-S's GELUs, and on every op of :data:`TABLE_OPS` in the tests).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from qir.records import AttrValue
from qir.runtimes.integer.qtensor import Coded, QTensor

__all__ = ["TABLE_OPS", "coded_op"]

#: Elementwise op types whose output element depends on the same element of its one varying
#: input alone (the others: constants of one element), and whose integer kernels (if any) take
#: only quantized inputs (so they decline a float one, as they would its tensor).
TABLE_OPS = frozenset({
    "Abs", "Add", "Ceil", "Celu", "Cos", "Div", "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish",
    "Identity", "LeakyRelu", "Log", "Max", "Min", "Mish", "Mul", "Neg", "Pow", "Reciprocal", "Relu", "Round", "Selu",
    "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt", "Sub", "Tanh",
})


def coded_op(fn: Callable, args: Sequence[Any], kwargs: Mapping[str, AttrValue]) -> Coded | None:
    """``fn(*args, **kwargs)`` as a table per code, when every input is a per-tensor QTensor or a
    Coded of one codes array, a constant array of one element, or None; None otherwise (the
    caller computes the op on tensors)."""
    codes = low = None
    for a in args:
        if isinstance(a, (QTensor, Coded)):
            mine = a.params.qrange[0] if isinstance(a, QTensor) else a.low
            if codes is not None and (a.codes is not codes or mine != low):
                return None
            codes, low = a.codes, mine
    if codes is None:
        return None
    tables: list[Any] = []
    entries = None  # (the shape of a table: one entry per code)
    for a in args:
        if isinstance(a, QTensor):
            first, last = a.params.qrange
            if 2 * (last - first + 1) > codes.size:  # (a table larger than the tensor gains nothing)
                return None
            a = Coded.of(a)
            if a is None:
                return None
        if isinstance(a, Coded):
            tables.append(a.table)
            entries = a.table.shape
        elif a is None or (isinstance(a, np.ndarray) and a.size == 1 and a.ndim <= codes.ndim):
            tables.append(a if a is None or a.ndim <= 1 else a.reshape(1))
        else:
            return None
    result = fn(*tables, **kwargs)
    if not isinstance(result, np.ndarray) or result.shape != entries:
        return None
    return Coded(codes, low, result)
