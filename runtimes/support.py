"""What a runtime refuses before it runs anything.

``check_supported(ir, runtime)`` raises an :class:`~qir.errors.UnsupportedOpError` naming the
node, the op and the attribute, input or type that the runtime cannot compute as ONNX
specifies, and what to do instead. The rules:

* Both runtimes compute the tensor types of :data:`ELEMENT_TYPES` and :data:`NARROW_TYPES`
  (bfloat16, the float8 / float4 formats, the packed 4- and 2-bit integers); others (complex
  numbers) are refused. onnxruntime computes the narrow types in any op it has a kernel for
  (:mod:`qir.runtimes.ort.boundary` carries them across its Python API); the numpy runtime only
  in the ops of :data:`NUMPY_NARROW_OPS` (numpy has no arithmetic for them).
* Both refuse what cannot give ONNX's answer on any input: training-mode Dropout (random
  numbers) and BatchNormalization (batch statistics), and the ops of :data:`REFUSED_OPS`
  (signal processing, MaxUnpool, the opset-23 Attention op), each with its reason.
* The numpy runtime refuses an op it has no kernel for, and the attribute values its kernels
  do not implement (:data:`NUMPY_REFUSED`).
* The ort runtime refuses a Resize with align_corners and a scales input
  that :mod:`qir.runtimes.ort.resize_lowering` cannot rewrite (an ``axes`` attribute with dynamic
  shape or scales).
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np

from qir.errors import UnsupportedOpError
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import OpRecord

__all__ = ["check_supported", "ELEMENT_TYPES", "NARROW_TYPES", "NUMPY_NARROW_OPS", "REFUSED_OPS", "NUMPY_REFUSED"]

logger = logging.getLogger(__name__)

ELEMENT_TYPES = frozenset({"float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                           "uint32", "uint64", "bool", "object"})  # object: ONNX strings

# bfloat16, the float8 / float4 formats and the packed integers (numpy dtypes from ml_dtypes)
NARROW_TYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                          "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"})
# the numpy ops that compute NARROW_TYPES (as ONNX's reference does), and which of them
NUMPY_NARROW_OPS = {"Cast": NARROW_TYPES, "CastLike": NARROW_TYPES, "Identity": NARROW_TYPES,
                    "Einsum": frozenset({"bfloat16"})}

REFUSED_OPS = {
    "DFT": "signal processing (onnxruntime's DFT differs from ONNX's reference by more than the suite's "
           "tolerance near zero); qir's runtimes are for the ops NPUs run",
    "STFT": "signal processing (onnxruntime's STFT differs from ONNX's reference by more than the suite's "
            "tolerance near zero); qir's runtimes are for the ops NPUs run",
    "MaxUnpool": "onnxruntime's MaxUnpool places values differently from ONNX's reference when output_shape is "
                 "given; export the model with an explicit scatter instead",
    "Attention": "onnxruntime's fused Attention (opset 23) differs from ONNX's reference with causal masks and "
                 "past state; export attention as MatMul/Softmax ops (opset < 23, or the function body)",
}

# (op type, attribute, predicate of its value, what to do) the numpy kernels do not implement
NUMPY_REFUSED: tuple[tuple[str, str, Callable[[object], bool], str], ...] = ()


def check_supported(ir: QIR, runtime: str) -> None:
    """Raise UnsupportedOpError for the first thing ``runtime`` cannot execute as ONNX says
    (see the module docstring for the rules)."""
    _check_types(ir, runtime)
    for op in ir.ops():
        _check_op(ir, op, runtime)
    if runtime == "numpy":
        _check_numpy(ir)


def _check_types(ir: QIR, runtime: str) -> None:
    for value in ir.values():
        if value.dtype is not None and value.dtype not in ELEMENT_TYPES | NARROW_TYPES:
            what = "weight" if value.kind is NodeKind.WEIGHT else "value"
            raise UnsupportedOpError(
                f"{what} {value.name!r} has element type {value.dtype}, which the {runtime} runtime does not "
                f"compute; convert the model to float32 or float16 first")
    if runtime != "numpy":
        return
    for rec in ir.runnables():
        allowed = NUMPY_NARROW_OPS.get(getattr(rec, "op_type", ""), frozenset()) if not getattr(rec, "domain", "") else ()
        for name in (*rec.inputs, *rec.outputs):
            dtype = ir.value(name).dtype if name else None
            if dtype in NARROW_TYPES and dtype not in allowed:
                raise UnsupportedOpError(
                    f"node {rec.name!r} ({getattr(rec, 'op_type', 'calibration')}) reads or writes {name!r} of "
                    f"type {dtype}, which the numpy runtime computes only in Cast, CastLike and Identity (and "
                    "Einsum in bfloat16); run this model with the ort runtime (--runtime ort)")


def _where(op: OpRecord) -> str:
    return f"node {op.name!r} ({op.op_type})"


def _constant(ir: QIR, name: str) -> np.ndarray | None:
    """The value of input ``name`` when it is a weight, else None."""
    if name and ir.has_value(name) and ir.value(name).kind is NodeKind.WEIGHT:
        return np.asarray(ir.value(name).data)
    return None


def _check_op(ir: QIR, op: OpRecord, runtime: str) -> None:
    if op.domain:
        return
    if op.op_type in REFUSED_OPS:
        raise UnsupportedOpError(f"{_where(op)}: qir does not run {op.op_type}: {REFUSED_OPS[op.op_type]}")
    if op.op_type == "Dropout" and len(op.inputs) > 2 and op.inputs[2]:
        mode = _constant(ir, op.inputs[2])
        if mode is None or bool(mode):
            raise UnsupportedOpError(
                f"{_where(op)}: the training_mode input is {'not a constant' if mode is None else 'true'}; "
                "training-mode Dropout draws random numbers, which no runtime reproduces; export the model in "
                "inference mode (model.eval())")
    if op.op_type == "BatchNormalization" and op.attrs.get("training_mode"):
        raise UnsupportedOpError(
            f"{_where(op)}: attribute training_mode=1 normalizes with the batch's statistics and updates the "
            "running ones; qir runs inference models: export the model in inference mode (model.eval())")
    if runtime == "ort" and op.op_type == "Resize":
        from qir.runtimes.ort.resize_lowering import needs_rewrite, rewrite_possible

        if needs_rewrite(ir, op) and not rewrite_possible(ir, op):
            raise UnsupportedOpError(
                f"{_where(op)}: align_corners with a scales input and the axes attribute needs constant scales "
                "and a static input shape for onnxruntime to compute ONNX's coordinates; load the model with "
                "static input_shapes, or give scales for every axis")


def _check_numpy(ir: QIR) -> None:
    from qir.runtimes.numpy_ref.interpreter import missing_kernels

    missing = missing_kernels(ir)
    if missing:
        op, names = sorted(missing.items())[0]
        raise UnsupportedOpError(f"the numpy runtime has no kernel for {op} (node {names[0]!r}); "
                                 "run this model with the ort runtime (--runtime ort)")
    for op in ir.ops():
        for op_type, attr, refused, todo in NUMPY_REFUSED:
            if op.op_type == op_type and not op.domain and attr in op.attrs and refused(op.attrs[attr]):
                raise UnsupportedOpError(f"{_where(op)}: the numpy runtime does not implement "
                                         f"{attr}={op.attrs[attr]!r}; {todo}")
