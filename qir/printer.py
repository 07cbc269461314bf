"""The IR's text form: ``str(ir)`` (one line per node) and ``repr(ir)`` (one line of counts).

The format is a stable contract (tests compare it as text); change it deliberately::

    qir "digits" opset=17
      input  %input : f32[1,1,8,8]
      weight @conv1.w : f32[8,1,3,3]
      weight @shape : i64[2] = [1,-1]
    {
         0  conv1: %c1 : f32[1,8,8,8] = Conv(%input, @conv1.w) {group=1, pads=[1,1,1,1]}
         1  conv1.in~cal: %c1~q : f32[1,8,8,8] = calib<int8 activation threshold=2.5>(%c1)
      return %logits
    }

Rules: ``%`` marks activations, ``@`` weights; a node line is ``index  name: outputs = op(inputs)
{attributes}``; attributes are sorted by name; floats print with 6 significant digits;
arrays of more than 8 elements print as their type only; an omitted optional input is ``_``;
``[module]`` ends the line of an op that records its source-framework module path.

Dims: a static size prints as its number and an unknown one as ``?``. A symbolic dim that is a
plain name (``batch``, ``height``: what a model declares on its inputs) prints as that name. A
derived symbolic dim (an expression some exporters write, such as ``floor(height/2 - 1/2) + 1``)
prints as a short name ``d0``, ``d1``, ... numbered in order of first appearance (skipping names
the model itself uses), and a legend line before the body gives each one's expression once, a
parenthesised earlier one written by its short name::

      input  %images : f32[1,3,height,width]
      dim    d0 = floor(height/2 - 1/2) + 1
      dim    d1 = floor(width/2 - 1/2) + 1
      dim    d2 = (d0)*(d1)
    {
         0  /conv: %c : f32[1,16,d0,d1] = Conv(%images, @w)

A model with static shapes prints no ``dim`` line, exactly as before.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from qir.kinds import NodeKind, short_dtype
from qir.records import CalibRecord, OpRecord, ValueRecord

__all__ = ["format_ir", "format_node", "format_type", "format_value", "summary", "DimNames"]

MAX_INLINE = 8


def format_type(dtype: str | None, shape: Any, dims: DimNames | None = None) -> str:
    """``f32[1,3,?,W]``: dtype and dims (``?`` unknown, names symbolic, ``*`` unknown rank);
    with ``dims``, derived symbolic dims print as their short names (see the module docstring)."""
    if shape is None:
        text = "*"
    else:
        text = ",".join("?" if d is None else dims(d) if dims is not None and isinstance(d, str) else str(d)
                        for d in shape)
    return f"{short_dtype(dtype)}[{text}]"


class DimNames:
    """Short names ``d0``, ``d1``, ... for the derived symbolic dims of one dump, in order of first
    use; plain-name dims (identifiers) map to themselves. ``reserved``: names the model uses."""

    def __init__(self, reserved: set[str] = frozenset()) -> None:
        self.reserved = reserved
        self.legend: dict[str, str] = {}  # expression -> short name

    def __call__(self, dim: str) -> str:
        if dim.isidentifier():
            return dim
        if dim not in self.legend:
            taken = self.reserved | set(self.legend.values())
            self.legend[dim] = next(f"d{n}" for n in itertools.count() if f"d{n}" not in taken)
        return self.legend[dim]

    def lines(self) -> list[str]:
        """The legend, ``  dim    d2 = (d0)*(d1)``: inside each expression, a parenthesised earlier
        one (a whole sub-expression, so precedence is kept) is written by its short name."""
        out, earlier = [], []
        for expr, short in self.legend.items():
            for prev, prev_short in earlier:  # each as already shortened: nested ones shorten in turn
                expr = expr.replace(f"({prev})", f"({prev_short})")
            out.append(f"  dim    {short} = {expr}")
            earlier.append((expr, short))
        return out


def format_value(value: Any) -> str:
    """An attribute or small constant, in the dump's spelling."""
    if isinstance(value, np.ndarray):
        if value.size > MAX_INLINE:
            return f"tensor<{format_type(value.dtype.name, value.shape)}>"
        flat = ",".join(_scalar(v) for v in value.reshape(-1).tolist())
        return f"tensor<{format_type(value.dtype.name, value.shape)}>[{flat}]"
    if isinstance(value, (list, tuple)):
        if len(value) > MAX_INLINE * 4:
            return f"[{len(value)} items]"
        return "[" + ",".join(format_value(v) for v in value) + "]"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bytes):
        return repr(value.decode("utf-8", "replace"))
    return _scalar(value)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _ref(ir: Any, name: str) -> str:
    if not name:
        return "_"
    key = "%" + name
    kind = ir.graph.nodes[key]["rec"].kind if key in ir.graph else None
    return ("@" if kind is NodeKind.WEIGHT else "%") + name


def _typed(ir: Any, name: str, dims: DimNames | None = None) -> str:
    if not name:
        return "_"
    rec: ValueRecord = ir.value(name)
    return f"%{name} : {format_type(rec.dtype, rec.shape, dims)}"


def format_node(ir: Any, rec: OpRecord | CalibRecord, dims: DimNames | None = None) -> str:
    """One node as ``name: outputs = op(inputs) {attrs}`` (no index column); ``dims`` names the
    derived symbolic dims (without it they print as their expressions)."""
    outs = ", ".join(_typed(ir, o, dims) for o in rec.outputs)
    args = ", ".join(_ref(ir, i) for i in rec.inputs)
    if isinstance(rec, CalibRecord):
        return f"{rec.name}: {outs} = {format_calib_state(rec)}({args})"
    op = rec.op_type if not rec.domain or rec.domain == "ai.onnx" else f"{rec.domain}::{rec.op_type}"
    line = f"{rec.name}: {outs} = {op}({args})"
    if rec.attrs:
        line += " {" + ", ".join(f"{k}={format_value(rec.attrs[k])}" for k in sorted(rec.attrs)) + "}"
    if rec.module:
        line += f"  [{rec.module}]"
    return line


def format_calib_state(rec: CalibRecord) -> str:
    """``calib<int8 weight axis=0 threshold=f32[16] fixed>``; imported nodes may add
    ``scale=``, ``zp=`` and ``clip=[lo,hi]`` (an activation their quantizer replaced)."""
    parts = [rec.mode.value, rec.role.value]
    if rec.axis is not None:
        parts.append(f"axis={rec.axis}")
    for label, v in (("threshold", rec.threshold), ("scale", rec.scale), ("zp", rec.zero_point)):
        if v is not None:
            parts.append(f"{label}={_number_or_vector(v)}")
    if rec.implied_clip is not None:
        parts.append("clip=[" + ",".join(_scalar(float(v)) for v in rec.implied_clip) + "]")
    if rec.fixed:
        parts.append("fixed")
    return "calib<" + " ".join(parts) + ">"


def _number_or_vector(v: Any) -> str:
    arr = np.asarray(v)
    if arr.ndim == 0:
        return f"{float(arr):.6g}"
    return format_value(arr.astype(np.float32)).removeprefix("tensor<").replace(">[", "[").rstrip(">")


def format_ir(ir: Any) -> str:
    """The full, stable text dump of ``ir`` (see the module docstring)."""
    extra = "".join(f" {d}={v}" for d, v in sorted(ir.opset_imports.items()) if d)
    lines = [f'qir "{ir.name}" opset={ir.opset}{extra}']
    dims = DimNames({d for v in ir.values() for d in (v.shape or ()) if isinstance(d, str) and d.isidentifier()})
    for name in ir.inputs:
        lines.append(f"  input  {_typed(ir, name, dims)}")
    for w in sorted(ir.weights(), key=lambda r: r.name):
        text = f"  weight @{w.name} : {format_type(w.dtype, w.shape, dims)}"
        if w.data is not None and w.data.size <= MAX_INLINE:
            text += " = [" + ",".join(_scalar(v) for v in w.data.reshape(-1).tolist()) + "]"
        lines.append(text)
    body = [f"  {i:>4}  {format_node(ir, rec, dims)}" for i, rec in enumerate(ir.runnables())]
    lines += dims.lines()
    lines.append("{")
    lines += body
    lines.append("  return " + ", ".join(_ref(ir, o) for o in ir.outputs))
    lines.append("}")
    return "\n".join(lines) + "\n"


def summary(ir: Any) -> str:
    """``QIR(name='m', opset=17, ops=12, calibrations=0, weights=8, activations=14, inputs=1, outputs=1)``."""
    c = ir.counts()
    return (f"QIR(name={ir.name!r}, opset={ir.opset}, ops={c['general']}, "
            f"calibrations={c['calibration']}, weights={c['weight']}, "
            f"activations={c['activation']}, inputs={len(ir.inputs)}, outputs={len(ir.outputs)})")
