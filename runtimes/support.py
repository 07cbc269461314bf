"""What the runtimes refuse before they run anything.

``check_supported(ir, runtime)`` raises an :class:`~qir.errors.UnsupportedOpError` naming the
node, the op and the attribute, input or type that ``runtime`` cannot compute as ONNX
specifies, and what to do instead. Each runtime calls it when it builds its plan or session for
an IR (so ``qir.run`` and :mod:`qir.backend` refuse alike, before the first node runs); the
numpy runtime then refuses ops it has no kernel for, the ort runtime what
:func:`qir.runtimes.ort.resize_lowering.check` refuses and what onnxruntime declines to load.
The rules here:

* The tensor types are those of :data:`ELEMENT_TYPES` and :data:`NARROW_TYPES` (bfloat16, the
  float8 / float4 formats, the packed 4- and 2-bit integers); others (complex numbers) are
  refused. onnxruntime computes the narrow types in any op it has a kernel for; the numpy
  runtime only in the ops of :data:`NUMPY_NARROW_OPS` (numpy has no arithmetic for them).
* What cannot give ONNX's answer on any input: training-mode Dropout (random numbers) and
  BatchNormalization (batch statistics), and the ops of :data:`REFUSED_OPS`, each with its
  reason.
* On the ort runtime, the uses of the opset-23 Attention op where onnxruntime's fused kernel
  departs from ONNX's reference (:func:`_check_attention`).
"""
from __future__ import annotations

import logging

import numpy as np

from qir.errors import UnsupportedOpError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import OpRecord

__all__ = ["check_supported", "ELEMENT_TYPES", "NARROW_TYPES", "NUMPY_NARROW_OPS", "REFUSED_OPS"]

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
    "DFT": "signal processing (onnxruntime's DFT differs from ONNX's reference by more than 1e-7 near zero); "
           "qir's runtimes are for the ops NPUs run",
    "STFT": "signal processing (onnxruntime's STFT differs from ONNX's reference by more than 1e-7 near zero); "
            "qir's runtimes are for the ops NPUs run",
    "MaxUnpool": "onnxruntime's MaxUnpool places values differently from ONNX's reference when output_shape is "
                 "given; export the model with an explicit scatter instead",
}


def check_supported(ir: QIR, runtime: str) -> None:
    """Raise UnsupportedOpError for the first thing ``runtime`` cannot execute as ONNX says
    (see the module docstring for the rules)."""
    _check_types(ir, runtime)
    for op in ir.ops():
        if not op.domain:
            _check_op(ir, op, runtime)


def _check_types(ir: QIR, runtime: str) -> None:
    for value in ir.values():
        if value.dtype is not None and value.dtype not in ELEMENT_TYPES | NARROW_TYPES:
            what = "weight" if value.kind is NodeKind.WEIGHT else "value"
            raise UnsupportedOpError(
                f"{what} {value.name!r} has element type {value.dtype}, which the {runtime} runtime does not "
                "compute; convert the model to float32 or float16 first")
    if runtime == Runtime.NUMPY:
        for rec in ir.runnables():
            op_type = rec.op_type if isinstance(rec, OpRecord) and not rec.domain else "calibration"
            for name in (*rec.inputs, *rec.outputs):
                dtype = ir.value(name).dtype if name else None
                if dtype in NARROW_TYPES and dtype not in NUMPY_NARROW_OPS.get(op_type, ()):
                    raise UnsupportedOpError(
                        f"node {rec.name!r} ({op_type}) reads or writes {name!r} of type {dtype}, which the numpy "
                        "runtime computes only in Cast, CastLike and Identity (and Einsum in bfloat16); run this "
                        "model with the ort runtime (--runtime ort)")


def _where(op: OpRecord) -> str:
    return f"node {op.name!r} ({op.op_type})"


def _constant(ir: QIR, name: str) -> np.ndarray | None:
    """The value of input ``name`` when it is a weight, else None."""
    if name and ir.has_value(name) and ir.value(name).kind is NodeKind.WEIGHT:
        return np.asarray(ir.value(name).data)
    return None


def _check_op(ir: QIR, op: OpRecord, runtime: str) -> None:
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
    if op.op_type == "Attention" and runtime == Runtime.ORT:
        _check_attention(ir, op)


def _given(op: OpRecord, slot: int) -> bool:
    return len(op.inputs) > slot and bool(op.inputs[slot])


def _check_attention(ir: QIR, op: OpRecord) -> None:
    """onnxruntime's fused Attention departs from ONNX's reference with a causal mask over past
    keys, with a causal mask in float16 (beyond 1e-3 relative), and with nonpad_kv_seqlen beside
    an attn_mask (it fails)."""
    causal = bool(op.attrs.get("is_causal", 0))
    why = None
    if causal and _given(op, 4):
        why = "is_causal=1 with past_key: onnxruntime masks other positions than ONNX's reference"
    elif causal and ir.value(op.inputs[0]).dtype == "float16":
        why = "is_causal=1 in float16: onnxruntime's result differs from ONNX's reference beyond 1e-3"
    elif _given(op, 6) and _given(op, 3):
        why = "nonpad_kv_seqlen with an attn_mask: onnxruntime fails on it"
    if why:
        raise UnsupportedOpError(f"{_where(op)}: {why}; export attention as MatMul/Softmax ops (opset < 23)")
