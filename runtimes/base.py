"""The ``Runtime`` protocol, the registry of runtimes by name, and input (feed) checking."""
from __future__ import annotations

import logging
from typing import Iterable, Mapping, Protocol, runtime_checkable

import numpy as np

from qir.data import shape_misfit
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.execution import LEVEL_NAMES, Execution
from qir.execution import Runtime as RuntimeName
from qir.graph import QIR

__all__ = ["Runtime", "get_runtime", "RUNTIMES", "check_feeds", "check_capture", "LEVELS"]

logger = logging.getLogger(__name__)

LEVELS = LEVEL_NAMES


@runtime_checkable
class Runtime(Protocol):
    """Executes a QIR on one set of inputs.

    ``run`` returns the graph outputs plus every captured value, keyed by value name.
    """

    name: str

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *,
            capture: Iterable[str] = ()) -> dict[str, np.ndarray]: ...


def get_runtime(name: str | Execution, **options) -> Runtime:
    """A runtime for an :class:`~qir.execution.Execution` (or a runtime name, with ``level`` and
    ``march`` among the options, resolved by :meth:`Execution.resolve <qir.execution.Execution.resolve>`):
    ``numpy`` (reference interpreter) or ``ort`` (onnxruntime); the numpy runtime's integer level is
    :class:`qir.runtimes.integer.IntegerRuntime` with the execution's march. The other options go to
    the runtime's constructor."""
    if isinstance(name, Execution):
        execution = name
    else:
        execution = Execution.resolve(name, options.pop("level", None), options.pop("march", None))
    import importlib
    if execution.integer:
        module_name, cls_name = INTEGER_RUNTIME
        return getattr(importlib.import_module(module_name), cls_name)(march=execution.march)
    module_name, cls_name = RUNTIMES[execution.runtime]
    return getattr(importlib.import_module(module_name), cls_name)(level=execution.level, **options)


INTEGER_RUNTIME = ("qir.runtimes.integer.interpreter", "IntegerRuntime")
RUNTIMES = {
    RuntimeName.NUMPY: ("qir.runtimes.numpy_ref.interpreter", "NumpyRuntime"),
    RuntimeName.ORT: ("qir.runtimes.ort.backend", "OrtRuntime"),
}


def check_feeds(ir: QIR, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate ``feeds`` against the graph inputs; returns arrays of the inputs' dtypes.

    Float inputs given in another float precision are converted; anything else that does not
    match (missing or unknown names, rank, a static dimension, dtype kind) is an InputError.
    """
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a mapping of input name to array, got {type(feeds).__name__}")
    unknown = [k for k in feeds if k not in ir.inputs]
    if unknown:
        raise InputError(did_you_mean(unknown[0], ir.inputs, "model input")
                         + f" (the model's inputs are {ir.inputs})")
    missing = [n for n in ir.inputs if n not in feeds]
    if missing:
        raise InputError(f"no data for model input(s) {missing}; the model's inputs are {ir.inputs}")
    out: dict[str, np.ndarray] = {}
    for name in ir.inputs:
        arr = np.asarray(feeds[name])
        rec = ir.value(name)
        if rec.dtype is not None and arr.dtype.name != rec.dtype:
            want = np.dtype(rec.dtype)
            if arr.dtype.kind == "f" and want.kind == "f":
                arr = arr.astype(want)
            elif arr.dtype.kind in "iu" and want.kind in "iu" and arr.size and (
                    arr.min() >= np.iinfo(want).min and arr.max() <= np.iinfo(want).max):
                arr = arr.astype(want)
            else:
                raise InputError(f"input {name!r} expects {rec.dtype}, got {arr.dtype.name}; "
                                 f"convert it, e.g. array.astype(np.{rec.dtype})")
        if rec.shape is not None and (why := shape_misfit(name, rec.shape, arr.shape)) is not None:
            raise InputError(why)
        out[name] = arr
    return out


def check_capture(ir: QIR, capture: Iterable[str]) -> tuple[str, ...]:
    """Capture names, deduplicated in order; unknown names raise NotFoundError."""
    names = tuple(dict.fromkeys(capture))
    for n in names:
        if not ir.has_value(n):
            raise NotFoundError(did_you_mean(n, [v.name for v in ir.values()], "value to capture"))
    return names
