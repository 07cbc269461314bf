"""``sensitivity-analysis``: how far raising the most sensitive nodes recovers the model (hmct
``sensitivity_analysis``).

Rule (``sensitivity_analysis`` in Horizon OpenExplorer's Accuracy Debug Tool documentation), on the analysis engine:

1. Sensitive nodes: ``sensitive_nodes`` as given, else the general nodes whose node sensitivity
   (only that node quantized, vs float) is no better than ``pick_threshold`` (for a
   higher-is-better metric: ``value <= pick_threshold``; else ``value >= pick_threshold``),
   most sensitive first.
2. ``single``: per node, the metric of the float model with only that node quantized.
3. ``cumulative``: the metric of the calibrated model with nodes 1..k raised to ``qtype``
   (``float`` = not quantized, or ``int16``/``fp16``), for k = 0 (the calibrated model as is) to
   the number of nodes.
   Samples whose float outputs hold NaN or Inf are left out of both (the report's ``left_out``);
   those where they are near zero or constant are left out of cosine/SQNR means, unless all are
   (the report's ``ill_conditioned``; :class:`qir.runtimes.engine.EngineResult`).
4. ``partial_quantization.png``: the cumulative curve (red), the single values (green crosses)
   and the float baseline (blue dashed), over "none" and then the nodes in order: drawn from the
   report, with the CSV and JSON, by ``qir.tools.reports.sensitivity_analysis`` (the pass only
   computes); hmct's ``sensitivity_analysis`` lives in ``qir.tools.compat.hmct``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from qir import metrics as qmetrics
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.lib.selection import calibrations_of
from qir.passes.node_sensitivity import NodeSensitivityPass
from qir.runtimes.engine import Engine, Variant

__all__ = ["SensitivityAnalysisPass", "SensitivityAnalysisReport"]

logger = logging.getLogger(__name__)

QTYPES = ("float", "int16", "fp16")


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


@dataclass
class SensitivityAnalysisReport(Report):
    """The recovery as the sensitive nodes are raised to ``qtype`` together: ``nodes`` in the order
    raised, ``single`` (each node's own sensitivity), ``cumulative`` (the metric with nothing
    raised, then with each node added), ``picked_from`` (how many nodes the pick read; None when
    the nodes were given), and, when some sample needed it, ``left_out`` and ``ill_conditioned``."""

    metric: str
    qtype: str
    pick_threshold: float
    nodes: list[str]
    single: dict[str, float]
    cumulative: list[float]
    picked_from: int | None
    left_out: dict[str, str] | None = None
    ill_conditioned: dict[str, dict[str, str]] | None = None

    optional = ("left_out", "ill_conditioned")


@register_pass
class SensitivityAnalysisPass(AnalysisPass):
    """Single and cumulative recovery of the sensitive nodes (see the module docstring)."""

    name = "sensitivity-analysis"

    def __init__(self, data: Any = None, metric: str = "cosine-similarity", *, pick_threshold: float = 0.999,
                 data_num: int | None = 1, sensitive_nodes: list[str] | None = None, qtype: str = "float",
                 runtime: str = Runtime.ORT, threads: int | None = None, progress: bool = True) -> None:
        if data is None:
            raise InputError("sensitivity analysis needs calibration data (a folder, .npz, .npy or samples)")
        qtype = "float" if qtype in ("float32", "float") else qtype
        if qtype not in QTYPES:
            raise InputError(f"unknown qtype {qtype!r}; choose one of float, int16, fp16")
        if not _finite(pick_threshold):
            raise InputError(f"pick_threshold must be a finite number, got {pick_threshold!r}: no metric value "
                             "would ever be compared with it")
        self.data, self.metric = data, qmetrics.check_metrics(metric)[0]
        self.pick_threshold, self.data_num, self.qtype = float(pick_threshold), data_num, qtype
        self.sensitive = list(sensitive_nodes or [])
        self.runtime, self.threads, self.progress = runtime, threads, progress
        self.options = {"metric": self.metric, "pick_threshold": self.pick_threshold, "qtype": qtype,
                        "data_num": data_num}

    def check(self, ir: QIR) -> None:
        """One clear error for a chosen sensitive node ``ir`` does not have or that has no
        calibration nodes (``runall`` calls it up front)."""
        for node in self.sensitive or ():
            calibrations_of(ir, node)

    def run(self, ir: QIR) -> PassResult:
        ns = NodeSensitivityPass(self.data, [self.metric], node_type="node", data_num=self.data_num,
                                 interested_nodes=self.sensitive or None, runtime=self.runtime,
                                 threads=self.threads, progress=self.progress)(ir).report
        single = {r["node"]: r[self.metric] for r in ns["rows"]}
        if self.sensitive:
            nodes = list(self.sensitive)
        else:
            higher = qmetrics.BETTER[self.metric] == "max"
            nodes = [n for n, v in single.items()
                     if (v <= self.pick_threshold if higher else v >= self.pick_threshold)]
        variants = [Variant("none", {})]
        changes: dict[str, str] = {}
        for node in nodes:
            changes.update({c.name: self._raised(c) for c in calibrations_of(ir, node)})
            variants.append(Variant(node, dict(changes)))
        with Engine(ir, self.data, runtime=self.runtime, reference="quantized", metrics=[self.metric],
                    data_num=self.data_num, threads=self.threads,
                    progress=self.progress and "sensitivity analysis (raised together)") as engine:
            result = engine.evaluate(variants)
        table = result.per_variant()
        report = SensitivityAnalysisReport(self.metric, self.qtype, self.pick_threshold, nodes,
                                           {n: single[n] for n in nodes}, [table[v.name][self.metric] for v in variants],
                                           len(single) if not self.sensitive else None)
        if result.left_out:  # (the node sensitivity above left out the same samples)
            report.left_out = {str(s): why for s, why in result.left_out.items()}
        if result.ill_conditioned:
            report.ill_conditioned = {str(s): ill for s, ill in result.ill_conditioned.items()}
        return PassResult(ir, False, report)

    def _raised(self, cal) -> str:
        if self.qtype == "int16" and cal.mode is not CalibMode.INT8:
            return cal.mode.value  # only int8 nodes are raised to int16
        return self.qtype
