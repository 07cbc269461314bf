"""The accumulated-error report as files: ``acc_error_<metric>.png`` (a curve per variant),
``acc_error.csv`` and ``acc_error.json`` (schema ``qir.acc_error`` v1).

The report is the ``AccErrorPass`` report; this module only draws and writes it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot

__all__ = ["files", "write_report"]


def files(metric: str) -> list[str]:
    """The files :func:`write_report` writes for a report of ``metric``."""
    return [f"acc_error_{metric}.png", "acc_error.csv", "acc_error.json"]


def write_report(report: dict, save_dir: Outputs | str | Path) -> list[Path]:
    """``acc_error_<metric>.png`` (a curve per variant), ``acc_error.csv`` (index, node, value,
    one column per variant) and ``acc_error.json`` (schema ``qir.acc_error`` v1: the report less
    the engine's statistics), through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    png, csv_name, json_name = files(report["metric"])
    curves = report["curves"]
    rows: list[list[Any]] = [["index", "node", "value", *curves]]
    rows += [[i, node, value, *("" if c[i] is None else f"{c[i]:.9g}" for c in curves.values())]
             for i, (node, value) in enumerate(zip(report["nodes"], report["values"]))]
    return [out.save_figure(png, plot_curves(report)), out.write_csv(csv_name, rows),
            out.write_json(json_name, "qir.acc_error", {k: v for k, v in report.items() if k != "engine"})]


def plot_curves(report: dict) -> Any:
    """The figure: the metric against the general node index, one curve per variant (points left
    out where null)."""
    plt = pyplot()
    metric, curves, nodes = report["metric"], report["curves"], report["nodes"]
    fig, ax = plt.subplots(figsize=(max(8.0, min(24.0, len(nodes) / 8)), 5))
    for name, curve in curves.items():
        xs = [i for i, y in enumerate(curve) if y is not None]
        ax.plot(xs, [curve[i] for i in xs], marker=".", markersize=3, linewidth=1, label=name)
    ax.set_xlabel("general node (topological order)")
    ax.set_ylabel(f"{'running mean of ' if report['average_mode'] else ''}{metric} vs float")
    ax.set_title(f"accumulated quantization error ({len(curves)} variant(s), {len(nodes)} nodes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    return fig
