"""``sensitivity-analysis``: how far raising the most sensitive nodes recovers the model (hmct
``sensitivity_analysis``).

Rule (``../shared/reference/horizon-semantics.md`` §1.7), on the analysis engine:

1. Sensitive nodes: ``sensitive_nodes`` as given, else the general nodes whose node sensitivity
   (only that node quantized, vs float) is no better than ``pick_threshold`` (for a
   higher-is-better metric: ``value <= pick_threshold``; else ``value >= pick_threshold``),
   most sensitive first.
2. ``single``: per node, the metric of the float model with only that node quantized.
3. ``cumulative``: the metric of the calibrated model with nodes 1..k raised to ``qtype``
   (``float`` = not quantized, or ``int16``/``fp16``), for k = 0 (the calibrated model as is) to
   the number of nodes.
4. ``partial_quantization.png``: the cumulative curve (red), the single values (green crosses)
   and the float baseline (blue dashed), over "none" and then the nodes in order.
"""
from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

from qir import metrics as qmetrics
from qir.api import as_ir
from qir.errors import InputError
from qir.graph import QIR
from qir.json_dump import write_json
from qir.kinds import CalibMode
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.passes.lib.selection import calibrations_of
from qir.passes.node_sensitivity import NodeSensitivityPass
from qir.runtimes.engine import Engine, Variant

__all__ = ["SensitivityAnalysisPass", "sensitivity_analysis", "write_report"]

logger = logging.getLogger(__name__)

QTYPES = ("float", "int16", "fp16")


@register_pass
class SensitivityAnalysisPass(AnalysisPass):
    """Single and cumulative recovery of the sensitive nodes (see the module docstring)."""

    name = "sensitivity-analysis"

    def __init__(self, data: Any = None, metric: str = "cosine-similarity", pick_threshold: float = 0.999,
                 data_num: int | None = 1, sensitive_nodes: list[str] | None = None, qtype: str = "float",
                 runtime: str = "ort", threads: int | None = None, progress: bool = True) -> None:
        if data is None:
            raise InputError("sensitivity analysis needs calibration data (a folder, .npz, .npy or samples)")
        qtype = "float" if qtype in ("float32", "float") else qtype
        if qtype not in QTYPES:
            raise InputError(f"unknown qtype {qtype!r}; choose one of float, int16, fp16")
        self.data, self.metric = data, qmetrics.check_metrics(metric)[0]
        self.pick_threshold, self.data_num, self.qtype = float(pick_threshold), data_num, qtype
        self.sensitive = list(sensitive_nodes or [])
        self.runtime, self.threads, self.progress = runtime, threads, progress
        self.options = {"metric": self.metric, "pick_threshold": self.pick_threshold, "qtype": qtype,
                        "data_num": data_num}

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
        engine = Engine(ir, self.data, runtime=self.runtime, reference="quantized", metrics=[self.metric],
                        data_num=self.data_num, threads=self.threads, progress=self.progress)
        try:
            table = engine.evaluate(variants).per_variant()
        finally:
            engine.close()
        report = {"metric": self.metric, "qtype": self.qtype, "pick_threshold": self.pick_threshold,
                  "nodes": nodes, "single": {n: single[n] for n in nodes},
                  "cumulative": [table[v.name][self.metric] for v in variants],
                  "picked_from": len(single) if not self.sensitive else None}
        return PassResult(ir, False, report)

    def _raised(self, cal) -> str:
        if self.qtype == "int16" and cal.mode is not CalibMode.INT8:
            return cal.mode.value  # only int8 nodes are raised to int16
        return self.qtype


def write_report(report: dict, save_dir: str | Path) -> list[Path]:
    """``partial_quantization.png``, ``sensitivity_analysis.csv`` (step, node, single,
    cumulative) and ``sensitivity_analysis.json`` (schema ``qir.sensitivity_analysis`` v1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    metric, nodes = report["metric"], report["nodes"]
    labels = ["none"] + nodes
    xs = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(max(7.0, min(24.0, 1.0 + 0.45 * len(labels))), 5))
    best = 1.0 if metric == "cosine-similarity" else None
    if best is not None:
        ax.axhline(best, color="tab:blue", linestyle="--", linewidth=1, label="float model")
    ax.plot(xs, report["cumulative"], color="red", marker="o", markersize=3,
            label=f"calibrated, nodes up to this one raised to {report['qtype']}")
    if nodes:
        ax.plot(xs[1:], [report["single"][n] for n in nodes], "x", color="green", markersize=7,
                label="float, only this node quantized")
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize="small")
    ax.set_ylabel(f"{metric} vs float")
    ax.set_title("partial quantization: recovery as sensitive nodes are raised")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    png = out / "partial_quantization.png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    csv_path = out / "sensitivity_analysis.csv"
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "node", f"single_{metric}", f"cumulative_{metric}"])
        for k, label in enumerate(labels):
            single = report["single"].get(label, "") if k else ""
            writer.writerow([k, label, single, report["cumulative"][k]])
    js = write_json(out / "sensitivity_analysis.json", "qir.sensitivity_analysis", report)
    return [png, csv_path, js]


def sensitivity_analysis(model_or_file, calibrated_data, metric="cosine-similarity", pick_threshold=0.999,
                         data_num=1, sensitive_nodes=None, qtype="float", save_dir="./debug_result/", *,
                         runtime="ort", threads=None, progress=True) -> dict:
    """hmct's ``sensitivity_analysis``: writes the chart and numbers to ``save_dir`` and returns
    ``{node: {"single": value, "cumulative": value}}`` in order."""
    ir = as_ir(model_or_file, calibrated=True)
    report = SensitivityAnalysisPass(calibrated_data, metric, pick_threshold, data_num, sensitive_nodes, qtype,
                                     runtime, threads, progress)(ir).report
    write_report(report, save_dir)
    return {n: {"single": report["single"][n], "cumulative": report["cumulative"][k + 1]}
            for k, n in enumerate(report["nodes"])}
