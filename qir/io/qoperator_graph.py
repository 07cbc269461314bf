"""The QOperator exporter's view of a QDQ model (:mod:`.qoperator_export`): quantized operands,
output quantizers, the clamps written on codes, and the :class:`Rewriter` the rules of
:mod:`.qoperator_rules` write through. The definitions are in :mod:`.qoperator_export`'s docstring.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qir.errors import ImportError_
from qir.io.qdq_graph import QdqGraph, is_op
from qir.io.qdq_params import QParams, qparams

__all__ = ["Quant", "OutQuant", "Rewriter", "quantize_scalar", "MS_DOMAIN", "EIGHT_BIT", "QOPERATOR_METADATA_KEY"]

QOPERATOR_METADATA_KEY = "qir.qoperator"  # written by qoperator_export, read by qoperator_import
MS_DOMAIN = "com.microsoft"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
_OPSET_INT_CLIP = 12  # Clip takes integer tensors
_OPSET_INT_RELU = 14  # Relu takes int8


@dataclass
class Quant:
    """A quantized operand: the integer tensor a DequantizeLinear reads, with that DQ's parameters."""

    tensor: str
    scale: str          # the scale constant's name
    zero_point: str     # the zero point constant's name ('' when the DQ has none)
    params: QParams
    constant: bool      # an integer initializer (a weight), not a QuantizeLinear output

    @property
    def dtype(self) -> np.dtype:
        return self.params.dtype

    @property
    def per_tensor(self) -> bool:
        return self.params.scale.ndim == 0


@dataclass
class OutQuant:
    """An op's output quantizer: the QuantizeLinear and the Relu/Clip nodes between (in order)."""

    q: onnx.NodeProto
    params: QParams
    clamps: list[onnx.NodeProto]

    @property
    def tensor(self) -> str:
        return self.q.output[0]


class Rewriter:
    """One rewrite of a QDQ model (changed in place): the graph index, the nodes written instead
    of others, the new constants and what was done (the rules in :mod:`.qoperator_rules` call it)."""

    def __init__(self, model: onnx.ModelProto, where: str = "model") -> None:
        self.model, self.where = model, where
        self.g = QdqGraph(model, where)
        self.opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        self.replace: dict[int, list[onnx.NodeProto]] = {}
        self.inits: list[onnx.TensorProto] = []
        self.retyped: set[str] = set()                 # float tensor names now holding integers
        self.forms: Counter = Counter()
        self.written: dict[str, str] = {}              # float op name -> the integer op written for it
        self.kept: list[dict[str, str]] = []
        self.activations: dict[str, dict[str, Any]] = {}
        self.attributes: dict[str, dict[str, Any]] = {}  # node -> float attributes its integer form lacks

    # ---- reading the QDQ model
    def operand(self, name: str) -> Quant | str:
        """The quantized operand ``name`` is, or why it is none (a reason for the report)."""
        dq = self.g.producer.get(name)
        if dq is None or not is_op(dq, "DequantizeLinear"):
            return f"input {name!r} is not quantized (float or fp16)"
        try:
            params = qparams(dq, self.g)
        except ImportError_ as exc:
            return str(exc)
        if params.dtype not in EIGHT_BIT:
            return f"input {name!r} is {params.dtype} (the integer ONNX ops take 8-bit operands)"
        zp = dq.input[2] if len(dq.input) > 2 else ""
        return Quant(dq.input[0], dq.input[1], zp, params, self.g.is_const(dq.input[0]))

    def output(self, node: onnx.NodeProto) -> OutQuant | str:
        """The output quantizer of ``node`` (the module docstring), or why it has none."""
        value, clamps = node.output[0], []
        while True:
            readers = self.g.readers.get(value, [])
            if value in self.g.graph_outputs or len(readers) != 1:
                return f"its output {value!r} is not quantized by one QuantizeLinear"
            reader = readers[0]
            if is_op(reader, "QuantizeLinear") and id(reader) not in self.replace:
                break
            if reader.op_type not in ("Relu", "Clip") or reader.domain not in ("", "ai.onnx") or not reader.name:
                return f"its output {value!r} goes to {reader.op_type}, not a QuantizeLinear"
            clamps.append(reader)
            value = reader.output[0]
        try:
            params = qparams(reader, self.g)
        except ImportError_ as exc:
            return str(exc)
        if params.dtype not in EIGHT_BIT or params.scale.ndim:
            return f"its output quantizer {reader.name!r} is not 8-bit per tensor ({params.dtype})"
        if clamps and self.opset < _OPSET_INT_CLIP:
            return f"a Relu/Clip on integer codes needs opset {_OPSET_INT_CLIP} (the model has {self.opset})"
        if any(self._bounds(c, params) is None for c in clamps):
            return "a Clip between it and its quantizer has bounds that are not constants"
        return OutQuant(reader, params, clamps)

    def const_array(self, name: str) -> np.ndarray | None:
        return self.g.const(name) if name and self.g.is_const(name) else None

    # ---- writing
    def const(self, base: str, value: np.ndarray) -> str:
        name = self.g.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def write(self, node: onnx.NodeProto, nodes: list[onnx.NodeProto], out: OutQuant | None = None) -> None:
        """Write ``nodes`` instead of ``node`` (and of ``out``'s QuantizeLinear and clamps, which
        ``nodes`` must end in: see :meth:`quantized_output`)."""
        self.replace[id(node)] = nodes
        if out is not None:
            for dropped in [out.q, *out.clamps]:
                self.replace[id(dropped)] = []
        self.forms[nodes[0].op_type] += 1
        self.written[node.name] = nodes[0].op_type

    def quantized_output(self, node: onnx.NodeProto, out: OutQuant) -> tuple[str, list[onnx.NodeProto]]:
        """The tensor the integer node writes, and the clamps on codes that follow it: with no
        clamp, the quantizer's output; else the op's own output name (now integer codes), then
        each clamp under its own name, the last one writing the quantizer's output."""
        if not out.clamps:
            return out.tensor, []
        first = node.output[0]
        nodes, src = [], first
        self.retyped.add(first)
        for i, clamp in enumerate(out.clamps):
            dst = out.tensor if i == len(out.clamps) - 1 else clamp.output[0]
            self.retyped.add(dst)
            nodes.append(self._clamp_on_codes(clamp, src, dst, out.params))
            src = dst
        return first, nodes

    def _bounds(self, clamp: onnx.NodeProto, params: QParams) -> tuple[Any, Any] | None:
        """The codes of a Relu's/Clip's bounds under ``params`` (None for an open end), or None
        when a bound is not a constant."""
        if clamp.op_type == "Relu":
            return int(params.zero_point), None
        codes = []
        for i in (1, 2):
            name = clamp.input[i] if len(clamp.input) > i else ""
            if not name:
                codes.append(None)
                continue
            value = self.const_array(name)
            if value is None or value.size != 1:
                return None
            codes.append(quantize_scalar(float(value.reshape(())), params))
        return codes[0], codes[1]

    def _clamp_on_codes(self, clamp: onnx.NodeProto, src: str, dst: str, params: QParams) -> onnx.NodeProto:
        lo, hi = self._bounds(clamp, params)
        entry: dict[str, Any] = {"op_type": clamp.op_type}
        if clamp.op_type == "Clip":
            bounds = []
            for i in (1, 2):
                name = clamp.input[i] if len(clamp.input) > i else ""
                value = self.const_array(name)
                bounds.append([name, None if value is None else float(value.reshape(()))])
            entry["bounds"] = bounds
        self.activations[clamp.name] = entry
        if clamp.op_type == "Relu" and lo == 0 and params.dtype == np.int8 and self.opset >= _OPSET_INT_RELU:
            return helper.make_node("Relu", [src], [dst], name=clamp.name)
        inputs = [src]
        for code, tag in ((lo, "min"), (hi, "max")):
            inputs.append(self.const(f"{clamp.name}.{tag}_code", np.array(code, params.dtype))
                          if code is not None else "")
        while inputs[-1] == "":
            inputs.pop()
        return helper.make_node("Clip", inputs, [dst], name=clamp.name)

    def keep(self, node: onnx.NodeProto, reason: str) -> None:
        self.kept.append({"node": node.name, "op_type": node.op_type, "reason": reason})


def quantize_scalar(value: float, params: QParams) -> int:
    """``sat(rint(value / s) + zp)`` in float32, as QuantizeLinear computes it."""
    info = np.iinfo(params.dtype)
    q = np.rint(np.float32(value) / np.float32(params.scale)) + np.float32(params.zero_point)
    return int(np.clip(q, info.min, info.max))
