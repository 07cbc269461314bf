"""Per-row calibration state inside one onnxruntime session: how the engine runs many variants
of a segment in one call.

**Switch.** A calibration node that variants change is lowered so that each row of the batch
(one variant) runs it in the reference mode or in the variant's mode::

    y = ScatterND(ref(x), rows, target(GatherND(x, rows)))

``rows`` (int64 ``[n, 1]``, one session input per node, see :func:`rows_input`) lists the batch
rows whose variant changes the node; ``ref`` and ``target`` are the node's fake-quant lowerings
(:func:`qir.runtimes.ort.backend.lower_fake_quant`) in the two modes. Rows not listed get
``ref(x)``, listed rows ``target(x)``: what a session with the node in that mode computes
(gathering and scattering rows copies values; only a fusion the switch keeps onnxruntime from
making, such as an Add folded into the Conv before a pass-through node, rounds differently).
``n = 0`` makes the switch the reference. Each ``rows`` input has a symbolic length of its own:
onnxruntime plans buffers by symbolic shape, and one shared name would make it assume every
switch changes as many rows.

**Batch-capable parts.** A part of a batch-1 model runs on a batch of ``B`` rows when every
value crossing its boundary has a leading dimension of 1 or a free one (declared as the
symbolic ``batch``) and no Reshape pins that dimension: a shape constant's leading ``1``
becomes ``0`` ("copy the input's dimension") where the Reshape's input has a leading 1 and
``allowzero`` is off. Other ops that could pin the batch (Expand, Tile, a Concat with a
constant on another axis) are not rewritten; the engine checks each part once (every row of a
batched run equal to the batch-1 run, bit for bit) before relying on it.
"""
from __future__ import annotations

import dataclasses

import onnx
from onnx import helper, numpy_helper

from qir.graph import QIR
from qir.records import CalibRecord
from qir.runtimes.ort.lowering import lower_fake_quant

__all__ = ["rows_input", "is_rows_input", "rows_value_info", "switch_nodes", "make_batch_capable", "BATCH"]

BATCH = "batch"  # the symbolic leading dimension of a batch-capable part
_ROWS = "::rows"


def rows_input(node: str) -> str:
    """The session input listing the rows that switch calibration node ``node``."""
    return node + _ROWS


def is_rows_input(name: str) -> bool:
    """True for a session input made by :func:`rows_input` (not a value of the model)."""
    return name.endswith(_ROWS)


def switch_nodes(ir: QIR, ref: CalibRecord, target: CalibRecord, rounding: str) -> list[onnx.NodeProto]:
    """Calibration node ``ref`` (in the reference mode) as a switch to ``target`` (the same node
    in a variant's mode) for the rows listed in :func:`rows_input` (module docstring)."""
    x, y, p = ref.input, ref.output, ref.name + "::switch::"
    rows = rows_input(ref.name)
    nodes = lower_fake_quant(ir, dataclasses.replace(ref, output=p + "ref", name=p + "ref"), rounding)
    if len(nodes) == 1 and nodes[0].op_type == "Identity":  # a pass-through reference: scatter into x
        nodes, base = [], x
    else:
        base = p + "ref"
    nodes.append(helper.make_node("GatherND", [x, rows], [p + "rows"], name=p + "gather"))
    nodes += lower_fake_quant(ir, dataclasses.replace(target, input=p + "rows", output=p + "target",
                                                      name=p + "target"), rounding)
    nodes.append(helper.make_node("ScatterND", [base, rows, p + "target"], [y], name=ref.name))
    return nodes


def rows_value_info(node: str, k: int) -> onnx.ValueInfoProto:
    """The ``rows`` input of switch ``k`` of a part (its own symbolic length)."""
    return helper.make_tensor_value_info(rows_input(node), onnx.TensorProto.INT64, [f"rows_{k}", 1])


def make_batch_capable(model: onnx.ModelProto, ir: QIR) -> bool:
    """Rewrite ``model`` (a part of ``ir`` as exported) in place to take a batch of rows (module
    docstring). False, with ``model`` unchanged, when a boundary value has no leading 1 (or free)
    dimension."""
    graph = model.graph
    boundary = [vi for vi in (*graph.input, *graph.output) if not is_rows_input(vi.name)]
    for vi in boundary:
        dims = vi.type.tensor_type.shape.dim
        if not len(dims) or (dims[0].HasField("dim_value") and dims[0].dim_value != 1):
            return False
    initializers = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type != "Reshape" or node.input[1] not in initializers:
            continue
        if any(a.name == "allowzero" and a.i for a in node.attribute):
            continue
        shape = ir.value(node.input[0]).shape if ir.has_value(node.input[0]) else None
        target = numpy_helper.to_array(initializers[node.input[1]])
        if shape and shape[0] == 1 and target.size and target[0] == 1:
            target = target.copy()
            target[0] = 0
            initializers[node.input[1]].CopyFrom(numpy_helper.from_array(target, node.input[1]))
    for vi in boundary:
        vi.type.tensor_type.shape.dim[0].dim_param = BATCH
    del graph.value_info[:]  # intermediate shapes of batch 1: let onnxruntime infer them
    return True
