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
import re
from pathlib import Path
from typing import Any

import numpy as np

from qir.errors import InputError, NotFoundError, did_you_mean
from qir.api import as_ir
from qir.graph import QIR
from qir.json_dump import write_json
from qir.kinds import NodeKind
from qir.records import CalibRecord

from ..engine import configured_clone
from ..runtimes.base import get_runtime
from ..runtimes.numerics import apply_calibration, max_threshold
from .base import AnalysisPass, PassResult, register_pass

__all__ = ["DistributionPass", "plot_distribution", "collect", "safe_filename", "clipped_fraction"]

logger = logging.getLogger(__name__)


def safe_filename(name: str) -> str:
    """A node name as a file name (path separators and odd characters become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "node"


def collect(ir: QIR, data: Any, values: list[str], *, quantized: bool, data_num: int | None,
            runtime: str = "ort") -> dict[str, list[np.ndarray]]:
    """``values`` on each of the first ``data_num`` samples (one model run per sample), in the
    calibrated model (``quantized``) or the float one."""
    from qir.data import model_samples

    model = ir if quantized else configured_clone(ir, "float", {})
    rt = get_runtime(runtime, level="fakequant")
    parts: dict[str, list[np.ndarray]] = {v: [] for v in values}
    for sample in model_samples(ir, data, data_num):
        got = rt.run(model, sample, capture=values)
        for v in values:
            parts[v].append(np.asarray(got[v]))
    return parts


def _flat(arrays: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a, np.float64).ravel() for a in arrays])


def clipped_fraction(x: np.ndarray, threshold: float | None) -> float | None:
    """Share of the values beyond ±threshold (what the quantizer clips)."""
    if threshold is None or not x.size:
        return None
    return float(np.mean(np.abs(x) > threshold))


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
