"""qir as an ONNX backend (``onnx.backend.base.Backend``): ``prepare`` loads a model with
:func:`qir.load` and readies a runtime for it, ``run`` executes it on that runtime (as
:func:`qir.run` does).

One backend class per runtime: :class:`NumpyBackend` (the reference interpreter) and
:class:`OrtBackend` (onnxruntime), so ONNX's own test suite (``onnx.backend.test.BackendTest``,
or a loop over ``onnx.backend.test.case.node.collect_testcases()`` as
``tests/qir/test_onnx_node_suite.py`` does) runs through qir's IR and either runtime.

Rules:

* Everything qir refuses, it refuses in ``prepare``: the import, then the runtime's plan or
  session (``runtime.prepare``, which applies :func:`qir.runtimes.support.check_supported`
  and the runtime's own limits), with a :class:`~qir.errors.QirError` naming the op and the
  attribute; ``run`` then executes only what was accepted.
* Inputs are converted to the type the model declares for them (ONNX's suite hands strings and
  some numbers over as object arrays); a value that does not convert is an InputError.
* The IR runs at qir's default level (``fakequant``): the calibration nodes of an imported QDQ
  model quantize, as the model's QuantizeLinear/DequantizeLinear pairs do.
"""
from __future__ import annotations

import logging
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from qir.api import load
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR

__all__ = ["QirBackendRep", "QirBackend", "NumpyBackend", "OrtBackend", "backend_for"]

logger = logging.getLogger(__name__)


class QirBackendRep(BackendRep):
    """A prepared model: the IR and the runtime that runs it (``run`` takes the inputs in the
    model's input order, or a mapping by name, and returns the outputs in the model's order)."""

    def __init__(self, ir: QIR, runtime: Any) -> None:
        self.ir = ir
        self.runtime = runtime

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        feeds = _as_feeds(self.ir, inputs)
        out = self.runtime.run(self.ir, feeds)
        return tuple(out[name] for name in self.ir.outputs)


class QirBackend(Backend):
    """``onnx.backend.base.Backend`` over qir; subclasses name the runtime (``runtime``)."""

    runtime: ClassVar[str] = Runtime.NUMPY

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> QirBackendRep:
        """Import ``model`` and ready the runtime; every refusal happens here (see the module
        docstring). ``kwargs`` are the runtime's options (``threads``, ...)."""
        if not cls.supports_device(device):
            raise InputError(f"qir runs on the CPU; device {device!r} is not supported")
        from qir.runtimes.base import get_runtime

        ir = load(model)
        runtime = get_runtime(cls.runtime, **kwargs)
        prepare = getattr(runtime, "prepare", None)  # (the integer level's runtime has none)
        if prepare is not None:
            prepare(ir)
        return QirBackendRep(ir, runtime)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple] | None = None, **kwargs: Any):
        """Not offered: a single node needs a model around it (types, opset); use
        :meth:`run_model` with ``onnx.helper.make_model``."""
        raise NotImplementedError("qir runs models, not bare nodes; wrap the node in a model "
                                  "(onnx.helper.make_graph / make_model) and use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """Only the CPU (both runtimes run there)."""
        return str(device).upper().startswith("CPU")


class NumpyBackend(QirBackend):
    """qir's numpy reference interpreter as an ONNX backend."""

    runtime = Runtime.NUMPY


class OrtBackend(QirBackend):
    """qir's onnxruntime runtime as an ONNX backend (the model goes through qir's IR first)."""

    runtime = Runtime.ORT


def backend_for(runtime: str) -> type[QirBackend]:
    """The backend class of a runtime name (``numpy`` or ``ort``)."""
    backends = {Runtime.NUMPY: NumpyBackend, Runtime.ORT: OrtBackend}
    if runtime not in backends:
        raise InputError(f"no qir backend for runtime {runtime!r}; choose one of {sorted(backends)}")
    return backends[runtime]


def _as_feeds(ir: QIR, inputs: Any) -> dict[str, np.ndarray]:
    """``inputs`` (a sequence in the model's input order, or a mapping by name) as arrays of
    the declared input types."""
    if isinstance(inputs, Mapping):
        named = dict(inputs)
    else:
        items = list(inputs)
        if len(items) != len(ir.inputs):
            raise InputError(f"the model takes {len(ir.inputs)} inputs {list(ir.inputs)}, "
                             f"{len(items)} were given")
        named = dict(zip(ir.inputs, items))
    return {name: _declared_type(ir, name, value) for name, value in named.items()}


def _declared_type(ir: QIR, name: str, value: Any) -> np.ndarray:
    """``value`` (an array, or a ``TensorProto`` as ONNX's suite hands some over) as an array;
    an object array is converted to input ``name``'s declared dtype, other arrays are left to
    the runtime's feed check."""
    if isinstance(value, onnx.TensorProto):
        value = onnx.numpy_helper.to_array(value)
    arr = np.asarray(value)
    dtype = ir.value(name).dtype if ir.has_value(name) else None
    if dtype is None or arr.dtype != object:
        return arr
    try:
        return arr.astype(np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise InputError(f"input {name!r} expects {dtype}; the object array given does not convert "
                         f"({exc}); pass a numeric array") from exc
