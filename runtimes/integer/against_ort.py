"""The integer level against onnxruntime's own integer kernels, op by op.

A QDQ model (``onnxruntime.quantization.quantize_static``) runs in onnxruntime's default CPU
session as fused kernels: onnxruntime's graph optimizer groups ``DQ -> op -> Q`` into QLinear*
ONNX or contrib kernels where it has one (QLinearConv, QLinearMatMul, QLinearAdd, QLinearMul,
QLinearSoftmax, ...) and runs every other quantized op as ``DequantizeLinear -> float op ->
QuantizeLinear``. qir's integer level with the ``ort`` profile states that arithmetic; this module
checks it, value by value:

* onnxruntime runs the model with every QuantizeLinear output made a graph output (its codes);
  the kernel that produced each one is read from the optimized graph onnxruntime writes
  (``SessionOptions.optimized_model_filepath``);
* qir's integer level runs the same samples, once as is (``differ``: what each quantized value
  inherits) and once with every quantized value forced to onnxruntime's codes (``own_differ``:
  what the op that produced it computes differently by itself, from exactly onnxruntime's inputs);
* :func:`compare_with_ort` returns an :class:`OrtComparison`, whose ``first`` is the first
  quantized value in the model's order whose codes differ, and ``first_own`` the first op that
  departs by itself (the one to fix).
"""
from __future__ import annotations

import collections
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qir.errors import InputError
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.records import CalibRecord, OpRecord
from qir.runtimes.integer.interpreter import IntegerRuntime
from qir.runtimes.integer.qtensor import params_of
from qir.runtimes.march import MarchProfile
from qir.runtimes.march.ort import ORT

__all__ = ["OrtComparison", "QuantizedValue", "compare_with_ort", "optimized_graph", "ort_float_ops", "ort_kernels"]

_QLINEAR_DOMAIN = "com.microsoft"


@dataclass
class QuantizedValue:
    """One QuantizeLinear of the model: who computes it in each runtime and how the codes agree."""

    quantizer: str          # the QuantizeLinear's output (onnxruntime's tensor of codes)
    node: str               # qir's calibration node
    op: str | None          # the op whose output it quantizes (None: a graph input)
    op_type: str
    ort_kernel: str         # what onnxruntime ran: a fused kernel, or "DQ -> <op> -> Q"
    count: int = 0          # codes compared
    differ: int = 0         # codes that differ
    max_step: int = 0
    own_differ: int = 0     # codes that differ when qir starts from onnxruntime's inputs
    own_max_step: int = 0

    @property
    def departs(self) -> bool:
        return self.own_differ > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OrtComparison:
    """qir's integer level (``march``) against onnxruntime's default CPU session on a QDQ model."""

    march: str
    samples: int
    values: list[QuantizedValue]              # in the model's order
    kernels: dict[str, int]                   # onnxruntime's optimized graph: op type -> count
    output_codes_agree: float                 # share of equal codes at the quantized graph outputs
    output_cosine: float                      # worst over samples and outputs (dequantized values)
    rerun_differs: bool = False               # the saved optimized graph did not reproduce the session
    notes: list[str] = field(default_factory=list)

    @property
    def first(self) -> QuantizedValue | None:
        """The first quantized value whose codes differ (inherited or not)."""
        return next((v for v in self.values if v.differ), None)

    @property
    def first_own(self) -> QuantizedValue | None:
        """The first op that departs from onnxruntime by itself."""
        return next((v for v in self.values if v.departs), None)

    @property
    def departing(self) -> list[QuantizedValue]:
        return [v for v in self.values if v.departs]

    def to_json(self) -> dict[str, Any]:
        first, own = self.first, self.first_own
        return {"march": self.march, "samples": self.samples, "output_codes_agree": self.output_codes_agree,
                "output_cosine": self.output_cosine, "first_departure": first.quantizer if first else None,
                "first_own_departure": own.quantizer if own else None, "kernels": dict(self.kernels),
                "rerun_differs": self.rerun_differs, "notes": list(self.notes),
                "values": [v.to_json() for v in self.values]}


# ----------------------------------------------------------------------------- onnxruntime side
def _session(model, level: str = "all"):
    """onnxruntime's CPU session over ``model`` (a ModelProto), one thread, at optimization
    ``level`` (``all``: the default session; ``none``: the graph as given)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = 1
    if level == "none":
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def optimized_graph(model, folder: Path):
    """The graph onnxruntime's default CPU session runs for ``model`` (its QDQ groups fused),
    as written by ``SessionOptions.optimized_model_filepath``."""
    import onnx
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(folder / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return onnx.load(str(folder / "optimized.onnx"))


def ort_kernels(optimized) -> dict[str, str]:
    """``{tensor: what onnxruntime computes it with}`` over an optimized graph: the kernel's op
    type (``QLinearMatMul``, ...; through a layout Transpose after it), or ``DQ -> <op> -> Q`` for
    a QuantizeLinear of a float op (``QuantizeLinear`` of a graph input)."""
    producer = {o: n for n in optimized.graph.node for o in n.output}
    found: dict[str, str] = {}
    for n in optimized.graph.node:
        for out in n.output:
            if n.op_type == "QuantizeLinear":
                src = producer.get(n.input[0])
                found[out] = f"DQ -> {src.op_type} -> Q" if src is not None else "QuantizeLinear"
            elif n.op_type == "Transpose" and n.input[0] in found:
                found[out] = found[n.input[0]]
            else:
                found[out] = n.op_type
    return found


def ort_float_ops(optimized) -> frozenset[str]:
    """The ops onnxruntime's optimized graph runs in float on dequantized codes (``DQ -> op ->
    Q``, a group its QDQ fusion left alone): nodes of the default domain, other than
    Quantize/DequantizeLinear, that read a DequantizeLinear's output. They keep their names."""
    dq_outputs = {o for n in optimized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return frozenset(n.name for n in optimized.graph.node
                     if n.domain in ("", "ai.onnx") and n.op_type not in ("QuantizeLinear", "DequantizeLinear")
                     and any(i in dq_outputs for i in n.input))


#: Fused kernels: the input that holds the output's zero point (its element type is the output's).
_OUTPUT_ZP = {"QLinearConv": 7, "QLinearMatMul": 7, "QLinearAdd": 7, "QLinearMul": 7, "QLinearSoftmax": 4,
              "QLinearSigmoid": 4, "QLinearLeakyRelu": 4, "QLinearAveragePool": 4, "QLinearGlobalAveragePool": 4,
              "QLinearConcat": 1, "QLinearReduceMean": 4, "QGemm": 7}


def _quantizers(model) -> dict[str, tuple[str, int]]:
    """``{QuantizeLinear output: (its float input, its ONNX element type)}`` over ``model``, in
    the model's order."""
    from onnx import TensorProto

    inits = {i.name: i.data_type for i in model.graph.initializer}
    return {n.output[0]: (n.input[0], inits.get(n.input[2], TensorProto.UINT8) if len(n.input) > 2
                          else TensorProto.UINT8) for n in model.graph.node if n.op_type == "QuantizeLinear"}


def _exposed(optimized, quantizers: dict[str, tuple[str, int]], ops: dict[str, str]) -> tuple[Any, dict[str, str]]:
    """The optimized graph with the quantized tensors it still holds made graph outputs, and
    ``{original QuantizeLinear output: its tensor there}``: the same name where onnxruntime kept
    it (a fused kernel's output, a QuantizeLinear left as is), else the QuantizeLinear that now
    quantizes the same float tensor, else the output of the fused kernel that replaced the op
    computing it (``ops``: ``{float tensor: its op's name}``; onnxruntime names a fused kernel after
    the op and renames the tensors it converts, e.g. int8 -> uint8 with the zero point moved by
    128). Run without further optimization, the graph runs exactly the kernels of the default
    session."""
    import onnx
    from onnx import helper

    exposed = onnx.ModelProto()
    exposed.CopyFrom(optimized)
    produced = {o for n in exposed.graph.node for o in n.output}
    inits = {i.name: i.data_type for i in exposed.graph.initializer}
    requant = {n.input[0]: (n.output[0], inits.get(n.input[2], 0) if len(n.input) > 2 else 0)
               for n in exposed.graph.node if n.op_type == "QuantizeLinear"}
    fused = {re.sub(r"_token_\d+$", "", n.name): (n.output[0], inits.get(n.input[_OUTPUT_ZP[n.op_type]], 0))
             for n in exposed.graph.node if n.op_type in _OUTPUT_ZP and len(n.input) > _OUTPUT_ZP[n.op_type]}
    existing = {o.name for o in exposed.graph.output}
    shown = {}
    for name, (source, dtype) in quantizers.items():
        if name in produced:
            shown[name] = name
        elif source in requant and requant[source][1]:
            shown[name], dtype = requant[source]
        elif ops.get(source) in fused and fused[ops[source]][1]:
            shown[name], dtype = fused[ops[source]]
        else:
            continue
        if shown[name] not in existing:
            existing.add(shown[name])
            exposed.graph.output.append(helper.make_tensor_value_info(shown[name], dtype, None))
    return exposed, shown


# ---------------------------------------------------------------------------------- comparison
def _codes(value: np.ndarray, cal: CalibRecord) -> np.ndarray:
    """qir's dequantized value as codes in the int8/int16 frame."""
    scale, zp = params_of(cal).broadcast(np.ndim(value))
    return np.rint(np.asarray(value, np.float64) / scale).astype(np.int64) + zp


def _channels_last(optimized) -> set[str]:
    """The tensors of an optimized graph in NHWC layout: outputs of kernels marked
    ``channels_last`` (onnxruntime's layout transformation of QLinearConv & co.) and of the ops
    that read them, up to a Transpose."""
    found: set[str] = set()
    for n in optimized.graph.node:
        marked = any(a.name == "channels_last" and a.i == 1 for a in n.attribute)
        if marked or (n.op_type != "Transpose" and any(i in found for i in n.input)):
            found.update(n.output)
    return found


def _ort_codes(codes: np.ndarray, nhwc: bool) -> np.ndarray:
    """onnxruntime's codes in qir's frame (uint8 -> int8: ``- 128``; uint16 -> int16) and layout
    (``nhwc``: transposed back to NCHW)."""
    shift = {np.dtype(np.uint8): 128, np.dtype(np.uint16): 32768}.get(codes.dtype, 0)
    if nhwc and codes.ndim == 4:
        codes = codes.transpose(0, 3, 1, 2)
    return codes.astype(np.int64) - shift


def _real(codes: np.ndarray, cal: CalibRecord) -> np.ndarray:
    """Codes (qir's frame) as the float32 reals they stand for, which quantize back to them."""
    scale, zp = params_of(cal).broadcast(codes.ndim)
    return ((codes - zp).astype(np.float32) * scale).astype(np.float32)


def _tally(row: QuantizedValue, ours: np.ndarray, theirs: np.ndarray, own: bool) -> None:
    delta = np.abs(ours - theirs)
    if own:
        row.own_differ += int(np.count_nonzero(delta))
        row.own_max_step = max(row.own_max_step, int(delta.max(initial=0)))
        return
    row.count += delta.size
    row.differ += int(np.count_nonzero(delta))
    row.max_step = max(row.max_step, int(delta.max(initial=0)))


def _rows(ir: QIR, quantizers: list[str], q_input: dict[str, str],
          kernels: dict[str, str]) -> list[tuple[QuantizedValue, CalibRecord]]:
    by_input = {c.input: c for c in ir.calibrations(CalibRole.ACTIVATION)}
    rows = []
    for q in quantizers:
        cal = by_input.get(q_input[q])
        if cal is None:
            continue
        producer = ir.producer(cal.input)
        op = producer if isinstance(producer, OpRecord) else None
        rows.append((QuantizedValue(q, cal.name, op.name if op else None, op.op_type if op else "input",
                                    kernels[q]), cal))
    return rows


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na and nb else float(np.array_equal(a, b))


def compare_with_ort(model: str | Path | Any, ir: QIR, samples: Sequence[dict[str, np.ndarray]],
                     march: str | MarchProfile = ORT, follow_fusion: bool = True) -> OrtComparison:
    """qir's integer level at ``march`` (onnxruntime's own profile by default) against onnxruntime's default CPU session on a QDQ
    ``model`` (a path or ModelProto; ``ir``: the same model loaded by ``qir.load``), on ``samples``
    (see the module docstring). ``follow_fusion``: run the ops
    onnxruntime left unfused in float, as it does (:func:`ort_float_ops`); otherwise the march
    alone decides what computes in integer."""
    import onnx

    proto = onnx.load(str(model)) if isinstance(model, (str, Path)) else model
    if not any(n.op_type == "QuantizeLinear" for n in proto.graph.node):
        raise InputError("the model has no QuantizeLinear node: comparing with onnxruntime's integer kernels needs a "
                         "QDQ model (quantize it with onnxruntime.quantization.quantize_static, QuantFormat.QDQ)")
    with tempfile.TemporaryDirectory() as tmp:
        optimized = optimized_graph(proto, Path(tmp))
    quantizers = _quantizers(proto)
    ops = {o: n.name for n in proto.graph.node for o in n.output}
    exposed, shown = _exposed(optimized, quantizers, ops)
    default, session = _session(proto), _session(exposed, "none")
    kernels, nhwc = ort_kernels(optimized), _channels_last(optimized)
    q_input = {q: source for q, (source, _) in quantizers.items()}
    rows = _rows(ir, list(shown), q_input, {q: kernels.get(t, "?") for q, t in shown.items()})
    runtime = IntegerRuntime(march, float_ops=ort_float_ops(optimized) if follow_fusion else ())
    rows, worst, same, dropped = _run(runtime, ir, session, default, samples, rows, shown, nhwc)
    out_q = _output_quantizers(proto)
    out_rows = [row for row, _ in rows if row.quantizer in out_q]
    out_total = sum(r.count for r in out_rows)
    notes = [] if out_rows else ["no graph output is a dequantized QuantizeLinear: output codes not compared"]
    hidden = len(quantizers) - len(shown)
    if hidden:
        notes.append(f"{hidden} of {len(quantizers)} QuantizeLinear outputs are gone from onnxruntime's optimized "
                     "graph (folded into a kernel): not compared")
    if dropped:
        notes.append(f"{dropped} quantized value(s) are held in another layout in onnxruntime: not compared")
    if not same:
        notes.append("onnxruntime's optimized graph, re-run as saved, does not reproduce its default session")
    counts = collections.Counter(n.op_type for n in optimized.graph.node)
    return OrtComparison(runtime.profile.name, len(samples), [row for row, _ in rows], dict(counts),
                         sum(r.count - r.differ for r in out_rows) / out_total if out_total else 1.0, worst,
                         not same, notes)


def _run(runtime: IntegerRuntime, ir: QIR, session, default, samples, rows: list, shown: dict[str, str],
         nhwc: set[str]) -> tuple[list, float, bool, int]:
    """Both runtimes on every sample, tallied into ``rows``; returns the rows compared (those whose
    layout matches qir's), the worst output cosine, whether the exposed graph reproduced the
    default session, and how many rows were dropped for their layout."""
    names = [o.name for o in session.get_outputs()]
    capture = [cal.output for _, cal in rows]
    worst, same, kept = 1.0, True, None
    for feed in samples:
        theirs = dict(zip(names, session.run(None, feed)))
        same = same and all(np.array_equal(theirs[o.name], v) for o, v in zip(default.get_outputs(),
                                                                              default.run(None, feed)))
        ours = runtime.run(ir, feed, capture=capture)
        codes = {row.quantizer: _ort_codes(theirs[shown[row.quantizer]], shown[row.quantizer] in nhwc)
                 for row, _ in rows}
        if kept is None:
            kept = [(row, cal) for row, cal in rows if codes[row.quantizer].shape == ours[cal.output].shape]
        own = runtime.run(ir, feed, capture=capture, forced={cal.name: _real(codes[row.quantizer], cal)
                                                             for row, cal in kept})
        for row, cal in kept:
            _tally(row, _codes(ours[cal.output], cal), codes[row.quantizer], own=False)
            _tally(row, _codes(own[cal.output], cal), codes[row.quantizer], own=True)
        worst = min([worst] + [_cosine(ours[o], theirs[o]) for o in ir.outputs])
    kept = rows if kept is None else kept
    return kept, worst, same, len(rows) - len(kept)


def _output_quantizers(proto) -> set[str]:
    """The QuantizeLinear outputs that a graph output dequantizes (``Q -> DQ -> output``)."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    found = set()
    for out in proto.graph.output:
        dq = producer.get(out.name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            q = producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                found.add(q.output[0])
    return found
