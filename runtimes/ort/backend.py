"""The onnxruntime backend: lower the IR to ONNX and run it with onnxruntime (CPU).

Captured values are exposed as extra graph outputs. Each capture gets its own ``Identity``
node writing a fresh output name (``qir.capture.<k>``), so a value that is also a graph input,
a weight, a graph output, or captured twice is returned correctly, and the results are keyed
back by the IR's value names. Sessions are built once per IR version and capture set and cached
on the IR. ``session.disable_quant_qdq`` keeps onnxruntime from fusing QuantizeLinear /
DequantizeLinear pairs into integer kernels, so fake quantization means what it says.
With ``layout_stable`` (the analysis engine's setting), GlobalAveragePool is written as
ReduceMean (:func:`qir.runtimes.ort.lowering.lower_layout_stable`), so a part of a model computes exactly what the whole
model computes there. Graph inputs and outputs of types onnxruntime's Python API cannot
exchange (bfloat16, float8, 4-bit integers) cross in a wider type (:mod:`.boundary`).
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qir.errors import ExecutionError, InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.io.onnx_export import CalibLowering, export_onnx
from qir.runtimes.base import LEVELS, check_capture, check_feeds
from qir.runtimes.numerics import ROUNDING
from qir.runtimes.ort.boundary import WidenedSession, widen_boundary
from qir.runtimes.ort.lowering import _implied_clip_nodes, lower_fake_quant, lower_layout_stable, lower_spec
from qir.runtimes.ort.resize_lowering import check as check_resize
from qir.runtimes.support import check_supported

__all__ = ["OrtRuntime", "new_session", "thread_limit", "limited_threads"]

logger = logging.getLogger(__name__)

#: Intra-op threads of the sessions built without a count of their own (None: onnxruntime's
#: choice, one per core); :func:`thread_limit` sets it for a span of work.
_THREADS: ContextVar[int | None] = ContextVar("qir_ort_threads", default=None)


def limited_threads() -> int | None:
    """The :func:`thread_limit` in force here (None: none)."""
    return _THREADS.get()


@contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """Inside, every :class:`OrtRuntime` and :func:`new_session` not given a thread count uses
    ``threads`` intra-op threads: what a command's ``--threads`` means for all of its work,
    passes that build their own runtimes (calibration, the repair transforms) included. None or
    0: the enclosing limit stays."""
    if not threads:
        yield
        return
    token = _THREADS.set(int(threads))
    try:
        yield
    finally:
        _THREADS.reset(token)

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtRuntime:
    """Run a QIR with onnxruntime.

    Args:
        threads: intra-op threads (default: the :func:`thread_limit` around it, else onnxruntime's choice).
        optimization: graph optimization level, ``disable|basic|extended|all`` (default all).
        level: ``fakequant`` (calibration nodes quantize) or ``float`` (they pass through).
        rounding: fake-quant rounding, ``half_to_even`` (default), ``half_up`` or ``half_away``.
        lower_calibration: a custom lowering of calibration nodes (default: :func:`lower_fake_quant`).
        layout_stable: write ops whose onnxruntime kernel depends on the memory layout of
            their input so that it does not (:func:`lower_layout_stable`); the analysis
            engine's setting, so a whole-model run computes what the engine's parts compute.
            Off by default: the model's own ops, as an emitted model has them.
    """

    name = Runtime.ORT

    def __init__(self, threads: int | None = None, optimization: str = "all",
                 level: str = Level.FAKEQUANT, rounding: str = "half_to_even",
                 lower_calibration: CalibLowering | None = None, layout_stable: bool = False) -> None:
        if optimization not in _LEVELS:
            raise InputError(f"unknown optimization {optimization!r}; choose {sorted(_LEVELS)}")
        if level not in LEVELS:
            raise InputError(f"unknown level {level!r}; choose {list(LEVELS)}")
        if level == Level.INTEGER:
            raise InputError("the ort runtime computes the float and fakequant levels; run the integer level "
                             "with the numpy runtime (--runtime numpy)")
        self.threads = threads
        self.optimization = optimization
        if rounding not in ROUNDING:
            raise InputError(f"unknown rounding {rounding!r}; choose {sorted(ROUNDING)}")
        self.level = level
        self.rounding = rounding
        self.lower_calibration = lower_calibration
        self.layout_stable = bool(layout_stable)

    @property
    def session_threads(self) -> int | None:
        """The intra-op threads of a session it builds now: its own ``threads``, else the
        :func:`thread_limit` around the call (a runtime made before the limit follows it too)."""
        return self.threads or limited_threads()

    def min_max(self, ir: QIR, feeds: Mapping[str, np.ndarray], values: Iterable[str]) -> dict[str, tuple[float, float]]:
        """``(min, max)`` of each value, reduced inside onnxruntime (two vectors come back, the
        minima and the maxima of all values, instead of the tensors, so the model runs near its
        plain speed). NaN in a tensor makes both NaN."""
        feeds = check_feeds(ir, feeds)
        names = tuple(sorted(check_capture(ir, values)))
        if not names:
            return {}
        key = ("ort-minmax", names, self.session_threads, self.optimization, self.level, self.rounding,
               self.layout_stable, os.getpid())
        session, outs, _ = ir.cached(key, lambda: self._session(ir, names, reduce_min_max=True))
        try:
            lows, highs = session.run(outs, dict(feeds))
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed on model {ir.name!r}: {_first_line(exc)}") from exc
        return dict(zip(names, zip(lows.tolist(), highs.tolist())))

    def _session(self, ir: QIR, captured: tuple[str, ...], reduce_min_max: bool = False):
        check_supported(ir, Runtime.ORT)
        check_resize(ir)
        if self.level == "float":
            def lower(_ir, rec):  # noqa: E306 - float level: pass through (restoring removed activations)
                if rec.implied_clip is not None:
                    return _implied_clip_nodes(rec, rec.input, rec.output, rec.name)
                return [helper.make_node("Identity", [rec.input], [rec.output], name=rec.name)]
        else:
            lower = self.lower_calibration or (lambda ir_, rec: lower_fake_quant(ir_, rec, self.rounding))
        nodes, outputs = [], []
        if reduce_min_max:
            nodes, outputs = _min_max_outputs(ir, captured)
        for k, name in enumerate(() if reduce_min_max else captured):
            out = f"qir.capture.{k}"
            nodes.append(helper.make_node("Identity", [name], [out], name=f"qir.capture.{k}.node"))
            outputs.append(helper.make_empty_tensor_value_info(out))
        model = export_onnx(ir, lower_calibration=lower, extra_nodes=nodes, extra_outputs=outputs,
                            lower_op=lower_layout_stable if self.layout_stable else lower_spec)
        model, wide_inputs, narrow_outputs = widen_boundary(model)
        session = new_session(model, self.session_threads, self.optimization, what=f"model {ir.name!r}")
        if wide_inputs or narrow_outputs:
            session = WidenedSession(session, wide_inputs, narrow_outputs)
        names = [o.name for o in session.get_outputs()]
        keys = list(ir.outputs) + list(captured)  # session output i is value keys[i]
        if reduce_min_max:  # only the two vectors of minima and maxima are fetched
            names, keys = names[len(ir.outputs):], []
        return session, names, keys

    def _cached_session(self, ir: QIR, ordered: tuple[str, ...]):
        """The session for a capture *set* (sorted), built once per IR version and settings."""
        key = ("ort-session", ordered, self.session_threads, self.optimization, self.level, self.rounding,
               self.lower_calibration, self.layout_stable, os.getpid())
        return ir.cached(key, lambda: self._session(ir, ordered))

    def prepare(self, ir: QIR) -> None:
        """Build (and cache) the session that :meth:`run` without captures uses: what qir
        refuses (:func:`qir.runtimes.support.check_supported`) and a model onnxruntime cannot
        load are refused before anything runs."""
        self._cached_session(ir, ())

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *,
            capture: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """Execute ``ir``; returns graph outputs and captured values by name."""
        feeds = check_feeds(ir, feeds)
        captured = check_capture(ir, capture)
        session, names, keys = self._cached_session(ir, tuple(sorted(captured)))
        try:
            values = dict(zip(keys, session.run(names, dict(feeds))))
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed on model {ir.name!r}: {_first_line(exc)}") from exc
        return {name: values[name] for name in (*ir.outputs, *captured)}


_ROW_REDUCTION_MIN = 1 << 16  # elements from which min/max are reduced row-wise first


def _min_max_outputs(ir: QIR, values: tuple[str, ...]) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto]]:
    """Nodes computing ``qir.capture.min`` / ``qir.capture.max``: the minima and the maxima of
    ``values``, in their order, as two vectors. Each value is viewed as rows and reduced per
    row, then over the rows. A tensor of 64K values or more becomes ``[N·C, H·W]`` rows
    (``Flatten`` at axis 2 for rank >= 3): onnxruntime splits a row-wise reduction across its
    threads, while a reduction to one number runs on one (measured: max calibration of
    PP-OCRv4 det 3.3x -> 2.5x a plain forward). A smaller one is one row (``Flatten`` at axis
    0), which one thread reduces as fast. Two outputs instead of two per value: fetching each
    result as its own array cost more than the reductions on small models."""
    make = helper.make_node
    p = "qir.capture"
    nodes = []
    if ir.opset >= 18:  # axes became an input in opset 18
        nodes.append(make("Constant", [], [f"{p}.axes"], name=f"{p}.axes",
                          value=numpy_helper.from_array(np.array([1], np.int64))))

    def reduce(op: str, src: str, dst: str) -> onnx.NodeProto:
        if ir.opset >= 18:
            return make(op, [src, f"{p}.axes"], [dst], name=dst, keepdims=0)
        return make(op, [src], [dst], name=dst, axes=[1], keepdims=0)

    lows, highs = [], []
    for k, value in enumerate(values):
        out = f"{p}.{k}"
        shape = ir.value(value).shape or ()
        rows = len(shape) >= 2 and not _smaller_than(shape, _ROW_REDUCTION_MIN)
        nodes.append(make("Flatten", [value], [f"{out}.rows"], name=f"{out}.rows",
                          axis=(2 if len(shape) >= 3 else 1) if rows else 0))
        for op, tag, acc in (("ReduceMin", "min", lows), ("ReduceMax", "max", highs)):
            row = f"{out}.{tag}.rows"
            nodes.append(reduce(op, f"{out}.rows", row))  # one number per row
            if rows:  # and one over the rows, kept as a vector of one
                nodes.append(make(op, [row], [f"{out}.{tag}"], name=f"{out}.{tag}", keepdims=1))
                row = f"{out}.{tag}"
            acc.append(row)
    nodes += [make("Concat", lows, [f"{p}.min"], name=f"{p}.min", axis=0),
              make("Concat", highs, [f"{p}.max"], name=f"{p}.max", axis=0)]
    return nodes, [helper.make_empty_tensor_value_info(f"{p}.{t}") for t in ("min", "max")]


def _smaller_than(shape, elements: int) -> bool:
    """True when ``shape`` is static and holds fewer than ``elements`` values."""
    return all(isinstance(d, int) for d in shape) and int(np.prod(shape, dtype=np.int64)) < elements


def new_session(model: onnx.ModelProto, threads: int | None = None, optimization: str = "all", *,
                shared: bool = False, what: str = "the model"):
    """An onnxruntime CPU session for ``model`` with qir's settings: quiet logging, QDQ pairs
    left unfused (``session.disable_quant_qdq``), ``threads`` intra-op threads (default: the
    :func:`thread_limit` around it, else onnxruntime's choice). ``shared``: one
    of many sessions living in one process, so idle thread pools do not busy-wait and no
    per-session memory arena keeps its peak allocation after a run."""
    import onnxruntime as ort

    if optimization not in _LEVELS:
        raise InputError(f"unknown optimization {optimization!r}; choose {sorted(_LEVELS)}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[optimization])
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.disable_quant_qdq", "1")
    threads = threads or limited_threads()
    if shared:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.enable_cpu_mem_arena = False
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExecutionError(f"onnxruntime could not load {what}: {_first_line(exc)}") from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
