"""Layer-by-layer comparison of two models on one input (horizon QuantAnalysis ``run`` and
``compare_per_layer``), with the abnormal-layer advisor and a split of every layer's error.

**Models.** As in :mod:`.bad_case`: ``baseline`` vs ``analysis``, each run as it is (a model
without calibration nodes runs in float); ``analysis=None`` compares the baseline model run in
float with the same model fake-quantized.

**run** (:func:`run_layers`): both models on the sample, keeping every graph input and every
general node's outputs (a node's quantized inputs are its calibration nodes applied to those,
recomputed when needed, not stored). With ``store``, values spill to ``.npy`` files as they are
captured and are read memory-mapped, so memory stays bounded on large models.

**Files.** The pass returns the rows and findings and writes no report:
:mod:`qir.tools.reports.layer_compare` writes ``compare_per_layer_out.txt``/``.csv``/``.json``
(columns in its ``COLUMNS``), ``abnormal_layer_advisor.txt``/``.json``, and ``save_layers``
one ``.npy`` per value under ``baseline/`` and ``analysis/`` (no pickle) with ``layers.json``
(which file holds which value; each node's type, inputs and outputs).

**Rows** (:func:`compare_per_layer`): one per floating-point output of each general node of the
analysis model, in topological order, matched to the baseline's value of the same name
(through ``fold-bn``'s aliases), else to the same output of the baseline's node of the same
name (node and value names are stable across qir's passes, the QDQ importer and the PyTorch
importer; a quantizer may rename what a node writes).
Inside a fusion group only the last op's row is kept. Columns, with ``b`` the baseline value
and ``a`` the analysis value:

- ``Cosine, MSE, L1, KL, SQNR`` (dB) from :mod:`qir.metrics`; ``Atol`` = max |a − b|;
  ``Rtol`` = max |a − b| / |b| over elements with b ≠ 0 (the least ``rtol`` with which
  ``allclose(a, b, atol=0)`` would hold there);
- ``quant_dtype`` / ``qscale``: the mode and (largest) scale of the calibration node(s) reading
  the output in the analysis model (``float`` if none); ``max_qscale_diff`` = Atol / qscale,
  the largest error in units of the output's quantization step; ``max_atol_diff``: b and a at
  the element of the largest difference;
- min, max, mean, var of b and of a; the shape;
- ``ill_conditioned``: why Cosine and SQNR are noise against ``b`` on this sample (near zero or
  constant: :func:`qir.metrics.ill_conditioned`, with the range of a bounded activation's
  output), else None.

**Error split** (columns ``clip%``, ``round%``, ``inherited%``). For a node ``f`` whose inputs
pass through calibration nodes ``Q``, with ``x_b`` its inputs in the baseline and ``x_a`` in the
analysis model: ``s = f(Q(x_b))`` (the shadow: the node's own quantization on the baseline's
inputs) and ``c = f(C(x_b))`` with ``C`` the quantizers' clipping without rounding
(:func:`qir.runtimes.numerics.clip_only`). Then ``a − b = (c − b) + (s − c) + (a − s)``:
clipping, rounding and the error inherited from the inputs. Each share is that term's mean
square over the sum of the three (the terms are nearly uncorrelated; the shares are a guide,
not an exact decomposition). A node with no quantized input has only inherited error; one
whose shadow cannot be computed (an input the baseline lacks, an op without a numpy kernel)
has empty shares. The split reads best against a float baseline; against a quantized one,
``b`` carries the baseline's own quantization and ``c`` is always computed.

**Advisor** (:func:`advise`), per layer of the analysis model:

- ``nan/inf``: non-finite values in either model;
- ``scale does not cover data``: an integer calibration node whose input, in the baseline, goes
  beyond the quantizer's range by more than one step (clipping); the count, the fixed threshold
  (``max |x|``) that would cover it, and the clipping SQNR (input power over the power clipped
  away). Nodes whose clipping SQNR is 40 dB or more are listed together on one
  ``minor clipping`` line;
- ``range too large for dtype``: an integer calibration node where half or more of the non-zero
  baseline values are smaller than one step (their channel's step; they round to 0 or ±1
  code): int16 next (int16 too: keep it in float);
- ``asymmetric input``: a model input quantized symmetrically (no zero point) whose range is
  one-sided or off-centre (``|max + min| > 0.5 (max − min)``): half the codes are unused;
  normalize it around 0;
- ``output not high precision``: a model output quantized to an integer mode;
- ``own error: clipping / rounding``: the (up to 10) layers with the largest own error, RMS
  ``‖s − b‖ / ‖b‖`` of at least 0.1%, with the split and the fix (fixed scale / int16);
- ``ill-conditioned baseline``: one line for the layers whose baseline output is near zero or
  constant on the sample (:func:`qir.metrics.ill_conditioned`, the rule the engine and the
  bad-case search use; the row's ``ill_conditioned`` says why): Cosine, SQNR and the relative
  own error are noise there, so those layers are left out of the own-error ranking; MSE and L1
  still measure them. A warning names them too.

The remedies named here are hypotheses: ``qir compare`` (:func:`qir.tools.advice.measure_findings`)
measures each one on the sample before it suggests it, with a complete command.
"""
from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from qir import metrics as qmetrics
from qir.calibration import QRANGE, along_axis, calib_scale, calib_zero_point, representable_range
from qir.execution import Runtime
from qir.graph import QIR
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.passes.lib.fusion import unit_type
from qir.passes.lib.layer_run import LayerRun, _readers, _source, compared_ops, run_layers, shadow_outputs
from qir.records import CalibRecord, OpRecord
from qir.runtimes.numerics import clip_only
from qir.runtimes.progress import track

__all__ = ["LayerComparePass", "compare_per_layer", "advise"]

logger = logging.getLogger(__name__)

_METRICS = {"Cosine": "cosine-similarity", "MSE": "mse", "L1": "l1", "KL": "kl", "SQNR": "sqnr-db"}
TOP_OWN_ERRORS = 10
OWN_ERROR_MIN = 1e-3  # own error (RMS relative to the baseline) the advisor mentions: 0.1%
CLIP_SQNR_DB = 40.0  # clipping that costs less (signal / clipped-away power above this) is "minor"


def _stats(x: np.ndarray) -> tuple[float | None, ...]:
    f = x[np.isfinite(x)]
    if not f.size:
        return None, None, None, None
    return float(f.min()), float(f.max()), float(f.mean()), float(f.var())


def _mean_square(x: np.ndarray) -> float:
    x = np.asarray(x, np.float64)
    x = x[np.isfinite(x)]
    return float(np.mean(x * x)) if x.size else 0.0


def compare_per_layer(run: LayerRun, prefixes: Iterable[str] = (), types: Iterable[str] = ()) -> list[dict]:
    """The rows (see the module docstring); ``prefixes`` (name or module-path prefixes or globs)
    and ``types`` (op types) restrict them. Rows whose baseline value is ill-conditioned are
    named in one warning."""
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf layers are reported, not warned about
        rows = _rows(run, prefixes, types)
    ill = [r["mod_name"] for r in rows if r["ill_conditioned"]]
    if ill:
        logger.warning("%d layer(s) have a near-zero or constant baseline output on this sample (%s): their Cosine and "
                       "SQNR measure noise; read MSE or L1 for them", len(ill), ", ".join(ill[:5])
                       + (", ..." if len(ill) > 5 else ""))
    return rows


def _rows(run: LayerRun, prefixes: Iterable[str], types: Iterable[str]) -> list[dict]:
    ir, base_ir = run.analysis, run.baseline
    ops = compared_ops(ir, prefixes, types)
    shadows = shadow_outputs(run, ops)
    rows = []
    for op in track(ops, "layer comparison", unit="layers"):
        for k, value in enumerate(op.outputs):
            base_value = run.base_name(value)
            a, b = run.analy_values.get(value), run.base_values.get(base_value)
            if a is None or b is None or a.dtype.kind != "f" or b.shape != a.shape:
                continue
            base_op = base_ir.producer(base_value)
            cals = _readers(ir, value)
            ints = [c for c in cals if c.mode in QRANGE]
            qscale = max(float(np.max(calib_scale(c))) for c in ints) if ints else None
            row: dict[str, Any] = {"index": len(rows), "mod_name": op.name if k == 0 else f"{op.name}[{k}]",
                                   "module": op.module, "value": value,
                                   "base_op_type": unit_type(base_ir, base_op) if isinstance(base_op, OpRecord)
                                   else "-", "analy_op_type": unit_type(ir, op),
                                   "shape": list(a.shape),
                                   "quant_dtype": ",".join(sorted({c.mode.value for c in cals})) or "float",
                                   "qscale": qscale}
            values = qmetrics.compute(list(_METRICS.values()) + ["atol"], b, a)
            row.update({col: values[name] for col, name in _METRICS.items()}, Atol=values["atol"])
            row["ill_conditioned"] = qmetrics.ill_conditioned(b, qmetrics.output_bound(base_ir, base_value))
            row["collapsed"] = qmetrics.collapsed(b, a, qmetrics.output_bound(base_ir, base_value))
            diff = np.asarray(np.abs(a.astype(np.float64) - b))
            diff[~np.isfinite(diff)] = -1
            where = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.size else ()
            nz = (b != 0) & (diff >= 0)
            row["Rtol"] = float(np.max(diff[nz] / np.abs(b[nz].astype(np.float64)))) if nz.any() else 0.0
            row["max_atol_diff"] = (f"{float(b[where]):.6g}->{float(a[where]):.6g}@{list(map(int, where))}"
                                    if diff.size else None)
            row["max_qscale_diff"] = row["Atol"] / qscale if qscale else None
            for who, x in (("base", b), ("analy", a)):
                for stat, v in zip(("min", "max", "mean", "var"), _stats(x)):
                    row[f"{who}_model_{stat}"] = v
            row.update(_split(a, b, shadows, op.name, k))
            rows.append(row)
    return rows


COLLAPSE_COSINE = 0.9  # a layer whose cosine falls below this has lost its match with the baseline
COLLAPSE_OWN_ERROR = 0.05  # ... and its own quantization alone this much relative error: it did it


@dataclass(frozen=True)
class CollapseStart:
    """Where a collapsed output begins on the analysed sample (:func:`collapse_start`)."""

    layer: str  # the table row's name
    value: str
    index: int
    cosine: float
    own_error: float
    end: str  # the first collapsed row's name
    end_how: str  # how its value collapsed (:func:`qir.metrics.collapsed`)

    def describe(self) -> str:
        return (f"cosine {self.cosine:.4g}, own error {100 * self.own_error:.3g}%; destroyed at {self.end} "
                f"({self.end_how})")


def row_op(row_name: str) -> str:
    """The op a table row (or a finding's ``layer``) belongs to: rows are named after their op,
    ``name[k]`` for its k-th output."""
    return re.sub(r"\[\d+\]$", "", row_name)


def collapse_start(rows: list[dict]) -> CollapseStart | None:
    """Where a collapsed output begins: None when no row's analysis value collapsed where the
    baseline's did not (:func:`qir.metrics.collapsed`; NaN and Inf aside, which the advisor names
    as such); else the first row, up to the first collapsed one, whose cosine falls below
    :data:`COLLAPSE_COSINE` by an own error of at least :data:`COLLAPSE_OWN_ERROR` (the layer whose
    own quantization starts the damage), or the first collapsed row itself."""
    end = next((r for r in rows if r.get("collapsed") and not r["collapsed"].startswith("not finite")), None)
    if end is None:
        return None
    start = next((r for r in rows[: end["index"] + 1] if not r.get("ill_conditioned")
                  and _number(r.get("Cosine"), 1.0) < COLLAPSE_COSINE
                  and _number(r.get("own_error"), 0.0) >= COLLAPSE_OWN_ERROR), end)
    return CollapseStart(start["mod_name"], start["value"], start["index"], _number(start.get("Cosine"), math.nan),
                         _number(start.get("own_error"), 0.0), end["mod_name"], end["collapsed"])


def _number(x: Any, default: float) -> float:
    return default if x is None else float(x)


def _from_collapse(rows: list[dict], found: list[dict]) -> list[dict]:
    """With a collapse: a finding for the layer where it begins, first, then the findings at and
    after that layer, nearest first, then the rest (each group in the order it had)."""
    start = collapse_start(rows)
    if start is None:
        return found
    where = {r["mod_name"]: r["index"] for r in rows}
    head = {"kind": "collapse", "layer": start.layer, "value": start.value,
            "downstream": [r["mod_name"] for r in rows if r["index"] >= start.index],
            "detail": f"an output collapses on this sample: it is destroyed at {start.end} ({start.end_how}), and "
                      f"the damage begins here (cosine {start.cosine:.4g}, its own quantization alone "
                      f"{100 * start.own_error:.3g}% relative error); the findings at and after it come first"}

    def _distance(f: dict) -> tuple[int, int]:
        k = where.get(row_op(str(f.get("layer"))), where.get(str(f.get("layer"))))
        return (0, k - start.index) if k is not None and k >= start.index else (1, 0)

    return [head, *sorted(found, key=_distance)]


def _split(a: np.ndarray, b: np.ndarray, shadows: dict, name: str, k: int) -> dict[str, float | None]:
    unknown = {"clip%": None, "round%": None, "inherited%": None, "own_error": None}
    if name not in shadows:  # no quantized input: all of its error comes from upstream
        total = _mean_square(a.astype(np.float64) - b)
        return {"clip%": 0.0, "round%": 0.0, "inherited%": 100.0 if total else 0.0, "own_error": 0.0}
    shadow = shadows[name]
    if shadow is None or k >= len(shadow[0]):
        return unknown
    s = np.asarray(shadow[0][k], np.float64)
    c = b.astype(np.float64) if shadow[1] is None else np.asarray(shadow[1][k], np.float64)  # None: nothing clipped
    if s.shape != a.shape:
        return unknown
    terms = {"clip%": _mean_square(c - b), "round%": _mean_square(s - c), "inherited%": _mean_square(a - s)}
    total = sum(terms.values()) if _mean_square(a.astype(np.float64) - b) else 0.0  # equal outputs: no split
    out = {k2: (100.0 * v / total if total else 0.0) for k2, v in terms.items()}
    signal = _mean_square(b)
    out["own_error"] = math.sqrt(_mean_square(s - b) / signal) if signal else 0.0
    return out


def advise(run: LayerRun, rows: list[dict], top: int = TOP_OWN_ERRORS) -> list[dict]:
    """Findings ``{"kind", "layer", "detail", ...}`` (see the module docstring), worst kinds first."""
    ir = run.analysis
    found: list[dict] = []
    for op in ir.ops():  # every op, fused ones too: a Relu after a NaN may hide it
        for v in op.outputs:
            a, b = run.analy_values.get(v), run.base(v)
            counts = [0 if x is None or x.dtype.kind != "f" else int((~np.isfinite(x)).sum()) for x in (a, b)]
            if any(counts):
                found.append({"kind": "nan/inf", "layer": op.name, "value": v,
                              "detail": f"{counts[0]} non-finite values in the analysis model's {v!r}, "
                                        f"{counts[1]} in the baseline's"})
    for cal in ir.calibrations():
        if cal.mode not in QRANGE:
            continue
        x = _source(run, cal)
        if x is None:
            continue
        layer = _layer_of(ir, cal)
        found += _range_findings(cal, np.asarray(x, np.float64), layer)
        if cal.input in ir.inputs and calib_zero_point(cal) is None:  # a zero point already centres it
            f = np.asarray(x, np.float64)
            f = f[np.isfinite(f)]
            lo, hi = (float(f.min()), float(f.max())) if f.size else (0.0, 0.0)
            if hi > lo and abs(hi + lo) > 0.5 * (hi - lo):
                found.append({"kind": "asymmetric input", "layer": cal.input, "calibration": cal.name,
                              "detail": f"model input {cal.input!r} spans [{lo:.4g}, {hi:.4g}]: about half of the "
                                        f"{cal.mode.value} codes are never used; normalize it around 0 "
                                        f"(e.g. (x - {0.5 * (lo + hi):.4g}) / {0.5 * (hi - lo):.4g})"})
        if cal.output in ir.outputs:
            found.append({"kind": "output not high precision", "layer": cal.output, "calibration": cal.name,
                          "detail": f"model output {cal.output!r} is quantized to {cal.mode.value}; keep the last "
                                    "layer's output in float"})
    own = sorted((r for r in rows if (r.get("own_error") or 0.0) >= OWN_ERROR_MIN and not r.get("ill_conditioned")),
                 key=lambda r: -r["own_error"])[:top]
    for r in own:
        clip, rnd = r["clip%"] or 0.0, r["round%"] or 0.0
        cause = "clipping" if clip >= rnd else "rounding"
        fix = ("a fixed threshold covering the data range, or more calibration data" if cause == "clipping"
               else "int16 for its input calibration nodes")
        found.append({"kind": f"own error: {cause}", "layer": r["mod_name"], "own_error": r["own_error"],
                      "detail": f"its own quantization alone gives {100 * r['own_error']:.3g}% relative error; of "
                                f"the layer's error {clip:.0f}% is clipping, {rnd:.0f}% rounding, "
                                f"{r['inherited%'] or 0.0:.0f}% inherited; try {fix}"})
    order = {k: i for i, k in enumerate(("nan/inf", "scale does not cover data", "output not high precision",
                                         "range too large for dtype", "asymmetric input"))}
    found.sort(key=lambda f: (order.get(f["kind"], len(order)), f.get("clip_sqnr_db", 0.0)))
    ill = [r for r in rows if r.get("ill_conditioned")]
    if ill:  # one line for them all, last: what to read instead, not a fault of the model
        names = ", ".join(r["mod_name"] for r in ill[:5]) + (", ..." if len(ill) > 5 else "")
        found.append({"kind": "ill-conditioned baseline", "layer": f"{len(ill)} layers", "layers":
                      {r["mod_name"]: r["ill_conditioned"] for r in ill},
                      "detail": f"the baseline output is near zero or constant on this sample ({names}; e.g. "
                                f"{ill[0]['ill_conditioned']}): Cosine, SQNR and the relative own error measure noise "
                                "there, so these layers are not ranked by them; read MSE or L1, or compare on a "
                                "sample where the model responds"})
    found = _from_collapse(rows, found)
    minor = [f for f in found if f["kind"] == "minor clipping"]
    if minor:  # one line for them all: a few values past a max-calibrated range is normal on a new input
        found = [f for f in found if f["kind"] != "minor clipping"]
        names = ", ".join(f["calibration"] for f in minor[:5]) + (", ..." if len(minor) > 5 else "")
        found.append({"kind": "minor clipping", "layer": f"{len(minor)} calibration nodes", "nodes": minor,
                      "detail": f"clip a few values of this input, keeping the clipping noise at least "
                                f"{min(f['clip_sqnr_db'] for f in minor):.0f} dB below the signal (>= "
                                f"{CLIP_SQNR_DB:.0f} dB: harmless): {names}"})
    return found


def _layer_of(ir: QIR, cal: CalibRecord) -> str:
    producer = ir.producer(cal.input)
    return producer.name if producer is not None else cal.input


def _range_findings(cal: CalibRecord, x: np.ndarray, layer: str) -> list[dict]:
    qmax = QRANGE[cal.mode][1]
    scale = np.asarray(calib_scale(cal), np.float64)
    s = along_axis(scale, cal.axis, x.ndim)
    lo, hi = representable_range(cal, x.ndim)
    finite = np.isfinite(x)
    if not finite.any():
        return []
    out = []
    beyond = int(((x > hi + s) | (x < lo - s))[finite].sum())
    f = np.abs(x[finite])
    rng = f"[{float(np.min(lo)):.4g}, {float(np.max(hi)):.4g}]"
    if beyond:
        amax = float(f.max())
        lost = float(np.sum((x - clip_only(cal, x))[finite] ** 2))
        clip_sqnr = 10 * math.log10(float(np.sum(f * f)) / lost) if lost else math.inf
        out.append({"kind": "scale does not cover data" if clip_sqnr < CLIP_SQNR_DB else "minor clipping",
                    "layer": layer, "calibration": cal.name, "clipped": beyond, "clipped_fraction": beyond / f.size,
                    "clip_sqnr_db": clip_sqnr, "fixed_threshold": amax,
                    "detail": f"{beyond} values ({100 * beyond / f.size:.3g}%) of {cal.input!r} lie beyond the "
                              f"{cal.mode.value} range {rng} by more than one step (clipping costs "
                              f"{clip_sqnr:.1f} dB SQNR); a fixed threshold of {amax:.6g} (scale {amax / qmax:.6g}) "
                              "would cover them"})
    steps = np.broadcast_to(s, x.shape)[finite]  # each element's own step (per channel)
    nonzero = f > 0
    small = float(np.mean(f[nonzero] < steps[nonzero])) if nonzero.any() else 0.0
    if small >= 0.5:
        nxt = "int16" if cal.mode.value == "int8" else "float"
        out.append({"kind": "range too large for dtype", "layer": layer, "calibration": cal.name,
                    "below_one_step": small,
                    "detail": f"{100 * small:.0f}% of the non-zero values of {cal.input!r} are below one "
                              f"{cal.mode.value} step (step {float(np.max(scale)):.4g}, max |x| {float(f.max()):.4g}): "
                              f"they round to 0 or ±1 code; use {nxt}"})
    return out


@register_pass
class LayerComparePass(AnalysisPass):
    """``layer-compare``: the layer-by-layer table and the advisor's findings for the IR (the
    analysis model) against ``baseline`` (None: the IR run in float) on ``sample``. The report
    holds ``rows``, ``findings`` and the :class:`LayerRun` (``run``) they were computed from.
    ``store``: the folder the layers' values spill to (memory-mapped, see :func:`run_layers`);
    the report files are :mod:`qir.tools.reports.layer_compare`'s."""

    name = "layer-compare"

    def __init__(self, sample: Mapping[str, np.ndarray], baseline: Any = None, *, prefixes: Iterable[str] = (),
                 types: Iterable[str] = (), runtime: str = Runtime.ORT, store: str | Path | None = None) -> None:
        self.sample, self.baseline = sample, baseline
        self.prefixes, self.types, self.runtime, self.store = tuple(prefixes), tuple(types), runtime, store

    def run(self, ir: QIR) -> PassResult:
        pair = (ir, None) if self.baseline is None else (self.baseline, ir)
        layers = run_layers(*pair, self.sample, runtime=self.runtime, store=self.store)
        rows = compare_per_layer(layers, self.prefixes, self.types)
        return PassResult(ir, False, {"rows": rows, "findings": advise(layers, rows), "run": layers})
