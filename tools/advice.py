"""What to try next, measured before it is shown: ``qir runall``'s advice (:func:`advise`), and the
commands and measurement ``qir compare``'s advisor shares (:func:`measure`, :func:`command`).

**Candidates**, by cause (the order that breaks ties), read off runall's results:

1. ``clipping``: an activation quantizer that clips more than 0.1% of its input (the distribution
   and channel-wise steps) gets a fixed threshold covering its data (max |x| of its input in the
   calibrated and in the float model, rounded up to 4 significant digits:
   :func:`covering_threshold`); each one alone, and all of them together.
2. ``rounding``: a sensitive int8 quantizer (among the 5 most sensitive of its type, its node
   sensitivity cosine below the pick threshold) goes to int16: the same range, 256x finer steps.
3. ``outlier channels``: an int8 activation quantizer with outlier channels goes to int16.
4. ``spread error``: the quantizers of the sensitivity analysis's ops back to float (as few ops
   as reach the pick threshold, else all of them) or, int8 ones, to int16; every int8 activation
   quantizer to int16; and when even all those ops in float miss the pick threshold (or no op is
   below it while the model is), calibrating again with ``mix`` (``max`` for a model calibrated
   with ``mix``).
5. the repair transforms where their cause is seen (:mod:`qir.tools.transform_advice`): outlier
   channels of a per-tensor activation feeding GEMMs -> ``smooth``; channel-range imbalance
   between Relu-joined convs -> ``equalize``; a biased output shift -> ``bias-correct``. Each is
   applied to a copy (smooth and equalize on the float model, calibrated again as the model was)
   and scored by :mod:`~qir.tools.transform_advice` itself; its command is a ``qir pipeline`` or a
   ``qir calibrate --fixes`` line.

**Measured.** Every candidate runs on the analysis engine (:func:`measure`) on the same data and
number of samples as the analyses, next to the model as it is: the output cosine against the
float model, the mean over samples. A candidate is kept when it recovers at least ``MIN_SHARE``
(1%) of what the current score misses to 1; the others are returned as tried and dropped, with
their numbers. Kept fixes are ordered by gain, cause first where gains tie.

**Confidence.** The kept fixes' order rests on the per-sample gains the measurement already
holds: each kept fix gets its gain's 95% bootstrap interval (``gain_low``, ``gain_high``) and
rank interval (``rank_low``, ``rank_high``), the advice its ``confidence`` (``stable_top_k``,
:mod:`qir.passes.lib.confidence`); the first fix is called the best (``settled``) only when it
is the stable top-1, else its line names the fixes it is not yet told apart from (``peers``);
on one sample how settled the order is is unknown (``settled`` left out).

**Commands** (:func:`command`) are complete and pasteable: ``qir set-mode MODEL --nodes ...
(--mode M | --threshold T) -o OUT`` for one kind of change, ``qir pipeline MODEL
'set-mode{...},set-mode{...}' -o OUT`` for several, ``qir pipeline MODEL 'calibrate{method=M}'
--data DATA -o OUT`` to recalibrate. MODEL is the model file as given; OUT a new file beside it
named after the model and the tool that suggests it, ``<stem>_runall_fix<k>.onnx`` or
``<stem>_compare_fix<k>.onnx`` (k: the fix's place in the list shown, best first; names that
exist are skipped), so runall's and compare's suggestions never share a name. A fix whose ``--nodes``
list would select other quantizers too is dropped, not printed.
"""
from __future__ import annotations

import logging
import math
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from qir.calibration import covering_threshold
from qir.errors import QirError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.base import Report
from qir.tools.results import Fix, RunallResults

__all__ = ["advise", "measure", "command", "helps", "describe", "measure_findings", "fix_line", "CAUSES", "MIN_SHARE",
           "Fix", "Advice", "Measured"]

logger = logging.getLogger(__name__)

CAUSES = ("clipping", "rounding", "outlier channels", "spread error", "channel-range imbalance", "output shift")
MIN_SHARE = 0.01  # a kept fix recovers at least this share of 1 - (current output cosine)
CLIP_SHARE = 1e-3  # a quantizer clipping more than this share of its input is a clipping candidate
TOP = 5  # the most sensitive quantizers of each type that get an int16 candidate
METRIC = "cosine-similarity"


@dataclass
class Measured:
    """:func:`measure`'s numbers: the output cosine ``before`` (the model as it is) and ``after``
    each change, on ``samples`` samples of which ``left_out`` were left out."""

    before: float
    after: list[float]
    samples: int
    left_out: int
    per_sample: dict[str, list[float]] = field(default_factory=dict)  # variant ("as it is", "fix i") -> values


@dataclass
class Advice(Report):
    """:func:`advise`'s result: the ``metric`` and its value ``before``, the ``samples`` measured
    and ``left_out``, the fixes that help (``advice``, best first), those ``dropped``, and
    ``notes``."""

    metric: str
    before: float
    samples: int
    left_out: int
    advice: list[Fix] = field(default_factory=list)
    dropped: list[Fix] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    confidence: dict[str, Any] | None = None  # the kept fixes' order: stable top-k, samples, resamples

    optional = ("confidence",)


def helps(before: float, after: float) -> bool:
    """``after`` recovers at least :data:`MIN_SHARE` of what ``before`` misses to 1 (and is higher)."""
    return math.isfinite(after) and after > before and after - before >= MIN_SHARE * (1.0 - before)


def describe(ir: QIR, name: str) -> str:
    """A quantizer with the ops it feeds (``relu2_out_calib (feeds dw3, add4)``), or an op with
    its quantizers (``add4 (quantizers relu2_out_calib, relu3_out_calib)``): reports name both."""
    if name in {c.name for c in ir.calibrations()}:
        return f"{name} (feeds {', '.join(ir.calibration(name).feeds) or '-'})"
    cals = [c.name for c in ir.calibrations() if name in c.feeds]
    return f"{name} (quantizers {', '.join(cals)})" if cals else name


# ------------------------------------------------------------------------------------------ commands
def _selector(ir: QIR, names: Sequence[str]) -> list[str]:
    """set-mode's selector for exactly ``names``: ``--all`` or ``--role R`` when that is what they
    are, else ``--nodes`` (a QirError when that list would select other quantizers too)."""
    from qir.passes.lib.selection import select_calibrations

    wanted = set(names)
    if wanted == {c.name for c in ir.calibrations()}:
        return ["--all"]
    for role in ("activation", "weight"):
        if wanted == {c.name for c in ir.calibrations(role)}:
            return ["--role", role]
    if any("," in n for n in names) or {c.name for c in select_calibrations(ir, names)} != wanted:
        raise QirError(f"a --nodes list of {', '.join(names)} would select other calibration nodes too")
    return ["--nodes", ",".join(names)]


def _groups(changes: Mapping[str, str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node, change in sorted(changes.items()):
        out.setdefault(change, []).append(node)
    return out


def _set_mode_args(change: str) -> list[str]:
    mode, _, threshold = change.partition("@")
    return (["--mode", mode] if mode else []) + (["--threshold", threshold] if threshold else [])


def command(ir: QIR, model: str, output: str, changes: Mapping[str, str] | None = None, *,
            recalibrate: str | None = None, data: str | None = None) -> str:
    """The shell command that writes ``output``: ``model`` with ``changes`` (calibration node ->
    ``int16``/``float``/``@T``...) or recalibrated with method ``recalibrate`` on ``data``
    (see the module docstring)."""
    if recalibrate:
        argv = ["qir", "pipeline", model, f"calibrate{{method={recalibrate}}}", "--data", str(data), "-o", output]
        return shlex.join(argv)
    groups = _groups(changes or {})
    if len(groups) == 1:
        (change, names), = groups.items()
        return shlex.join(["qir", "set-mode", model, *_selector(ir, names), *_set_mode_args(change), "-o", output])
    steps = []
    for change, names in groups.items():
        flag, *value = _selector(ir, names)  # the same selector as set-mode's options
        option = "all=True" if flag == "--all" else f"role={value[0]}" if flag == "--role" else f'nodes="{value[0]}"'
        mode, _, threshold = change.partition("@")
        options = [option] + ([f"mode={mode}"] if mode else []) + ([f"threshold={threshold}"] if threshold else [])
        steps.append("set-mode{" + ",".join(options) + "}")
    return shlex.join(["qir", "pipeline", model, ",".join(steps), "-o", output])


def _output_names(model: str, count: int, tool: str) -> list[str]:
    """``count`` new files beside ``model``: ``<stem>_<tool>_fix<k>.onnx``, skipping names that exist."""
    path = Path(model)
    names, k = [], 0
    while len(names) < count:
        k += 1
        out = path.with_name(f"{path.stem}_{tool}_fix{k}.onnx")
        if not out.exists():
            names.append(str(out))
    return names


# --------------------------------------------------------------------------------------- measuring
def measure(ir: QIR, data: Any, changes: Sequence[Mapping[str, str]], *, data_num: int | None = None,
            runtime: str = Runtime.ORT, progress: bool = True) -> Measured:
    """The output cosine (vs the float model, mean over samples) of ``ir`` as it is and with each
    of ``changes``, on the engine."""
    from qir.runtimes.engine import Engine, Variant

    variants = [Variant("as it is", {})] + [Variant(f"fix {i}", dict(ch)) for i, ch in enumerate(changes)]
    with Engine(ir, data, runtime=runtime, reference="quantized", metrics=[METRIC], data_num=data_num,
                progress=progress and "measure fixes") as engine:
        result = engine.evaluate(variants)
    table = result.per_variant()
    return Measured(table["as it is"][METRIC], [table[v.name][METRIC] for v in variants[1:]], len(engine.samples),
                    len(result.left_out), result.per_sample(METRIC))


def _recalibrated(ir: QIR, data: Any, method: str, *, data_num: int | None, runtime: str, progress: bool) -> float:
    """The output cosine of ``ir`` calibrated again with ``method`` on ``data`` (as ``qir pipeline
    MODEL 'calibrate{method=M}' --data DATA`` does), measured as :func:`measure` does."""
    from qir.passes.calibrate import CalibratePass

    clone = ir.clone()
    CalibratePass(data, method, runtime=runtime, progress=progress)(clone)
    return measure(clone, data, [], data_num=data_num, runtime=runtime, progress=False).before


# -------------------------------------------------------------------------------------- candidates
def _float_abs_max(ir: QIR, data: Any, names: Sequence[str], data_num: int | None, runtime: str) -> dict[str, float]:
    """Max |x| at the inputs of the quantizers ``names`` in the float model (what calibration sees)."""
    from qir.api import run
    from qir.data import model_samples

    inputs = {n: ir.calibration(n).input for n in names}
    found = dict.fromkeys(names, 0.0)
    for sample in model_samples(ir, data, data_num) if names else ():
        got = run(ir, sample, runtime=runtime, level="float", capture=sorted(set(inputs.values())))
        for n, v in inputs.items():
            x = np.abs(np.asarray(got[v], np.float64))
            x = x[np.isfinite(x)]
            found[n] = max(found[n], float(x.max()) if x.size else 0.0)
    return found


def _clipping(ir: QIR, results: Mapping[str, Any], data: Any, data_num: int | None,
              runtime: str) -> dict[str, tuple[float, float, float]]:
    """Activation quantizers clipping more than CLIP_SHARE of their input in the calibrated model
    (the distribution and channel-wise steps): ``{name: (share, threshold, max |x|)}``, max |x|
    over that input and the same value in the float model (which calibration reads, and which
    upstream fixes move the input towards)."""
    activations = {c.name for c in ir.calibrations("activation")}
    found: dict[str, tuple[float, float, float]] = {}
    for name, e in (results.get("channelwise") or {}).items():
        if e.get("clipped_fraction") is not None and e.get("channel_abs_max"):
            found[name] = (e["clipped_fraction"], e["threshold"], max(e["channel_abs_max"]))
    for name, e in (results.get("distribution") or {}).items():
        if e.get("type") == "activation" and e.get("clipped_fraction") is not None and "abs_max" in e.get("input", {}):
            found[name] = (e["clipped_fraction"], e["threshold"], e["input"]["abs_max"])
    found = {n: v for n, v in found.items() if n in activations and v[0] > CLIP_SHARE}
    floats = _float_abs_max(ir, data, list(found), data_num, runtime)
    return {n: (share, t, max(amax, floats[n])) for n, (share, t, amax) in found.items() if max(amax, floats[n]) > 0}


def _sensitive(results: Mapping[str, Any], pick_threshold: float) -> dict[str, float | None]:
    """The most sensitive quantizers of each type: ``{name: node-sensitivity cosine or None}``."""
    out: dict[str, float | None] = {}
    for nt in ("activation", "weight"):
        rows = ((results.get("sensitivity") or {}).get(nt) or {}).get("rows", [])[:TOP]
        for r in rows:
            value = r.get(METRIC)
            if value is None or value < pick_threshold:
                out[r["node"]] = value
    return out


def _node_candidates(ir: QIR, results: Mapping[str, Any], pick_threshold: float, clipping: dict) -> list[Fix]:
    """Clipping, rounding and outlier-channel candidates (see the module docstring); ``clipping``
    from :func:`_clipping`."""
    found = []
    for name, (share, threshold, amax) in clipping.items():
        t = covering_threshold(amax)
        found.append(Fix(cause="clipping", changes={name: f"@{t!r}"}, fix=f"a fixed threshold {t!r}",
                         why=f"{describe(ir, name)} clips {100 * share:.2g}% of its input "
                             f"(threshold {threshold:.4g}, max |x| {amax:.4g})"))
    if len(clipping) > 1:
        changes = {n: f"@{covering_threshold(v[2])!r}" for n, v in clipping.items()}
        found.append(Fix(changes=changes, fix="fixed thresholds covering each one's data ("
                         + ", ".join(f"{n} {c[1:]}" for n, c in changes.items()) + ")", cause="clipping",
                         why=f"{len(clipping)} activation quantizers clip their input"))
    outliers = {n: e["outlier_channels"] for n, e in (results.get("channelwise") or {}).items()
                if e.get("outlier_channels") and n in {c.name for c in ir.calibrations("activation")}}
    for name, value in {**_sensitive(results, pick_threshold), **dict.fromkeys(outliers)}.items():
        if ir.calibration(name).mode is not CalibMode.INT8:
            continue
        if name in outliers:
            why = (f"{describe(ir, name)} has outlier channels {outliers[name][:8]} (max |x| over 4x the median "
                   "channel): one per-tensor step is coarse for the others")
        else:
            why = f"{describe(ir, name)} is sensitive" + ("" if value is None else f" (only it quantized: cosine {value:.5f})")
        found.append(Fix(changes={name: "int16"}, fix="int16 (the same range, 256x finer steps)",
                         cause="outlier channels" if name in outliers else "rounding", why=why))
    return found


def _spread_candidates(ir: QIR, results: Mapping[str, Any], pick_threshold: float, before: float) -> list[Fix]:
    """Candidates that change many quantizers (see the module docstring)."""
    from qir.passes.lib.selection import calibrations_of

    sa = results.get("sensitivity_analysis") or {}
    ops, cumulative = sa.get("nodes") or [], sa.get("cumulative") or []
    found = []
    reach = next((k for k, v in enumerate(cumulative[1:], 1) if v >= pick_threshold), None)
    if ops:
        chosen = ops[:reach or len(ops)]
        cals = [c for op in chosen for c in calibrations_of(ir, op)]
        why = f"the sensitivity analysis's {len(chosen)} most sensitive op(s) ({', '.join(describe(ir, o) for o in chosen)})"
        found.append(Fix(cause="spread error", changes={c.name: "float" for c in cals}, fix="their quantizers back to float",
                         why=why))
        int8 = {c.name: "int16" for c in cals if c.mode is CalibMode.INT8}
        if int8:
            found.append(Fix(cause="spread error", changes=int8, fix="their int8 quantizers to int16", why=why))
    every = {c.name: "int16" for c in ir.calibrations("activation") if c.mode is CalibMode.INT8}
    if len(every) > 1:
        found.append(Fix(cause="spread error", changes=every, fix="every int8 activation quantizer to int16",
                         why="the error is spread over many activations"))
    if (ops and not reach) or (not ops and before < pick_threshold):
        own = (ir.meta.get("calibration") or {}).get("method")
        method = "max" if own == "mix" else "mix"
        why = (f"even all {len(ops)} sensitive op(s) in float reach only cosine {cumulative[-1]:.5f}" if ops else
               f"no single op is below cosine {pick_threshold} while the model is at {before:.5f}")
        found.append(Fix(cause="spread error", recalibrate=method, changes=None, why=why + ": the error is spread",
                         fix=f"calibrating again with method {method}" + (f" (it was calibrated with {own})" if own else "")))
    return found


def _unique(candidates: list[Fix]) -> list[Fix]:
    seen, out = set(), []
    for c in candidates:
        key = (tuple(sorted((c.changes or {}).items())), c.recalibrate)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


# -------------------------------------------------------------------------------------------- advise
def advise(ir: QIR, results: RunallResults, data: Any, *, model_path: str | None = None, data_num: int | None = 1,
           runtime: str = Runtime.ORT, pick_threshold: float = 0.999, progress: bool = True) -> Advice:
    """Measured advice for runall's ``results`` on ``ir`` (see the module docstring). Each
    :class:`Fix` holds ``cause``, ``why``, ``fix``, ``changes`` (or ``recalibrate``), ``before``,
    ``after``, ``gain``; kept ones also ``command``, ``output`` and ``text`` (one line); dropped
    ones ``reason``."""
    model = str(model_path) if model_path else "CALIBRATED_MODEL.onnx"
    notes = [] if model_path else ["runall was given an IR, not a file: the commands name CALIBRATED_MODEL.onnx; "
                                   "save the IR (qir.save) and use that path, or pass model_path="]
    cumulative = (results.get("sensitivity_analysis") or {}).get("cumulative") or [0.0]  # [0]: the model as it is
    clipping = _clipping(ir, results, data, data_num, runtime)
    candidates = _unique(_node_candidates(ir, results, pick_threshold, clipping)
                         + _spread_candidates(ir, results, pick_threshold, cumulative[0]))
    variants = [c for c in candidates if c.changes is not None]
    measured = measure(ir, data, [c.changes for c in variants], data_num=data_num, runtime=runtime,
                       progress=progress)
    gains: dict[int, list[float]] = {}  # id(fix) -> its gain per sample
    for i, (c, after) in enumerate(zip(variants, measured.after)):
        c.after = after
        if measured.per_sample:
            gains[id(c)] = [a - b for a, b in zip(measured.per_sample[f"fix {i}"], measured.per_sample["as it is"])]
    for c in (c for c in candidates if c.changes is None):
        if isinstance(data, (str, Path)):
            c.after = _recalibrated(ir, data, c.recalibrate, data_num=data_num, runtime=runtime, progress=progress)
        else:
            notes.append(f"{c.fix} was not tried: the data is not a file or folder a command could name")
    tried = [c for c in candidates if c.after is not None]
    for c in tried:
        c.before, c.gain = measured.before, c.after - measured.before
    tried += _transforms(ir, data, data_num, runtime, notes)
    kept, dropped, confidence = _keep(ir, tried, model, data, gains)
    return Advice("output cosine", measured.before, measured.samples, measured.left_out, kept, dropped, notes,
                  confidence)


def _transforms(ir: QIR, data: Any, data_num: int | None, runtime: str, notes: list[str]) -> list[Fix]:
    """The repair transforms proposed where their cause is seen, measured
    (:mod:`qir.tools.transform_advice`); a note instead when they cannot be."""
    from qir.tools.transform_advice import measure_transforms, transform_candidates

    try:
        found = transform_candidates(ir, data, data_num=data_num, runtime=runtime)
        if found and not isinstance(data, (str, Path)):
            notes.append(f"{', '.join(c.fix for c in found)} not tried: the data is not a file or folder a "
                         "command could name")
            return []
        measure_transforms(ir, data, found, data_num=data_num, runtime=runtime)
    except QirError as exc:
        notes.append(f"the repair transforms were not tried: {exc}")
        return []
    return list(found)


def _command(ir: QIR, c: Fix, model: str, output: str, data: Any) -> str:
    """A kept fix's command: :func:`command`, or a transform's."""
    from qir.tools.transform_advice import TransformFix, transform_command

    if isinstance(c, TransformFix):
        return transform_command(ir, c.transform, c.step, model, output, data)
    return command(ir, model, output, c.changes, recalibrate=c.recalibrate, data=data)


def _rank(kept: list[Fix], gains: Mapping[int, list[float]]) -> dict[str, Any] | None:
    """The kept fixes' order, bootstrapped over their per-sample gains (see the module
    docstring); a recalibration (measured as a whole: no per-sample gains) is left out of it."""
    from qir.passes.lib.confidence import rank_confidence

    ranked = [c for c in kept if id(c) in gains]
    if not ranked:
        return None
    conf = rank_confidence({str(i): gains[id(c)] for i, c in enumerate(ranked)}, descending=True)
    for c, row in zip(ranked, conf.rows):
        c.gain_low, c.gain_high, c.rank_low, c.rank_high = row.low, row.high, row.rank_low, row.rank_high
    first = ranked[0]
    if conf.stable_top_k is not None:  # (one sample: unknown)
        first.settled = conf.named_alone("0")
        if not first.settled:
            first.peers = [i + 1 for i, row in enumerate(conf.rows[1:], 1) if row.rank_low <= conf.rows[0].rank_high]
    return {k: v for k, v in conf.to_json().items() if k != "rows"}


def _text(c: Fix) -> str:
    """A kept fix's line (its command last, so that it pastes)."""
    interval = f", 95% interval {c.gain_low:+.5f} to {c.gain_high:+.5f}" if c.gain_low is not None else ""
    note = ""
    if c.settled:
        note = " (the best fix in >= 95% of bootstrap resamples)"
    elif c.settled is False:
        note = (f" (not settled as the best: fix(es) {', '.join(map(str, c.peers))} may do as well on other samples)"
                if c.peers else " (not settled as the best)")
    return (f"{c.cause}: {c.why}; {c.fix}: output cosine {c.before:.5f} -> {c.after:.5f} ({c.gain:+.5f}{interval})"
            f"{note}: {c.command}")


def _keep(ir: QIR, tried: list[Fix], model: str, data: Any,
          gains: Mapping[int, list[float]]) -> tuple[list[Fix], list[Fix], dict[str, Any] | None]:
    """Split ``tried`` into kept fixes (ordered, with their confidence, commands and text) and
    dropped ones; and the kept order's confidence (:func:`_rank`)."""
    dropped = [replace(c, reason="does not help") for c in tried if not helps(c.before, c.after)]
    kept = []
    for c in sorted((c for c in tried if helps(c.before, c.after)), key=lambda c: (-c.gain, CAUSES.index(c.cause))):
        try:
            _command(ir, c, model, "OUT", data)
        except QirError as exc:
            dropped.append(replace(c, reason=str(exc)))
        else:
            kept.append(c)
    confidence = _rank(kept, gains)
    for c, out in zip(kept, _output_names(model, len(kept), "runall")):
        c.command = _command(ir, c, model, out, data)
        c.output = out
        c.text = _text(c)
    return kept, dropped, confidence


# -------------------------------------------------------------------------------- qir compare's advisor
def _finding_fix(ir: QIR, run: Any, finding: Mapping[str, Any]) -> tuple[dict[str, str], str] | None:
    """The change that would fix an advisor finding (:func:`qir.passes.layer_compare.advise`), and
    its description; None for findings without one (NaN, an asymmetric input, minor clipping)."""
    from qir.calibration import QRANGE
    from qir.kinds import NodeKind
    from qir.passes.layer_compare import row_op
    from qir.passes.lib.fusion import unit_of
    from qir.runtimes.numerics import clip_only

    kind, cal = finding["kind"], finding.get("calibration")
    if kind == "scale does not cover data":
        t = covering_threshold(finding["fixed_threshold"])
        return {cal: f"@{t!r}"}, f"a fixed threshold {t!r}"
    if kind == "range too large for dtype":
        mode = "int16" if ir.calibration(cal).mode is CalibMode.INT8 else "float"
        return {cal: mode}, mode
    if kind == "output not high precision":
        return {cal: "float"}, "float"
    if kind == "collapse":  # the damage's whole path: what, if anything, precision can restore
        ops = {row_op(name) for name in finding.get("downstream", [])}
        changes = {c.name: "int16" for c in ir.calibrations("activation")
                   if c.mode is CalibMode.INT8 and ops & set(c.feeds)}
        return (changes, f"int16 for the {len(changes)} int8 activation quantizers from {finding['layer']} on"
                ) if changes else None
    layer = row_op(str(finding.get("layer")))  # an op's name, or "name[k]" for its k-th output
    if not kind.startswith("own error") or not ir.has_node(layer):
        return None
    unit = {op.name for op in unit_of(ir, ir.op(layer))}  # its fusion group: the quantizers feed the group's ops
    cals = [c for c in ir.calibrations() if unit & set(c.feeds) and c.mode in QRANGE]
    if kind == "own error: rounding":
        changes = {c.name: "int16" for c in cals if c.mode is CalibMode.INT8}
        return (changes, "int16 for its int8 input quantizers") if changes else None
    changes = {}
    for c in cals:  # activations: a weight's threshold is its own max |W| per channel
        x = None if ir.value(c.input).kind is NodeKind.WEIGHT else run.base(c.input)
        if x is None or not np.any(clip_only(c, np.asarray(x)) != x):
            continue
        f = np.abs(np.asarray(x, np.float64))
        f = f[np.isfinite(f)]
        if f.size and float(f.max()) > 0:
            changes[c.name] = f"@{covering_threshold(float(f.max()))!r}"
    return (changes, "fixed thresholds covering its clipped inputs") if changes else None


def measure_findings(run: Any, findings: list[dict], *, model_path: str | None = None, runtime: str = Runtime.ORT,
                     values: Sequence[str] = ()) -> None:
    """Measure the fix of each advisor finding that has one on the layer run's sample (output
    cosine of the analysis model with that change against the baseline's outputs, mean over the
    outputs and ``values``, activations scored beside them; ``scored`` names what was scored when
    that is more than the outputs) and add it to the finding as ``fix``: ``{"changes", "fix", "before", "after", "gain",
    "helps"}`` plus, when it helps (:func:`helps`), its ``rank`` (best first), ``output`` and the
    ``command`` that writes it; a fix that does not help is kept as tried (``helps`` False) and gets
    no command. Logs each."""
    from qir import metrics as qmetrics
    from qir.runtimes.engine import evaluate_plainly

    ir = run.analysis
    outputs = [o for o in (*ir.outputs, *values) if run.base(o) is not None]
    fixes = [(f, fix) for f in findings if outputs and (fix := _finding_fix(ir, run, f))]
    scored = "cosine of the outputs and " + ", ".join(values) if values else None
    if not fixes:
        return

    def score(changes: Mapping[str, str]) -> float:
        got = evaluate_plainly(ir, run.sample, changes, reference="quantized", compare=outputs, runtime=runtime)
        return float(np.mean([qmetrics.compute([METRIC], run.base(o), got[o])[METRIC] for o in outputs]))

    model = str(model_path) if model_path else "CALIBRATED_MODEL.onnx"
    before = score({})
    if not math.isfinite(before):
        logger.warning("advisor: the analysis model's outputs are not finite on the bad case; its fixes are not measured")
        return
    done: dict[tuple, Fix] = {}  # the same change for two findings: measured once, one command
    for finding, (changes, text) in fixes:
        key = tuple(sorted(changes.items()))
        if key in done:
            finding["fix"] = replace(done[key], fix=text)
            continue
        after = score(changes)
        finding["fix"] = done[key] = Fix(changes=changes, fix=text, before=before, after=after, gain=after - before,
                                         helps=helps(before, after), scored=scored)
        logger.info("advisor: %s for %s: output cosine %.5f -> %.5f%s", text, finding["layer"], before, after,
                    "" if finding["fix"].helps else " (does not help)")
    _name_fixes(ir, model, findings, list(done.values()))


def _name_fixes(ir: QIR, model: str, findings: list[dict], measured: list[Fix]) -> None:
    """Give each fix that helps its command, output file and ``rank``: numbered as they are shown,
    best first (``<stem>_compare_fix1.onnx`` is the best); a finding sharing a fix gets the same."""
    helping = []
    for fix in sorted((f for f in measured if f.helps), key=lambda f: -f.gain):
        try:
            command(ir, model, "OUT", fix.changes)
        except QirError as exc:
            fix.helps, fix.reason = False, str(exc)
        else:
            helping.append(fix)
    for rank, (fix, out) in enumerate(zip(helping, _output_names(model, len(helping), "compare")), 1):
        fix.rank, fix.output, fix.command = rank, out, command(ir, model, out, fix.changes)
    by_changes = {tuple(sorted(f.changes.items())): f for f in measured}
    for finding in findings:
        fix = finding.get("fix")
        if fix:
            shared = by_changes[tuple(sorted(fix.changes.items()))]
            fix.helps, fix.reason, fix.rank, fix.output, fix.command = (shared.helps, shared.reason, shared.rank,
                                                                        shared.output, shared.command)


def fix_line(fix: Fix, with_command: bool = True) -> str:
    """One line for a measured advisor fix (see :func:`measure_findings`); a fix that helps is
    named by its rank (``fix 2``), its command left out unless ``with_command``."""
    numbers = f"{fix.scored or 'output cosine'} on the bad case {fix.before:.5f} -> {fix.after:.5f} ({fix.gain:+.5f})"
    if fix.command:
        return (f"fix {'' if fix.rank is None else fix.rank} ({fix.fix}), measured: {numbers}"
                + (f": {fix.command}" if with_command else " (its command is in the list of fixes)"))
    return f"tried {fix.fix}: {numbers}: {fix.reason or 'does not help'}, not suggested"
