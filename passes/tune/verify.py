"""Verifying a tuned configuration before ``qir tune`` claims it: emitted, re-imported, and run.

1. The tuned IR is emitted as a standard QDQ ONNX model (:func:`qir.io.qdq_export.export_qdq`,
   what ``qir emit`` writes) and imported back (``qir.load``): every calibration node must come
   back with the same mode and scale.
2. The emitted model runs in onnxruntime as written (``session.disable_quant_qdq``: the Q/DQ
   ops as ops, qir's fake quantization) on the evaluation samples; the target metric against the
   float model's outputs is averaged as the search averages it (samples whose float outputs are
   near zero or constant left out of cosine/SQNR, :func:`qir.metrics.ill_conditioned`).
3. It *agrees* with the search when the two means differ by at most
   :meth:`~.tune_target.Target.tolerance` (2% of the distance to a perfect match) and it meets
   the target itself; otherwise verification fails and ``qir tune`` says so and exits non-zero.
4. With ``march``: the re-imported model also runs at the integer level
   (``qir.run(..., level="integer", march=...)``, what the NPU computes per the profile's
   assumptions). That is what deploys, so it must meet the target too: a configuration that
   meets it only in fake quantization is not claimed (the integer level differs from fake
   quantization where the profile's arithmetic does; :mod:`qir.passes.tune` then searches
   again for a tighter target).

:func:`check_unseen` runs the emitted model the same way on samples the search never saw (the
user's ``check_data``): a result picked for its mean on the evaluation samples may not hold on
others, and this says whether it does. It decides nothing; the report shows it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.calibration import QRANGE, calib_scale
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.io.onnx_import import import_onnx
from qir.io.qdq_export import export_qdq
from qir.passes.base import Report
from qir.passes.tune.target import Score, Target
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.ort.backend import new_session

__all__ = ["verify", "sample_values", "check_unseen", "float_outputs", "Verification", "IntegerCheck", "Unseen"]


@dataclass(frozen=True)
class IntegerCheck(Report):
    """The re-imported model at ``march``'s integer level (:func:`_integer_level`): the target's
    numbers there (:class:`~.target.Judged`'s), and whether every sample ran (``complete``; when
    not, ``samples_run`` ran and the numbers are over those)."""

    optional = ("samples_run",)

    march: str
    mean: float
    worst: float
    worst_sample: int | None
    margin: float
    meets: bool
    complete: bool
    samples_run: int | None = None


@dataclass(frozen=True)
class Verification(Report):
    """What :func:`verify` found: the emitted model in onnxruntime (``runtime``) scored as the
    search scores (:class:`~.target.Judged`'s numbers), the search's mean (``searched``), their
    ``difference`` and the ``tolerance`` it must be within, the calibration nodes that did not come
    back from the emitted model (``roundtrip``), whether onnxruntime agrees and, with a march, the
    ``integer`` level; ``agrees``: all of it. ``model``: the emitted ``ModelProto`` (None once a
    caller took it; not part of the JSON then)."""

    optional = ("model", Level.INTEGER)  # (the field named integer)

    runtime: str
    mean: float
    worst: float
    worst_sample: int | None
    margin: float
    meets: bool
    searched: float
    difference: float
    tolerance: float
    roundtrip: list[str]
    model: Any
    agrees: bool
    onnxruntime_agrees: bool
    integer: IntegerCheck | None = None


@dataclass(frozen=True)
class Unseen(Report):
    """The emitted model on samples the search never saw (:func:`check_unseen`): how many, and the
    target's numbers there (:class:`~.target.Judged`'s)."""

    samples: int
    mean: float
    worst: float
    worst_sample: int | None
    margin: float
    meets: bool


def sample_values(ir: QIR, target: Target, floats: Sequence[dict], outs: Sequence[dict]) -> tuple[float, tuple[float, ...]]:
    """The target's mean and per-sample values of ``outs`` against the float outputs ``floats``,
    averaged as the engine averages them (ill-conditioned samples out of relative metrics unless
    every sample is one)."""
    if not isinstance(target.metric, str):
        values = tuple(float(target.metric(o, i)) for i, o in enumerate(outs))
        return float(np.nanmean(values)) if any(v == v for v in values) else math.nan, values
    metric, relative = target.metric, target.metric in qmetrics.RELATIVE
    compared = target.compared(ir)
    bounds = {v: qmetrics.output_bound(ir, v) for v in compared}
    trusted, every = [], []
    for f, o in zip(floats, outs):
        per = {v: qmetrics.compute([metric], f[v], o[v])[metric] for v in compared}
        good = [x for v, x in per.items() if x == x and not (relative and qmetrics.ill_conditioned(f[v], bounds[v]))]
        trusted.append(float(np.mean(good)) if good else math.nan)
        every.append(float(np.nanmean(list(per.values()))) if any(x == x for x in per.values()) else math.nan)
    values = tuple(trusted if any(x == x for x in trusted) else every)
    return (float(np.nanmean(values)) if any(x == x for x in values) else math.nan), values


def _roundtrip(ir: QIR, back: QIR) -> list[str]:
    """Calibration nodes whose mode or scale did not come back from the emitted model."""
    bad = []
    for c in ir.calibrations():
        if not back.has_node(c.name):
            bad.append(f"{c.name}: missing")
            continue
        b = back.calibration(c.name)
        if b.mode is not c.mode:
            bad.append(f"{c.name}: {c.mode.value} came back {b.mode.value}")
        elif c.mode in QRANGE and not np.allclose(calib_scale(b), calib_scale(c), rtol=1e-6, atol=0):
            bad.append(f"{c.name}: its scale changed")
    return bad


def verify(ir: QIR, samples: Sequence[dict], target: Target, searched: float, *, march: str | None = None,
           threads: int | None = None, floats: Sequence[dict] | None = None, stop_at_floor: bool = False) -> Verification:
    """Emit ``ir``, re-import it, run it on ``samples`` (see the module docstring). Returns the
    :class:`Verification` (``agrees``: all of it, the integer level included;
    ``model``: the emitted ``ModelProto``). ``floats``: :func:`float_outputs` of ``samples``,
    when a configuration of the same model was verified on them before. ``stop_at_floor``: the
    integer level stops at the first sample that misses the target's floor
    (:func:`_integer_level`)."""
    model = export_qdq(ir)
    back = import_onnx(model)
    floats = float_outputs(ir, samples, target.values) if floats is None else floats
    outs = _onnxruntime_outputs(model, [check_feeds(ir, s) for s in samples], threads, target.values)
    score = Score(*sample_values(ir, target, floats, outs))
    roundtrip = _roundtrip(ir, back)
    agrees = abs(score.mean - searched) <= target.tolerance(searched)  # (False when either is NaN)
    judged = target.judged(score)
    onnxruntime_agrees = bool(agrees and not roundtrip and judged.meets)
    integer = None if march is None else _integer_level(ir, back, samples, target, floats, march, score, stop_at_floor)
    return Verification("onnxruntime (session.disable_quant_qdq)", **judged, searched=searched,
                        difference=score.mean - searched, tolerance=target.tolerance(searched), roundtrip=roundtrip,
                        model=model, agrees=onnxruntime_agrees and (integer is None or integer.meets),
                        onnxruntime_agrees=onnxruntime_agrees, integer=integer)


def _integer_level(ir: QIR, back: QIR, samples: Sequence[dict], target: Target, floats: Sequence[dict], march: str,
                   fake: Score, stop_at_floor: bool) -> IntegerCheck:
    """The re-imported model ``back`` at ``march``'s integer level on ``samples``, those
    fake quantization (``fake``) scores worst first.
    With ``stop_at_floor``, it stops at the first sample that misses the target's floor: the
    target is then missed whatever the others score (a sample that misses the floor among some
    misses it among all: a relative metric's ill-conditioned sample is NaN among others, and NaN
    misses a floor), and the numbers are over the samples run (``complete`` false)."""
    rt = get_runtime(Runtime.NUMPY, level=Level.INTEGER, march=march)
    sign = 1.0 if target.higher_is_better else -1.0
    order = sorted(range(len(samples)), key=lambda i: (fake.samples[i] == fake.samples[i], sign * fake.samples[i]))
    outs: dict[int, dict] = {}
    for i in order:
        outs[i] = rt.run(back, check_feeds(back, samples[i]), capture=target.values)
        if stop_at_floor and target.floor is not None and len(outs) < len(samples):
            done = sorted(outs)
            part = Score(*sample_values(ir, target, [floats[j] for j in done], [outs[j] for j in done]))
            if target.misses_floor(part.samples):
                judged = target.judged(part)
                worst = judged.worst_sample
                judged = replace(judged, worst_sample=None if worst is None else done[worst], meets=False)
                return IntegerCheck(march, **judged, complete=False, samples_run=len(done))
    ints = [outs[i] for i in range(len(samples))]
    return IntegerCheck(march, **target.judged(Score(*sample_values(ir, target, floats, ints))), complete=True)


def float_outputs(ir: QIR, samples: Sequence[dict], values: Sequence[str] = ()) -> list[dict]:
    """The outputs of ``ir`` (and ``values``, any activations) run as float in onnxruntime, on each of ``samples``."""
    rt = get_runtime(Runtime.ORT, level="float")
    return [rt.run(ir, check_feeds(ir, sample), capture=values) for sample in samples]


def _onnxruntime_outputs(model, feeds: Sequence[dict], threads: int | None, values: Sequence[str] = ()) -> list[dict]:
    """The emitted ``model``'s outputs in onnxruntime (and ``values``, activations it computes,
    made outputs of a copy), on each of ``feeds``."""
    extra = [v for v in values if v not in {o.name for o in model.graph.output}]
    if extra:
        import onnx

        model = onnx.ModelProto.FromString(model.SerializeToString())
        model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v) for v in extra)
    session = new_session(model, threads=threads, what="the emitted model")
    names = [o.name for o in session.get_outputs()]
    return [dict(zip(names, session.run(names, f))) for f in feeds]


def check_unseen(ir: QIR, model, samples: Sequence[dict], target: Target, *, threads: int | None = None) -> Unseen:
    """The emitted ``model`` (of the tuned ``ir``) on ``samples`` the search never saw, in
    onnxruntime as :func:`verify` runs it (:class:`Unseen`). Whether the result holds beyond the
    evaluation data it was picked on."""
    floats = float_outputs(ir, samples, target.values)
    outs = _onnxruntime_outputs(model, [check_feeds(ir, s) for s in samples], threads, target.values)
    return Unseen(len(samples), **target.judged(Score(*sample_values(ir, target, floats, outs))))
