"""The channelwise report as files: one ``<node>_channelwise.png`` box plot per node,
``channelwise.txt`` (one summary line per node) and ``channelwise.json`` (schema ``qir.channelwise`` v1).

The input is the ``ChannelwisePass`` result: its ``report`` holds the per-channel statistics and
outlier channels, its ``arrays`` each node's channels (see ``qir.passes.channelwise``). A box
plot draws one box per channel: box = quartiles, whiskers = 1.5 IQR, red solid line = median,
blue dashed line = mean, dots = outliers; outlier channels are shaded, and an activation node's
threshold is drawn as red dashed lines.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from qir.passes.channelwise import ChannelStats, ChannelwiseReport
from qir.passes.lib.capture import PlotResult
from qir.runtimes.progress import track
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot, safe_filename

__all__ = ["files", "write_report", "summary_line"]


def files(nodes: Iterable[str]) -> list[str]:
    """The files :func:`write_report` writes for ``nodes``."""
    return [f"{safe_filename(name)}_channelwise.png" for name in nodes] + ["channelwise.txt", "channelwise.json"]


def write_report(result: PlotResult, save_dir: Outputs | str | Path) -> ChannelwiseReport:
    """Draw every node of ``result`` (a ``ChannelwisePass`` result) to ``<node>_channelwise.png``,
    then write ``channelwise.txt`` and ``channelwise.json``, through
    :class:`~qir.tools.reports.output.Outputs`; returns the report as written: its nodes, each
    with its ``png`` path."""
    out = as_outputs(save_dir)
    report: ChannelwiseReport = result.report  # type: ignore[assignment]
    ratio = report.outlier_ratio
    written = ChannelwiseReport({})
    lines = []
    for name, entry in track(report.nodes.items(), "channel box plots", unit="plots"):
        fig = boxplot(name, result.arrays[name]["channels"], entry.axis, entry.outlier_channels, entry.threshold)
        path = out.save_figure(f"{safe_filename(name)}_channelwise.png", fig)
        written.nodes[name] = replace(entry, png=str(path))
        lines.append(summary_line(name, entry, ratio))
    out.write_text("channelwise.txt", "\n".join(lines) + "\n")
    out.write_json("channelwise.json", "qir.channelwise", written)
    return written


def summary_line(name: str, entry: ChannelStats, ratio: float) -> str:
    """One node's line of ``channelwise.txt``: channels, median channel max |x|, outlier channels (the first 10)."""
    peaks = entry.channel_abs_max
    detail = ", ".join(f"{i} (max |x| {peaks[i]:.4g})" for i in entry.outlier_channels[:10]) or "none"
    return (f"{name}: {entry.channels} channels on axis {entry.axis}; median of channel max |x| "
            f"{entry.median_abs_max:.4g}; outlier channels (> {ratio:g}x): {detail}")


def boxplot(name: str, channels: np.ndarray, axis: int, outliers: list[int], threshold: float | None = None) -> Any:
    """The figure: one box per row of ``channels``, outlier channels shaded, ±threshold dashed."""
    n = channels.shape[0]
    fig, ax = pyplot().subplots(figsize=(max(8.0, min(30.0, n * 0.18)), 5))
    ax.boxplot(list(channels), showmeans=True, meanline=True, sym=".", widths=0.6,
               medianprops={"color": "red"}, meanprops={"color": "blue", "linestyle": "--"},
               flierprops={"markersize": 2, "alpha": 0.5})
    step = max(1, n // 32)
    ax.set_xticks(range(1, n + 1, step), [str(i) for i in range(0, n, step)], fontsize="small")
    for i in outliers:
        ax.axvspan(i + 0.5, i + 1.5, color="orange", alpha=0.25)
    if threshold is not None:
        for t in (-threshold, threshold):
            ax.axhline(t, color="red", linestyle="--", linewidth=1)
        ax.plot([], [], color="red", linestyle="--", label=f"threshold ±{threshold:.4g} (beyond: clipped)")
        ax.legend(fontsize="small", loc="upper right")
    ax.set_xlabel(f"channel (axis {axis}); shaded: outlier channels")
    ax.set_ylabel("value")
    ax.set_title(f"{name}: per-channel distribution of its input ({n} channels)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
