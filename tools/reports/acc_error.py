"""The accumulated-error report as files: ``acc_error_<metric>.png`` (a curve per variant),
``acc_error.csv`` and ``acc_error.json`` (schema ``qir.acc_error`` v1).

The report is the ``AccErrorPass`` report; this module only draws and writes it. The figure stays
readable on large graphs: one panel per ``PANEL`` nodes (stacked, 12 inches wide, so a report page
shows it near full size), the op names on the x axis when the whole graph has at most ``NAMED``
nodes, and otherwise node numbers with the ``DIPS`` worst dips (:func:`dips`: the largest
worsening from one node to the next on any curve) marked and named.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qir.passes.acc_error import AccErrorReport
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot

__all__ = ["files", "write_report", "dips", "plot_curves", "Dip"]

PANEL = 60  # nodes per panel
NAMED = 30  # at most this many nodes: every op named on the x axis
DIPS = 8  # worst dips named on larger graphs


@dataclass(frozen=True)
class Dip:
    """A worsening of the metric on ``curve`` from the point before node ``index`` to it."""

    index: int
    node: str
    curve: str
    before: float
    after: float
    drop: float


def files(metric: str) -> list[str]:
    """The files :func:`write_report` writes for a report of ``metric``."""
    return [f"acc_error_{metric}.png", "acc_error.csv", "acc_error.json"]


def write_report(report: AccErrorReport, save_dir: Outputs | str | Path) -> list[Path]:
    """``acc_error_<metric>.png`` (a curve per variant), ``acc_error.csv`` (index, node, value,
    one column per variant) and ``acc_error.json`` (schema ``qir.acc_error`` v1: the report less
    the engine's statistics), through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    png, csv_name, json_name = files(report.metric)
    curves = report.curves
    rows: list[list[Any]] = [["index", "node", "value", *curves]]
    rows += [[i, node, value, *("" if c[i] is None else f"{c[i]:.9g}" for c in curves.values())]
             for i, (node, value) in enumerate(zip(report.nodes, report.values))]
    return [out.save_figure(png, plot_curves(report)), out.write_csv(csv_name, rows),
            out.write_json(json_name, "qir.acc_error", {k: v for k, v in report.to_json().items() if k != "engine"})]


def dips(report: AccErrorReport, count: int = DIPS) -> list[Dip]:
    """The ``count`` largest worsenings of the metric from one node to the next on any curve
    (the previous point shown; lower is worse for cosine/SQNR, higher for the error metrics),
    worst first."""
    from qir.metrics import BETTER

    sign = 1.0 if BETTER.get(report.metric, "max") == "max" else -1.0
    found = []
    for name, curve in report.curves.items():
        prev = None
        for i, y in enumerate(curve):
            if y is None:
                continue
            if prev is not None and sign * (prev - y) > 0:
                found.append(Dip(i, report.nodes[i], name, prev, y, sign * (prev - y)))
            prev = y
    found.sort(key=lambda d: -d.drop)
    return found[:count]


def plot_curves(report: AccErrorReport) -> Any:
    """The figure (see the module docstring): the metric against the general node index, one
    curve per variant (points left out where null), in panels of ``PANEL`` nodes."""
    plt = pyplot()
    metric, curves, nodes = report.metric, report.curves, report.nodes
    panels = max(1, -(-len(nodes) // PANEL))
    named = len(nodes) <= NAMED
    fig, axes = plt.subplots(panels, 1, figsize=(12.0, 3.4 * panels + (1.6 if named else 0.8)), squeeze=False)
    marked = {(d.index, d.curve) for d in ([] if named else dips(report))}
    for p, ax in enumerate(axes[:, 0]):
        lo, hi = p * PANEL, min(len(nodes), (p + 1) * PANEL)
        for name, curve in curves.items():
            xs = [i for i in range(lo, hi) if curve[i] is not None]
            ax.plot(xs, [curve[i] for i in xs], marker=".", markersize=3, linewidth=1, label=name)
            for k, i in enumerate(i for i in xs if (i, name) in marked):
                ax.annotate(nodes[i], (i, curve[i]), xytext=(4, -14 - 10 * (k % 2)), textcoords="offset points",
                            fontsize=8, color="darkred", arrowprops={"arrowstyle": "-", "color": "darkred", "lw": 0.5})
                ax.plot([i], [curve[i]], "o", color="darkred", markersize=4)
        if named:
            ax.set_xticks(range(lo, hi), [nodes[i] for i in range(lo, hi)], rotation=60, ha="right", fontsize=8)
        ax.set_xlim(lo - 0.5, hi - 0.5)
        ax.set_ylabel(f"{'running mean of ' if report.average_mode else ''}{metric}", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_title(f"accumulated quantization error vs float ({len(curves)} variant(s), {len(nodes)} nodes"
                         + ("" if named else f"; the {len(marked)} worst dips named") + ")", fontsize=10)
    axes[0, 0].legend(fontsize="small", loc="best")
    axes[-1, 0].set_xlabel("general node (topological order)" + ("" if named else ": number, as in acc_error.csv"))
    fig.tight_layout()
    return fig
