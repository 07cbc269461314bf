"""The QDQ importer's view of an ONNX graph (:mod:`qir.io.qdq_import`): which nodes are
QuantizeLinear/DequantizeLinear, and an index of the graph's constants, producers, readers and
the names in use."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from qir.naming import fresh_name

__all__ = ["QDQ_DOMAINS", "QdqGraph", "is_op", "label"]

QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")


def is_op(node: onnx.NodeProto, op_type: str) -> bool:
    """Is ``node`` the ONNX (or com.microsoft) op ``op_type``?"""
    return node.op_type == op_type and node.domain in QDQ_DOMAINS


def label(node: onnx.NodeProto) -> str:
    """``OpType 'name'`` for error messages."""
    return f"{node.op_type} {node.name or '(unnamed)'!r}"


class QdqGraph:
    """Index of a ModelProto's graph: constants, producers, readers, names in use."""

    def __init__(self, proto: onnx.ModelProto, where: str) -> None:
        self.proto, self.where = proto, where
        g = proto.graph
        self.inits = {i.name: i for i in g.initializer}
        self.constant_nodes = {n.output[0]: n for n in g.node
                               if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.output}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in n.input:
                if i:
                    self.readers.setdefault(i, []).append(n)
        self.graph_inputs = {i.name for i in g.input if i.name not in self.inits}
        self.graph_outputs = {o.name for o in g.output}
        self.names = set(self.inits) | {i.name for i in g.input} | set(self.producer)
        # Q/DQ nodes all go away, so their names are free for the calibration nodes
        self.node_names = {n.name for n in g.node if n.name and not (
            is_op(n, "QuantizeLinear") or is_op(n, "DequantizeLinear"))}
        self.ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
                      for vi in list(g.value_info) + list(g.input) + list(g.output)
                      if vi.type.tensor_type.HasField("shape")}
        self._arrays: dict[str, np.ndarray] = {}

    def const(self, name: str) -> np.ndarray | None:
        """The value of a constant (initializer or Constant node), else None."""
        if not name:
            return None
        if name not in self._arrays:
            if name in self.inits:
                self._arrays[name] = numpy_helper.to_array(self.inits[name])
            elif name in self.constant_nodes:
                from qir.io.onnx_proto import constant_value
                self._arrays[name] = constant_value(self.constant_nodes[name], self.where)
            else:
                return None
        return self._arrays[name]

    def is_const(self, name: str) -> bool:
        return name in self.inits or name in self.constant_nodes

    def rank(self, name: str) -> int | None:
        """Rank of a constant or of a value with a known shape, else None."""
        if self.is_const(name):
            return self.const(name).ndim
        return self.ranks.get(name)

    def fresh(self, base: str) -> str:
        """A tensor name not in use (``base``, ``base_1``, ...); reserves it."""
        name = fresh_name(base, self.names)
        self.names.add(name)
        return name

    def fresh_node(self, base: str) -> str:
        """``<base>_calib`` style unique node name (insert-calibration's convention); reserves it."""
        name = fresh_name(base, self.node_names, sep="")
        self.node_names.add(name)
        return name
