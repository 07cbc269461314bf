"""``channelwise``: per-channel statistics of a calibration node's input (hmct
``get_channelwise_data_distribution``).

For each calibration node: its input (a weight array, or the activation entering it in the
calibrated model over the first ``data_num`` samples) is split along ``axis`` (default: the
node's own axis for weights, else 0; 1 for activations) into channels.

Activation nodes also get their threshold and the share of values beyond it
(``clipped_fraction``). A channel is an *outlier channel* when its max |x| is more than ``outlier_ratio`` (default 4)
times the median of all channels' max |x|: one such channel sets a per-tensor scale that wastes
the integer range of all the others.

The pass only computes: it returns a :class:`~qir.passes.lib.capture.PlotResult` whose
``report`` is ``{"nodes": {node: {"axis", "channels", "channel_abs_max", "median_abs_max",
"outlier_channels", "threshold", "clipped_fraction"}}, "outlier_ratio"}`` and whose ``arrays``
hold each node's ``channels`` (a ``channels x values`` array). ``qir.tools.reports.channelwise``
draws the box plots (one box per channel), summarizes the outlier channels in
``channelwise.txt`` and writes ``channelwise.json`` (schema ``qir.channelwise`` v1); hmct's
``get_channelwise_data_distribution`` lives in ``qir.tools.compat.hmct``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from qir.calibration import max_threshold
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.passes.base import AnalysisPass, Report, register_pass
from qir.passes.lib.capture import PlotResult, clipped_fraction, collect
from qir.records import CalibRecord

__all__ = ["ChannelwisePass", "ChannelwiseReport", "ChannelStats"]


@dataclass
class ChannelStats(Report):
    """One calibration node's input by channel: the ``axis``, how many ``channels``, each
    channel's max |x| (``channel_abs_max``) and their median, the ``outlier_channels`` (max |x|
    above the ratio times the median), the node's ``threshold`` (activations) and the share of
    values beyond it (``clipped_fraction``); ``png``, the box plot, once a writer drew it."""

    axis: int
    channels: int
    channel_abs_max: list[float]
    median_abs_max: float
    outlier_channels: list[int]
    threshold: float | None
    clipped_fraction: float | None
    png: str | None = None

    optional = ("png",)


@dataclass
class ChannelwiseReport(Report):
    """``nodes``: each node's :class:`ChannelStats`; ``outlier_ratio``: the ratio to the median
    beyond which a channel is an outlier (the written report, ``channelwise.json``, has the
    nodes only)."""

    nodes: dict[str, ChannelStats]
    outlier_ratio: float | None = None

    optional = ("outlier_ratio",)

logger = logging.getLogger(__name__)


@register_pass
class ChannelwisePass(AnalysisPass):
    """Per-channel statistics and outlier channels (see the module docstring); returns a ``PlotResult``."""

    name = "channelwise"

    def __init__(self, data: Any = None, nodes_list: list[str] | str | None = None, *, axis: int | None = None,
                 data_num: int | None = 1, outlier_ratio: float = 4.0, runtime: str = Runtime.ORT) -> None:
        if data is None:
            raise InputError("channelwise needs calibration data (a folder, .npz, .npy or samples)")
        nodes = [nodes_list] if isinstance(nodes_list, str) else list(nodes_list or [])
        if not nodes:
            raise InputError("nodes_list is required: name calibration nodes")
        self.data, self.nodes, self.axis = data, nodes, axis
        self.data_num, self.ratio, self.runtime = data_num, float(outlier_ratio), runtime
        self.options = {"nodes_list": nodes, "axis": axis, "data_num": data_num}

    def check(self, ir: QIR) -> list[CalibRecord]:
        """The chosen calibration nodes; one clear error for an unknown name or an axis out of
        the range of a known input rank (before any work: ``runall`` calls it up front)."""
        cals: list[CalibRecord] = []
        for n in self.nodes:
            if not ir.has_node(n) or not isinstance(ir.node(n), CalibRecord):
                raise NotFoundError(did_you_mean(n, [c.name for c in ir.calibrations()], "calibration node"))
            cals.append(ir.node(n))
        for cal in cals:
            shape = ir.value(cal.input).shape
            if self.axis is not None and shape is not None and not -len(shape) <= self.axis < len(shape):
                raise InputError(f"axis {self.axis} is out of range for {cal.name!r}, whose input has shape "
                                 f"{list(shape)}")
        return cals

    def run(self, ir: QIR) -> PlotResult:
        cals = self.check(ir)
        acts = [c for c in cals if ir.value(c.input).kind is not NodeKind.WEIGHT]
        captured = collect(ir, self.data, list(dict.fromkeys(c.input for c in acts)), quantized=True,
                           data_num=self.data_num, runtime=self.runtime) if acts else {}
        report = ChannelwiseReport({}, self.ratio)
        arrays: dict[str, dict[str, np.ndarray]] = {}
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
            arrays[cal.name] = {"channels": channels}
            report.nodes[cal.name] = ChannelStats(int(axis), int(channels.shape[0]), [float(p) for p in peaks], ref,
                                                  outliers, threshold, clipped_fraction(x, threshold))
        return PlotResult(ir, False, report, arrays)
