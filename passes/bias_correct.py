"""``bias-correct``: remove the expected output shift that quantizing a layer's weights causes
(empirical bias correction, Nagel et al. 2019 §4.2; AIMET's and NNCF's "bias correction")."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from qir.data import model_samples
from qir.errors import InputError, QirError
from qir.execution import DEFAULT_MARCH, Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibRole, NodeKind
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.repair import (
    RepairReport,
    Site,
    Skipped,
    all_int8_error,
    check_repair_options,
    finished,
    float_captures,
    note_change,
    run_step,
    scale_along,
)
from qir.passes.lib.rescale import Edit, apply_edits
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.numerics import apply_calibration
from qir.runtimes.numpy_ref.interpreter import execution_plan
from qir.runtimes.numpy_ref.registry import lookup

__all__ = ["BiasCorrectPass"]

logger = logging.getLogger(__name__)

OP_TYPES = ("Conv", "Gemm", "MatMul")
MODES = ("weights", "empirical")


@dataclass
class _Layer:
    op: OpRecord
    weight_cal: CalibRecord
    target: Edit  # the bias to correct: its op, slot and current contents (zeros where absent)
    axis: int  # the output-channel axis of the op's output
    scale: float  # the bias counts `scale` times in the output (Gemm's beta)


@register_pass
class BiasCorrectPass(Pass):
    """Subtract from each layer's bias the mean output error its quantized weights cause.

    Runs on a **calibrated** IR (after ``calibrate``): it reads each weight's calibration node to
    know how the weight is quantized. An uncalibrated IR is refused.

    Rules:

    1. A layer is a Conv, Gemm or MatMul (``op_types``) whose input 1 is a constant behind a WEIGHT
       calibration node that quantizes (int8/int16) and whose input 0 is an activation.
    2. Its shift, per output channel c, a mean over the calibration samples and every other
       output position, streamed (one sample at a time, nothing kept but running sums):

       * ``mode="weights"`` (default): ``δ_c = E[(W_q x)_c] - E[(W x)_c] = E[((W_q - W) x)_c]``
         with x the layer's float input, computed by the op's numpy kernel on ``W_q - W``
         without bias: the shift the layer's own weight quantization causes. One float pass.
       * ``mode="empirical"``: ``δ_c = E[y_q,c] - E[y_c]``, the layer's output (after its bias)
         in the fake-quant model, corrections upstream already applied, against the original
         float model: the whole mean shift arriving there, activation quantization and upstream
         layers included (AIMET's empirical bias correction). Layers are corrected in waves, a
         layer once every target layer upstream of it is done; one fake-quant pass over the
         data per wave, so nearly one per layer on a chain-like network: minutes on a real one.
    3. The bias becomes ``b - δ / beta`` (beta: Gemm's, else 1): Conv's and Gemm's bias input
       (added where the op has none: both can take one); for a MatMul, the constant of the Add
       that is the only reader of its output (through activation calibration nodes). A MatMul
       without such an Add is skipped and reported.
    4. The float model changes by design (its outputs move by the corrections, which are of the
       size of the weight quantization's own error); the quantized model's outputs move towards
       the original float ones. Changed ops carry a note; with ``measure`` the report holds the
       fake-quant error (as calibrated) on the calibration data before and after, both against
       the float outputs of the model as it was given.
    """

    name = "bias-correct"

    def __init__(self, data: Any = None, op_types: tuple[str, ...] | list[str] = OP_TYPES, *,
                 mode: str = "weights", runtime: str = Runtime.ORT, limit: int | None = None,
                 measure: bool = True, march: str = DEFAULT_MARCH) -> None:
        check_repair_options(self.name, data, "output shifts", op_types, OP_TYPES, mode=(mode, MODES))
        self.data, self.op_types, self.mode = data, tuple(op_types), mode
        self.runtime, self.limit, self.measure, self.march = runtime, limit, bool(measure), march
        self.options = {"op_types": list(self.op_types), "mode": mode, "runtime": runtime}
        self.report: RepairReport | None = None

    def run(self, ir: QIR) -> PassResult:
        if not ir.calibrations(CalibRole.WEIGHT):
            raise InputError("bias-correct runs on a calibrated model (after calibrate): it needs each weight's "
                             "calibration node; run insert-calibration and calibrate first")
        report = RepairReport(self.name)
        layers = self._layers(ir, report.skipped)
        original = ir.clone()  # the float reference: correcting biases moves the float outputs too
        if layers and self.measure:
            report.before = self._error(ir, original)
        if self.mode == "weights":
            shifts = self._shifts(ir, layers)
            apply_edits(ir, [_corrected(layer, shifts[layer.op.name]) for layer in layers])
        else:
            shifts = self._empirical(ir, layers, original)
        for layer in layers:
            delta = shifts[layer.op.name]
            detail = {"shift_max": float(np.abs(delta).max()), "shift_mean": float(np.abs(delta).mean()),
                      "bias_of": layer.target.op, "mode": self.mode, "weight_mode": layer.weight_cal.mode.value}
            note_change(ir, layer.op, self.name, detail)
            report.changed.append(Site(layer.op.name, [layer.target.op], detail))
        self.report = report
        return finished(ir, report, (lambda: self._error(ir, original)) if self.measure else None,
                        "layer(s) corrected")

    def _error(self, ir: QIR, original: QIR):
        return all_int8_error(ir, self.data, march=self.march, runtime=self.runtime, limit=self.limit,
                              reference=original)

    def _layers(self, ir: QIR, skipped: list[Skipped]) -> list[_Layer]:
        layers = []
        for op in ir.ops():
            if op.op_type not in self.op_types or op.domain or len(op.inputs) < 2:
                continue
            cal = ir.producer(op.inputs[1])
            if not isinstance(cal, CalibRecord) or cal.role is not CalibRole.WEIGHT or not cal.quantizes:
                continue
            if ir.value(cal.input).kind is not NodeKind.WEIGHT or ir.value(op.inputs[0]).kind is NodeKind.WEIGHT:
                continue
            found = _bias_target(ir, op)
            if isinstance(found, str):
                skipped.append(Skipped(op.name, found))
                continue
            target, axis, scale = found
            layers.append(_Layer(op, cal, target, axis, scale))
        return layers

    def _shifts(self, ir: QIR, layers: list[_Layer]) -> dict[str, np.ndarray]:
        sums: dict[str, np.ndarray] = {}
        if not layers:
            return sums
        deltas = {}
        for layer in layers:
            w = ir.weight_array(layer.weight_cal.input)
            deltas[layer.op.name] = apply_calibration(layer.weight_cal, np.asarray(w, np.float32)) - w
        count = 0
        inputs = sorted({layer.op.inputs[0] for layer in layers})
        for got in float_captures(ir, self.data, inputs, runtime=self.runtime, limit=self.limit):
            count += 1
            for layer in layers:
                y = _run_op(ir, layer.op, got[layer.op.inputs[0]], deltas[layer.op.name])
                sums[layer.op.name] = sums.get(layer.op.name, 0.0) + _channel_mean(y, layer.axis)
        return {name: s / count for name, s in sums.items()}


    def _empirical(self, ir: QIR, layers: list[_Layer], original: QIR) -> dict[str, np.ndarray]:
        """Rule 2's empirical shifts, applied; returns them. One fake-quant pass of the numpy
        runtime over every calibration sample at once, op by op: when a layer's output is
        computed on every sample, its shift against the float model's mean is measured and
        removed from that output at once (``y - δ`` is what the corrected bias gives), so every
        layer after it sees the layers upstream corrected. Where the numpy runtime cannot run the
        model, the waves of :meth:`_empirical_waves` instead."""
        out = {layer.op.name: ir.op(layer.target.op).outputs[0] for layer in layers}
        at = {out[layer.op.name]: layer for layer in layers}
        try:
            plan = execution_plan(ir, frozenset(ir.outputs) | frozenset(at), fold_batchnorm=False)
        except QirError as exc:
            logger.info("bias-correct: the numpy runtime cannot run %s (%s): correcting in waves", ir.name, exc)
            return self._empirical_waves(ir, layers, original)
        reference = self._means(original, Level.FLOAT, {v: layer.axis for v, layer in at.items()})
        envs = [{**plan.weights, **check_feeds(ir, s)} for s in model_samples(ir, self.data, self.limit)]
        done: dict[str, np.ndarray] = {}
        for step in plan.steps:
            run_step(step, envs)
            for name in step.outputs:
                layer = at.get(name)
                if layer is None:
                    continue
                delta = np.mean([_channel_mean(env[name], layer.axis) for env in envs], axis=0) - reference[name]
                done[layer.op.name] = delta
                for env in envs:
                    y = env[name]
                    env[name] = (y - scale_along(delta, layer.axis, y.ndim)).astype(y.dtype)
            for env in envs:
                for name in step.free:
                    del env[name]
        apply_edits(ir, [_corrected(layer, done[layer.op.name], ir) for layer in layers])
        return done

    def _empirical_waves(self, ir: QIR, layers: list[_Layer], original: QIR) -> dict[str, np.ndarray]:
        """Rule 2's empirical shifts, applied wave by wave (a layer once every target layer
        upstream of it is done; one fake-quant pass over the data per wave); returns them."""
        out = {layer.op.name: ir.op(layer.target.op).outputs[0] for layer in layers}
        reference = self._means(original, Level.FLOAT, {out[layer.op.name]: layer.axis for layer in layers})
        names = {layer.op.name for layer in layers}
        upstream = {layer.op.name: names & nx.ancestors(ir.graph, layer.op.name) for layer in layers}
        done: dict[str, np.ndarray] = {}
        while len(done) < len(layers):
            wave = [layer for layer in layers if layer.op.name not in done and upstream[layer.op.name] <= done.keys()]
            got = self._means(ir, Level.FAKEQUANT, {out[layer.op.name]: layer.axis for layer in wave})
            edits = []
            for layer in wave:
                value = out[layer.op.name]
                done[layer.op.name] = got[value] - reference[value]
                edits.append(_corrected(layer, done[layer.op.name], ir))
            apply_edits(ir, edits)
        return done

    def _means(self, ir: QIR, level: Level, values: dict[str, int]) -> dict[str, np.ndarray]:
        """Per-channel means (channel axis per value) over the calibration samples."""
        rt = get_runtime(self.runtime, level=level)
        sums: dict[str, np.ndarray] = {}
        count = 0
        for sample in model_samples(ir, self.data, self.limit):
            got = rt.run(ir, check_feeds(ir, sample), capture=list(values))
            count += 1
            for v, axis in values.items():
                sums[v] = sums.get(v, 0.0) + _channel_mean(got[v], axis)
        return {v: s / count for v, s in sums.items()}


def _corrected(layer: _Layer, delta: np.ndarray, ir: QIR | None = None) -> Edit:
    """The layer's bias minus ``delta / beta``; with ``ir``, its bias as ``ir`` holds it now."""
    t = layer.target
    bias = t.array
    if ir is not None:
        inputs = ir.op(t.op).inputs
        if t.slot < len(inputs) and inputs[t.slot]:
            bias = ir.weight_array(inputs[t.slot])
    return Edit(t.op, t.slot, (bias.astype(np.float64) - delta.reshape(bias.shape) / layer.scale).astype(np.float32))


def _channel_mean(y: np.ndarray, axis: int) -> np.ndarray:
    y = np.asarray(y, np.float64)
    return np.moveaxis(y, axis, 0).reshape(y.shape[axis], -1).mean(axis=1)


def _bias_target(ir: QIR, op: OpRecord):
    """``(Edit with the current bias, output channel axis, beta)`` for rule 3, or why not."""
    out_rank = len(ir.value(op.outputs[0]).shape or ())
    if out_rank == 0:
        return "the rank of its output is unknown"
    w = ir.weight_array(ir.producer(op.inputs[1]).input)
    if op.op_type == "Conv":
        channels, axis, slot, scale = w.shape[0], 1, 2, 1.0
    elif op.op_type == "Gemm":
        channels = w.shape[0] if op.attrs.get("transB", 0) else w.shape[1]
        axis, slot, scale = out_rank - 1, 2, float(op.attrs.get("beta", 1.0))
    else:
        return _matmul_add(ir, op, w, out_rank)
    if len(op.inputs) > slot and op.inputs[slot]:
        if ir.value(op.inputs[slot]).kind is not NodeKind.WEIGHT:
            return "its bias is not a constant"
        b = ir.weight_array(op.inputs[slot])
        if b.size != channels or scale == 0.0:
            return "its bias is not one value per output channel"
        return Edit(op.name, slot, np.asarray(b)), axis, scale
    return Edit(op.name, slot, np.zeros(channels, np.float32)), axis, scale


def _matmul_add(ir: QIR, op: OpRecord, w: np.ndarray, out_rank: int):
    value = op.outputs[0]
    while True:
        readers = [r for r, _ in ir.uses(value)]
        if len(readers) == 1 and isinstance(readers[0], CalibRecord) and value not in ir.outputs:
            value = readers[0].output
            continue
        break
    if len(readers) != 1 or not isinstance(readers[0], OpRecord) or readers[0].op_type != "Add" or value in ir.outputs:
        return "a MatMul has no bias input, and no Add of a constant is the only reader of its output"
    add = readers[0]
    slot = 1 - add.inputs.index(value)
    const = add.inputs[slot]
    if ir.value(const).kind is not NodeKind.WEIGHT or ir.weight_array(const).size != w.shape[-1] or \
            ir.weight_array(const).shape[-1] != w.shape[-1]:
        return f"the Add after it ({add.name!r}) does not add a constant per output channel"
    return Edit(add.name, slot, np.asarray(ir.weight_array(const))), out_rank - 1, 1.0


def _run_op(ir: QIR, op: OpRecord, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``op``'s numpy kernel on ``x`` and ``weight``, without a bias."""
    spec = lookup(op.op_type, op.domain)
    kwargs = dict(op.attrs)
    if "_opset" in spec.context:
        kwargs["_opset"] = ir.opset
    if "_num_outputs" in spec.context:
        kwargs["_num_outputs"] = len(op.outputs)
    out = spec.fn(np.asarray(x, np.float32), weight, **kwargs)
    return out[0] if isinstance(out, tuple) else out
