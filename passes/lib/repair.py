"""What the int8 repair transforms (``smooth``, ``equalize``, ``bias-correct``) share: their report,
the all-int8 error they measure before and after, int8 quantization of a tensor as the model does
it, streamed float captures over calibration data, and the note each leaves on the ops it changed.

The note: every changed op gets ``op.meta["repair"][<pass>] = {...}`` and the IR's serialized
``metadata_props["qir.repairs"]`` holds ``{<pass>: {<op>: {...}}}`` as JSON, so a saved, dumped or
emitted model says which transform changed which weights (the weights themselves are ordinary
weights of the IR).
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Mapping, Union

import numpy as np

from qir.data import model_samples
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibRole
from qir.metrics import cosine_similarity, mse
from qir.passes.base import PassResult
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.numerics import fake_quant

__all__ = ["Site", "Skipped", "QuantError", "RepairReport", "all_int8_error", "quantize_int8", "run_step",
           "float_captures", "note_change", "REPAIRS_KEY", "WEIGHT_TIED", "weight_tied_ops", "scale_along", "float_model",
           "recalibrated"]

logger = logging.getLogger(__name__)

REPAIRS_KEY = "qir.repairs"
#: Repairs that fit a layer to its weights' quantization as it was (bias-correct removes the mean
#: shift *those* quantized weights cause; round-weights chooses *their* int8 codes): at another
#: weight precision the fit is stale (on PP-OCRv4 det, bias-corrected layers with int16 weights
#: score 0.9920 / 0.9689 where the model as given scores 0.9969 / 0.9933).
WEIGHT_TIED = ("bias-correct", "round-weights")
QMAX = 127
TINY = 1e-12


@dataclass
class Site:
    """One place a transform changed: a name (the activation or the op pair), the ops whose
    weights changed, and what it did there (factors, chosen alpha, ...)."""

    name: str
    ops: list[str]
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Skipped:
    """A candidate site a transform left alone, and why."""

    name: str
    reason: str


@dataclass
class QuantError:
    """All-int8 fake-quant outputs against float ones on the calibration data: the mean and the
    worst (least) per-sample cosine over every output, and the mean squared error."""

    cosine_mean: float
    cosine_worst: float
    mse: float


@dataclass
class RepairReport:
    """What a repair transform did: sites changed and skipped, and the all-int8 error on the
    calibration data before and after (None when it was not measured)."""

    transform: str
    changed: list[Site] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    before: QuantError | None = None
    after: QuantError | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-able data (what a pipeline collects)."""
        out = asdict(self)
        if self.before and self.after:
            out["cosine_gain"] = round(self.after.cosine_mean - self.before.cosine_mean, 6)
            out["mse_removed"] = self.before.mse - self.after.mse
        return out


def scale_along(v: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """``v`` (a vector) shaped to broadcast along ``axis`` of a rank-``ndim`` tensor."""
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return np.asarray(v).reshape(shape)


def quantize_int8(x: np.ndarray, axis: int | None = None, threshold: np.ndarray | float | None = None) -> np.ndarray:
    """Symmetric int8 fake quantization, ``clamp(round(x / s), -128, 127) * s`` with
    ``s = threshold / 127``; ``threshold`` defaults to max |x| (per channel along ``axis``)."""
    x = np.asarray(x, np.float32)
    if threshold is None:
        if axis is None:
            threshold = np.abs(x).max(initial=0.0)
        else:
            others = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
            threshold = np.abs(x).max(axis=others, initial=0.0)
    scale = np.maximum(np.asarray(threshold, np.float32), np.float32(TINY)) / np.float32(QMAX)
    return fake_quant(x, scale, -128, QMAX, None if axis is None else axis % x.ndim)


def float_captures(ir: QIR, data: Any, values: list[str], *, runtime: str = Runtime.ORT,
                   limit: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """``values`` of the float model, one sample at a time (nothing is kept between samples)."""
    rt = get_runtime(runtime, level=Level.FLOAT)
    for sample in model_samples(ir, data, limit):
        yield rt.run(ir, check_feeds(ir, sample), capture=values)


def all_int8_error(ir: QIR, data: Any, *, march: str, runtime: str = Runtime.ORT,
                   limit: int | None = None, reference: QIR | None = None) -> QuantError:
    """The fake-quant error of ``ir`` on ``data`` against the float outputs of ``reference``
    (default ``ir`` itself): a calibrated IR as it is calibrated; an uncalibrated one all-int8,
    through ``insert-calibration{march}`` and ``calibrate{method=max}`` on a clone first (the
    input is never changed)."""
    from qir.passes.base import get_pass

    model = ir
    if not ir.calibrations():
        model = ir.clone()
        get_pass("insert-calibration", march=march)(model)
        get_pass("calibrate", data=data, method="max", runtime=runtime, limit=limit, progress=False)(model)
    ref_rt = get_runtime(runtime, level=Level.FLOAT)
    q_rt = get_runtime(runtime, level=Level.FAKEQUANT)
    cosines, errors = [], []
    for sample in model_samples(ir, data, limit):
        feed = check_feeds(ir, sample)
        ref, got = ref_rt.run(reference or ir, feed), q_rt.run(model, feed)
        cosines.append(min(cosine_similarity(ref[o], got[o]) for o in ir.outputs))
        errors.append(float(np.mean([mse(ref[o], got[o]) for o in ir.outputs])))
    return QuantError(float(np.mean(cosines)), float(np.min(cosines)), float(np.mean(errors)))


JsonValue = Union[float, int, str, bool, None, list, dict]  # what a note holds: it is saved as JSON metadata


def check_repair_options(name: str, data: Any, purpose: str, op_types: Any = (), allowed: tuple[str, ...] = (),
                         **choices: tuple[Any, tuple[str, ...]]) -> None:
    """One clear error for a repair pass built without calibration data (needed to measure
    ``purpose``), with op types outside ``allowed``, or with a choice (``name=(value, allowed
    values)``) outside its allowed values."""
    if data is None:
        raise InputError(f"{name} needs calibration data (a folder, .npz, .npy or samples) to measure {purpose}; "
                         "give it data=...")
    unknown = set(op_types) - set(allowed)
    if unknown:
        raise InputError(f"{name}: unknown op types {sorted(unknown)}; choose from {', '.join(allowed)}")
    for what, (value, options) in choices.items():
        if value not in options:
            raise InputError(f"{name}: unknown {what} {value!r}; choose one of {', '.join(options)}")


def note_change(ir: QIR, op: OpRecord, transform: str, detail: Mapping[str, JsonValue]) -> None:
    """Record on ``op`` (``meta["repair"]``) and in the IR's serialized metadata what
    ``transform`` changed there (see the module docstring): ``detail`` is a JSON document."""
    op.meta["repair"] = {**op.meta.get("repair", {}), transform: detail}
    notes = _notes(ir)
    notes.setdefault(transform, {})[op.name] = detail
    ir.metadata_props[REPAIRS_KEY] = json.dumps(notes, sort_keys=True)


def _notes(ir: QIR) -> dict[str, dict[str, Any]]:
    """The IR's serialized repair notes, ``{transform: {op: detail}}``; a value under
    :data:`REPAIRS_KEY` that is not that (not JSON, or another shape) is an InputError."""
    try:
        notes = json.loads(ir.metadata_props.get(REPAIRS_KEY, "{}"))
    except json.JSONDecodeError as exc:
        notes = exc
    if not isinstance(notes, dict) or not all(isinstance(v, dict) for v in notes.values()):
        raise InputError(f"the model's {REPAIRS_KEY!r} metadata is not the notes qir writes ({{transform: {{op: "
                         f"detail}}}} as JSON): {str(notes)[:80]!r}; remove that entry, or run the repairs again")
    return notes


def weight_tied_ops(ir: QIR) -> dict[str, str]:
    """The ops whose weights a :data:`WEIGHT_TIED` repair fitted, each with the weight mode it
    fitted them at, from the IR's serialized notes (so a saved and loaded model says so too). A
    note without ``weight_mode``, written before it was recorded, means the mode of the op's
    weight calibration node now (int8 where it has none)."""
    notes = _notes(ir)
    tied: dict[str, str] = {}
    for transform in WEIGHT_TIED:
        for op_name, detail in notes.get(transform, {}).items():
            mode = detail.get("weight_mode") if isinstance(detail, dict) else None
            tied[op_name] = str(mode) if mode else _weight_mode_now(ir, op_name)
    return tied


def _weight_mode_now(ir: QIR, op_name: str) -> str:
    op = ir.op(op_name) if ir.has_node(op_name) else None
    w = ir.producer(op.inputs[1]) if isinstance(op, OpRecord) and len(op.inputs) > 1 else None
    return w.mode.value if isinstance(w, CalibRecord) else "int8"


def finished(ir: QIR, report: RepairReport, measure: Callable[[], QuantError] | None, done: str) -> PassResult:
    """A repair pass's result: the all-int8 error after it (``measure()``, when given and something
    changed), one log line (``done`` says what the count is: ``"site(s) changed"``), and the report
    in its JSON form."""
    if report.changed and measure is not None:
        report.after = measure()
    logger.info("%s: %d %s, %d skipped", report.transform, len(report.changed), done, len(report.skipped))
    return PassResult(ir, bool(report.changed), report.to_json())


def run_step(step, envs: list[dict[str, np.ndarray]]) -> None:
    """One step of a numpy execution plan (:func:`qir.runtimes.numpy_ref.interpreter.execution_plan`)
    on every sample's environment, fake-quantized (:func:`~qir.runtimes.numpy_ref.interpreter.execute_step`):
    how the repairs that correct layer by layer (empirical bias correction, round-weights) run every
    sample at once, op by op. The step's dead values are left for the caller to drop."""
    from qir.runtimes.numpy_ref.interpreter import execute_step

    for env in envs:
        execute_step(step, env)


def float_model(ir: QIR) -> QIR:
    """A clone of ``ir`` without its calibration nodes: the float model it was calibrated from
    (after fold-bn and fuse, with any repair already applied), which ``smooth`` and ``equalize``
    need. The input is never changed. A calibration node that stands in for a deleted Relu/Clip
    (an imported quantizer's ``implied_clip``) is an error: without it the function changes."""
    from qir.errors import InputError

    clipping = [c.name for c in ir.calibrations() if c.implied_clip is not None]
    if clipping:
        raise InputError(f"calibration node(s) {', '.join(clipping[:3])} stand in for a Relu/Clip the quantizer "
                         "deleted: removing them changes the function; start from the float model instead")
    model = ir.clone()
    for cal in model.calibrations():
        model.replace_uses(cal.output, cal.input)
        model.remove_node(cal.name)
    return model


def recalibrated(model: QIR, data: Any, *, march: str | None = None, like: QIR | None = None,
                 method: str | None = None, runtime: str = Runtime.ORT, limit: int | None = None) -> QIR:
    """``model`` (float: :func:`float_model`) calibrated again as ``like`` was, in a clone:
    ``insert-calibration{march}`` (default ``like``'s recorded march) and ``calibrate`` with
    ``method`` (default the one ``like.meta["calibration"]`` records, else max) on ``data``; then
    each calibration node that ``like`` has by the same name takes its mode, and an activation
    node its threshold where that one is ``fixed`` (a user's; a weight's fixed threshold belongs
    to weights a transform may have changed). Returns the calibrated clone; ``model`` is not
    changed."""
    from qir.execution import DEFAULT_MARCH
    from qir.passes.base import get_pass

    meta = like.meta if like is not None else {}
    march = march or meta.get("march") or DEFAULT_MARCH
    method = method or (meta.get("calibration") or {}).get("method") or "max"
    out = model.clone()
    get_pass("insert-calibration", march=march)(out)
    options = {"percentile": meta["calibration"]["percentile"]} if "percentile" in (meta.get("calibration") or {}) else {}
    get_pass("calibrate", data=data, method=method, runtime=runtime, limit=limit, progress=False, **options)(out)
    if like is not None:
        theirs = {c.name: c for c in like.calibrations()}
        for cal in out.calibrations():
            old = theirs.get(cal.name)
            if old is None:
                continue
            fixed = old.fixed and old.threshold is not None and old.role is CalibRole.ACTIVATION
            out.set_calibration(cal.name, mode=old.mode, **({"threshold": old.threshold, "fixed": True} if fixed else {}))
    return out
