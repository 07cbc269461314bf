"""``smooth``: SmoothQuant-style migration of activation outliers into the weights of the GEMMs
that read them (Xiao et al. 2023), per site, with alpha chosen on calibration data."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qir.data import model_samples
from qir.errors import InputError
from qir.execution import DEFAULT_MARCH, Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.fusion import inside_fusion
from qir.passes.lib.repair import (
    RepairReport,
    Site,
    Skipped,
    all_int8_error,
    check_repair_options,
    finished,
    float_captures,
    note_change,
    quantize_int8,
)
from qir.passes.lib.rescale import (
    apply_edits,
    channel_axis,
    divide_channels,
    divided_values,
    input_channel_absmax,
    multiply_input_channels,
    power_of_two,
)
from qir.records import OpRecord

__all__ = ["SmoothPass", "ALPHAS"]

logger = logging.getLogger(__name__)

ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
S_BOUNDS = (1e-4, 1e4)  # factors are clipped here: a dead channel must not blow a weight up


@dataclass
class _Site:
    value: str
    axis: int
    consumers: list[OpRecord]
    #: values 1/s divides on its way up that the march quantizes on their own (rule 4)
    between: list[str] = field(default_factory=list)


@register_pass
class SmoothPass(Pass):
    """Move per-channel range from an activation into the weights of the GEMMs that read it.

    Runs on a **float** IR, before ``insert-calibration`` (after ``fold-bn`` and ``fuse``): it
    changes weights, which calibration then measures. A calibrated IR is refused.

    Rules:

    1. A site is an activation X read only by GEMMs with a constant weight (MatMul with a 2-D
       weight, Gemm without transA, Conv 1×1 of group 1) at their input 0 (Shape readers aside),
       all on the same channel axis j (the last for MatMul/Gemm, 1 for Conv).
    2. Per channel, ``s_j = max|X_j|^α / max|W_j|^(1-α)`` (clipped to [1e-4, 1e4]; 1 where a
       range is 0), with max|X_j| streamed over the calibration data and max|W_j| over every
       reader's weight entries that read channel j; then rounded to the nearest power of two,
       so that dividing and multiplying by it are exact in binary floating point.
    3. X becomes X / s in the ops that produce it, exactly (:mod:`qir.passes.lib.rescale`: a
       LayerNormalization's or a decomposed LayerNorm's final Mul/Add constants, BatchNorm, a
       preceding Conv/Gemm/MatMul's output channels, a layer-scale Mul, through Relu-like ops);
       each reader's weight rows j are multiplied by s_j. ``X W = (X / s)(s W)``, and with s a
       power of two every changed constant and product is exact: the float model computes the
       same numbers (unless a value under- or overflows).
    4. α per site: each α of ``alphas`` and "no smoothing" are scored by the int8 error at the
       readers' outputs on the calibration data (``max_rows`` rows of X in all, taken evenly
       from every sample in the same pass that streams the maxima),
       ``Σ_readers MSE(Q(X/s) Q(sW), X W) / mean((X W)²)``
       with Q per-tensor int8 for X (max threshold) and per-output-channel int8 for W (how the
       march quantizes them); the least wins, and a site where no α beats "none" is skipped.
       The division also reaches the values between X and the constants that absorb it (a
       Gemm's output before its PRelu, a decomposed LayerNorm's ``x̂·γ`` before ``+ β``); each
       one the march quantizes on its own (not inside a fusion group, ``fuse``) adds its own
       per-tensor int8 error, carried to the readers as an error of X at the same rows,
       ``Σ_readers MSE((Q(P/s)·s - P) W) / mean((X W)²)``: the channels X loses range in may be
       those P gains range in (a PRelu squashes P's negative side). On MTCNN's ONet, scoring X
       alone smoothed such a site and took all-int8 from 0.9989 to 0.601.
    5. A site whose producer cannot absorb 1/s exactly, or whose X is read by anything else, is
       skipped with the reason in the report.
    6. Changed ops carry the site's note (:func:`qir.passes.lib.repair.note_change`); with
       ``measure`` the report holds the all-int8 (max calibration, ``march``) error before and after.
    """

    name = "smooth"

    def __init__(self, data: Any = None, alphas: tuple[float, ...] | list[float] = ALPHAS, *,
                 march: str = DEFAULT_MARCH, runtime: str = Runtime.ORT, limit: int | None = None,
                 measure: bool = True, max_rows: int = 4096) -> None:
        check_repair_options(self.name, data, "activation ranges")
        self.alphas = tuple(float(a) for a in alphas)
        if not self.alphas or not all(0.0 <= a <= 1.0 for a in self.alphas):
            raise InputError(f"smooth: alphas must be numbers in [0, 1], got {alphas!r}")
        self.data, self.march, self.runtime, self.limit = data, march, runtime, limit
        self.measure, self.max_rows = bool(measure), int(max_rows)
        self.options = {"alphas": list(self.alphas), "march": march, "runtime": runtime}
        self.report: RepairReport | None = None

    def run(self, ir: QIR) -> PassResult:
        if ir.calibrations():
            raise InputError("smooth runs on a float model, before insert-calibration (it changes weights that "
                             "calibration measures); put it earlier in the pipeline")
        report = RepairReport(self.name)
        sites = self._sites(ir, report.skipped)
        if sites and self.measure:
            report.before = self._error(ir)
        xmax, rows = self._collect(ir, sites)
        wmax = {s.value: np.max([input_channel_absmax(ir, op) for op in s.consumers], axis=0) for s in sites}
        errors = self._alpha_errors(ir, sites, xmax, wmax, rows)
        for site in sites:
            self._apply(ir, site, xmax[site.value], wmax[site.value], errors[site.value], report)
        self.report = report
        return finished(ir, report, (lambda: self._error(ir)) if self.measure else None, "site(s) changed")

    def _error(self, ir: QIR):
        return all_int8_error(ir, self.data, march=self.march, runtime=self.runtime, limit=self.limit)

    # ------------------------------------------------------------------ sites
    @staticmethod
    def _sites(ir: QIR, skipped: list[Skipped]) -> list[_Site]:
        sites = []
        for value in ir.activations():
            readers = [(r, slot) for r, slot in ir.uses(value.name)
                       if not (isinstance(r, OpRecord) and r.op_type == "Shape")]
            gemms = [r for r, slot in readers if slot == 0 and isinstance(r, OpRecord) and _smoothable(ir, r)]
            if not gemms:
                continue
            others = [r for r, slot in readers if r not in gemms]
            if others or value.name in ir.outputs:
                what = f"{others[0].op_type} {others[0].name!r}" if others else "the graph output"
                skipped.append(Skipped(value.name, f"also read by {what}"))
                continue
            axes = {channel_axis(ir, op) for op in gemms}
            channels = {len(input_channel_absmax(ir, op)) for op in gemms}
            if len(axes) != 1 or len(channels) != 1:
                skipped.append(Skipped(value.name, "its readers disagree on the channel axis"))
                continue
            axis = axes.pop()
            path = divided_values(ir, value.name, axis, channels.pop())
            if isinstance(path, str):
                skipped.append(Skipped(value.name, path))
                continue
            between = [v for v in path[1:] if not inside_fusion(ir, v)]  # (rule 4: quantized there too)
            other = next((v for v in between if ir.value(v).shape != value.shape), None)
            if other is not None:
                skipped.append(Skipped(value.name, f"1/s would also divide {other!r}, of another shape, which "
                                                   "the march quantizes on its own"))
                continue
            sites.append(_Site(value.name, axis, gemms, between))
        return sites

    def _collect(self, ir: QIR, sites: list[_Site]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """One float pass over the data: per site, max |X_j| per channel (every value seen) and a
        bounded set of X's rows for the α search (``max_rows`` in all, evenly from each sample)."""
        xmax: dict[str, np.ndarray] = {}
        values = {v: s.axis for s in sites for v in (s.value, *s.between)}  # (X and the values between, rule 4)
        rows: dict[str, list[np.ndarray]] = {v: [] for v in values}
        if not sites:
            return xmax, {}
        count = len(model_samples(ir, self.data, self.limit))
        per_sample = max(1, self.max_rows // count)
        for got in float_captures(ir, self.data, list(values), runtime=self.runtime, limit=self.limit):
            for v, axis in values.items():
                x = np.moveaxis(np.asarray(got[v], np.float32), axis, -1)
                x = x.reshape(-1, x.shape[-1])
                m = np.abs(x).max(axis=0).astype(np.float64)
                xmax[v] = m if v not in xmax else np.maximum(xmax[v], m)
                rows[v].append(x[:: max(1, len(x) // per_sample)][:per_sample])
        return xmax, {v: np.concatenate(r) for v, r in rows.items()}

    def _alpha_errors(self, ir: QIR, sites: list[_Site], xmax, wmax, rows) -> dict[str, dict[float | None, float]]:
        """Per site, the int8 error at its readers' outputs for no smoothing (key None) and each α."""
        errors = {}
        for s in sites:
            matrices = [_matrix(ir, op) for op in s.consumers]
            errors[s.value] = {}
            for alpha in (None, *self.alphas):
                f = _factors(xmax[s.value], wmax[s.value], alpha)
                errors[s.value][alpha] = _site_error(rows[s.value], matrices, f, float(np.max(xmax[s.value] / f))) + sum(
                    _between_error(rows[v], rows[s.value], matrices, f, float(np.max(xmax[v] / f))) for v in s.between)
        return errors

    def _apply(self, ir: QIR, site: _Site, xmax, wmax, errors: dict, report: RepairReport) -> None:
        best = min(errors, key=lambda a: (errors[a], a is not None))
        if best is None:
            report.skipped.append(Skipped(site.value, "no alpha of the grid lowers the int8 error at its GEMMs"))
            return
        s = _factors(xmax, wmax, best)
        edits = divide_channels(ir, site.value, site.axis, s)
        if isinstance(edits, str):  # an earlier site changed what produces this one
            report.skipped.append(Skipped(site.value, edits))
            return
        edits += [multiply_input_channels(ir, op, s) for op in site.consumers]
        apply_edits(ir, edits)
        base = errors[None]
        detail = {"alpha": best, "relative_error_before": round(base, 8), "relative_error_after": round(errors[best], 8),
                  "s_min": float(s.min()), "s_max": float(s.max()),
                  "activation_range_ratio": float(xmax.max() / max(np.median(xmax), 1e-12))}
        for name in dict.fromkeys(e.op for e in edits):
            note_change(ir, ir.op(name), self.name, {"site": site.value, **detail})
        report.changed.append(Site(site.value, list(dict.fromkeys(e.op for e in edits)), detail))


def _smoothable(ir: QIR, op: OpRecord) -> bool:
    """A GEMM whose 2-D weight smoothing can scale and whose error :func:`_site_error` models."""
    if channel_axis(ir, op) is None or ir.value(op.inputs[1]).kind is not NodeKind.WEIGHT:
        return False
    if op.op_type == "Conv":
        w = ir.weight_array(op.inputs[1])
        return int(op.attrs.get("group", 1)) == 1 and w.ndim == 4 and w.shape[2:] == (1, 1)
    return op.op_type in ("MatMul", "Gemm")


def _matrix(ir: QIR, op: OpRecord) -> np.ndarray:
    """The reader's weight as a (input channels × outputs) matrix."""
    w = np.asarray(ir.weight_array(op.inputs[1]), np.float32)
    if op.op_type == "Conv":
        return w[:, :, 0, 0].T
    if op.op_type == "Gemm":
        w = w * np.float32(op.attrs.get("alpha", 1.0))
        return w.T if op.attrs.get("transB", 0) else w
    return w


def _factors(xmax: np.ndarray, wmax: np.ndarray, alpha: float | None) -> np.ndarray:
    """Rule 2's factors, each rounded to the nearest power of two (module docstring)."""
    if alpha is None:
        return np.ones_like(xmax)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.power(xmax, alpha) / np.power(wmax, 1.0 - alpha)
    s = np.where(np.isfinite(s) & (xmax > 0) & (wmax > 0), s, 1.0)
    return power_of_two(np.clip(s, *S_BOUNDS))


def _site_error(x: np.ndarray, matrices: list[np.ndarray], s: np.ndarray, threshold: float) -> float:
    xq = quantize_int8(x / s.astype(np.float32), threshold=threshold)
    total = 0.0
    for w in matrices:
        ref = x @ w
        wq = quantize_int8(w * s[:, None].astype(np.float32), axis=1)
        total += float(np.mean((xq @ wq - ref) ** 2) / max(float(np.mean(ref ** 2)), 1e-30))
    return total


def _between_error(p: np.ndarray, x: np.ndarray, matrices: list[np.ndarray], s: np.ndarray, threshold: float) -> float:
    """A value between X and its absorbing constants, divided by ``s`` and quantized per tensor
    (max ``threshold``): its error carried to the readers' outputs as an error of X at the same
    rows (a homogeneous op passes it on at most unchanged), relative to their power (rule 4)."""
    f = s.astype(np.float32)
    dp = quantize_int8(p / f, threshold=threshold) * f - p
    total = 0.0
    for w in matrices:
        total += float(np.mean((dp @ w) ** 2) / max(float(np.mean((x @ w) ** 2)), 1e-30))
    return total
