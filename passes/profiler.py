"""``profiler``: per-op statistics of inputs, weights, biases and outputs (horizon ``ModelProfiler``).

The model runs (fake-quantized, as calibrated) on the first ``data_num`` samples with every value
an op reads or writes captured. For each general node kept by the filters (name ``prefixes``,
op ``types``), one row per tensor it touches:

``op, op_type, module, role (input<i> / weight / bias / output<i>), value, dtype, scale, min,
max, mean, var, shape``

``dtype`` is the mode of the calibration node the op reads the tensor through (``float`` when
none); ``scale`` is that node's (largest) scale. Weights and biases are the stored arrays; an
input read through a weight calibration node is the weight, shown as calibrated. Activations are
pooled over the samples. The report holds the ``rows`` and each op's ``tensors``; the pass writes
nothing. :mod:`qir.tools.reports.profiler` writes ``statistic.txt`` (aligned) and
``statistic.csv``; with ``histograms``, one PNG per op with the histogram of each tensor (log
counts); with ``tensorboard`` (needs the ``tensorboard`` package), the same histograms as a
TensorBoard event file. :func:`qir.tools.profiler.profile_model` does both (horizon ``ModelProfiler``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from qir.calibration import QRANGE, calib_scale
from qir.errors import InputError, shown
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import CalibMode, NodeKind
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.lib.capture import collect
from qir.records import CalibRecord
from qir.runtimes.numerics import apply_calibration

__all__ = ["ProfilerPass", "ProfileReport"]

logger = logging.getLogger(__name__)


@dataclass
class ProfileReport(Report):
    """Per-op tensor statistics: ``rows`` (one per op input/output: op, op_type, module, role,
    value, dtype, scale, min, max, mean, var, shape), ``samples`` (how many were pooled) and
    ``tensors`` (``{op: {"<role> <value>": array}}``, for histograms; not JSON)."""

    rows: list[dict[str, Any]]
    samples: int
    tensors: dict[str, dict[str, np.ndarray]]


@register_pass
class ProfilerPass(AnalysisPass):
    """Per-op tensor statistics (see the module docstring). The report holds ``rows``."""

    name = "profiler"

    def __init__(self, data: Any = None, data_num: int | None = 1, *, prefixes: list[str] | None = None,
                 types: list[str] | None = None, runtime: str = Runtime.ORT) -> None:
        if data is None:
            raise InputError("the profiler needs data (a folder, .npz, .npy or samples)")
        self.data, self.data_num, self.runtime = data, data_num, runtime
        self.prefixes, self.types = list(prefixes or []), list(types or [])
        self.options = {"data_num": data_num, "prefixes": self.prefixes, "types": self.types}

    def selected_ops(self, ir: QIR) -> list:
        """The general nodes the filters keep (the ops the report has a row and tensors for)."""
        ops = [op for op in ir.ops() if (not self.prefixes or any(op.name.startswith(p) for p in self.prefixes))
               and (not self.types or op.op_type in self.types)]
        if not ops:
            raise InputError(f"no op matches prefixes {shown(self.prefixes)} and types {shown(self.types)}")
        return ops

    def run(self, ir: QIR) -> PassResult:
        ops = self.selected_ops(ir)
        activations = sorted({v for op in ops for v in (*op.inputs, *op.outputs)
                              if v and ir.value(v).kind is NodeKind.ACTIVATION and not self._weight_view(ir, v)})
        pooled = collect(ir, self.data, activations, quantized=True, data_num=self.data_num, runtime=self.runtime)
        rows: list[dict] = []
        tensors: dict[str, dict[str, np.ndarray]] = {}
        for op in ops:
            tensors[op.name] = {}
            for i, v in enumerate(op.inputs):
                if not v:
                    continue
                cal = ir.producer(v) if isinstance(ir.producer(v), CalibRecord) else None
                weight_cal = self._weight_view(ir, v)
                if weight_cal is not None:
                    array = apply_calibration(weight_cal, ir.weight_array(weight_cal.input))
                    role = "weight" if i == 1 else "bias"
                elif ir.value(v).kind is NodeKind.WEIGHT:
                    array, role = ir.weight_array(v), ("weight" if i == 1 else "bias")
                else:
                    array, role = np.concatenate(pooled[v], axis=0), f"input{i}"
                rows.append(_row(op, role, v, weight_cal or cal, np.asarray(array), _shape(pooled, v, array)))
                tensors[op.name][f"{role} {v}"] = np.asarray(array)
            for j, v in enumerate(op.outputs):
                if v and v in pooled:
                    array = np.concatenate(pooled[v], axis=0)
                    readers = [r for r in ir.consumers(v) if isinstance(r, CalibRecord)]
                    rows.append(_row(op, f"output{j}", v, readers[0] if readers else None, array,
                                     _shape(pooled, v, array)))
                    tensors[op.name][f"output{j} {v}"] = array
        return PassResult(ir, False, ProfileReport(rows, len(next(iter(pooled.values()), [])), tensors))

    @staticmethod
    def _weight_view(ir: QIR, value: str) -> CalibRecord | None:
        """The weight calibration node producing ``value``, if it is one."""
        p = ir.producer(value)
        if isinstance(p, CalibRecord) and ir.value(p.input).kind is NodeKind.WEIGHT:
            return p
        return None


def _shape(pooled: dict[str, list[np.ndarray]], value: str, array: np.ndarray) -> list[int]:
    """One sample's shape (activations are pooled over samples along axis 0)."""
    return list(pooled[value][0].shape if value in pooled else array.shape)


def _row(op, role: str, value: str, cal: CalibRecord | None, array: np.ndarray, shape: list[int]) -> dict[str, Any]:
    x = array.astype(np.float64).ravel()
    x = x[np.isfinite(x)]
    scale = float(np.max(calib_scale(cal))) if cal is not None and cal.mode in QRANGE else None
    return {"op": op.name, "op_type": op.op_type, "module": op.module or "", "role": role, "value": value,
            "dtype": (cal.mode.value if cal is not None else CalibMode.FLOAT.value),
            "scale": scale, "min": float(x.min()) if x.size else None, "max": float(x.max()) if x.size else None,
            "mean": float(x.mean()) if x.size else None, "var": float(x.var()) if x.size else None,
            "shape": shape}
