"""The QDQ rewrite: Q/DQ nodes of a ``ModelProto`` → float ops and ``qir::Calibration`` nodes
(:mod:`qir.io.qdq_import`; quantizer parameters: :mod:`qir.io.qdq_params`, implied clips:
:mod:`qir.io.qdq_clips`, emit metadata: :mod:`qir.io.qdq_metadata`).

1. **Activations**: ``x → QuantizeLinear(s, zp) → DequantizeLinear(s, zp) → y`` becomes one
   calibration node ``x → <x>_calib → y`` holding the stored scale ``s`` (used as stored), the
   zero point, and ``axis`` when per-channel. A Q whose output feeds several DQs with the same
   parameters becomes one node (every DQ output then reads it). Q input a constant → role weight.
2. **Weights**: ``W_q`` (int8/uint8/int16/uint16 initializer) ``→ DequantizeLinear(s, zp, axis)``
   becomes a float32 initializer ``W = (W_q - zp) * s``, computed exactly as DequantizeLinear
   does (integer subtraction, then one float32 multiply), followed by a weight calibration node
   with the stored ``s``/``zp``/``axis``. Fake quantization of ``W`` gives back ``W`` bit for
   bit: ``W / s`` is within ``|k| * 2^-23`` of the integer ``k = W_q - zp`` (``|k| <= 65535``),
   so it rounds to ``k``, and ``k * s`` is the same float32 product. The float name is the
   int initializer's name without onnxruntime's ``_quantized`` suffix.
3. **Biases**: an int32 ``DequantizeLinear`` becomes a plain float initializer (the DQ output
   name, same exact arithmetic); biases stay float, with no calibration node.

Anything else is an error naming the node: a QuantizeLinear feeding a non-DQ op or a graph
output, a DequantizeLinear reading neither a QuantizeLinear nor an integer constant, a Q→DQ
pair with different parameters, 4-bit / float8 / blocked quantization.
"""
from __future__ import annotations

import heapq
from typing import Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qir.errors import ImportError_
from qir.io import calib_onnx
from qir.io.qdq_clips import implied_clip
from qir.io.qdq_graph import QdqGraph, is_op, label
from qir.io.qdq_metadata import EmitRestore
from qir.io.qdq_params import QParams, dequantize, qparams, quantizer_state
from qir.kinds import CalibRole
from qir.records import QuantizerState

__all__ = ["QdqRewrite"]

_ORT_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


def _calib_node(name: str, x: str, y: str, role: CalibRole, state: QuantizerState) -> onnx.NodeProto:
    rec = state.record(name, x, y, role)
    return calib_onnx.calibration_to_node(rec)


class QdqRewrite(EmitRestore):
    """One rewrite of ``proto`` (changed in place): :meth:`run` returns it."""

    def __init__(self, proto: onnx.ModelProto, where: str,
                 float_clips: Mapping[str, tuple[float, float]] | None) -> None:
        self.proto, self.where = proto, where
        self.g = QdqGraph(proto, where)
        self.float_clips = float_clips
        self.replace: dict[int, list[onnx.NodeProto]] = {}   # id(node) -> nodes written instead
        self.insert: dict[int, list[onnx.NodeProto]] = {}    # id(node) -> nodes written before it
        self.rename: dict[str, str] = {}                     # tensor read -> tensor to read instead
        self.new_inits: list[onnx.TensorProto] = []
        self.calib_outputs: set[str] = set()
        self.helpers: set[int] = set()                       # Identity nodes written for graph outputs
        self.explicit_feeds: set[str] = set()                # calibration nodes with feeds from metadata
        self.entries: dict[str, dict[str, Any]] = {}
        self.report = {"activation": 0, "weight": 0, "bias": 0, "implied_clip": 0, "restored": 0}
        self._float_weights: dict[tuple, str] = {}

    # ---- entry point
    def run(self) -> onnx.ModelProto:
        self._read_metadata()
        nodes = list(self.proto.graph.node)
        self._restore_emitted(nodes)
        for node in nodes:
            if id(node) not in self.replace and is_op(node, "QuantizeLinear"):
                self._activation_pair(node)
        for node in nodes:
            if id(node) not in self.replace and is_op(node, "DequantizeLinear"):
                self._dequantize_constant(node)
        return self._write(nodes)

    # ---- pieces
    def _name_for(self, base: str) -> str:
        return self.g.fresh_node(f"{base}_calib")

    def _add_calibration(self, node: onnx.NodeProto, name: str, x: str, y: str, role: CalibRole,
                         state: QuantizerState, *, before: bool = False) -> None:
        """Write a calibration node instead of ``node`` (or right before it, ``before``)."""
        cal = _calib_node(name, x, y, role, state)
        self.calib_outputs.add(y)
        table = self.insert if before else self.replace
        table.setdefault(id(node), []).append(cal)

    def _activation_pair(self, q: onnx.NodeProto) -> None:
        g, where = self.g, f"{self.where}: {label(q)}"
        out = q.output[0]
        if out in g.graph_outputs:
            raise ImportError_(f"{where}: its quantized output {out!r} is a graph output; qir imports "
                               "QDQ models whose graph outputs are float (the IR's calibration nodes are "
                               "fake quantization: float in, float out)")
        readers = g.readers.get(out, [])
        bad = [r for r in readers if not is_op(r, "DequantizeLinear") or r.input[0] != out]
        if bad:
            raise ImportError_(f"{where} feeds {label(bad[0])}; qir reads QuantizeLinear → "
                               "DequantizeLinear pairs only (QDQ format, not QOperator)")
        if not readers:
            self.replace[id(q)] = []  # a dangling Q: nothing reads it
            return
        params = qparams(q, g)
        for dq in readers:
            if not qparams(dq, g).same(params):
                raise ImportError_(f"{where} and {label(dq)} quantize with different parameters "
                                   "(scale, zero point, type or axis); qir needs them equal")
        x = q.input[0]
        role = CalibRole.WEIGHT if g.is_const(x) else CalibRole.ACTIVATION
        state = quantizer_state(params, g.rank(x), where)
        first = readers[0]
        y = first.output[0]
        name, state = self._overlay(first.name, state, role)
        if name is None:
            state.implied_clip = implied_clip(g, x, state, role, self.float_clips)
            # onnxruntime renames a graph output y it quantizes to y_QuantizeLinear_Input
            base = x[: -len(_ORT_OUTPUT_SUFFIX)] if x.endswith(_ORT_OUTPUT_SUFFIX) and x != _ORT_OUTPUT_SUFFIX else x
            name = self._name_for(base)
        if state.implied_clip is not None:
            self.report["implied_clip"] += 1
        self._add_calibration(q, name, x, y, role, state)
        self.report[role.value] += 1
        for dq in readers[1:]:  # further DQs of the same quantizer: their readers read y
            self.replace[id(dq)] = []
            self.rename[dq.output[0]] = y
            if dq.output[0] in g.graph_outputs:  # the graph output keeps its name
                copy = helper.make_node("Identity", [y], [dq.output[0]], name=dq.name)
                self.replace[id(dq)] = [copy]
                self.helpers.add(id(copy))
        self.replace.setdefault(id(first), [])

    def _dequantize_constant(self, dq: onnx.NodeProto) -> None:
        g, where = self.g, f"{self.where}: {label(dq)}"
        src = dq.input[0]
        if not g.is_const(src):
            producer = g.producer.get(src)
            what = f"{label(producer)}" if producer is not None else "a graph input"
            raise ImportError_(f"{where} reads {src!r}, produced by {what}: not a QuantizeLinear nor an "
                               "integer constant; qir cannot tell which float value it stands for (the IR's "
                               "calibration nodes are fake quantization: float in, float out)")
        q = np.asarray(g.const(src))
        params = qparams(dq, g)
        y = dq.output[0]
        values = dequantize(q, params.scale, params.zero_point, params.axis)
        if params.dtype == np.int32:  # a bias: plain float initializer, no calibration node
            self.new_inits.append(numpy_helper.from_array(values, y))
            self.replace[id(dq)] = []
            self.report["bias"] += 1
            return
        state = quantizer_state(params, q.ndim, where)
        name, state = self._overlay(dq.name, state, CalibRole.WEIGHT)
        entry_input = self.entries.get(name, {}).get("input") if name else None
        w = self._float_weight(src, params, values, entry_input)
        if name is None:
            name = self._name_for(w)
        self._add_calibration(dq, name, w, y, CalibRole.WEIGHT, state)
        self.report["weight"] += 1

    def _float_weight(self, src: str, params: QParams, values: np.ndarray, preferred: str | None) -> str:
        key = (src, params.scale.tobytes(), params.zero_point.tobytes(), params.axis)
        if key in self._float_weights:
            return self._float_weights[key]
        base = preferred or (src[: -len("_quantized")] if src.endswith("_quantized") else src + "_float")
        name = self.g.fresh(base)
        self.new_inits.append(numpy_helper.from_array(values, name))
        self._float_weights[key] = name
        return name

    # ---- output
    def _write(self, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        graph = self.proto.graph
        out: list[onnx.NodeProto] = []
        for node in nodes:
            out.extend(self.insert.get(id(node), []))
            out.extend(self.replace.get(id(node), [node]))
        rename = self.rename
        for node in out:
            if id(node) in self.helpers:
                continue
            for i, v in enumerate(node.input):
                if v in rename:
                    node.input[i] = rename[v]
        # feeds: the ops reading each calibration output (unless the metadata named them)
        readers: dict[str, list[str]] = {}
        for node in out:
            if node.domain == calib_onnx.DOMAIN or id(node) in self.helpers:
                continue
            for v in node.input:
                if v in self.calib_outputs and node.name:
                    readers.setdefault(v, [])
                    if node.name not in readers[v]:
                        readers[v].append(node.name)
        for node in out:
            if node.domain == calib_onnx.DOMAIN and node.name not in self.explicit_feeds:
                for a in list(node.attribute):
                    if a.name == "feeds":
                        node.attribute.remove(a)
                feeds = readers.get(node.output[0])
                if feeds:
                    node.attribute.append(helper.make_attribute("feeds", feeds))
        graph.initializer.extend(self.new_inits)
        sorted_nodes = _toposort(out, {i.name for i in graph.input} | {i.name for i in graph.initializer})
        del graph.node[:]
        graph.node.extend(sorted_nodes)
        # drop constants and value infos nothing uses any more
        used = {v for n in graph.node for v in n.input} | {o.name for o in graph.output}
        kept = [i for i in graph.initializer if i.name in used]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        produced = {o for n in graph.node for o in n.output} | {i.name for i in graph.input} | \
            {i.name for i in graph.initializer}
        vis = [v for v in graph.value_info if v.name in produced]
        del graph.value_info[:]
        graph.value_info.extend(vis)
        if any(n.domain == calib_onnx.DOMAIN for n in graph.node) and \
                not any(o.domain == calib_onnx.DOMAIN for o in self.proto.opset_import):
            self.proto.opset_import.append(helper.make_opsetid(calib_onnx.DOMAIN, calib_onnx.OPSET))
        return self.proto


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Stable topological order (Kahn; ties in the given order). Inputs nobody produces count
    as available (the importer reports them)."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps: list[set[int]] = []
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        d = {producer[v] for v in n.input if v and v not in available and v in producer and producer[v] != i}
        deps.append(d)
        for j in d:
            users.setdefault(j, []).append(i)
    ready = [i for i, d in enumerate(deps) if not d]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            deps[u].discard(i)
            if not deps[u]:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):  # a cycle: leave the rest in place for the importer to report
        seen = set(order)
        order += [i for i in range(len(nodes)) if i not in seen]
    return [nodes[i] for i in order]
