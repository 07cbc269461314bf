"""``distribution``: data distributions at chosen nodes (hmct ``plot_distribution``).

Per node in ``nodes_list``, one PNG:

- a **weight calibration node**: the original weights and the calibrated (fake-quantized)
  weights, overlaid;
- an **activation calibration node**: the values entering it in the calibrated model, with the
  threshold (red dashed line, the largest threshold for per-channel nodes), max |x| (blue
  triangle) and the share of values beyond the threshold (clipped) in the title;
- a **general node**: its first output in the float and in the calibrated model, overlaid, and
  next to it the error (calibrated − float).

Counts are on a log scale (quantization effects live in the tails). Values are gathered over
the first ``data_num`` samples. The report gives, per node, the statistics drawn; it is also
written as ``distribution.json`` (schema ``qir.distribution`` v1).
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
from qir.runtimes.numerics import apply_calibration

__all__ = ["DistributionPass", "plot_distribution"]

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
    """Distribution plots (see the module docstring); ``save_dir`` receives ``<node>.png``."""

    name = "distribution"

    def __init__(self, data: Any = None, nodes_list: list[str] | str | None = None, save_dir: str = "./debug_result/",
                 data_num: int | None = 1, runtime: str = "ort") -> None:
        if data is None:
            raise InputError("distribution needs calibration data (a folder, .npz, .npy or samples)")
        nodes = [nodes_list] if isinstance(nodes_list, str) else list(nodes_list or [])
        if not nodes:
            raise InputError("nodes_list is required: name calibration nodes and/or general nodes")
        self.data, self.nodes, self.save_dir = data, nodes, Path(save_dir)
        self.data_num, self.runtime = data_num, runtime
        self.options = {"nodes_list": nodes, "data_num": data_num}

    def run(self, ir: QIR) -> PassResult:
        names = [r.name for r in ir.runnables()]
        for n in self.nodes:
            if not ir.has_node(n):
                raise NotFoundError(did_you_mean(n, names, "node"))
        recs = [ir.node(n) for n in self.nodes]
        acts = [r.input for r in recs if isinstance(r, CalibRecord) and ir.value(r.input).kind is not NodeKind.WEIGHT]
        outs = [r.outputs[0] for r in recs if not isinstance(r, CalibRecord)]
        quant = {v: _flat(a) for v, a in collect(ir, self.data, acts + outs, quantized=True, data_num=self.data_num,
                                                  runtime=self.runtime).items()} if acts or outs else {}
        flt = {v: _flat(a) for v, a in collect(ir, self.data, outs, quantized=False, data_num=self.data_num,
                                                runtime=self.runtime).items()} if outs else {}
        self.save_dir.mkdir(parents=True, exist_ok=True)
        report = {"nodes": {}}
        for rec in recs:
            path = self.save_dir / f"{safe_filename(rec.name)}.png"
            if isinstance(rec, CalibRecord) and ir.value(rec.input).kind is NodeKind.WEIGHT:
                w = np.asarray(ir.weight_array(rec.input))
                q = apply_calibration(rec, w)
                entry = {"type": "weight", "original": _stats(w.ravel()), "calibrated": _stats(np.ravel(q)),
                         "threshold": max_threshold(rec)}
                _plot_overlay(path, rec.name, {"original": w.ravel(), "calibrated": np.ravel(q)},
                              entry["threshold"], "weight value")
            elif isinstance(rec, CalibRecord):
                x = quant[rec.input]
                th = max_threshold(rec)
                entry = {"type": "activation", "input": _stats(x), "threshold": th,
                         "clipped_fraction": clipped_fraction(x, th)}
                title = rec.name if th is None else f"{rec.name}: {100 * entry['clipped_fraction']:.3g}% clipped"
                _plot_overlay(path, title, {f"input of {rec.name} (calibrated model)": x}, th, "activation value")
            else:
                f, q = flt[rec.outputs[0]], quant[rec.outputs[0]]
                entry = {"type": "node", "float": _stats(f), "calibrated": _stats(q), "error": _stats(q - f)}
                _plot_node(path, rec.name, f, q)
            entry["png"] = str(path)
            report["nodes"][rec.name] = entry
        write_json(self.save_dir / "distribution.json", "qir.distribution", report)
        return PassResult(ir, False, report)


def _plot_overlay(path: Path, title: str, series: dict[str, np.ndarray], threshold: float | None, xlabel: str,
                  ax=None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(8, 4.5))
    finite = {k: v[np.isfinite(v)] for k, v in series.items()}
    lo = min((v.min() for v in finite.values() if v.size), default=0.0)
    hi = max((v.max() for v in finite.values() if v.size), default=1.0)
    if threshold is not None:
        lo, hi = min(lo, -threshold), max(hi, threshold)
    bins = np.linspace(lo, hi if hi > lo else lo + 1, 201)
    for label, v in finite.items():
        ax.hist(v, bins=bins, histtype="step" if len(finite) > 1 else "stepfilled", alpha=0.8, label=label, log=True)
    amax = max((float(np.abs(v).max()) for v in finite.values() if v.size), default=0.0)
    ymax = ax.get_ylim()[1]
    ax.plot([amax], [ymax * 0.5], marker="v", color="tab:blue", linestyle="none", markersize=9,
            label=f"max |x| = {amax:.4g}")
    if threshold is not None:
        for t in (-threshold, threshold):
            ax.axvline(t, color="red", linestyle="--", linewidth=1)
        ax.plot([], [], color="red", linestyle="--", label=f"threshold = {threshold:.4g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count (log)")
    ax.set_title(title)
    ax.legend(fontsize="small")
    ax.grid(True, alpha=0.3)
    if own:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _plot_node(path: Path, name: str, f: np.ndarray, q: np.ndarray) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
    _plot_overlay(path, f"output of {name}", {"float model": f, "calibrated model": q}, None, "output value", ax=a)
    err = (q - f)
    _plot_overlay(path, "error (calibrated − float)", {"error": err}, None, "error", ax=b)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_distribution(save_dir, model_or_file, calibrated_data, nodes_list, *, data_num: int | None = 1,
                      runtime: str = "ort") -> dict:
    """hmct's ``plot_distribution``: one PNG per node in ``save_dir``; returns the statistics."""
    ir = as_ir(model_or_file)
    return DistributionPass(calibrated_data, nodes_list, save_dir, data_num, runtime)(ir).report["nodes"]
