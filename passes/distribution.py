"""``distribution``: data distributions at chosen nodes (hmct ``plot_distribution``).

Per node in ``nodes_list``, the values one plot draws, and their statistics:

- a **weight calibration node**: the original weights and the calibrated (fake-quantized)
  weights, and its threshold;
- an **activation calibration node**: the values entering it in the calibrated model, its
  threshold (the largest one for per-channel nodes) and the share of values beyond it
  (``clipped_fraction``), and the values entering it in the float model (``float_input``: what
  calibration reads, larger where an upstream quantizer clips; the advice's max |x| is the larger
  of the two);
- a **general node**: its first output in the float and in the calibrated model, and the error
  (calibrated − float).

Values are gathered over the first ``data_num`` samples. The pass only computes: it returns a
:class:`~qir.passes.lib.capture.PlotResult` whose ``report`` holds, per node, the statistics
(``{"nodes": {node: {"type", ...}}}``) and whose ``arrays`` hold what the plots draw
(``original``/``calibrated`` for a weight node, ``input`` and ``float_input`` for an activation node,
``float``/``calibrated`` for a general node). ``qir.tools.reports.distribution`` draws one PNG
per node (log-scale counts; the threshold as a red dashed line, max |x| as a blue triangle) and
writes ``distribution.json`` (schema ``qir.distribution`` v1); hmct's ``plot_distribution``
lives in ``qir.tools.compat.hmct``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

from qir.calibration import max_threshold
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.passes.base import AnalysisPass, Report, register_pass
from qir.passes.lib.capture import PlotResult, clipped_fraction, collect
from qir.records import CalibRecord
from qir.runtimes.numerics import apply_calibration

__all__ = ["DistributionPass", "DistributionReport", "WeightDistribution", "ActivationDistribution",
           "OutputDistribution", "NodeDistribution"]


@dataclass
class WeightDistribution(Report):
    """A weight calibration node: statistics (count, min, max, mean, std, abs_max) of the weight
    as stored and as calibrated, and the node's threshold; ``png`` once drawn."""

    type: str = field(default="weight", init=False)
    original: dict[str, float]
    calibrated: dict[str, float]
    threshold: float | None
    png: str | None = None

    optional = ("png",)


@dataclass
class ActivationDistribution(Report):
    """An activation calibration node: statistics of its input in the calibrated and the float
    model, its threshold and the share of the input beyond it; ``png`` once drawn."""

    type: str = field(default="activation", init=False)
    input: dict[str, float]
    float_input: dict[str, float]
    threshold: float | None
    clipped_fraction: float | None
    png: str | None = None

    optional = ("png",)


@dataclass
class OutputDistribution(Report):
    """A general node: statistics of its output in the float and the calibrated model and of the
    error between them; ``png`` once drawn."""

    type: str = field(default="node", init=False)
    float: dict[str, float]
    calibrated: dict[str, float]
    error: dict[str, float]
    png: str | None = None

    optional = ("png",)


NodeDistribution = Union[WeightDistribution, ActivationDistribution, OutputDistribution]


@dataclass
class DistributionReport(Report):
    """``nodes``: each chosen node's distribution, in the order asked."""

    nodes: dict[str, NodeDistribution]

logger = logging.getLogger(__name__)


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def _stats(x: np.ndarray) -> dict[str, float]:
    finite = x[np.isfinite(x)]
    if not finite.size:
        return {"count": int(x.size)}
    return {"count": int(x.size), "min": float(finite.min()), "max": float(finite.max()),
            "mean": float(finite.mean()), "std": float(finite.std()), "abs_max": float(np.abs(finite).max())}


@register_pass
class DistributionPass(AnalysisPass):
    """Distributions at nodes (see the module docstring); returns a ``PlotResult``."""

    name = "distribution"

    def __init__(self, data: Any = None, nodes_list: list[str] | str | None = None, *, data_num: int | None = 1,
                 runtime: str = Runtime.ORT) -> None:
        if data is None:
            raise InputError("distribution needs calibration data (a folder, .npz, .npy or samples)")
        nodes = [nodes_list] if isinstance(nodes_list, str) else list(nodes_list or [])
        if not nodes:
            raise InputError("nodes_list is required: name calibration nodes and/or general nodes")
        self.data, self.nodes = data, nodes
        self.data_num, self.runtime = data_num, runtime
        self.options = {"nodes_list": nodes, "data_num": data_num}

    def check(self, ir: QIR) -> None:
        """One clear error for a node name ``ir`` does not have (``runall`` calls it up front)."""
        names = [r.name for r in ir.runnables()]
        for n in self.nodes:
            if not ir.has_node(n):
                raise NotFoundError(did_you_mean(n, names, "node"))

    def run(self, ir: QIR) -> PlotResult:
        self.check(ir)
        recs = [ir.node(n) for n in self.nodes]
        acts = [r.input for r in recs if isinstance(r, CalibRecord) and ir.value(r.input).kind is not NodeKind.WEIGHT]
        outs = [r.outputs[0] for r in recs if not isinstance(r, CalibRecord)]
        quant = {v: _flat(a) for v, a in collect(ir, self.data, acts + outs, quantized=True, data_num=self.data_num,
                                                  runtime=self.runtime).items()} if acts or outs else {}
        flt = {v: _flat(a) for v, a in collect(ir, self.data, acts + outs, quantized=False, data_num=self.data_num,
                                                runtime=self.runtime).items()} if acts or outs else {}
        report = DistributionReport({})
        arrays: dict[str, dict[str, np.ndarray]] = {}
        for rec in recs:
            if isinstance(rec, CalibRecord) and ir.value(rec.input).kind is NodeKind.WEIGHT:
                w = np.asarray(ir.weight_array(rec.input))
                arrays[rec.name] = {"original": w.ravel(), "calibrated": np.ravel(apply_calibration(rec, w))}
                entry: NodeDistribution = WeightDistribution(_stats(arrays[rec.name]["original"]),
                                                             _stats(arrays[rec.name]["calibrated"]), max_threshold(rec))
            elif isinstance(rec, CalibRecord):
                x = quant[rec.input]
                th = max_threshold(rec)
                arrays[rec.name] = {"input": x, "float_input": flt[rec.input]}
                entry = ActivationDistribution(_stats(x), _stats(flt[rec.input]), th, clipped_fraction(x, th))
            else:
                f, q = flt[rec.outputs[0]], quant[rec.outputs[0]]
                arrays[rec.name] = {"float": f, "calibrated": q}
                entry = OutputDistribution(_stats(f), _stats(q), _stats(q - f))
            report.nodes[rec.name] = entry
        return PlotResult(ir, False, report, arrays)
