"""The sensitivity-analysis report as files: ``partial_quantization.png`` (the recovery chart),
``sensitivity_analysis.csv`` and ``sensitivity_analysis.json`` (schema ``qir.sensitivity_analysis`` v1).

The report is the ``SensitivityAnalysisPass`` report; this module only draws and writes it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qir.passes.sensitivity_analysis import SensitivityAnalysisReport
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot

__all__ = ["FILES", "write_report"]

FILES = ("partial_quantization.png", "sensitivity_analysis.csv", "sensitivity_analysis.json")


def write_report(report: SensitivityAnalysisReport, save_dir: Outputs | str | Path) -> list[Path]:
    """``partial_quantization.png``, ``sensitivity_analysis.csv`` (step, node, single,
    cumulative) and ``sensitivity_analysis.json`` (schema ``qir.sensitivity_analysis`` v1: the
    report), through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    png, csv_name, json_name = FILES
    metric, labels = report.metric, ["none"] + report.nodes
    rows: list[list[Any]] = [["step", "node", f"single_{metric}", f"cumulative_{metric}"]]
    rows += [[k, label, report.single.get(label, "") if k else "", report.cumulative[k]]
             for k, label in enumerate(labels)]
    return [out.save_figure(png, plot_recovery(report)), out.write_csv(csv_name, rows),
            out.write_json(json_name, "qir.sensitivity_analysis", report)]


def plot_recovery(report: SensitivityAnalysisReport) -> Any:
    """The figure: the cumulative curve (red), the single values (green crosses) and the float baseline (blue
    dashed, cosine only), over "none" and then the nodes in order."""
    plt = pyplot()
    metric, nodes = report.metric, report.nodes
    labels = ["none"] + nodes
    xs = list(range(len(labels)))
    fig, ax = plt.subplots(figsize=(max(7.0, min(24.0, 1.0 + 0.45 * len(labels))), 5))
    if metric == "cosine-similarity":
        ax.axhline(1.0, color="tab:blue", linestyle="--", linewidth=1, label="float model")
    ax.plot(xs, report.cumulative, color="red", marker="o", markersize=3,
            label=f"calibrated, nodes up to this one raised to {report.qtype}")
    if nodes:
        ax.plot(xs[1:], [report.single[n] for n in nodes], "x", color="green", markersize=7,
                label="float, only this node quantized")
    ax.set_xticks(xs, labels, rotation=60, ha="right", fontsize="small")
    ax.set_ylabel(f"{metric} vs float")
    ax.set_title("partial quantization: recovery as sensitive nodes are raised")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig
