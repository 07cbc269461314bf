"""``calibrate``: choose every calibration node's threshold from calibration data."""
from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np

from qir.calibration import QRANGE
from qir.data import model_samples
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.calibrate.observers import AbsHistogram, AbsMaxObserver, channel_abs_max
from qir.passes.calibrate.range_propagation import derivations, derive
from qir.passes.calibrate.thresholds import compute_threshold
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.numerics import fake_quant
from qir.runtimes.numpy_ref.registry import lookup
from qir.runtimes.progress import track

__all__ = ["CalibratePass", "METHODS"]

logger = logging.getLogger(__name__)

METHODS = ("max", "percentile", "kl", "mse", "mix")
MIX_CANDIDATES = ("max", "percentile", "kl", "mse")
TINY = np.float32(1e-8)  # threshold of an all-zero tensor (anything positive quantizes 0 to 0)


@register_pass
class CalibratePass(Pass):
    """Set thresholds: per-channel max |W| for weights, a statistic of the data for activations.

    Rules:

    1. Weights: ``threshold = max |W|`` per output channel (per tensor without an axis).
    2. Activations: the model runs in float (every calibration node passes through) on each
       sample; each calibration node's input feeds a streaming |x| histogram (bounded memory,
       no stored tensors); ``method`` turns it into a threshold: ``max``, ``percentile``
       (``percentile`` option), ``kl`` (TensorRT entropy), ``mse`` (least quantization MSE).
       ``max`` on onnxruntime reduces each tensor to its min and max inside the graph, and
       only for values whose range does not follow from another observed one
       (:mod:`.range_propagation`).
       ``mix`` computes all four and keeps, per node, the one whose quantization of that
       node alone gives the smallest error at the outputs of the ops it feeds (measured on
       the first ``mix_samples`` samples with the numpy kernels).
    3. ``fixed`` thresholds are never changed; an all-zero tensor gets a tiny positive
       threshold; NaN/Inf values are ignored and counted in the report.
    4. qmax for the statistics follows the node's mode (int16 → 32767, else 127).
    5. ``ir.meta["calibration"]`` records the method and the number of samples (saved with the
       model, so reports can state how it was calibrated).
    """

    name = "calibrate"

    def __init__(self, data: Any = None, method: str = "max", *, percentile: float = 99.99,
                 num_bins: int = 2048, runtime: str = Runtime.ORT, limit: int | None = None,
                 mix_samples: int = 2, progress: bool = True) -> None:
        if method not in METHODS:
            raise InputError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")
        if data is None:
            raise InputError("calibrate needs calibration data (a folder, .npz, .npy or samples)")
        if not 0 < float(percentile) <= 100:
            raise InputError(f"percentile must be in (0, 100], got {percentile}")
        self.data, self.method, self.percentile = data, method, float(percentile)
        self.num_bins, self.runtime, self.limit = int(num_bins), runtime, limit
        self.mix_samples, self.progress = int(mix_samples), progress
        self.options = {"method": method, "percentile": self.percentile, "num_bins": self.num_bins,
                        "runtime": runtime}

    # ------------------------------------------------------------------ run
    def run(self, ir: QIR) -> PassResult:
        start = time.perf_counter()
        weights = self._calibrate_weights(ir)
        targets = [c for c in ir.calibrations(CalibRole.ACTIVATION) if not c.fixed]
        samples = self._samples(ir)
        histograms = self._collect(ir, targets, samples)
        chosen: dict[str, str] = {}
        candidates = {c.name: self._candidates(c, histograms[c.input]) for c in targets}
        if self.method == "mix":
            chosen = self._mix(ir, targets, candidates, samples)
        for cal in targets:
            method = chosen.get(cal.name, self.method)
            ir.set_calibration(cal.name, threshold=np.float32(candidates[cal.name][method]))
            h = histograms[cal.input]
            cal.meta["calibration"] = {"method": method, "abs_max": float(h.abs_max),
                                       "candidates": {k: float(v) for k, v in candidates[cal.name].items()}}
            cal.meta["histogram"] = h
        nonfinite = {c.input: int(histograms[c.input].nan_count + histograms[c.input].inf_count)
                     for c in targets if histograms[c.input].nan_count + histograms[c.input].inf_count}
        ir.meta["calibration"] = {"method": self.method, "samples": len(samples),  # kept in the saved model
                                  **({"percentile": self.percentile} if self.method == "percentile" else {})}
        report = {"method": self.method, "samples": len(samples), "weights": weights,
                  "activations": len(targets), "seconds": round(time.perf_counter() - start, 3),
                  "nonfinite_values": nonfinite}
        if chosen:
            report["mix_choices"] = {m: sum(1 for v in chosen.values() if v == m) for m in MIX_CANDIDATES}
        if nonfinite:
            logger.warning("NaN/Inf values ignored while calibrating %d tensor(s): %s",
                           len(nonfinite), ", ".join(list(nonfinite)[:5]))
        return PassResult(ir, bool(weights or targets), report)

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _calibrate_weights(ir: QIR) -> int:
        count = 0
        for cal in ir.calibrations(CalibRole.WEIGHT):
            if cal.fixed:
                continue
            w = ir.weight_array(cal.input)
            th = channel_abs_max(w, cal.axis) if cal.axis is not None else np.float32(np.abs(w).max())
            ir.set_calibration(cal.name, threshold=np.maximum(np.asarray(th, np.float32), TINY))
            count += 1
        return count

    def _samples(self, ir: QIR):
        return model_samples(ir, self.data, self.limit)

    def _collect(self, ir: QIR, targets: list[CalibRecord], samples) -> dict[str, AbsHistogram]:
        values = list(dict.fromkeys(c.input for c in targets))
        fast_max = self.method == "max" and self.runtime == Runtime.ORT
        hists = {v: (AbsMaxObserver() if fast_max else AbsHistogram(self.num_bins)) for v in values}
        if not values:
            return hists
        rt = get_runtime(self.runtime, level="float")
        rules = derivations(ir, values) if fast_max else {}
        observed = [v for v in values if v not in rules]  # the rest follow from these exactly
        for i, sample in enumerate(track(samples, f"calibrate ({self.method})", unit="samples",
                                         enabled=self.progress)):
            try:
                feed = check_feeds(ir, sample)
            except InputError as exc:
                raise InputError(f"calibration sample {i}: {exc}") from exc
            if fast_max:  # reduced inside onnxruntime; NaN/Inf fall back to the full tensor
                ranges = derive(rt.min_max(ir, feed, observed), rules)
                bad = [v for v in values if not (math.isfinite(ranges[v][0]) and math.isfinite(ranges[v][1]))]
                full = rt.run(ir, feed, capture=bad) if bad else {}
                for v in values:
                    if v in full:
                        hists[v].update(full[v])
                    else:
                        hists[v].update_range(*ranges[v])
                continue
            out = rt.run(ir, feed, capture=values)
            for v in values:
                hists[v].update(out[v])
        return hists

    def _candidates(self, cal: CalibRecord, h: AbsHistogram) -> dict[str, float]:
        qmax = QRANGE.get(cal.mode, QRANGE[CalibMode.INT8])[1]
        methods = MIX_CANDIDATES if self.method == "mix" else (self.method,)
        out = {}
        for m in methods:
            opts = {"percentile": self.percentile} if m == "percentile" else {}
            try:
                th = compute_threshold(h, m, qmax=qmax, **opts)
            except ValueError as exc:
                raise InputError(f"calibration node {cal.name!r}: {exc}") from exc
            out[m] = max(float(th), float(TINY))
        return out

    def _mix(self, ir: QIR, targets: list[CalibRecord], candidates: dict[str, dict[str, float]],
             samples) -> dict[str, str]:
        """Per node, the candidate threshold with the least error at its readers' outputs."""
        readers = {c.name: [r for r in ir.consumers(c.output) if isinstance(r, OpRecord)
                            and lookup(r.op_type, r.domain) is not None] for c in targets}
        needed = {v for rs in readers.values() for r in rs for v in (*r.inputs, *r.outputs) if v}
        needed |= {c.input for c in targets}
        needed = sorted(v for v in needed if ir.value(v).kind.value == "activation")
        rt = get_runtime(self.runtime, level="float")
        errors = {c.name: dict.fromkeys(candidates[c.name], 0.0) for c in targets}
        for sample in list(samples)[: max(1, self.mix_samples)]:
            env = rt.run(ir, check_feeds(ir, sample), capture=needed)
            for cal in targets:
                if not readers[cal.name]:
                    continue
                x = env[cal.input]
                qmin, qmax = QRANGE.get(cal.mode, QRANGE[CalibMode.INT8])
                for method, th in candidates[cal.name].items():
                    xq = fake_quant(x, np.float32(th) / np.float32(qmax), qmin, qmax, None)
                    errors[cal.name][method] += sum(_reader_error(ir, r, cal, xq, env) for r in readers[cal.name])
        return {name: (min(errs, key=errs.get) if any(errs.values()) else "mse") for name, errs in errors.items()}


def _reader_error(ir: QIR, op: OpRecord, cal: CalibRecord, xq: np.ndarray, env: dict) -> float:
    """MSE at ``op``'s first output when the calibrated input reads ``xq`` (others float)."""
    spec = lookup(op.op_type, op.domain)
    args = [None if not v else xq if v == cal.output
            else ir.weight_array(v) if ir.value(v).kind.value == "weight" else env[v]
            for v in op.inputs]
    kwargs = dict(op.attrs)
    if "_opset" in spec.context:
        kwargs["_opset"] = ir.opset
    if "_num_outputs" in spec.context:
        kwargs["_num_outputs"] = len(op.outputs)
    out = spec.fn(*args, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    ref = env[op.outputs[0]]
    return float(np.mean((np.asarray(out, np.float64) - ref) ** 2))

