"""The distribution report as files: one ``<node>.png`` per node and ``distribution.json``
(schema ``qir.distribution`` v1).

The input is the ``DistributionPass`` result: its ``report`` holds the statistics, its ``arrays``
the values drawn (see ``qir.passes.distribution``). Counts are on a log scale (quantization
effects live in the tails):

- a weight node: the original and the calibrated weights overlaid, with the threshold;
- an activation node: its input in the calibrated and in the float model (what calibration
  read), the threshold (red dashed lines), max |x| over both (blue triangle: the value the
  advice names) and the clipped share in the title;

Values that are never negative (after a ReLU) are drawn from 0, with the threshold's positive
side only; others on an axis that takes in ±threshold.
- a general node: its float and calibrated outputs overlaid, and next to them the error.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from qir.passes.distribution import ActivationDistribution, DistributionReport, NodeDistribution, WeightDistribution
from qir.passes.lib.capture import PlotResult
from qir.runtimes.progress import track
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot, safe_filename

__all__ = ["files", "write_report", "plot_overlay"]


def files(nodes: Iterable[str]) -> list[str]:
    """The files :func:`write_report` writes for ``nodes``."""
    return [f"{safe_filename(name)}.png" for name in nodes] + ["distribution.json"]


def write_report(result: PlotResult, save_dir: Outputs | str | Path) -> DistributionReport:
    """Draw every node of ``result`` (a ``DistributionPass`` result) to ``<node>.png`` and write
    ``distribution.json``, through :class:`~qir.tools.reports.output.Outputs`; returns the report
    as written: each node's entry with its ``png`` path."""
    out = as_outputs(save_dir)
    report: DistributionReport = result.report  # type: ignore[assignment]
    written = DistributionReport({})
    for name, entry in track(report.nodes.items(), "plot distributions", unit="plots"):
        path = out.save_figure(f"{safe_filename(name)}.png", _figure(name, entry, result.arrays[name]))
        written.nodes[name] = replace(entry, png=str(path))
    out.write_json("distribution.json", "qir.distribution", written)
    return written


def _figure(name: str, entry: NodeDistribution, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(entry, WeightDistribution):
        return plot_overlay(name, {"original": arrays["original"], "calibrated": arrays["calibrated"]},
                            entry.threshold, "weight value")
    if isinstance(entry, ActivationDistribution):
        th = entry.threshold
        title = name if th is None else f"{name}: {100 * entry.clipped_fraction:.3g}% clipped"
        series = {f"input of {name} (calibrated model)": arrays["input"]}
        if "float_input" in arrays:
            series["input (float model)"] = arrays["float_input"]
        return plot_overlay(title, series, th, "activation value")
    return _plot_node(name, arrays["float"], arrays["calibrated"])


def plot_overlay(title: str, series: dict[str, np.ndarray], threshold: float | None, xlabel: str,
                 ax=None) -> Any:
    """Log-scale histograms of ``series`` on shared bins, max |x| and ±threshold marked, drawn on
    ``ax``, or on a new figure that is returned."""
    plt = pyplot()
    own = ax is None
    fig = None
    if own:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    finite = {k: v[np.isfinite(v)] for k, v in series.items()}
    lo = min((v.min() for v in finite.values() if v.size), default=0.0)
    hi = max((v.max() for v in finite.values() if v.size), default=1.0)
    signed = lo < 0
    if threshold is not None:
        lo, hi = (min(lo, -threshold) if signed else 0.0), max(hi, threshold)
    bins = np.linspace(lo, hi if hi > lo else lo + 1, 201)
    for label, v in finite.items():
        ax.hist(v, bins=bins, histtype="step" if len(finite) > 1 else "stepfilled", alpha=0.8, label=label, log=True)
    amax = max((float(np.abs(v).max()) for v in finite.values() if v.size), default=0.0)
    ymax = ax.get_ylim()[1]
    ax.plot([amax], [ymax * 0.5], marker="v", color="tab:blue", linestyle="none", markersize=9,
            label=f"max |x| = {amax:.4g}")
    if threshold is not None:
        for t in ((-threshold, threshold) if signed else (threshold,)):
            ax.axvline(t, color="red", linestyle="--", linewidth=1)
        ax.plot([], [], color="red", linestyle="--", label=f"threshold = {threshold:.4g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count (log)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    if own:
        fig.tight_layout()
    return fig


def _plot_node(name: str, f: np.ndarray, q: np.ndarray) -> Any:
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(13, 4.5))
    plot_overlay(f"output of {name}", {"float model": f, "calibrated model": q}, None, "output value", ax=a)
    plot_overlay("error (calibrated − float)", {"error": q - f}, None, "error", ax=b)
    fig.tight_layout()
    return fig
