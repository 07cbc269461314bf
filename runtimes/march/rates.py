"""The latency model's march parameters: peak arithmetic rates per precision pair, memory
bandwidth, a fixed overhead per op the march runs, and the element size of each precision.

The profile fields (see :class:`~qir.runtimes.march.profile.MarchProfile`):

* ``peak_tops``: rate key -> peak rate in tera-operations per second, operations counted as
  :func:`qir.runtimes.engine.cost.op_flops` counts them (a multiply and an add are two, the way
  TOPS figures count a MAC). Keys (:data:`RATE_KEYS`): ``int8 x int8``, ``int16 x int8``,
  ``int16 x int16`` (GEMM input x weight), ``fp16`` and ``float``.
* ``memory_gbps``: bandwidth to the memory that feature maps and weights cross, in GB/s (1e9 B/s).
* ``op_overhead_us``: a fixed time per op the march runs (a fused group counts once), in µs.
* ``free_ops``: op types that move no data (views: Reshape, Flatten, ...): they cost nothing.

:func:`rate_key` says which rate an op at a precision runs at; :func:`element_bytes` how many
bytes one element of a precision takes (int8 1, int16 2, fp16 2, float 4, int32 4).
"""
from __future__ import annotations

from typing import Any

__all__ = ["RATE_KEYS", "ELEMENT_BYTES", "VIEW_OPS", "WIDTH_ORDER", "element_bytes", "widest", "rate_key", "check_rates"]

#: The keys of ``peak_tops``: GEMM (input x weight) pairs of the integer MAC array, then fp16 and float.
RATE_KEYS = ("int8 x int8", "int16 x int8", "int16 x int16", "fp16", "float")
#: Bytes per element of each precision.
ELEMENT_BYTES = {"int8": 1, "int16": 2, "fp16": 2, "float": 4, "int32": 4}
#: Op types that only reinterpret a tensor's shape: no data moves, no arithmetic.
VIEW_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")
#: Precisions from the narrowest to the widest: an op whose inputs differ runs at the widest.
WIDTH_ORDER = ("int8", "int16", "fp16", "float")


def element_bytes(dtype: str) -> int:
    """Bytes per element of a precision in profile spelling (``ValueError`` for others)."""
    try:
        return ELEMENT_BYTES[dtype]
    except KeyError:
        raise ValueError(f"no element size for precision {dtype!r}; expected one of {sorted(ELEMENT_BYTES)}") from None


def widest(dtypes: list[str] | tuple[str, ...]) -> str:
    """The widest of some precisions by :data:`WIDTH_ORDER` (``int8`` when there are none)."""
    return max(dtypes, key=WIDTH_ORDER.index, default="int8")


def rate_key(input_dtype: str, weight_dtype: str | None) -> str:
    """The ``peak_tops`` key an op runs at.

    Rule: ``float`` if either operand is float, else ``fp16`` if either is fp16; else the integer
    pair ``input x weight`` (an op without a weight - an Add, a pool, a MatMul of two activations -
    pairs its input precision with itself), ordered wider first (``int8 x int16`` runs as
    ``int16 x int8``).
    """
    other = weight_dtype or input_dtype
    pair = (input_dtype, other)
    if "float" in pair:
        return "float"
    if "fp16" in pair:
        return "fp16"
    a, b = sorted(pair, key=WIDTH_ORDER.index, reverse=True)
    return f"{a} x {b}"


def check_rates(p: Any) -> None:
    """On a :class:`~qir.runtimes.march.profile.MarchProfile`: ``peak_tops`` has a positive rate
    for every :data:`RATE_KEYS` key (and no other key); bandwidth is positive and the overhead is not negative."""
    keys = set(p.peak_tops)
    if keys != set(RATE_KEYS):
        raise ValueError(f"{p.name}: peak_tops needs exactly the keys {list(RATE_KEYS)}; "
                         f"missing {sorted(set(RATE_KEYS) - keys)}, unknown {sorted(keys - set(RATE_KEYS))}")
    bad = {k: v for k, v in p.peak_tops.items() if not v > 0}
    if bad:
        raise ValueError(f"{p.name}: peak_tops rates must be positive (TOPS), got {bad}")
    if not p.memory_gbps > 0:
        raise ValueError(f"{p.name}: memory_gbps must be positive (GB/s), got {p.memory_gbps}")
    if not p.op_overhead_us >= 0:
        raise ValueError(f"{p.name}: op_overhead_us must be 0 or more (µs), got {p.op_overhead_us}")
