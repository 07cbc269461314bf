"""The integer level: what an NPU computes (codes, exact accumulators, requantization, LUTs) per
a march profile. :class:`IntegerRuntime` runs a QIR; :mod:`.requant` holds the requantization
arithmetic, :mod:`.arithmetic` binds a profile's choices, :mod:`.kernels` the per-op rules."""
from qir.runtimes.integer.interpreter import IntegerRuntime

__all__ = ["IntegerRuntime"]
