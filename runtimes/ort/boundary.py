"""Graph inputs and outputs of element types onnxruntime's Python API cannot exchange.

onnxruntime computes bfloat16, the float8 / float4 formats and the packed 4- and 2-bit
integers, but its Python API takes and returns only numpy's own types. A model with such a
graph input or output is given a wide boundary instead (:func:`widen_boundary`): the input is
declared float32 (int8 / uint8 for the integers) and cast to its type inside the graph, the
output is cast to the wide type at the end. :class:`WidenedSession` converts the feeds to the
wide type and the outputs back; every value of the narrow types is exact in the wide one, so
nothing changes but the container.

onnxruntime has no kernels for float4e2m1 at all: a float4 graph input stays float32 inside
the graph (an Identity instead of the Cast; a Cast from it then reads float32), and a Cast to
float4 whose result is a graph output rounds in float32 instead (:func:`float4_cast`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["NARROW_TYPES", "widen_boundary", "WidenedSession", "float4_cast"]

# narrow ONNX element type -> the wide one it crosses the boundary as
NARROW_TYPES = {
    TensorProto.BFLOAT16: TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN: TensorProto.FLOAT,
    TensorProto.FLOAT8E4M3FNUZ: TensorProto.FLOAT, TensorProto.FLOAT8E5M2: TensorProto.FLOAT,
    TensorProto.FLOAT8E5M2FNUZ: TensorProto.FLOAT, TensorProto.FLOAT8E8M0: TensorProto.FLOAT,
    TensorProto.FLOAT4E2M1: TensorProto.FLOAT, TensorProto.INT4: TensorProto.INT8, TensorProto.INT2: TensorProto.INT8,
    TensorProto.UINT4: TensorProto.UINT8, TensorProto.UINT2: TensorProto.UINT8,
}


def _np(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _rename_uses(graph: onnx.GraphProto, old: str, new: str, outputs: bool) -> None:
    for node in graph.node:
        node.input[:] = [new if v == old else v for v in node.input]
        if outputs:
            node.output[:] = [new if v == old else v for v in node.output]


@dataclass
class WidenedSession:
    """An onnxruntime session behind a widened boundary: ``run`` takes and returns the narrow
    types (``inputs``: the wide type of each widened input; ``outputs``: the narrow type of
    each widened output)."""

    session: object
    inputs: dict[str, np.dtype]
    outputs: dict[str, np.dtype]

    def get_outputs(self):
        return self.session.get_outputs()

    def run(self, names, feeds):
        wide = {k: np.asarray(v).astype(self.inputs[k]) if k in self.inputs else v for k, v in feeds.items()}
        values = self.session.run(names, wide)
        return [v.astype(self.outputs[n]) if n in self.outputs else v for n, v in zip(names, values)]


def widen_boundary(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, np.dtype], dict[str, np.dtype]]:
    """``model`` with a wide boundary (module docstring), the wide input types and the narrow
    output types by name; ``model`` itself when no graph input or output is narrow."""
    narrow = [v.name for v in (*model.graph.input, *model.graph.output)
              if v.type.tensor_type.elem_type in NARROW_TYPES]
    if not narrow:
        return model, {}, {}
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    graph = widened.graph
    inputs, outputs, first, last = {}, {}, [], []
    for vi in graph.input:
        elem = vi.type.tensor_type.elem_type
        if elem in NARROW_TYPES:
            inner = f"{vi.name}::narrow"
            _rename_uses(graph, vi.name, inner, outputs=False)
            if elem == TensorProto.FLOAT4E2M1:  # no float4 kernels: its values stay exact in float32
                first.append(helper.make_node("Identity", [vi.name], [inner], name=f"{inner}.cast"))
            else:
                first.append(helper.make_node("Cast", [vi.name], [inner], name=f"{inner}.cast", to=elem))
            vi.type.tensor_type.elem_type = NARROW_TYPES[elem]
            inputs[vi.name] = _np(NARROW_TYPES[elem])
    for vi in graph.output:
        elem = vi.type.tensor_type.elem_type
        if elem in NARROW_TYPES:
            inner = f"{vi.name}::narrow"
            _rename_uses(graph, vi.name, inner, outputs=True)
            last.append(helper.make_node("Cast", [inner], [vi.name], name=f"{inner}.widen", to=NARROW_TYPES[elem]))
            vi.type.tensor_type.elem_type = NARROW_TYPES[elem]
            outputs[vi.name] = _np(elem)
    nodes = first + list(graph.node) + last
    del graph.node[:]
    graph.node.extend(nodes)
    return widened, inputs, outputs


def float4_cast(x: str, y: str, name: str) -> list[onnx.NodeProto]:
    """Nodes writing to ``y`` (float32) ``x`` rounded to float4e2m1 as ONNX's reference casts it:
    to the nearest of 0, 0.5, 1, 1.5, 2, 3, 4, 6 (ties to the even mantissa: steps of 0.5 below 2,
    of 1 below 4, of 2 above, with ``Round`` halving to even), saturating at 6 (infinities too),
    the sign kept, NaN to zero."""
    p = f"{name}::"
    make = helper.make_node

    def const(tag: str, value: float) -> onnx.NodeProto:
        return make("Constant", [], [p + tag], name=p + tag, value=helper.make_tensor(p + tag, TensorProto.FLOAT, [], [value]))

    return [
        *(const(t, v) for t, v in (("zero", 0.0), ("half", 0.5), ("one", 1.0), ("two", 2.0), ("four", 4.0), ("six", 6.0))),
        make("Cast", [x], [p + "x"], name=p + "x", to=TensorProto.FLOAT),
        make("Abs", [p + "x"], [p + "abs"], name=p + "abs"),
        make("Less", [p + "abs", p + "two"], [p + "below2"], name=p + "below2"),
        make("Less", [p + "abs", p + "four"], [p + "below4"], name=p + "below4"),
        make("Where", [p + "below4", p + "one", p + "two"], [p + "coarse"], name=p + "coarse"),
        make("Where", [p + "below2", p + "half", p + "coarse"], [p + "step"], name=p + "step"),
        make("Div", [p + "abs", p + "step"], [p + "steps"], name=p + "steps"),
        make("Round", [p + "steps"], [p + "rounded"], name=p + "rounded"),
        make("Mul", [p + "rounded", p + "step"], [p + "grid"], name=p + "grid"),
        make("Min", [p + "grid", p + "six"], [p + "saturated"], name=p + "saturated"),
        make("IsNaN", [p + "x"], [p + "nan"], name=p + "nan"),
        make("Where", [p + "nan", p + "zero", p + "saturated"], [p + "magnitude"], name=p + "magnitude"),
        make("Neg", [p + "magnitude"], [p + "negative"], name=p + "negative"),
        make("Less", [p + "x", p + "zero"], [p + "sign"], name=p + "sign"),
        make("Where", [p + "sign", p + "negative", p + "magnitude"], [y], name=name),
    ]
