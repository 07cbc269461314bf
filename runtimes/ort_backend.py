"""The onnxruntime backend: lower the IR to ONNX and run it with onnxruntime (CPU).

Captured values are exposed as extra graph outputs. Each capture gets its own ``Identity``
node writing a fresh output name (``qir.capture.<k>``), so a value that is also a graph input,
a weight, a graph output, or captured twice is returned correctly, and the results are keyed
back by the IR's value names. Sessions are built once per IR version and capture set and cached
on the IR. ``session.disable_quant_qdq`` keeps onnxruntime from fusing QuantizeLinear /
DequantizeLinear pairs into integer kernels, so fake quantization means what it says.
"""
from __future__ import annotations

import logging
import os
from typing import Iterable, Mapping

import numpy as np
from onnx import helper

from qir.errors import ExecutionError, QirError
from qir.graph import QIR
from qir.onnx_export import CalibLowering, export_onnx

from .base import LEVELS, InputError, check_capture, check_feeds

__all__ = ["OrtRuntime"]

logger = logging.getLogger(__name__)

_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OrtRuntime:
    """Run a QIR with onnxruntime.

    Args:
        threads: intra-op threads (default: onnxruntime's choice).
        optimization: graph optimization level, ``disable|basic|extended|all`` (default all).
        level: ``fakequant`` (calibration nodes lowered by ``lower_calibration``) or ``float``.
        lower_calibration: how calibration nodes become ONNX (default: float nodes only).
    """

    name = "ort"

    def __init__(self, threads: int | None = None, optimization: str = "all",
                 level: str = "fakequant", lower_calibration: CalibLowering | None = None) -> None:
        if optimization not in _LEVELS:
            raise InputError(f"unknown optimization {optimization!r}; choose {sorted(_LEVELS)}")
        if level not in LEVELS:
            raise InputError(f"unknown level {level!r}; choose {list(LEVELS)}")
        self.threads = threads
        self.optimization = optimization
        self.level = level
        self.lower_calibration = lower_calibration

    def _session(self, ir: QIR, captured: tuple[str, ...]):
        import onnxruntime as ort

        lower = self.lower_calibration
        if self.level == "float":
            def lower(_ir, rec):  # noqa: E306 - float level: every calibration node passes through
                return [helper.make_node("Identity", [rec.input], [rec.output], name=rec.name)]
        nodes, outputs = [], []
        for k, name in enumerate(captured):
            out = f"qir.capture.{k}"
            nodes.append(helper.make_node("Identity", [name], [out], name=f"qir.capture.{k}.node"))
            outputs.append(helper.make_empty_tensor_value_info(out))
        model = export_onnx(ir, lower_calibration=lower, extra_nodes=nodes, extra_outputs=outputs)
        opts = ort.SessionOptions()
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[self.optimization])
        opts.log_severity_level = 3
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
        if self.threads:
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
        try:
            session = ort.InferenceSession(model.SerializeToString(), opts,
                                           providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise ExecutionError(f"onnxruntime could not load model {ir.name!r}: {_first_line(exc)}") from exc
        names = [o.name for o in session.get_outputs()]
        keys = list(ir.outputs) + list(captured)
        return session, names, keys

    def run(self, ir: QIR, feeds: Mapping[str, np.ndarray], *,
            capture: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """Execute ``ir``; returns graph outputs and captured values by name."""
        feeds = check_feeds(ir, feeds)
        captured = check_capture(ir, capture)
        key = ("ort-session", captured, self.threads, self.optimization, self.level,
               self.lower_calibration, os.getpid())
        session, names, keys = ir.cached(key, lambda: self._session(ir, captured))
        try:
            values = session.run(names, dict(feeds))
        except QirError:
            raise
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed on model {ir.name!r}: {_first_line(exc)}") from exc
        return dict(zip(keys, values))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
