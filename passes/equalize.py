"""``equalize``: cross-layer equalization of Conv pairs with high-bias absorption (Nagel et al.
2019, "Data-Free Quantization Through Weight Equalization and Bias Correction")."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from qir.errors import InputError
from qir.execution import DEFAULT_MARCH, Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.repair import RepairReport, Site, Skipped, all_int8_error, finished, float_captures, note_change
from qir.passes.lib.rescale import (
    HOMOGENEOUS,
    Edit,
    apply_edits,
    divide_channels,
    input_channel_absmax,
    multiply_input_channels,
    only_reader,
    power_of_two,
)
from qir.records import OpRecord

__all__ = ["EqualizePass"]

logger = logging.getLogger(__name__)

S_BOUNDS = (1e-4, 1e4)  # a dead channel must not push a weight to under- or overflow
NOT_HOMOGENEOUS = ("Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Mul", "Tanh", "Elu", "Selu", "Gelu",
                   "Softplus", "Mish", "Swish")


@dataclass
class _Pair:
    first: OpRecord
    act: OpRecord | None
    second: OpRecord

    @property
    def name(self) -> str:
        return f"{self.first.name} -> {self.second.name}"

    @property
    def between(self) -> str:
        """The value the second conv reads (the first's output, or the activation's)."""
        return self.second.inputs[0]


@register_pass
class EqualizePass(Pass):
    """Rescale the channels between two Convs so their ranges match.

    Runs on a **float** IR, after ``fold-bn`` (folded BatchNorms make the pairs visible) and
    before ``insert-calibration``; a calibrated IR is refused.

    Rules:

    1. A pair is Conv₁ → (Relu | LeakyRelu | PRelu | nothing) → Conv₂ (either may be depthwise or
       grouped), each value on the way read only by the next op, both weights constant.
       Where the op in between is not positively homogeneous (Clip, HardSwish, HardSigmoid,
       SiLU = x·Sigmoid(x), ...), the pair is skipped and reported: ``f(x / s) ≠ f(x) / s``.
    2. Per channel i between them, ``s_i = sqrt(r1_i · r2_i) / r2_i`` with r1_i = max|W₁| over
       output channel i and r2_i = max|W₂| over the entries reading input channel i (the paper's
       choice: both then have range sqrt(r1_i · r2_i)); with ``activations``, r1_i is instead the
       activation's channel range on the calibration data, which equalizes the per-tensor
       activation's channels against W₂ (what matters when weights are quantized per channel).
       Factors are clipped to [1e-4, 1e4], rounded to powers of two (exact in binary floating
       point) and 1 where a range is 0.
    3. W₁'s output channel i and its bias are divided by s_i, W₂'s input channel i multiplied:
       ``Conv₂(f(Conv₁(x) / s) · s) = Conv₂(f(Conv₁(x)))`` for homogeneous f (PRelu's per-channel
       slope is unaffected). Pairs are swept ``iterations`` times (chains share convs) or until
       no factor changes.
    4. High-bias absorption (``absorb_bias``, off by default; needs data, Relu between, Conv₂
       without padding): c_i = max(0, min of Conv₁'s output channel i on the calibration data);
       b₁ -= c, and b₂ += Σ_i c_i Σ_(spatial) W₂[:, i]. Exact wherever the pre-activation stays
       above its calibration minimum (all the calibration data); elsewhere Relu would have
       clipped below c_i, so the float function changes there: measured on PP-OCRv4 det, an
       unseen text image's output moved by 0.97 of its range. Hence off unless asked for.
    5. Changed ops carry a note; with data and ``measure`` the report holds the all-int8 error
       (max calibration, ``march``) on the calibration data before and after.
    """

    name = "equalize"

    def __init__(self, data: Any = None, iterations: int = 4, *, activations: bool = False,
                 absorb_bias: bool = False, march: str = DEFAULT_MARCH, runtime: str = Runtime.ORT,
                 limit: int | None = None, measure: bool = True) -> None:
        for flag, on, what in (("activations", activations, "activation ranges"),
                               ("absorb_bias", absorb_bias, "pre-activation minima")):
            if on and data is None:
                raise InputError(f"equalize{{{flag}=True}} needs calibration data to measure {what}; "
                                 "give it data=...")
        if int(iterations) < 1:
            raise InputError(f"equalize: iterations must be at least 1, got {iterations}")
        self.data, self.iterations, self.activations = data, int(iterations), bool(activations)
        self.absorb_bias = bool(absorb_bias)
        self.march, self.runtime, self.limit = march, runtime, limit
        self.measure = bool(measure) and data is not None
        self.options = {"iterations": self.iterations, "activations": self.activations,
                        "absorb_bias": self.absorb_bias, "march": march}
        self.report: RepairReport | None = None

    def run(self, ir: QIR) -> PassResult:
        if ir.calibrations():
            raise InputError("equalize runs on a float model, before insert-calibration (it changes weights that "
                             "calibration measures); put it earlier in the pipeline")
        report = RepairReport(self.name)
        pairs = _pairs(ir, report.skipped)
        if pairs and self.measure:
            report.before = self._error(ir)
        stats = self._stats(ir, pairs)
        total = {p.name: np.ones(len(input_channel_absmax(ir, p.second))) for p in pairs}
        for _ in range(self.iterations):
            if not any([self._equalize(ir, p, total, stats) for p in pairs]):
                break
        absorbed = self._absorb_all(ir, pairs, stats, total) if self.absorb_bias else {}
        for p in pairs:
            s = total[p.name]
            if np.all(s == 1.0) and p.name not in absorbed:
                report.skipped.append(Skipped(p.name, "already balanced (every factor rounds to 1)"))
                continue
            detail = {"s_min": float(s.min()), "s_max": float(s.max()), "channels_scaled": int(np.sum(s != 1.0)),
                      "between": p.act.op_type if p.act else None, "bias_absorbed": absorbed.get(p.name, 0)}
            for op in (p.first, p.second):
                note_change(ir, op, self.name, detail)
            report.changed.append(Site(p.name, [p.first.name, p.second.name], detail))
        self.report = report
        return finished(ir, report, (lambda: self._error(ir)) if self.measure else None, "pair(s) changed")

    def _error(self, ir: QIR):
        return all_int8_error(ir, self.data, march=self.march, runtime=self.runtime, limit=self.limit)

    def _stats(self, ir: QIR, pairs: list[_Pair]) -> dict[str, np.ndarray]:
        """Per channel: the activation's max |x| (``amax:<value>``) and Conv₁'s output minimum
        (``min:<value>``), streamed over the calibration data (only what the options need)."""
        wanted = ([p.between for p in pairs] if self.activations else []) + \
                 ([p.first.outputs[0] for p in pairs if _absorbable(ir, p)] if self.absorb_bias else [])
        out: dict[str, np.ndarray] = {}
        if not wanted:
            return out
        for got in float_captures(ir, self.data, sorted(set(wanted)), runtime=self.runtime, limit=self.limit):
            for v in set(wanted):
                x = np.moveaxis(np.asarray(got[v], np.float64), 1, 0).reshape(got[v].shape[1], -1)
                for key, m, f in ((f"amax:{v}", np.abs(x).max(axis=1), np.maximum),
                                  (f"min:{v}", x.min(axis=1), np.minimum)):
                    out[key] = m if key not in out else f(out[key], m)
        return out

    def _equalize(self, ir: QIR, p: _Pair, total: dict[str, np.ndarray], stats) -> bool:
        r2 = input_channel_absmax(ir, p.second)
        if self.activations:
            r1 = stats[f"amax:{p.between}"] / total[p.name]
        else:
            w1 = np.abs(ir.weight_array(p.first.inputs[1]).astype(np.float64))
            r1 = w1.reshape(w1.shape[0], -1).max(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.sqrt(r1 * r2) / r2
        s = power_of_two(np.clip(np.where(np.isfinite(s) & (r1 > 0) & (r2 > 0), s, 1.0), *S_BOUNDS))
        if np.all(s == 1.0):
            return False
        edits = divide_channels(ir, p.between, 1, s)
        if isinstance(edits, str):  # pairs were checked: only a bug gets here
            raise InputError(f"equalize: pair {p.name}: {edits}")
        apply_edits(ir, edits + [multiply_input_channels(ir, p.second, s)])
        total[p.name] = total[p.name] * s
        return True

    def _absorb_all(self, ir: QIR, pairs: list[_Pair], stats, total) -> dict[str, int]:
        done = {}
        for p in pairs:
            key = f"min:{p.first.outputs[0]}"
            if key not in stats or not _absorbable(ir, p):
                continue
            c = np.maximum(stats[key] / total[p.name], 0.0)
            if np.any(c > 0):
                apply_edits(ir, _absorb_edits(ir, p, c))
                done[p.name] = int(np.sum(c > 0))
        return done


def _pairs(ir: QIR, skipped: list[Skipped]) -> list[_Pair]:
    """Rule 1's pairs, and the skipped ones with their reasons."""
    pairs = []
    for second in ir.ops("Conv"):
        if not _const_weight(ir, second):
            continue
        x = second.inputs[0]
        p = ir.producer(x)
        if not isinstance(p, OpRecord) or only_reader(ir, x) is not second:
            continue
        act, first = None, p
        if p.op_type in HOMOGENEOUS:
            act, first = p, ir.producer(p.inputs[0])
            if not isinstance(first, OpRecord) or only_reader(ir, p.inputs[0]) is not act:
                continue
        elif p.op_type in NOT_HOMOGENEOUS:
            before = [ir.producer(v) for v in p.inputs if v]
            if any(isinstance(b, OpRecord) and b.op_type == "Conv" for b in before):
                skipped.append(Skipped(f"... -> {second.name}", f"{p.op_type} {p.name!r} in between is not positively "
                                       "homogeneous (f(x/s) != f(x)/s)"))
            continue
        if first.op_type != "Conv" or not _const_weight(ir, first):
            continue
        if ir.weight_array(first.inputs[1]).shape[0] != len(input_channel_absmax(ir, second)):
            continue
        pairs.append(_Pair(first, act, second))
    return pairs


def _const_weight(ir: QIR, op: OpRecord) -> bool:
    return len(op.inputs) > 1 and ir.value(op.inputs[1]).kind is NodeKind.WEIGHT and \
        all(not v or ir.value(v).kind is NodeKind.WEIGHT for v in op.inputs[2:])


def _absorbable(ir: QIR, p: _Pair) -> bool:
    """Rule 4's conditions: Relu between, Conv₁ with a bias, Conv₂ without padding."""
    pads = p.second.attrs.get("pads", [0])
    auto = p.second.attrs.get("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    return (p.act is not None and p.act.op_type == "Relu" and len(p.first.inputs) > 2 and bool(p.first.inputs[2])
            and not any(pads) and auto in ("NOTSET", "VALID"))


def _absorb_edits(ir: QIR, p: _Pair, c: np.ndarray) -> list[Edit]:
    """b₁ - c, and b₂ + Σ_i c_i Σ_spatial W₂[:, i] (a new bias input when Conv₂ has none)."""
    b1 = ir.weight_array(p.first.inputs[2])
    w2 = ir.weight_array(p.second.inputs[1]).astype(np.float64)
    groups = int(p.second.attrs.get("group", 1))
    out_ch, per_group = w2.shape[0], w2.shape[1]
    c_of = c.reshape(groups, per_group)[np.arange(out_ch) // (out_ch // groups)]  # (O, C/g)
    shift = (w2.reshape(out_ch, per_group, -1).sum(axis=2) * c_of).sum(axis=1)
    edits = [Edit(p.first.name, 2, (b1 - c).astype(b1.dtype))]
    if len(p.second.inputs) > 2 and p.second.inputs[2]:
        b2 = ir.weight_array(p.second.inputs[2])
        edits.append(Edit(p.second.name, 2, (b2 + shift).astype(b2.dtype)))
    else:
        edits.append(Edit(p.second.name, 2, shift.astype(np.float32)))
    return edits
