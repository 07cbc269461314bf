"""``channelwise``: per-channel box plots of a calibration node's input (hmct
``get_channelwise_data_distribution``).

For each calibration node: its input (a weight array, or the activation entering it in the
calibrated model over the first ``data_num`` samples) is split along ``axis`` (default: the
node's own axis for weights, else 0; 1 for activations) and drawn as one box per channel: box =
quartiles, whiskers = 1.5 IQR, red solid line = median, blue dashed line = mean, dots = outliers.

Activation nodes also get their threshold (red dashed lines) and the share of values beyond it
(``clipped_fraction``). A channel is an *outlier channel* when its max |x| is more than ``outlier_ratio`` (default 4)
times the median of all channels' max |x|: one such channel sets a per-tensor scale that wastes
the integer range of all the others. The report lists them per node, ``channelwise.txt``
summarizes them and ``channelwise.json`` (schema ``qir.channelwise`` v1) holds the report.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from qir.api import as_ir
from qir.calibration import max_threshold
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.graph import QIR
from qir.json_dump import write_json
from qir.kinds import NodeKind
from qir.naming import safe_filename
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.passes.lib.capture import clipped_fraction, collect
from qir.records import CalibRecord

__all__ = ["ChannelwisePass", "get_channelwise_data_distribution"]

logger = logging.getLogger(__name__)


@register_pass
class ChannelwisePass(AnalysisPass):
    """Per-channel box plots (see the module docstring); ``save_dir`` receives
    ``<node>_channelwise.png`` and ``channelwise.txt``."""

    name = "channelwise"

    def __init__(self, data: Any = None, nodes_list: list[str] | str | None = None, save_dir: str = "./debug_result/",
                 axis: int | None = None, data_num: int | None = 1, outlier_ratio: float = 4.0,
                 runtime: str = "ort") -> None:
        if data is None:
            raise InputError("channelwise needs calibration data (a folder, .npz, .npy or samples)")
        nodes = [nodes_list] if isinstance(nodes_list, str) else list(nodes_list or [])
        if not nodes:
            raise InputError("nodes_list is required: name calibration nodes")
        self.data, self.nodes, self.save_dir, self.axis = data, nodes, Path(save_dir), axis
        self.data_num, self.ratio, self.runtime = data_num, float(outlier_ratio), runtime
        self.options = {"nodes_list": nodes, "axis": axis, "data_num": data_num}

    def run(self, ir: QIR) -> PassResult:
        cals: list[CalibRecord] = []
        for n in self.nodes:
            if not ir.has_node(n) or not isinstance(ir.node(n), CalibRecord):
                raise NotFoundError(did_you_mean(n, [c.name for c in ir.calibrations()], "calibration node"))
            cals.append(ir.node(n))
        acts = [c for c in cals if ir.value(c.input).kind is not NodeKind.WEIGHT]
        self.save_dir.mkdir(parents=True, exist_ok=True)
        captured = collect(ir, self.data, list(dict.fromkeys(c.input for c in acts)), quantized=True,
                           data_num=self.data_num, runtime=self.runtime) if acts else {}
        report, lines = {"nodes": {}}, []
        for cal in cals:
            threshold = None
            if cal in acts:  # samples stack along the batch axis
                x = np.concatenate(captured[cal.input], axis=0).astype(np.float64)
                axis = 1 if self.axis is None else self.axis
                threshold = max_threshold(cal)
            else:
                x = np.asarray(ir.weight_array(cal.input), np.float64)
                axis = (cal.axis if cal.axis is not None else 0) if self.axis is None else self.axis
            if not -x.ndim <= axis < x.ndim:
                raise InputError(f"axis {axis} is out of range for {cal.name!r}, whose input has shape {list(x.shape)}")
            channels = np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
            peaks = np.abs(channels).max(axis=1)
            ref = float(np.median(peaks))
            outliers = [int(i) for i in np.flatnonzero(peaks > self.ratio * ref)] if ref > 0 else []
            path = self.save_dir / f"{safe_filename(cal.name)}_channelwise.png"
            _boxplot(path, cal.name, channels, axis, outliers, threshold)
            report["nodes"][cal.name] = {"axis": int(axis), "channels": int(channels.shape[0]),
                                         "channel_abs_max": [float(p) for p in peaks],
                                         "median_abs_max": ref, "outlier_channels": outliers,
                                         "threshold": threshold, "clipped_fraction": clipped_fraction(x, threshold),
                                         "png": str(path)}
            detail = ", ".join(f"{i} (max |x| {peaks[i]:.4g})" for i in outliers[:10]) or "none"
            lines.append(f"{cal.name}: {channels.shape[0]} channels on axis {axis}; median of channel max |x| "
                         f"{ref:.4g}; outlier channels (> {self.ratio:g}x): {detail}")
        (self.save_dir / "channelwise.txt").write_text("\n".join(lines) + "\n")
        write_json(self.save_dir / "channelwise.json", "qir.channelwise", report)
        return PassResult(ir, False, report)


def _boxplot(path: Path, name: str, channels: np.ndarray, axis: int, outliers: list[int],
             threshold: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = channels.shape[0]
    fig, ax = plt.subplots(figsize=(max(8.0, min(30.0, n * 0.18)), 5))
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
    fig.savefig(path, dpi=110)
    plt.close(fig)


def get_channelwise_data_distribution(save_dir, model_or_file, calibrated_data, nodes_list, axis=None, *,
                                      data_num: int | None = 1, runtime: str = "ort") -> dict:
    """hmct's ``get_channelwise_data_distribution``: box plots in ``save_dir``; returns the
    per-node channel statistics and outlier channels."""
    ir = as_ir(model_or_file)
    return ChannelwisePass(calibrated_data, nodes_list, save_dir, axis, data_num, 4.0, runtime)(ir).report["nodes"]
