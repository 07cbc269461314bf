"""The rules of the QOperator exporter (:mod:`.qoperator_export`): one function per float op type.

Each rule looks at one op of the QDQ model and either writes its integer form through the
:class:`~qir.io.qoperator_graph.Rewriter` (and returns None) or returns why the op stays QDQ.
"Quantized", "output quantizer" and "clamps on codes" are defined in :mod:`.qoperator_export`'s docstring;
the contrib ops are onnxruntime's (domain ``com.microsoft``), as its QOperator format uses them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from qir.io.qoperator_graph import MS_DOMAIN, OutQuant, Quant, Rewriter

__all__ = ["RULES", "accumulator_scale", "bias_codes"]

_INT32 = (-(2 ** 31), 2 ** 31 - 1)


def accumulator_scale(x: Quant, w: Quant) -> np.ndarray:
    """``s_x · s_w`` as float32 (per output channel when ``w`` is): the scale of the int32 sums."""
    return (np.float32(x.params.scale) * w.params.scale.astype(np.float32)).astype(np.float32)


def bias_codes(bias: np.ndarray, acc_scale: np.ndarray) -> np.ndarray | None:
    """A float bias as int32 at the accumulator's scale: ``rint(b / (s_x·s_w))`` with the
    division in float64 and ties to even (what onnxruntime's quantizer writes), or None when a
    value leaves int32."""
    q = np.rint(np.asarray(bias, np.float64) / np.asarray(acc_scale, np.float64))
    if not np.all(np.isfinite(q)) or q.min(initial=0) < _INT32[0] or q.max(initial=0) > _INT32[1]:
        return None
    return q.astype(np.int32)


def _zero_point(rw: Rewriter, q: Quant) -> str:
    return q.zero_point or rw.const(f"{q.tensor}.zero_point", np.zeros((), q.dtype))


def _triple(rw: Rewriter, q: Quant) -> list[str]:
    return [q.tensor, q.scale, _zero_point(rw, q)]


def _out_pair(rw: Rewriter, out: OutQuant) -> list[str]:
    q = out.q
    zp = q.input[2] if len(q.input) > 2 and q.input[2] else rw.const(f"{q.name}.zero_point",
                                                                      np.zeros((), out.params.dtype))
    return [q.input[1], zp]


def _activations(rw: Rewriter, node: onnx.NodeProto, names: list[str]) -> list[Quant] | str:
    """The quantized per-tensor 8-bit operands ``names`` of ``node``, all of one type, or why not."""
    found = []
    for name in names:
        q = rw.operand(name)
        if isinstance(q, str):
            return q
        if not q.per_tensor:
            return f"input {name!r} is quantized per channel (the integer ops take per-tensor activations)"
        found.append(q)
    if len({q.dtype for q in found}) > 1:
        return "its inputs are quantized to different types (int8 and uint8)"
    return found


def _matching_output(rw: Rewriter, node: onnx.NodeProto, dtype: np.dtype) -> OutQuant | str:
    out = rw.output(node)
    if isinstance(out, OutQuant) and out.params.dtype != dtype:
        return f"its output quantizer is {out.params.dtype}, its input {dtype}"
    return out


def _weight(rw: Rewriter, name: str, channel_axis: int) -> Quant | str:
    """A quantized weight: 8-bit, per tensor or per channel along ``channel_axis``."""
    w = rw.operand(name)
    if isinstance(w, str):
        return w
    rank = np.ndim(rw.const_array(w.tensor)) if w.constant else rw.g.rank(w.tensor)
    if not w.per_tensor and (rank is None or w.params.axis % rank != channel_axis % rank):
        return f"weight {name!r} is quantized per channel along axis {w.params.axis}, not the output channel"
    return w


def _bias(rw: Rewriter, node: onnx.NodeProto, slot: int, acc_scale: np.ndarray, channels: int) -> np.ndarray | str | None:
    """The op's float constant bias as int32 codes (None: no bias), or why it cannot be one."""
    name = node.input[slot] if len(node.input) > slot else ""
    if not name:
        return None
    b = rw.const_array(name)
    if b is None or b.dtype.kind != "f" or b.shape != (channels,):
        return f"its bias {name!r} is not a float constant of {channels} values"
    codes = bias_codes(b, np.broadcast_to(acc_scale, b.shape))
    if codes is None:
        return f"its bias {name!r} leaves int32 at the scale s_x*s_w"
    return codes


def _attrs(node: onnx.NodeProto, drop: tuple[str, ...] = (), rw: Rewriter | None = None) -> dict:
    """The node's attributes but ``drop`` (those its integer form lacks; ``rw`` keeps them for the
    importer, which gives them back to the float op)."""
    found = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if rw is not None and any(k in found for k in drop):
        rw.attributes[node.name] = {k: found[k] for k in drop if k in found}
    return {k: v for k, v in found.items() if k not in drop}


def _integer_sums(rw: Rewriter, node: onnx.NodeProto, acc: onnx.NodeProto, bias: np.ndarray | None,
                  scale: np.ndarray) -> None:
    """Write ``acc`` (a ConvInteger/MatMulInteger writing int32 sums) → ``Add(bias codes)`` →
    ``Cast(float)`` → ``Mul(s_x·s_w)`` into the op's own float output, instead of ``node``."""
    y, nodes, src = node.output[0], [acc], acc.output[0]
    if bias is not None:
        added = rw.g.fresh(f"{y}.acc_bias")
        b_name = rw.const(f"{node.input[2]}_quantized", bias)
        nodes.append(helper.make_node("Add", [src, b_name], [added], name=rw.g.fresh_node(f"{node.name}/bias")))
        src = added
    as_float = rw.g.fresh(f"{y}.acc_float")
    nodes.append(helper.make_node("Cast", [src], [as_float], name=rw.g.fresh_node(f"{node.name}/to_float"),
                                  to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Mul", [as_float, rw.const(f"{node.name}.acc_scale", scale)], [y],
                                  name=rw.g.fresh_node(f"{node.name}/scale")))
    rw.write(node, nodes)


def conv(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """Conv with a quantized activation ``x`` (8-bit, per tensor), a quantized constant weight
    ``W`` (per tensor or per output channel) and an optional float constant bias ``b``:

    * with an output quantizer of ``x``'s type: ``QLinearConv(x, s_x, zp_x, W, s_w, zp_w, s_y,
      zp_y, B)``, ``B`` = :func:`bias_codes` at ``s_x·s_w``, then the clamps on codes;
    * otherwise (the output is float, fp16, int16 or per channel): ``ConvInteger(x, W, zp_x,
      zp_w)`` → ``Add(B)`` → ``Cast`` → ``Mul(s_x·s_w)`` per channel, the op's float output
      (ConvInteger takes one weight zero point, so all channels' must be equal).
    """
    xs = _activations(rw, node, [node.input[0]])
    if isinstance(xs, str):
        return xs
    x, w = xs[0], _weight(rw, node.input[1], 0)
    if isinstance(w, str):
        return w
    if not w.constant:
        return f"its weight {node.input[1]!r} is not a constant"
    channels = rw.const_array(w.tensor).shape[0]
    scale = np.broadcast_to(accumulator_scale(x, w), (channels,))
    bias = _bias(rw, node, 2, scale, channels)
    if isinstance(bias, str):
        return bias
    out = _matching_output(rw, node, x.dtype)
    attrs = _attrs(node)
    if isinstance(out, OutQuant):
        b_name = [rw.const(f"{node.input[2]}_quantized", bias)] if bias is not None else []
        dst, clamps = rw.quantized_output(node, out)
        q = helper.make_node("QLinearConv", _triple(rw, x) + _triple(rw, w) + _out_pair(rw, out) + b_name, [dst],
                             name=node.name, **attrs)
        rw.write(node, [q, *clamps], out)
        return None
    zps = np.asarray(w.params.zero_point)
    if zps.size and np.any(zps != zps.reshape(-1)[0]):
        return "its weight zero points differ per channel (ConvInteger takes one)"
    w_zp = rw.const(f"{w.tensor}.zero_point_scalar", np.asarray(zps.reshape(-1)[0] if zps.size else 0, w.dtype))
    rank = rw.const_array(w.tensor).ndim
    shaped = (channels,) + (1,) * (rank - 2)
    acc = helper.make_node("ConvInteger", [x.tensor, w.tensor, _zero_point(rw, x), w_zp],
                           [rw.g.fresh(f"{node.output[0]}.acc")], name=node.name, **attrs)
    _integer_sums(rw, node, acc, None if bias is None else bias.reshape(shaped), scale.reshape(shaped).copy())
    return None


def matmul(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """MatMul of a quantized activation ``a`` (8-bit, per tensor) by a quantized ``b`` (per
    tensor, or per column when 2-D): ``QLinearMatMul`` with an output quantizer of ``a``'s type
    (then the clamps on codes), else ``MatMulInteger(a, b, zp_a, zp_b)`` → ``Cast`` →
    ``Mul(s_a·s_b)`` into the op's float output."""
    xs = _activations(rw, node, [node.input[0]])
    if isinstance(xs, str):
        return xs
    a, b = xs[0], _weight(rw, node.input[1], -1)
    if isinstance(b, str):
        return b
    if b.dtype != a.dtype and not b.constant:
        return "its inputs are quantized to different types (int8 and uint8)"
    if not b.per_tensor and (rw.const_array(b.tensor) if b.constant else np.zeros(())).ndim != 2:
        return "its per-column quantized input is not 2-D"
    out = _matching_output(rw, node, a.dtype)
    if isinstance(out, OutQuant):
        dst, clamps = rw.quantized_output(node, out)
        q = helper.make_node("QLinearMatMul", _triple(rw, a) + _triple(rw, b) + _out_pair(rw, out), [dst], name=node.name)
        rw.write(node, [q, *clamps], out)
        return None
    acc = helper.make_node("MatMulInteger", [a.tensor, b.tensor, _zero_point(rw, a), _zero_point(rw, b)],
                           [rw.g.fresh(f"{node.output[0]}.acc")], name=node.name)
    _integer_sums(rw, node, acc, None, accumulator_scale(a, b))
    return None


def gemm(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """Gemm (``alpha = beta = 1``) of a quantized activation ``A`` (8-bit, per tensor) by a
    quantized ``B`` (per tensor or per output column) plus an optional float constant bias ``C``
    of N values: ``QGemm(A, s_a, zp_a, B, s_b, zp_b, C_int32 [, s_y, zp_y])`` (com.microsoft),
    requantized into an output quantizer of ``A``'s type (then the clamps on codes), else with
    the float output ``acc·s_a·s_b``."""
    attrs = _attrs(node)
    if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        return "alpha or beta is not 1"
    xs = _activations(rw, node, [node.input[0]])
    if isinstance(xs, str):
        return xs
    trans_b = int(attrs.get("transB", 0))
    a, b = xs[0], _weight(rw, node.input[1], 0 if trans_b else 1)
    if isinstance(b, str):
        return b
    if not b.constant:
        return f"its B {node.input[1]!r} is not a constant"
    channels = rw.const_array(b.tensor).shape[0 if trans_b else 1]
    scale = np.broadcast_to(accumulator_scale(a, b), (channels,))
    bias = _bias(rw, node, 2, scale, channels)
    if isinstance(bias, str):
        return bias
    inputs = _triple(rw, a) + _triple(rw, b) + [rw.const(f"{node.input[2]}_quantized", bias) if bias is not None else ""]
    out = _matching_output(rw, node, a.dtype)
    kw = _attrs(node, ("alpha", "beta"), rw)
    if isinstance(out, OutQuant):
        dst, clamps = rw.quantized_output(node, out)
        rw.write(node, [helper.make_node("QGemm", inputs + _out_pair(rw, out), [dst], name=node.name,
                                         domain=MS_DOMAIN, **kw), *clamps], out)
        return None
    while inputs[-1] == "":
        inputs.pop()
    rw.write(node, [helper.make_node("QGemm", inputs, [node.output[0]], name=node.name, domain=MS_DOMAIN, **kw)])
    return None


def _same_type(rw: Rewriter, node: onnx.NodeProto, op_type: str, inputs: list[str], layout: Callable,
               drop: tuple[str, ...] = ()) -> str | None:
    """``node`` whose ``inputs`` are quantized per tensor (8-bit, one type) with an output
    quantizer of that type: the contrib op ``op_type`` with the inputs ``layout(operands, out
    pair)`` puts in its order, then the clamps on codes."""
    xs = _activations(rw, node, inputs)
    if isinstance(xs, str):
        return xs
    out = _matching_output(rw, node, xs[0].dtype)
    if isinstance(out, str):
        return out
    dst, clamps = rw.quantized_output(node, out)
    q = helper.make_node(op_type, layout([_triple(rw, x) for x in xs], _out_pair(rw, out)), [dst], name=node.name,
                         domain=MS_DOMAIN, **_attrs(node, drop, rw))
    rw.write(node, [q, *clamps], out)
    return None


def binary(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """Add / Mul of two quantized values (8-bit, per tensor, one type) into an output quantizer
    of that type: ``QLinearAdd`` / ``QLinearMul(A, s_a, zp_a, B, s_b, zp_b, s_c, zp_c)``."""
    return _same_type(rw, node, f"QLinear{node.op_type}", list(node.input[:2]),
                      lambda ins, out: ins[0] + ins[1] + out)


def unary(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """Sigmoid, LeakyRelu, AveragePool, GlobalAveragePool of a quantized value (8-bit, per tensor)
    into an output quantizer of its type: ``QLinear<op>(X, s_x, zp_x, s_y, zp_y)`` with the op's
    attributes (AveragePool: no dilations, which QLinearAveragePool lacks)."""
    if node.op_type == "AveragePool" and any(d != 1 for d in _attrs(node).get("dilations", [])):
        return "dilated AveragePool (QLinearAveragePool has no dilations)"
    return _same_type(rw, node, f"QLinear{node.op_type}", [node.input[0]], lambda ins, out: ins[0] + out,
                      drop=("dilations",))


def concat(rw: Rewriter, node: onnx.NodeProto) -> str | None:
    """Concat of quantized values (8-bit, per tensor, one type) into an output quantizer of that
    type: ``QLinearConcat(s_y, zp_y, X1, s_1, zp_1, ...)``, each input rescaled to the output's."""
    return _same_type(rw, node, "QLinearConcat", list(node.input),
                      lambda ins, out: out + [v for triple in ins for v in triple])


RULES: dict[str, Callable[[Rewriter, onnx.NodeProto], str | None]] = {
    "Conv": conv, "MatMul": matmul, "Gemm": gemm, "Add": binary, "Mul": binary, "Sigmoid": unary,
    "LeakyRelu": unary, "AveragePool": unary, "GlobalAveragePool": unary, "Concat": concat,
}
