"""The repair transforms as advice (:mod:`qir.tools.advice`): proposed where their cause is seen,
measured before they are shown.

**Causes**, read off the float and fake-quant runs of the model on the advisor's samples:

- ``outlier channels`` → ``smooth``: a per-tensor int8 activation quantizer feeding a GEMM with a
  constant weight (MatMul, Gemm, Conv) whose input has a channel (the GEMM's input-channel axis)
  over :data:`OUTLIER_RATIO` times the median channel's max |x|;
- ``channel-range imbalance`` → ``equalize``: a Conv → (Relu, LeakyRelu, PRelu or nothing) →
  Conv pair whose activation in between spans channel ranges (max |x| per channel, the nonzero
  ones) over :data:`IMBALANCE_RATIO` apart;
- ``output shift`` → ``bias-correct`` (weights and ``mode=empirical``): at a model output, the
  per-channel mean of the quantization error carries at least :data:`SHIFT_SHARE` of its mean
  square.

**Measured**: ``smooth`` and ``equalize`` run on the model's float model
(:func:`qir.passes.lib.repair.float_model`), which is then calibrated again as the model was
(:func:`~qir.passes.lib.repair.recalibrated`) on the advisor's data; since that recalibration alone
changes the score, the plain recalibration is measured too and the transform must beat both it
and the model as it is. ``bias-correct`` runs on a clone of the calibrated model. Each is fitted
on all the data, as its printed command fits it, and scored on the advisor's samples: the output
cosine of the fake-quant model against the float outputs of the model as it is, per sample the
mean over its outputs, then the mean over samples.
"""
from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qir.data import model_samples
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.metrics import cosine_similarity
from qir.passes import get_pass
from qir.passes.lib.repair import float_model, recalibrated
from qir.passes.lib.rescale import HOMOGENEOUS
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import check_feeds, get_runtime
from qir.tools.results import Fix

__all__ = ["TransformFix", "transform_candidates", "measure_transforms", "transform_command", "OUTLIER_RATIO",
           "IMBALANCE_RATIO", "SHIFT_SHARE"]

logger = logging.getLogger(__name__)

OUTLIER_RATIO = 8.0
IMBALANCE_RATIO = 100.0
SHIFT_SHARE = 0.25
FLOAT_TRANSFORMS = ("smooth", "equalize")


@dataclass(kw_only=True)
class TransformFix(Fix):
    """A transform proposed for a cause (:class:`~qir.tools.results.Fix`, ``changes`` None: no
    quantizer setting does it): the pass and its ``options``; measured, also
    ``recalibrated_only`` (a float transform's plain recalibration's score)."""

    changes: dict[str, str] | None = None
    transform: str
    options: dict[str, Any] = field(default_factory=dict)
    recalibrated_only: float | None = None

    optional = Fix.optional + ("recalibrated_only",)

    @property
    def step(self) -> str:
        """The pass as a pipeline step: ``bias-correct{mode=empirical}``."""
        return self.transform + ("{" + ",".join(f"{k}={v}" for k, v in self.options.items()) + "}" if self.options else "")


def _reader_ops(ir: QIR, value: str) -> list[OpRecord]:
    """The ops reading ``value``, through calibration nodes."""
    out = []
    for rec in ir.consumers(value):
        out += _reader_ops(ir, rec.output) if isinstance(rec, CalibRecord) else [rec]
    return out


def _source(ir: QIR, value: str) -> str:
    """``value`` before any calibration nodes."""
    while isinstance(ir.producer(value), CalibRecord):
        value = ir.producer(value).input
    return value


def _smooth_sites(ir: QIR) -> dict[str, tuple[str, int]]:
    """Per-tensor int8 activation quantizers feeding a GEMM: ``{quantizer: (value, channel axis)}``."""
    found = {}
    for cal in ir.calibrations(CalibRole.ACTIVATION):
        if cal.mode is not CalibMode.INT8 or cal.axis is not None:
            continue
        for op in _reader_ops(ir, cal.output):
            axis = _gemm_input_axis(ir, op)
            if axis is not None:
                found[cal.name] = (cal.input, axis)
                break
    return found


def _gemm_input_axis(ir: QIR, op: OpRecord) -> int | None:
    """The input-channel axis of a GEMM's activation input (its weight a constant behind a
    calibration node or not), or None for other ops."""
    if op.op_type not in ("MatMul", "Gemm", "Conv") or len(op.inputs) < 2:
        return None
    weight, rank = _source(ir, op.inputs[1]), len(ir.value(op.inputs[0]).shape or ())
    if ir.value(weight).kind is not NodeKind.WEIGHT or not rank:
        return None
    if op.op_type == "Conv":
        return 1 if rank >= 3 else None
    if op.op_type == "Gemm":
        return None if op.attrs.get("transA", 0) else 1
    return rank - 1 if ir.weight_array(weight).ndim == 2 and rank >= 2 else None


def _equalize_sites(ir: QIR) -> dict[str, str]:
    """Conv → (Relu-like or nothing) → Conv pairs: ``{"<conv> -> <conv>": the activation in between}``."""
    found = {}
    for op in ir.ops():
        if op.op_type != "Conv":
            continue
        value = _source(ir, op.inputs[0])
        prev = ir.producer(value)
        if isinstance(prev, OpRecord) and prev.op_type in HOMOGENEOUS:
            prev = ir.producer(_source(ir, prev.inputs[0]))
        if isinstance(prev, OpRecord) and prev.op_type == "Conv":
            found[f"{prev.name} -> {op.name}"] = value
    return found


def _channel_peaks(x: np.ndarray, axis: int) -> np.ndarray:
    x = np.abs(np.asarray(x, np.float64))
    return np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1).max(axis=1)


def transform_candidates(ir: QIR, data: Any, *, data_num: int | None = 1,
                         runtime: str = Runtime.ORT) -> list[TransformFix]:
    """The transforms for the causes seen in ``ir`` on ``data`` (module docstring)."""
    smooth, pairs = _smooth_sites(ir), _equalize_sites(ir)
    values = sorted({v for v, _ in smooth.values()} | set(pairs.values()))
    peaks: dict[str, np.ndarray] = {}
    axes = {**{v: a for v, a in smooth.values()}, **dict.fromkeys(pairs.values(), 1)}
    sums: dict[str, list] = {}
    fl, fq = get_runtime(runtime, level=Level.FLOAT), get_runtime(runtime, level=Level.FAKEQUANT)
    for sample in model_samples(ir, data, data_num):
        feed = check_feeds(ir, sample)
        ref = fl.run(ir, feed, capture=values)
        got = fq.run(ir, feed)
        for v in values:
            p = _channel_peaks(ref[v], axes[v])
            peaks[v] = p if v not in peaks else np.maximum(peaks[v], p)
        for o in ir.outputs:
            err = np.asarray(got[o], np.float64) - np.asarray(ref[o], np.float64)
            axis = 1 if err.ndim >= 3 else max(err.ndim - 1, 0)
            means = np.moveaxis(err, axis, 0).reshape(err.shape[axis], -1).mean(axis=1) if err.ndim else err.reshape(1)
            s = sums.setdefault(o, [0.0, 0.0, 0])
            s[0], s[1], s[2] = s[0] + means, s[1] + float(np.mean(err ** 2)), s[2] + 1
    found = []
    outliers = {name: float(peaks[v].max() / np.median(peaks[v])) for name, (v, _) in smooth.items()
                if np.median(peaks[v]) > 0 and peaks[v].max() > OUTLIER_RATIO * np.median(peaks[v])}
    if outliers:
        worst = sorted(outliers, key=outliers.get, reverse=True)[:3]
        found.append(TransformFix(cause="outlier channels", transform="smooth",
                                  fix="smooth (move the outlier channels' range into the next GEMMs' weights)",
                                  why=f"{len(outliers)} per-tensor activation quantizer(s) feeding GEMMs have a channel "
                                  f"over {OUTLIER_RATIO:g}x the median channel ("
                                  + ", ".join(f"{n} {outliers[n]:.0f}x" for n in worst) + ")"))
    spread = {}
    for pair, v in pairs.items():
        nonzero = peaks[v][peaks[v] > 0]
        if nonzero.size and nonzero.max() > IMBALANCE_RATIO * nonzero.min():
            spread[pair] = float(nonzero.max() / nonzero.min())
    if spread:
        worst = sorted(spread, key=spread.get, reverse=True)[:3]
        found.append(TransformFix(cause="channel-range imbalance", transform="equalize",
                                  fix="equalize{activations=True} (cross-layer equalization of the Conv pairs)",
                                  why=f"{len(spread)} Conv pair(s) pass on channels whose ranges differ over "
                                  f"{IMBALANCE_RATIO:g}x (" + ", ".join(f"{p} {spread[p]:.0f}x" for p in worst) + ")",
                                  options={"activations": True}))
    shifted = {o: float(np.sum((s[0] / s[2]) ** 2) / np.size(s[0]) / (s[1] / s[2]))
               for o, s in sums.items() if s[1] > 0}
    shifted = {o: share for o, share in shifted.items() if share >= SHIFT_SHARE}
    if shifted:
        why = ("the quantization error's per-channel mean is " + ", ".join(f"{100 * v:.0f}% of its mean square at {o}"
               for o, v in shifted.items()))
        for mode, fix in (("weights", "bias-correct (remove the output shift quantized weights cause)"),
                          ("empirical", "bias-correct{mode=empirical} (remove the whole mean shift)")):
            found.append(TransformFix(cause="output shift", transform="bias-correct", fix=fix, why=why,
                                      options={"mode": mode}))
    return found


def _score(model: QIR, reference: QIR, samples: list, runtime: str) -> float:
    fl, fq = get_runtime(runtime, level=Level.FLOAT), get_runtime(runtime, level=Level.FAKEQUANT)
    scores = []
    for sample in samples:
        feed = check_feeds(reference, sample)
        ref, got = fl.run(reference, feed), fq.run(model, feed)
        scores.append(np.mean([cosine_similarity(ref[o], got[o]) for o in reference.outputs]))
    return float(np.mean(scores))


def measure_transforms(ir: QIR, data: Any, candidates: list[TransformFix], *, data_num: int | None = 1,
                       runtime: str = Runtime.ORT) -> None:
    """Fill ``before`` and ``after`` of each candidate (module docstring); a float transform's
    also ``recalibrated_only`` (the plain recalibration's score), and its ``before`` is the
    better of that and the model as it is."""
    samples = list(model_samples(ir, data, data_num))
    before = _score(ir, ir, samples, runtime)
    plain = None
    for c in candidates:
        options = {"data": data, "measure": False, **c.options}  # on all the data, as the command does
        if c.transform in FLOAT_TRANSFORMS:
            model = float_model(ir)
            if plain is None:
                plain = _score(recalibrated(model, data, like=ir, runtime=runtime), ir, samples, runtime)
            get_pass(c.transform, **options)(model)
            model = recalibrated(model, data, like=ir, runtime=runtime)
            c.recalibrated_only, c.before = plain, max(before, plain)
        else:
            model = ir.clone()
            get_pass(c.transform, **options)(model)
            c.before = before
        c.after = _score(model, ir, samples, runtime)
        c.gain = c.after - c.before
        logger.info("advisor: %s: output cosine %.5f -> %.5f", c.fix, c.before, c.after)


def transform_command(ir: QIR, transform: str, step: str, model: str, output: str, data: Any) -> str:
    """The command that applies ``transform`` as pipeline ``step``: ``qir pipeline MODEL
    'bias-correct{...}' --data DATA -o OUT`` on the calibrated model; for smooth/equalize, ``qir
    calibrate FLOAT_MODEL DATA --fixes STEP --method M --march A -o OUT`` (FLOAT_MODEL: the float
    model MODEL was calibrated from, which the advisor does not know)."""
    if transform in FLOAT_TRANSFORMS:
        method = (ir.meta.get("calibration") or {}).get("method", "max")
        argv = ["qir", "calibrate", "FLOAT_MODEL.onnx", str(data), "--fixes", step, "--method", method,
                *(["--march", ir.meta["march"]] if ir.meta.get("march") else []), "-o", output]
    else:
        argv = ["qir", "pipeline", model, step, "--data", str(data), "-o", output]
    return shlex.join(argv)
