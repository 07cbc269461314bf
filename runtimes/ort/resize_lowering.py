"""Resize with ``align_corners`` and a scales input, written so that onnxruntime computes what
ONNX specifies.

ONNX's reference maps output index x to ``x (L - 1) / (s L - 1)`` (the unrounded resized
length ``s L``); onnxruntime divides by the rounded output length ``R - 1`` instead. The same
coordinates are ``tf_crop_and_resize`` with the region of interest ``[0, (R - 1) / (s L - 1)]``
on each axis (``[0, 0]`` where R = 1), and the output sizes given as ``sizes`` (with scales,
onnxruntime would shrink the output by the region). With constant scales and a static input
shape the region and sizes are constants, and a Resize whose ``s L`` are all whole is left as
it is; otherwise they are computed in the graph from ``Shape(X)`` and the scales (which then
must cover every axis: no ``axes`` attribute; :func:`rewrite_possible`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qir.errors import UnsupportedOpError
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.records import OpRecord

__all__ = ["lower_resize", "needs_rewrite", "rewrite_possible", "check"]


def _scales(ir: QIR, op: OpRecord) -> np.ndarray | None:
    """The constant scales input (empty or absent: None)."""
    name = op.inputs[2] if len(op.inputs) > 2 else ""
    if not name or ir.value(name).kind is not NodeKind.WEIGHT:
        return None
    scales = np.asarray(ir.value(name).data, np.float32).ravel()
    return scales if scales.size else None


def needs_rewrite(ir: QIR, op: OpRecord) -> bool:
    """True for a Resize with align_corners whose scales input is given (not sizes): its
    coordinates may then differ between onnxruntime and ONNX."""
    if op.op_type != "Resize" or op.domain or ir.opset_imports.get("", ir.opset) < 11:
        return False
    if op.attrs.get("coordinate_transformation_mode", "half_pixel") != "align_corners":
        return False
    scales_name = op.inputs[2] if len(op.inputs) > 2 else ""
    return bool(scales_name) and not (ir.value(scales_name).kind is NodeKind.WEIGHT and _scales(ir, op) is None)


def _static(ir: QIR, op: OpRecord) -> bool:
    shape = ir.value(op.inputs[0]).shape
    return _scales(ir, op) is not None and shape is not None and all(isinstance(d, int) for d in shape)


def rewrite_possible(ir: QIR, op: OpRecord) -> bool:
    """The rewrite needs constant scales and a static input shape, or scales over every axis
    (no ``axes`` attribute)."""
    return _static(ir, op) or "axes" not in op.attrs


def check(ir: QIR) -> None:
    """Refuse (UnsupportedOpError) a Resize this module would need to rewrite but cannot: an
    ``axes`` attribute with dynamic scales or input shape."""
    for op in ir.ops("Resize"):
        if needs_rewrite(ir, op) and not rewrite_possible(ir, op):
            raise UnsupportedOpError(
                f"node {op.name!r} (Resize): align_corners with a scales input and the axes attribute needs "
                "constant scales and a static input shape for onnxruntime to compute ONNX's coordinates; load "
                "the model with static input_shapes, or give scales for every axis")


def _plan(ir: QIR, op: OpRecord) -> tuple[list[float], list[float], list[int]] | None:
    """(roi starts, roi ends, output sizes) over every axis, or None when no axis needs it."""
    shape = [int(d) for d in ir.value(op.inputs[0]).shape]
    rank = len(shape)
    axes = [int(a) % rank for a in op.attrs.get("axes", range(rank))]
    full = [1.0] * rank
    for a, s in zip(axes, _scales(ir, op)):
        full[a] = float(s)
    starts, ends, sizes, changed = [0.0] * rank, [1.0] * rank, [], False
    for a, (n, s) in enumerate(zip(shape, full)):
        out = int(np.float32(s) * np.float32(n))  # onnxruntime's output length
        resized = s * n  # ONNX's reference divides by this, unrounded
        sizes.append(out)
        if out == 1:
            ends[a] = 0.0
        elif out != resized:
            ends[a], changed = (out - 1) / (resized - 1), True
    return (starts, ends, sizes) if changed else None


def lower_resize(ir: QIR, op: OpRecord) -> list[onnx.NodeProto] | None:
    """The rewritten Resize (see the module docstring), or None for the op as it is."""
    if not needs_rewrite(ir, op) or not rewrite_possible(ir, op):
        return None
    p = f"{op.name}::"
    attrs = {k: v for k, v in op.attrs.items() if k not in ("axes", "keep_aspect_ratio_policy")}
    attrs["coordinate_transformation_mode"] = "tf_crop_and_resize"
    resize = helper.make_node("Resize", [op.inputs[0], p + "roi", "", p + "sizes"], list(op.outputs),
                              name=op.name, **attrs)
    if not _static(ir, op):
        return _computed_roi(op.inputs[0], op.inputs[2], p) + [resize]
    plan = _plan(ir, op)
    if plan is None:
        return None
    starts, ends, sizes = plan
    roi = numpy_helper.from_array(np.array(starts + ends, np.float32), p + "roi")
    size = numpy_helper.from_array(np.array(sizes, np.int64), p + "sizes")
    return [helper.make_node("Constant", [], [p + "roi"], name=p + "roi", value=roi),
            helper.make_node("Constant", [], [p + "sizes"], name=p + "sizes", value=size), resize]


def _computed_roi(x: str, scales: str, p: str) -> list[onnx.NodeProto]:
    """Nodes computing ``p roi`` and ``p sizes`` from ``Shape(x)`` and ``scales`` (all axes):
    L' = s L (float32), R = floor(L') (onnxruntime's output length), ends = (R - 1) / (L' - 1)
    where R > 1 else 0, starts = 0."""
    make = helper.make_node

    def const(name: str, value: float) -> onnx.NodeProto:
        return make("Constant", [], [p + name], name=p + name,
                    value=numpy_helper.from_array(np.array(value, np.float32), p + name))

    return [
        const("one", 1.0), const("zero", 0.0),
        make("Shape", [x], [p + "shape"], name=p + "shape"),
        make("Cast", [p + "shape"], [p + "lengths"], name=p + "lengths", to=onnx.TensorProto.FLOAT),
        make("Mul", [scales, p + "lengths"], [p + "resized"], name=p + "resized"),
        make("Floor", [p + "resized"], [p + "out"], name=p + "out"),
        make("Sub", [p + "out", p + "one"], [p + "out_m1"], name=p + "out_m1"),
        make("Sub", [p + "resized", p + "one"], [p + "resized_m1"], name=p + "resized_m1"),
        make("Div", [p + "out_m1", p + "resized_m1"], [p + "ratio"], name=p + "ratio"),
        make("Greater", [p + "out", p + "one"], [p + "several"], name=p + "several"),
        make("Where", [p + "several", p + "ratio", p + "zero"], [p + "ends"], name=p + "ends"),
        make("Mul", [p + "ends", p + "zero"], [p + "starts"], name=p + "starts"),
        make("Concat", [p + "starts", p + "ends"], [p + "roi"], name=p + "roi", axis=0),
        make("Cast", [p + "out"], [p + "sizes"], name=p + "sizes", to=onnx.TensorProto.INT64),
    ]
