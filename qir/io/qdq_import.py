"""ONNX QDQ models (e.g. onnxruntime's ``quantize_static``, ``QuantFormat.QDQ``) → calibration nodes.

:func:`convert_qdq` rewrites the ``ModelProto`` before the normal import
(:func:`qir.io.onnx_import.import_onnx` calls it first), so the importer only ever sees float ops
and ``qir::Calibration`` nodes (:mod:`qir.io.calib_onnx`):

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

**Modes and the int8 frame.** The zero point's type picks the mode: int8/uint8 → ``int8``,
int16/uint16 → ``int16``. Unsigned quantizers are stored in the signed frame with
``zp - 128`` (uint16: ``zp - 32768``); this is exact, because for every integer ``r``
``clip(r + zp, 0, 255) - zp == clip(r + (zp - 128), -128, 127) - (zp - 128)`` (both sides
add and remove the same offset), so dequantized values are identical. An all-zero zero point
is stored as none (symmetric).

**Removed activations.** onnxruntime's quantizer deletes a Relu/Clip whose input it quantizes
(when that input has no other reader and asymmetric activations are used) and gives the op
before it the Relu/Clip output's range; only the range then clips. The QDQ file keeps no trace
of the deleted op but that range, so the rule is: an activation quantizer whose zero point is
``qmin`` (range starting at exactly 0), on a value computed by an op that is not itself
non-negative (``NONNEGATIVE_OPS``; nor a pooling/reshaping op of a non-negative value, nor a
Mul/Add/Concat/... of non-negative values) and not a graph input, gets ``implied_clip = (0, inf)``
— a Relu. If the top of the range, ``(qmax - zp) * s``, is ``6`` (``CLIP_TOPS``, within 1e-6
relative: Relu6 / hard-swish's ``Clip(0, 6)`` on data that reached 6), the clip is ``(0, 6)``.
The ``float``/``fp16`` modes apply it (:func:`qir.runtimes.numerics.apply_calibration`), the
emit pass writes it back as a Relu/Clip. This is a reading of the range: a value computed by a
Conv that was non-negative on all calibration data reads as Relu too, and a ``Clip(0, 6)``
whose data stayed below 6 reads as Relu. Give the float model (``float_model=``, see
:func:`import_qdq`) to take the bounds from the deleted ops themselves instead.

**Emitted models.** A model written by qir's emit pass carries its calibration state as JSON
in the metadata ``qir.calibrations``; it restores names, thresholds, ``fixed``, ``feeds``,
implied clips and the fp16/float nodes (which the emitted model holds as Cast pairs / nothing),
each entry only when the model still matches it.

Anything else is an error naming the node: a QuantizeLinear feeding a non-DQ op or a graph
output, a DequantizeLinear reading neither a QuantizeLinear nor an integer constant, a Q→DQ
pair with different parameters, 4-bit / float8 / blocked quantization.
"""
from __future__ import annotations

import heapq
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qir.calibration import along_axis
from qir.errors import ImportError_
from qir.io import calib_onnx
from qir.kinds import CalibMode, CalibRole
from qir.naming import fresh_name
from qir.records import CalibRecord

__all__ = ["convert_qdq", "is_qdq_model", "NONNEGATIVE_OPS", "CLIP_TOPS", "EMIT_METADATA_KEY", "dequantize"]

logger = logging.getLogger(__name__)

QDQ_DOMAINS = ("", "ai.onnx", "com.microsoft")
EMIT_METADATA_KEY = "qir.calibrations"
_ORT_OUTPUT_SUFFIX = "_QuantizeLinear_Input"

# ops whose output is never negative: a quantizer range starting at 0 after them is no Relu
NONNEGATIVE_OPS = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "Softmax", "Abs", "Exp",
                             "Sqrt", "Softplus", "ReduceL2", "ReduceL1", "ReduceSumSquare"})
# ops whose output is non-negative when their data input is (the other inputs are shapes/indices)
SIGN_PRESERVING_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Flatten",
                                 "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Resize", "Upsample",
                                 "Identity", "Slice", "Split", "Gather", "DepthToSpace", "SpaceToDepth",
                                 "ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "Tile", "Expand"})
# ops whose output is non-negative when every input is
NONNEGATIVE_IF_INPUTS = frozenset({"Concat", "Mul", "Add", "Div", "Max", "Min", "Sum", "Mean"})
CLIP_TOPS = (6.0,)  # range tops read as Clip(0, top): Relu6 and hard-swish's Clip(0, 6)
_TOP_RTOL = 1e-6

# zero-point dtype -> (mode, offset into the signed frame)
_FRAME = {np.dtype(np.int8): (CalibMode.INT8, 0), np.dtype(np.uint8): (CalibMode.INT8, -128),
          np.dtype(np.int16): (CalibMode.INT16, 0), np.dtype(np.uint16): (CalibMode.INT16, -32768)}
_QMIN = {CalibMode.INT8: -128, CalibMode.INT16: -32768}
_QMAX = {CalibMode.INT8: 127, CalibMode.INT16: 32767}


def _is(node: onnx.NodeProto, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in QDQ_DOMAINS


def is_qdq_model(proto: onnx.ModelProto) -> bool:
    """True when the model holds QuantizeLinear/DequantizeLinear nodes or qir emit metadata."""
    return (any(_is(n, "QuantizeLinear") or _is(n, "DequantizeLinear") for n in proto.graph.node)
            or any(p.key == EMIT_METADATA_KEY for p in proto.metadata_props))


# ---------------------------------------------------------------------------------- helpers
@dataclass
class _QParams:
    """One Q or DQ node's quantization parameters."""

    scale: np.ndarray          # float32, 0-d (per tensor) or 1-d (per channel)
    zero_point: np.ndarray     # integer, same shape as scale (zeros when absent)
    dtype: np.dtype            # the quantized integer type
    axis: int | None           # per-channel axis (None per tensor)

    def same(self, other: "_QParams") -> bool:
        return (self.dtype == other.dtype and self.axis == other.axis
                and self.scale.shape == other.scale.shape
                and np.array_equal(self.scale, other.scale)
                and np.array_equal(self.zero_point, other.zero_point))


class _Graph:
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
            _is(n, "QuantizeLinear") or _is(n, "DequantizeLinear"))}
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


def _label(node: onnx.NodeProto) -> str:
    return f"{node.op_type} {node.name or '(unnamed)'!r}"


def _qparams(node: onnx.NodeProto, g: _Graph) -> _QParams:
    """Scale/zero point/type/axis of a QuantizeLinear or DequantizeLinear node."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    where = f"{g.where}: {_label(node)}"
    if attrs.get("block_size"):
        raise ImportError_(f"{where} uses blocked quantization (block_size={attrs['block_size']}), "
                           "which qir's calibration nodes cannot hold")
    if len(node.input) < 2 or not g.is_const(node.input[1]):
        raise ImportError_(f"{where}: its scale {node.input[1] if len(node.input) > 1 else '(none)'!r} "
                           "is not a constant; qir imports static quantization only")
    scale = np.asarray(g.const(node.input[1]))
    zp_name = node.input[2] if len(node.input) > 2 else ""
    if zp_name and not g.is_const(zp_name):
        raise ImportError_(f"{where}: its zero point {zp_name!r} is not a constant")
    zp = g.const(zp_name) if zp_name else None
    if zp is not None:
        dtype = zp.dtype
    elif _is(node, "DequantizeLinear") and g.is_const(node.input[0]):
        dtype = g.const(node.input[0]).dtype
    elif "output_dtype" in attrs and attrs["output_dtype"]:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(attrs["output_dtype"]))
    else:
        dtype = np.dtype(np.uint8)  # QuantizeLinear's default output type
    zp = np.zeros(scale.shape, dtype) if zp is None else np.asarray(zp)
    if scale.size == 1 and zp.size == 1:  # one value (also a [1] vector): per tensor
        scale, zp = scale.reshape(()), zp.reshape(())
    if scale.ndim > 1 or zp.shape != scale.shape:
        raise ImportError_(f"{where}: scale {list(scale.shape)} / zero point {list(zp.shape)} are "
                           "not one scalar or one vector of the same length")
    axis = int(attrs.get("axis", 1)) if scale.ndim == 1 else None
    if scale.dtype != np.float32:
        f32 = scale.astype(np.float32)
        if not np.array_equal(f32.astype(scale.dtype), scale):
            raise ImportError_(f"{where}: scale of type {scale.dtype} is not exactly a float32")
        scale = f32
    return _QParams(scale, zp, np.dtype(dtype), axis)


def _frame(params: _QParams, where: str) -> tuple[CalibMode, np.ndarray]:
    """(mode, zero point in the signed frame as int64) of a quantizer."""
    if params.dtype not in _FRAME:
        raise ImportError_(f"{where}: quantization to {params.dtype} is not supported "
                           "(qir has int8 and int16 modes; 4-bit, 32-bit and float8 are not)")
    mode, offset = _FRAME[params.dtype]
    return mode, params.zero_point.astype(np.int64) + offset


def dequantize(q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None,
               axis: int | None) -> np.ndarray:
    """``(q - zp) * s`` in float32, exactly as ONNX DequantizeLinear computes it."""
    k = q.astype(np.int64)
    if zero_point is not None:
        k = k - along_axis(np.asarray(zero_point, np.int64), axis, q.ndim)
    return k.astype(np.float32) * along_axis(np.asarray(scale, np.float32), axis, q.ndim)


def _rank(g: _Graph, name: str) -> int | None:
    if g.is_const(name):
        return g.const(name).ndim
    return g.ranks.get(name)


def _state(params: _QParams, rank: int | None, where: str) -> dict[str, Any]:
    mode, zp = _frame(params, where)
    axis = params.axis
    if axis is not None and axis < 0 and rank is not None:
        axis += rank
    scale = params.scale if axis is not None else np.float32(params.scale)
    if not np.any(zp):
        zero_point = None
    else:
        zero_point = zp if axis is not None else int(zp)
    return {"mode": mode, "scale": scale, "zero_point": zero_point, "axis": axis}


def _range_clip(state: dict[str, Any]) -> tuple[float, float] | None:
    """The implied clip read from an asymmetric range starting at 0 (see the module docstring)."""
    zp = state["zero_point"]
    mode = state["mode"]
    if zp is None or not np.all(np.asarray(zp) == _QMIN[mode]):
        return None
    top = (np.float32(_QMAX[mode]) - np.asarray(zp, np.float32)) * np.asarray(state["scale"], np.float32)
    for t in CLIP_TOPS:
        if np.all(np.abs(top - t) <= _TOP_RTOL * t):
            return (0.0, float(t))
    return (0.0, float("inf"))


def _float_clips(float_model: str | Path | onnx.ModelProto) -> dict[str, tuple[float, float]]:
    """``{output: (lo, hi)}`` of every Relu/Clip in the float model."""
    from qir.io.onnx_proto import read_onnx
    proto = read_onnx(float_model)
    opset = {o.domain: o.version for o in proto.opset_import}.get("", 13)
    g = _Graph(proto, str(float_model) if not isinstance(float_model, onnx.ModelProto) else "float model")
    clips: dict[str, tuple[float, float]] = {}
    for n in proto.graph.node:
        if n.op_type == "Relu" and n.domain in ("", "ai.onnx"):
            clips[n.output[0]] = (0.0, float("inf"))
        elif n.op_type == "Clip" and n.domain in ("", "ai.onnx"):
            if opset < 11:
                attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
                lo, hi = attrs.get("min", -np.inf), attrs.get("max", np.inf)
            else:
                bounds = [g.const(n.input[i]) if len(n.input) > i and n.input[i] else None for i in (1, 2)]
                if any(b is None and len(n.input) > i + 1 and n.input[i + 1] for i, b in enumerate(bounds)):
                    continue  # a computed bound: not a static clip
                lo = -np.inf if bounds[0] is None else bounds[0]
                hi = np.inf if bounds[1] is None else bounds[1]
            clips[n.output[0]] = (float(lo), float(hi))
    return clips


def _calib_node(name: str, x: str, y: str, role: CalibRole, state: Mapping[str, Any]) -> onnx.NodeProto:
    rec = CalibRecord(name, x, y, role=role, **state)
    return calib_onnx.calibration_to_node(rec)


# ---------------------------------------------------------------------------------- emit metadata
def _entry_state(entry: Mapping[str, Any]) -> dict[str, Any]:
    """CalibRecord fields of one emit-metadata entry (:mod:`qir.passes.emit` writes them)."""
    axis = entry.get("axis")

    def values(key: str, dtype: type) -> Any:
        v = entry.get(key)
        if v is None:
            return None
        a = np.asarray(v, dtype=dtype)
        if axis is not None:
            return a
        return int(a.reshape(-1)[0]) if dtype is np.int64 else dtype(a.reshape(-1)[0])

    clip = entry.get("implied_clip")
    if clip is not None:  # JSON has no infinities: null marks an open end
        clip = (-np.inf if clip[0] is None else float(clip[0]), np.inf if clip[1] is None else float(clip[1]))
    return {"mode": CalibMode(entry["mode"]), "threshold": values("threshold", np.float32),
            "scale": values("scale", np.float32), "zero_point": values("zero_point", np.int64),
            "axis": axis, "fixed": bool(entry.get("fixed", False)),
            "feeds": tuple(entry.get("feeds", ())), "implied_clip": clip}


def _consistent(entry_state: Mapping[str, Any], found: Mapping[str, Any]) -> bool:
    """Does the quantizer found in the file compute what the metadata entry says?"""
    from qir.calibration import calib_scale

    if entry_state["mode"] is not found["mode"]:
        return False
    if None not in (entry_state["axis"], found["axis"]) and entry_state["axis"] != found["axis"]:
        return False
    probe = CalibRecord("probe", "x", "y", mode=entry_state["mode"], threshold=entry_state["threshold"],
                        scale=entry_state["scale"], axis=entry_state["axis"])
    try:
        scale = calib_scale(probe)
    except Exception:
        return False
    pairs = [(scale, found["scale"]), (entry_state["zero_point"], found["zero_point"])]
    try:
        for a, b in pairs:
            a = np.zeros((), np.int64) if a is None else np.asarray(a)
            b = np.zeros((), np.int64) if b is None else np.asarray(b)
            a, b = np.broadcast_arrays(a, b)
            if not np.array_equal(a, b):
                return False
    except ValueError:  # shapes that do not broadcast
        return False
    return True


# ---------------------------------------------------------------------------------- the rewrite
class _Rewrite:
    def __init__(self, proto: onnx.ModelProto, where: str,
                 float_clips: Mapping[str, tuple[float, float]] | None) -> None:
        self.proto, self.where = proto, where
        self.g = _Graph(proto, where)
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

    # ---- entry points
    def run(self) -> onnx.ModelProto:
        self._read_metadata()
        nodes = list(self.proto.graph.node)
        self._restore_emitted(nodes)
        for node in nodes:
            if id(node) not in self.replace and _is(node, "QuantizeLinear"):
                self._activation_pair(node)
        for node in nodes:
            if id(node) not in self.replace and _is(node, "DequantizeLinear"):
                self._dequantize_constant(node)
        return self._write(nodes)

    def _read_metadata(self) -> None:
        props = self.proto.metadata_props
        keep = [p for p in props if p.key != EMIT_METADATA_KEY]
        for p in props:
            if p.key == EMIT_METADATA_KEY:
                try:
                    data = json.loads(p.value)
                    self.entries = {e["name"]: e for e in data["calibrations"]}
                except Exception as exc:  # a broken note is no reason to refuse the model
                    logger.warning("%s: ignoring unreadable %s metadata (%s)", self.where, EMIT_METADATA_KEY, exc)
        if len(keep) != len(props):
            del props[:]
            props.extend(keep)

    # ---- pieces
    def _name_for(self, base: str) -> str:
        return self.g.fresh_node(f"{base}_calib")

    def _add_calibration(self, node: onnx.NodeProto, name: str, x: str, y: str, role: CalibRole,
                         state: dict[str, Any], *, before: bool = False) -> None:
        """Write a calibration node instead of ``node`` (or right before it, ``before``)."""
        cal = _calib_node(name, x, y, role, state)
        self.calib_outputs.add(y)
        table = self.insert if before else self.replace
        table.setdefault(id(node), []).append(cal)

    def _overlay(self, name: str, found: dict[str, Any], role: CalibRole) -> tuple[str | None, dict[str, Any]]:
        """Metadata entry ``name`` (an emitted int node) over the state found in the file."""
        entry = self.entries.get(name)
        if entry is None:
            return None, found
        state = _entry_state(entry)
        if CalibRole(entry.get("role", role.value)) is not role or not _consistent(state, found):
            logger.warning("%s: calibration %r no longer matches the emit metadata; using the file's "
                           "quantizer as stored", self.where, name)
            return None, found
        self.report["restored"] += 1
        self.g.node_names.add(name)
        if state["feeds"]:
            self.explicit_feeds.add(name)
        return name, state

    def _activation_pair(self, q: onnx.NodeProto) -> None:
        g, where = self.g, f"{self.where}: {_label(q)}"
        out = q.output[0]
        if out in g.graph_outputs:
            raise ImportError_(f"{where}: its quantized output {out!r} is a graph output; qir imports "
                               "QDQ models whose graph outputs are float")
        readers = g.readers.get(out, [])
        bad = [r for r in readers if not _is(r, "DequantizeLinear") or r.input[0] != out]
        if bad:
            raise ImportError_(f"{where} feeds {_label(bad[0])}; qir reads QuantizeLinear → "
                               "DequantizeLinear pairs only (QDQ format, not QOperator)")
        if not readers:
            self.replace[id(q)] = []  # a dangling Q: nothing reads it
            return
        params = _qparams(q, g)
        for dq in readers:
            if not _qparams(dq, g).same(params):
                raise ImportError_(f"{where} and {_label(dq)} quantize with different parameters "
                                   "(scale, zero point, type or axis); qir needs them equal")
        x = q.input[0]
        role = CalibRole.WEIGHT if g.is_const(x) else CalibRole.ACTIVATION
        state = _state(params, _rank(g, x), where)
        first = readers[0]
        y = first.output[0]
        name, state = self._overlay(first.name, state, role)
        if name is None:
            state["implied_clip"] = self._implied_clip(x, state, role)
            # onnxruntime renames a graph output y it quantizes to y_QuantizeLinear_Input
            base = x[: -len(_ORT_OUTPUT_SUFFIX)] if x.endswith(_ORT_OUTPUT_SUFFIX) and x != _ORT_OUTPUT_SUFFIX else x
            name = self._name_for(base)
        if state.get("implied_clip") is not None:
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

    def _implied_clip(self, x: str, state: dict[str, Any], role: CalibRole) -> tuple[float, float] | None:
        if role is not CalibRole.ACTIVATION:
            return None
        producer = self.g.producer.get(x)
        if self.float_clips is not None:
            clip = self.float_clips.get(x)
            if clip is None or (producer is not None and producer.op_type in ("Relu", "Clip")):
                return None  # no Relu/Clip there in the float model, or it is still in place
            return clip
        if producer is None or producer.op_type in NONNEGATIVE_OPS or x in self.g.graph_inputs \
                or _is(producer, "DequantizeLinear") or _is(producer, "QuantizeLinear"):
            return None
        if producer.op_type in SIGN_PRESERVING_OPS:
            inputs = list(producer.input[:1])
        elif producer.op_type in NONNEGATIVE_IF_INPUTS:
            inputs = [v for v in producer.input if v]
        else:
            inputs = []
        if inputs and all(self._nonnegative(v) for v in inputs):
            return None  # e.g. MaxPool of a clipped value: nothing was removed here
        return _range_clip(state)

    def _nonnegative(self, v: str) -> bool:
        """Is ``v`` non-negative by construction: a constant >= 0, or dequantized from a range
        starting at 0 or from non-negative integers?"""
        g = self.g
        if g.is_const(v):
            return bool(np.all(np.asarray(g.const(v)) >= 0))
        dq = g.producer.get(v)
        if dq is None or not _is(dq, "DequantizeLinear"):
            return False
        params = _qparams(dq, g)
        if g.is_const(dq.input[0]):
            q = np.asarray(g.const(dq.input[0]))
            return bool(np.all(dequantize(q, params.scale, params.zero_point, params.axis) >= 0))
        mode, zp = _frame(params, f"{self.where}: {_label(dq)}")
        return bool(np.all(zp == _QMIN[mode]))

    def _dequantize_constant(self, dq: onnx.NodeProto) -> None:
        g, where = self.g, f"{self.where}: {_label(dq)}"
        src = dq.input[0]
        if not g.is_const(src):
            producer = g.producer.get(src)
            what = f"{_label(producer)}" if producer is not None else "a graph input"
            raise ImportError_(f"{where} reads {src!r}, produced by {what}: not a QuantizeLinear nor an "
                               "integer constant; qir cannot tell which float value it stands for")
        q = np.asarray(g.const(src))
        params = _qparams(dq, g)
        y = dq.output[0]
        values = dequantize(q, params.scale, params.zero_point, params.axis)
        if params.dtype == np.int32:  # a bias: plain float initializer, no calibration node
            self.new_inits.append(numpy_helper.from_array(values, y))
            self.replace[id(dq)] = []
            self.report["bias"] += 1
            return
        state = _state(params, q.ndim, where)
        name, state = self._overlay(dq.name, state, CalibRole.WEIGHT)
        entry_input = self.entries.get(name, {}).get("input") if name else None
        w = self._float_weight(src, params, values, entry_input)
        if name is None:
            name = self._name_for(w)
        self._add_calibration(dq, name, w, y, CalibRole.WEIGHT, state)
        self.report["weight"] += 1

    def _float_weight(self, src: str, params: _QParams, values: np.ndarray, preferred: str | None) -> str:
        key = (src, params.scale.tobytes(), params.zero_point.tobytes(), params.axis)
        if key in self._float_weights:
            return self._float_weights[key]
        base = preferred or (src[: -len("_quantized")] if src.endswith("_quantized") else src + "_float")
        name = self.g.fresh(base)
        self.new_inits.append(numpy_helper.from_array(values, name))
        self._float_weights[key] = name
        return name

    # ---- emitted fp16 / float nodes
    def _restore_emitted(self, nodes: list[onnx.NodeProto]) -> None:
        by_name = {n.name: n for n in nodes if n.name}
        for name, entry in self.entries.items():
            mode = entry.get("mode")
            if mode not in (CalibMode.FP16.value, CalibMode.FLOAT.value):
                continue
            try:
                ok = self._restore_one(name, entry, by_name, nodes)
            except (KeyError, ValueError, TypeError):
                ok = False
            if not ok:
                logger.warning("%s: calibration %r (%s) of the emit metadata is not in the model as "
                               "written by qir emit; skipped", self.where, name, mode)

    def _restore_one(self, name: str, entry: dict[str, Any], by_name: dict[str, onnx.NodeProto],
                     nodes: list[onnx.NodeProto]) -> bool:
        x, y = entry["input"], entry["output"]
        role = CalibRole(entry.get("role", "activation"))
        state = _entry_state(entry)
        chain: list[onnx.NodeProto] = []
        last = by_name.get(name)
        if last is not None:  # Cast pair (fp16), Relu/Clip (implied clip) or Identity (graph output)
            if list(last.output) != [y] or last.op_type not in ("Cast", "Relu", "Clip", "Identity"):
                return False
            cur = last
            chain.append(cur)
            for prefix in ("/to_fp16", "/clip"):
                prev = by_name.get(name + prefix)
                if prev is not None and cur.input[0] == prev.output[0]:
                    chain.append(prev)
                    cur = prev
            if cur.input[0] != x or any(id(n) in self.replace for n in chain):
                return False
            if any(len(self.g.readers.get(n.output[0], [])) != 1 for n in chain[1:]):
                return False
            first = chain[-1]
            for n in chain[:-1]:
                self.replace[id(n)] = []
            self._add_calibration(first, name, x, y, role, state)
        else:  # a float node emitted as nothing: its readers read x; point them back at y
            if state["mode"] is not CalibMode.FLOAT or y in self.g.names:
                return False
            targets = []
            for reader, slot in entry.get("uses", []):
                node = by_name.get(reader)
                if node is None or slot >= len(node.input) or node.input[slot] != x:
                    return False
                targets.append((node, slot))
            if not targets:
                return False
            for node, slot in targets:
                node.input[slot] = y
            self.g.names.add(y)
            position = {id(n): i for i, n in enumerate(nodes)}
            first_reader = min((t[0] for t in targets), key=lambda n: position[id(n)])
            self._add_calibration(first_reader, name, x, y, role, state, before=True)
        self.g.node_names.add(name)
        if state["feeds"]:
            self.explicit_feeds.add(name)
        self.report["restored"] += 1
        self.report[role.value] += 1
        return True

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


def convert_qdq(proto: onnx.ModelProto, where: str = "model", *,
                input_shapes: Mapping[str, Sequence[int]] | None = None, normalize: bool = True,
                float_model: str | Path | onnx.ModelProto | None = None,
                report: dict[str, int] | None = None) -> onnx.ModelProto:
    """Rewrite a QDQ model into float ops + ``qir::Calibration`` nodes (module docstring).

    A model without QuantizeLinear/DequantizeLinear (and without emit metadata) comes back
    untouched (the same object). Otherwise ``proto`` is changed in place and returned (or a
    normalized copy when ``normalize``).

    Args:
        input_shapes: fix input shapes first (as the importer does), so the clean-up folds
            shape computations.
        normalize: fold constants / clean up / toposort with onnx-graphsurgeon first, keeping
            every Q/DQ node and its constants (not for models qir emitted, whose order is kept).
        float_model: the float model the QDQ model was quantized from; when given, implied
            clips come from its Relu/Clip nodes instead of being read from the ranges.
        report: filled with counts (activation, weight, bias, implied_clip, restored).
    """
    if not is_qdq_model(proto):
        return proto
    from qir.io.onnx_proto import fix_input_shapes, name_unnamed_nodes

    name_unnamed_nodes(proto)
    if input_shapes:
        fix_input_shapes(proto, input_shapes)
    emitted = any(p.key == EMIT_METADATA_KEY for p in proto.metadata_props)
    if normalize and not emitted:  # qir wrote emitted models from a normalized IR: keep their order
        from qir.io.onnx_proto import normalize_proto

        proto = normalize_proto(proto, keep_ops=("QuantizeLinear", "DequantizeLinear"))
    clips = _float_clips(float_model) if float_model is not None else None
    rewrite = _Rewrite(proto, where, clips)
    result = rewrite.run()
    if report is not None:
        report.update(rewrite.report)
    logger.info("%s: QDQ import: %s", where, rewrite.report)
    return result


