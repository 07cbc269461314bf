"""QOperator models → the QDQ form the QDQ importer reads (:func:`qir.io.qdq_import.convert_qdq`
calls :func:`to_qdq` first; :mod:`.qoperator_export` writes such models).

Each integer node becomes ``DequantizeLinear`` of each quantized input → the float op →
``QuantizeLinear`` of its output (with the node's output scale and zero point), so the QDQ
importer then finds the same Q→DQ pairs and weights the QDQ model had:

* ``QLinearConv`` / ``QLinearMatMul`` (ONNX), ``QGemm`` / ``QLinearAdd`` / ``QLinearMul`` /
  ``QLinearSigmoid`` / ``QLinearLeakyRelu`` / ``QLinearAveragePool`` /
  ``QLinearGlobalAveragePool`` / ``QLinearConcat`` (com.microsoft): the float op of the same
  name and attributes (a ``QGemm`` without ``y_scale`` has a float output: no QuantizeLinear);
* an int32 bias ``B`` (QLinearConv, QGemm) becomes the float constant ``B · (s_x·s_w)``,
  computed as DequantizeLinear computes it;
* ``ConvInteger`` / ``MatMulInteger`` → [``Add`` int32 bias] → ``Cast`` → ``Mul(s)`` (what
  :mod:`.qoperator_rules` writes for an op with a float output) becomes the float op writing
  the ``Mul``'s output. The input's scale is its QuantizeLinear's; the weight's comes from the
  calibration metadata and must give ``s`` (``s_x·s_w`` in float32), else it is an error;
* a ``Relu`` / ``Clip`` on the codes of an integer node's output becomes the float Relu/Clip
  before the QuantizeLinear: the one in the ``qir.qoperator`` metadata (op type, bound names
  and values) when its codes are still the bounds' codes, else one with the dequantized bounds.

**Names.** With the ``qir.qoperator`` metadata, the DequantizeLinear of a quantized tensor takes
the name and the output of the calibration node that read it in the QDQ model, and its
QuantizeLinear the name ``<calibration>/quantize`` and the calibration node's input; so the QDQ
importer's metadata overlay restores every calibration node. Without it (models of other
tools), fresh names. The float op keeps the integer node's name.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qir.calibration import calib_scale
from qir.errors import ImportError_
from qir.io.qdq_graph import QdqGraph, is_op, label
from qir.io.qdq_metadata import EMIT_METADATA_KEY, entry_state
from qir.io.qdq_params import QParams, dequantize, qparams
from qir.io.qoperator_graph import MS_DOMAIN, QOPERATOR_METADATA_KEY, quantize_scalar
from qir.records import CalibRecord

__all__ = ["to_qdq", "has_qoperator", "QOPERATOR_METADATA_KEY"]

# integer op -> (float op, input triples (tensor, scale, zero point), output pair, bias slot)
_LAYOUT: dict[str, tuple[str, list[tuple[int, int, int]], tuple[int, int], int | None]] = {
    "QLinearConv": ("Conv", [(0, 1, 2), (3, 4, 5)], (6, 7), 8),
    "QLinearMatMul": ("MatMul", [(0, 1, 2), (3, 4, 5)], (6, 7), None),
    "QGemm": ("Gemm", [(0, 1, 2), (3, 4, 5)], (7, 8), 6),
    "QLinearAdd": ("Add", [(0, 1, 2), (3, 4, 5)], (6, 7), None),
    "QLinearMul": ("Mul", [(0, 1, 2), (3, 4, 5)], (6, 7), None),
    "QLinearSigmoid": ("Sigmoid", [(0, 1, 2)], (3, 4), None),
    "QLinearLeakyRelu": ("LeakyRelu", [(0, 1, 2)], (3, 4), None),
    "QLinearAveragePool": ("AveragePool", [(0, 1, 2)], (3, 4), None),
    "QLinearGlobalAveragePool": ("GlobalAveragePool", [(0, 1, 2)], (3, 4), None),
}
_DEFAULT_DOMAIN = ("QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger")
_INTEGER_SUMS = {"ConvInteger": "Conv", "MatMulInteger": "MatMul"}


def _is_integer_node(node: onnx.NodeProto) -> bool:
    domain = ("", "ai.onnx") if node.op_type in _DEFAULT_DOMAIN else (MS_DOMAIN,)
    known = node.op_type in _LAYOUT or node.op_type in _INTEGER_SUMS or node.op_type == "QLinearConcat"
    return known and node.domain in domain


def has_qoperator(proto: onnx.ModelProto) -> bool:
    """Does the model hold integer nodes :func:`to_qdq` rewrites?"""
    return any(_is_integer_node(n) for n in proto.graph.node)


def _weight_axis(op_type: str, attrs: dict[str, Any], slot: int, rank: int | None) -> int | None:
    """The output-channel axis of a per-channel quantized input ``slot`` of the float op."""
    if slot != 1:
        return None
    if op_type == "Conv":
        return 0
    if op_type == "Gemm":
        return 0 if attrs.get("transB", 0) else 1
    return (rank - 1) if rank else 1  # MatMul: per column


class QOperatorRewrite:
    """One rewrite of ``proto`` (changed in place)."""

    def __init__(self, proto: onnx.ModelProto, where: str) -> None:
        self.proto, self.where = proto, where
        self.g = QdqGraph(proto, where)
        self.g.node_names |= {n.name for n in proto.graph.node if n.name}
        note = self._pop_metadata()
        self.quantized: dict[str, str] = note.get("quantized", {})
        self.activations: dict[str, dict[str, Any]] = note.get("activations", {})
        self.attributes: dict[str, dict[str, Any]] = note.get("attributes", {})
        self.entries = self._calibration_entries()
        self.replace: dict[int, list[onnx.NodeProto]] = {}
        self.dq_cache: dict[tuple, str] = {}  # (tensor, scale, zero point, axis) -> its float value
        self.inits: list[onnx.TensorProto] = []
        for n in proto.graph.node:  # the DequantizeLinear nodes already there are reused
            if is_op(n, "DequantizeLinear") and len(n.input) >= 2:
                key = (n.input[0], n.input[1], n.input[2] if len(n.input) > 2 else "", _axis_attr(n))
                self.dq_cache.setdefault(key, n.output[0])

    # ---- metadata
    def _pop_metadata(self) -> dict[str, Any]:
        props = self.proto.metadata_props
        note: dict[str, Any] = {}
        for p in [p for p in props if p.key == QOPERATOR_METADATA_KEY]:
            try:
                note = json.loads(p.value)
            except ValueError:
                note = {}
            props.remove(p)
        return note if isinstance(note, dict) else {}

    def _calibration_entries(self) -> dict[str, dict[str, Any]]:
        for p in self.proto.metadata_props:
            if p.key == EMIT_METADATA_KEY:
                try:
                    return {e["name"]: e for e in json.loads(p.value)["calibrations"]}
                except (ValueError, KeyError, TypeError):
                    return {}
        return {}

    def _entry(self, tensor: str) -> dict[str, Any] | None:
        calib = self.quantized.get(tensor)
        return self.entries.get(calib) if calib else None

    # ---- helpers
    def const(self, base: str, value: np.ndarray) -> str:
        name = self.g.fresh(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def dequantized(self, tensor: str, scale: str, zp: str, axis: int | None, out: list[onnx.NodeProto]) -> str:
        """The float value of ``tensor``: an existing DequantizeLinear's output, or a new one's."""
        key = (tensor, scale, zp, axis)
        if key in self.dq_cache:
            return self.dq_cache[key]
        entry = self._entry(tensor)
        if entry and entry["name"] not in self.g.node_names and entry["output"] not in self.g.names:
            name, value = entry["name"], entry["output"]
            self.g.node_names.add(name)
            self.g.names.add(value)
        else:
            name, value = self.g.fresh_node(f"{tensor}/dequantize"), self.g.fresh(f"{tensor}_dequantized")
        attrs = {"axis": axis} if axis is not None else {}
        out.append(helper.make_node("DequantizeLinear", [tensor, scale] + ([zp] if zp else []), [value], name=name, **attrs))
        self.dq_cache[key] = value
        return value

    def quantize(self, tensor: str, scale: str, zp: str) -> tuple[str, onnx.NodeProto]:
        """A QuantizeLinear writing ``tensor`` and the float value it reads (a new name)."""
        entry = self._entry(tensor)
        if entry and entry["input"] not in self.g.names and f"{entry['name']}/quantize" not in self.g.node_names:
            value, name = entry["input"], f"{entry['name']}/quantize"
            self.g.names.add(value)
            self.g.node_names.add(name)
        else:
            value, name = self.g.fresh(f"{tensor}_float"), self.g.fresh_node(f"{tensor}/quantize")
        return value, helper.make_node("QuantizeLinear", [value, scale] + ([zp] if zp else []), [tensor], name=name)

    def params(self, scale: str, zp: str, where: str) -> QParams:
        probe = helper.make_node("DequantizeLinear", ["x", scale] + ([zp] if zp else []), ["y"], name=where)
        return qparams(probe, self.g)

    def clamps_after(self, tensor: str) -> list[onnx.NodeProto]:
        """The chain of Relu/Clip nodes (constant bounds) on the codes of ``tensor``, each the only
        reader of the value before."""
        chain = []
        while True:
            readers = self.g.readers.get(tensor, [])
            if len(readers) != 1 or tensor in self.g.graph_outputs or readers[0].op_type not in ("Relu", "Clip"):
                return chain
            if any(b and not self.g.is_const(b) for b in readers[0].input[1:]):
                return chain
            chain.append(readers[0])
            tensor = readers[0].output[0]

    # ---- the rewrite
    def run(self) -> onnx.ModelProto:
        for node in list(self.proto.graph.node):
            if _is_integer_node(node) and id(node) not in self.replace:
                if node.op_type in _INTEGER_SUMS:
                    self._integer_sums(node)
                else:
                    self._qlinear(node)
        graph = self.proto.graph
        nodes = [m for n in graph.node for m in self.replace.get(id(n), [n])]
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(self.inits)
        retyped = {o for new in self.replace.values() for n in new for o in n.output}
        vis = [v for v in graph.value_info if v.name not in retyped]
        del graph.value_info[:]
        graph.value_info.extend(vis)
        _infer_types(self.proto, retyped)
        if not any(n.domain == MS_DOMAIN for n in nodes):
            keep = [o for o in self.proto.opset_import if o.domain != MS_DOMAIN]
            del self.proto.opset_import[:]
            self.proto.opset_import.extend(keep)
        return self.proto

    def _qlinear(self, node: onnx.NodeProto) -> None:
        where = f"{self.where}: {label(node)}"
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.pop("channels_last", 0):
            raise ImportError_(f"{where} is channels-last, which qir does not read back")
        if node.op_type == "QLinearConcat":
            float_op, triples, pair, bias_slot = "Concat", [(i, i + 1, i + 2) for i in range(2, len(node.input), 3)], (0, 1), None
        else:
            float_op, triples, pair, bias_slot = _LAYOUT[node.op_type]
        ins = list(node.input) + [""] * 10
        out: list[onnx.NodeProto] = []
        inputs = []
        for slot, (t, s, z) in enumerate(triples):
            scale = self.g.const(ins[s])
            axis = _weight_axis(float_op, attrs, slot, self.g.rank(ins[t])) if scale is not None and scale.size > 1 else None
            inputs.append(self.dequantized(ins[t], ins[s], ins[z], axis, out))
        if bias_slot is not None and ins[bias_slot]:
            inputs.append(self._bias(node, ins[bias_slot], ins[triples[0][1]], ins[triples[1][1]]))
        scale, zp = ins[pair[0]], ins[pair[1]]
        # no output scale: a float output (QGemm without y_scale)
        float_y, tail = self._quantized_tail(node, scale, zp) if scale else (node.output[0], [])
        attrs.update(self.attributes.get(node.name, {}))
        self.replace[id(node)] = out + [helper.make_node(float_op, inputs, [float_y], name=node.name, **attrs)] + tail

    def _quantized_tail(self, node: onnx.NodeProto, scale: str, zp: str) -> tuple[str, list[onnx.NodeProto]]:
        """The float op's output name, and what follows it: the float Relu/Clip nodes that were on
        its codes (the op then writes its own output name, float now) and the QuantizeLinear that
        writes the node's quantized tensor."""
        clamps = self.clamps_after(node.output[0])
        if not clamps:
            value, q = self.quantize(node.output[0], scale, zp)
            return value, [q]
        params = self.params(scale, zp, f"{node.name}/output")
        tail, src = [], node.output[0]
        for clamp in clamps:
            self.replace[id(clamp)] = []
            if clamp is clamps[-1]:
                value, q = self.quantize(clamp.output[0], scale, zp)
            else:
                value, q = clamp.output[0], None
            tail.append(self._float_clamp(clamp, src, value, params))
            src = value
        return node.output[0], tail + [q]

    def _float_clamp(self, clamp: onnx.NodeProto, src: str, dst: str, params: QParams) -> onnx.NodeProto:
        codes = []
        for i in (1, 2):
            name = clamp.input[i] if len(clamp.input) > i else ""
            codes.append(None if not name else int(np.asarray(self.g.const(name)).reshape(())))
        if clamp.op_type == "Relu":
            codes = [int(params.zero_point), None]
        entry = self.activations.get(clamp.name)
        if entry and _restorable(entry, codes, params):
            if entry["op_type"] == "Relu":
                return helper.make_node("Relu", [src], [dst], name=clamp.name)
            bounds = [self._bound(n, v) for n, v in entry["bounds"]]
        else:
            bounds = [self.const(f"{clamp.name}.{tag}", dequantize(np.asarray(c), params.scale, params.zero_point, None))
                      if c is not None else "" for c, tag in zip(codes, ("min", "max"))]
        while bounds and bounds[-1] == "":
            bounds.pop()
        return helper.make_node("Clip", [src, *bounds], [dst], name=clamp.name)

    def _bound(self, name: str, value: float | None) -> str:
        if value is None:
            return ""
        if name and name not in self.g.names:
            self.g.names.add(name)
            self.inits.append(numpy_helper.from_array(np.array(value, np.float32), name))
            return name
        return self.const(name or "clip_bound", np.array(value, np.float32))

    def _bias(self, node: onnx.NodeProto, bias: str, x_scale: str, w_scale: str) -> str:
        codes = self.g.const(bias)
        if codes is None:
            raise ImportError_(f"{self.where}: {label(node)}: its bias {bias!r} is not a constant")
        scale = (np.float32(self.g.const(x_scale)) * np.asarray(self.g.const(w_scale), np.float32)).astype(np.float32)
        values = dequantize(codes, np.broadcast_to(scale, codes.shape) if codes.ndim else scale, None,
                            0 if codes.ndim else None)
        base = bias[: -len("_quantized")] if bias.endswith("_quantized") else f"{bias}_float"
        return self.const(base, values)

    def _integer_sums(self, node: onnx.NodeProto) -> None:
        """ConvInteger / MatMulInteger → [Add bias] → Cast → Mul(s), as the exporter writes them."""
        where = f"{self.where}: {label(node)}"
        chain = self._sums_chain(node, where)
        add, cast, mul = chain
        x, w = node.input[0], node.input[1]
        x_scale, x_zp = self._activation_params(x, where)
        w_zp = node.input[3] if len(node.input) > 3 else ""
        w_scale = self._weight_scale(w, where)
        acc_scale = np.asarray(self.g.const(mul.input[1]), np.float32).reshape(-1)
        if not np.array_equal(np.broadcast_to((np.float32(self.g.const(x_scale)) * w_scale).astype(np.float32),
                                              acc_scale.shape), acc_scale):
            raise ImportError_(f"{where}: its output scale is not s_x*s_w of its inputs' quantizers")
        float_op = _INTEGER_SUMS[node.op_type]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        rank = self.g.rank(w)
        axis = _weight_axis(float_op, attrs, 1, rank) if w_scale.size > 1 else None
        w_zp_value = np.asarray(self.g.const(w_zp)) if w_zp else np.zeros((), self.g.const(w).dtype)
        w_scale_name = self.const(f"{w}.scale", w_scale if axis is not None else w_scale.reshape(()))
        w_zp_name = self.const(f"{w}.zero_point", np.broadcast_to(w_zp_value.reshape(-1)[0], w_scale.shape).copy()
                               if axis is not None else w_zp_value.reshape(()))
        out: list[onnx.NodeProto] = []
        inputs = [self.dequantized(x, x_scale, x_zp, None, out), self.dequantized(w, w_scale_name, w_zp_name, axis, out)]
        if add is not None:
            b = add.input[1]
            codes = np.asarray(self.g.const(b)).reshape(-1)
            base = b[: -len("_quantized")] if b.endswith("_quantized") else f"{b}_float"
            inputs.append(self.const(base, dequantize(codes, np.broadcast_to(acc_scale, codes.shape), None, 0)))
        for n in (add, cast, mul):
            if n is not None:
                self.replace[id(n)] = []
        self.replace[id(node)] = out + [helper.make_node(float_op, inputs, [mul.output[0]], name=node.name, **attrs)]

    def _sums_chain(self, node: onnx.NodeProto, where: str) -> tuple[Any, onnx.NodeProto, onnx.NodeProto]:
        def only_reader(value: str) -> onnx.NodeProto | None:
            readers = self.g.readers.get(value, [])
            return readers[0] if len(readers) == 1 and value not in self.g.graph_outputs else None

        nxt = only_reader(node.output[0])
        add = None
        if nxt is not None and nxt.op_type == "Add" and self.g.is_const(nxt.input[1]):
            add, nxt = nxt, only_reader(nxt.output[0])
        cast = nxt
        mul = only_reader(cast.output[0]) if cast is not None and cast.op_type == "Cast" else None
        to = next((helper.get_attribute_value(a) for a in cast.attribute if a.name == "to"), None) if cast is not None else None
        if mul is None or mul.op_type != "Mul" or to != TensorProto.FLOAT or not self.g.is_const(mul.input[1]):
            raise ImportError_(f"{where} is not followed by [Add bias] -> Cast(float) -> Mul(scale); qir reads "
                               "integer sums only in the form qir emit --format qoperator writes")
        return add, cast, mul

    def _activation_params(self, tensor: str, where: str) -> tuple[str, str]:
        """The scale and zero point names of an integer activation: those of the QuantizeLinear or
        integer node that writes it (through clamps on codes), else of a DequantizeLinear reading it."""
        node = self.g.producer.get(tensor)
        while node is not None and node.op_type in ("Relu", "Clip"):
            node = self.g.producer.get(node.input[0])
        if node is not None and is_op(node, "QuantizeLinear"):
            return node.input[1], node.input[2] if len(node.input) > 2 else ""
        if node is not None and _is_integer_node(node) and node.op_type not in _INTEGER_SUMS:
            pair = (0, 1) if node.op_type == "QLinearConcat" else _LAYOUT[node.op_type][2]
            ins = list(node.input) + [""] * 10
            if ins[pair[0]]:
                return ins[pair[0]], ins[pair[1]]
        dq = next((r for r in self.g.readers.get(tensor, []) if is_op(r, "DequantizeLinear")), None)
        if dq is None:
            raise ImportError_(f"{where}: the scale of its input {tensor!r} is unknown (no QuantizeLinear or "
                               "integer node writes it, no DequantizeLinear reads it)")
        return dq.input[1], dq.input[2] if len(dq.input) > 2 else ""

    def _weight_scale(self, tensor: str, where: str) -> np.ndarray:
        entry = self._entry(tensor)
        if entry is None:
            raise ImportError_(f"{where}: the scale of its weight {tensor!r} is unknown (the model has no "
                               f"{QOPERATOR_METADATA_KEY} / {EMIT_METADATA_KEY} metadata naming it)")
        state = entry_state(entry, f"{self.where}: the {EMIT_METADATA_KEY} metadata of {entry['name']!r}")
        probe = CalibRecord("probe", "x", "y", mode=state.mode, threshold=state.threshold, scale=state.scale,
                            axis=state.axis)
        return np.asarray(calib_scale(probe), np.float32).reshape(-1)


def _infer_types(proto: onnx.ModelProto, names: set[str]) -> None:
    """Add the inferred type and shape of the tensors ``names`` (the float values the rewrite
    wrote, typed in the QDQ model qir emitted from) to the graph's value infos."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto)
    except Exception:  # a model onnx cannot infer: the importer infers what it needs
        return
    known = {v.name for v in proto.graph.value_info}
    proto.graph.value_info.extend(v for v in inferred.graph.value_info if v.name in names and v.name not in known)


def _axis_attr(node: onnx.NodeProto) -> int | None:
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), None)


def _restorable(entry: dict[str, Any], codes: list[int | None], params: QParams) -> bool:
    """Is the metadata's Relu/Clip the one whose bound codes the file holds?"""
    if entry.get("op_type") == "Relu":
        return codes[0] == int(params.zero_point) and codes[1] is None
    try:
        want = [None if v is None else quantize_scalar(float(v), params) for _, v in entry["bounds"]]
    except (KeyError, TypeError, ValueError):
        return False
    return entry.get("op_type") == "Clip" and want == codes


def to_qdq(proto: onnx.ModelProto, where: str = "model") -> onnx.ModelProto:
    """Rewrite the integer nodes of ``proto`` (changed in place and returned) into QDQ form (the
    module docstring); a model without them comes back untouched."""
    if not has_qoperator(proto):
        return proto
    return QOperatorRewrite(proto, where).run()
