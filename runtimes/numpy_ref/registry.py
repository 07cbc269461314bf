"""The numpy kernel table: one plain function per ONNX op type.

A kernel takes the op's input arrays positionally and its attributes as keyword arguments
(ONNX attribute names; strings decoded to ``str``, tensors as numpy arrays) and returns one
array or a tuple of arrays, one per op output, with ONNX's output dtypes. A missing optional
input arrives as ``None``; trailing missing inputs may be absent. A kernel that needs more than
its inputs and attributes declares it in ``context`` and receives it as a keyword:

* ``_opset``: the model's default-domain opset version (Softmax before/after 13, ...);
* ``_num_outputs``: how many outputs the node has (Split without split sizes, ...).

The table is filled when :mod:`qir.runtimes.numpy_ref` is imported (its ``__init__`` imports
the kernel modules, which register themselves here). Kernels never see IR nodes, so each one is
a small function testable against onnxruntime.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

__all__ = ["KernelSpec", "kernel", "lookup", "registered_op_types", "CONTEXT_KEYS"]

logger = logging.getLogger(__name__)

CONTEXT_KEYS = frozenset({"_opset", "_num_outputs"})


@dataclass(frozen=True)
class KernelSpec:
    """A registered kernel: the function and the context keywords it wants."""

    op_type: str
    domain: str
    fn: Callable
    context: tuple[str, ...] = ()


_KERNELS: dict[tuple[str, str], KernelSpec] = {}


def kernel(*op_types: str, domain: str = "", context: tuple[str, ...] = ()) -> Callable:
    """Register the decorated function as the kernel of ``op_types`` in ``domain``.

    Raises:
        ValueError: an op type is registered twice, or an unknown context key is asked for.
    """
    unknown = set(context) - CONTEXT_KEYS
    if unknown:
        raise ValueError(f"unknown kernel context keys {sorted(unknown)}; known: {sorted(CONTEXT_KEYS)}")

    def register(fn: Callable) -> Callable:
        for op_type in op_types:
            key = (domain, op_type)
            if key in _KERNELS:
                raise ValueError(f"duplicate numpy kernel for {op_type!r} (domain {domain!r})")
            _KERNELS[key] = KernelSpec(op_type, domain, fn, tuple(context))
        return fn

    return register


def lookup(op_type: str, domain: str = "") -> KernelSpec | None:
    """The kernel registered for ``op_type`` (``ai.onnx`` is the default domain), or None."""
    if domain == "ai.onnx":
        domain = ""
    return _KERNELS.get((domain, op_type))


def registered_op_types(domain: str = "") -> list[str]:
    """Sorted op types that have a kernel in ``domain``."""
    return sorted(op for d, op in _KERNELS if d == domain)
