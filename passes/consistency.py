"""``consistency``: fake quantization against the integer level, value by value (Horizon's
consistency debugging; QuantAnalysis' "quantized" analysis model).

Both runs start from the same samples. For every activation calibration node in an integer mode
the quantized value is read as codes (``rint(x / s) + zp``) from the fake-quant run (what the
calibrated model computes) and from the integer run (what the march's NPU computes, per its
profile), and compared in output quantization steps:

* ``max_step``: the largest ``|Δcode|``; ``differ``: the share of codes that differ; ``cosine`` of
  the dequantized values (over all samples).
* ``own_max_step`` / ``own_differ``: the same, when its segment (the ops back to the previous
  calibration nodes: a fused GEMM + activation, a LUT op, ...) computes in integer from exactly
  the fake-quant values it reads (a third run, every quantized value forced to the fake-quant
  one: ``IntegerRuntime.run(forced=...)``). That is the deviation the segment introduces itself,
  whatever it inherits. ``introduced`` marks such nodes, and ``cause`` names the op family:
  ``requant rounding`` (GEMM, elementwise, pooling: the integer accumulator requantized instead of
  rounding a float), ``LUT approximation`` (table ops), ``accumulator overflow`` (the node's
  accumulator left the profile's width), ``float fallback`` (no integer kernel: the op ran in
  float on a CPU), ``float composite`` (Softmax & co., emulated in float by design). A node that
  differs only through its inputs is ``inherited``.

The bad case is the sample whose model output agrees least (lowest cosine between fake-quant and
integer outputs). A sample whose fake-quantized values hold NaN or Inf is left out with a warning
naming it (its ``output_cosine`` is None; the report's ``left_out``: ``{"<sample>": why}``), as
the engine and the bad-case search do: its codes would be garbage. None left is an InputError.
The pass returns the report (``PassResult.report``: the JSON form of the :class:`ConsistencyReport`
that :meth:`ConsistencyPass.compare` returns) and writes nothing (:mod:`qir.tools.reports.consistency`).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole
from qir.metrics import cosine_similarity, nonfinite_note
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.records import CalibRecord, OpRecord
from qir.runtimes.base import get_runtime
from qir.runtimes.integer import IntegerRuntime
from qir.runtimes.integer.kernels import FLOAT_COMPOSITES, INTEGER_KERNELS
from qir.runtimes.integer.qtensor import params_of
from qir.runtimes.march import OpClass, get_profile, op_class

__all__ = ["ConsistencyPass", "ConsistencyReport", "ConsistencyRow"]

logger = logging.getLogger(__name__)


@dataclass
class ConsistencyRow:
    """One quantized value: how its codes differ between fake quantization and the integer level."""

    node: str
    op: str | None
    op_type: str
    segment: list[str]
    mode: str
    max_step: int
    differ: float
    cosine: float
    own_max_step: int
    own_differ: float
    introduced: bool
    cause: str


@dataclass
class ConsistencyReport:
    """What the ``consistency`` pass found (schema ``qir.consistency`` v1 through :meth:`to_json`)."""

    march: str
    samples: int
    rows: list[ConsistencyRow]
    output_cosine: list[float | None]
    bad_case: int | None
    float_fallback: dict[str, list[str]]
    overflows: dict[str, int]
    summary: str
    left_out: dict[str, str] = field(default_factory=dict)   # "<sample>" -> why it was left out

    def to_json(self) -> dict[str, Any]:
        doc = {"march": self.march, "samples": self.samples, "rows": [asdict(r) for r in self.rows],
               "output_cosine": list(self.output_cosine), "bad_case": self.bad_case,
               "float_fallback": dict(self.float_fallback), "overflows": dict(self.overflows), "summary": self.summary}
        if self.left_out:
            doc["left_out"] = dict(self.left_out)
        return doc


def _codes(value: np.ndarray, cal: CalibRecord) -> np.ndarray:
    p = params_of(cal)
    scale, zp = p.broadcast(value.ndim)
    return np.rint(value / scale).astype(np.int64) + zp


def _cause(ops: list[OpRecord], profile, overflows) -> str:
    """The op family a deviation starting in the segment ``ops`` comes from (the most specific)."""
    if not ops:
        return "requant rounding"  # a calibration node rescaling codes between parameters
    if any(op.name in overflows for op in ops):
        return "accumulator overflow"
    if any(op.op_type not in INTEGER_KERNELS or not profile.computes_in_integer(op.op_type) for op in ops):
        composite = all(op.op_type in FLOAT_COMPOSITES for op in ops if op.op_type not in INTEGER_KERNELS)
        return "float composite" if composite and profile.softmax_mode == "float" else "float fallback"
    if any(op_class(op.op_type) is OpClass.LUT for op in ops):
        return "LUT approximation"
    return "requant rounding"


def _segment(ir: QIR, cal: CalibRecord, boundaries: dict[str, CalibRecord]) -> list[OpRecord]:
    """The ops between ``cal`` and the quantized values upstream of it (the fused integer
    segment that produced it)."""
    ops, todo, seen = [], [cal.input], set()
    while todo:
        v = todo.pop()
        if not v or v in seen or v in boundaries:
            continue
        seen.add(v)
        p = ir.producer(v)
        if isinstance(p, OpRecord):
            ops.append(p)
            todo.extend(p.inputs)
    return ops


@register_pass
class ConsistencyPass(AnalysisPass):
    """Fake quantization vs the integer level on ``samples`` (see the module docstring)."""

    name = "consistency"

    def __init__(self, samples: Sequence[dict[str, np.ndarray]], march: str = "nash-e") -> None:
        self.samples = list(samples)
        self.profile = get_profile(march)
        self.options = {"march": self.profile.name, "samples": len(self.samples)}

    def run(self, ir: QIR) -> PassResult:
        return PassResult(ir, False, self.compare(ir).to_json())

    def compare(self, ir: QIR) -> ConsistencyReport:
        """The comparison itself (:meth:`run` returns its JSON form)."""
        cals = [c for c in ir.calibrations(CalibRole.ACTIVATION) if c.mode in (CalibMode.INT8, CalibMode.INT16)]
        capture = [c.output for c in cals]
        fake = get_runtime(Runtime.NUMPY, level=Level.FAKEQUANT)
        integer = IntegerRuntime(self.profile)
        per_node = {c.name: _stats() for c in cals}
        own = {c.name: _stats() for c in cals}
        outputs, overflows, fallbacks = [], {}, {}
        left_out: dict[int, str] = {}
        for i, sample in enumerate(self.samples):
            a = fake.run(ir, sample, capture=capture)
            note = nonfinite_note({v: a[v] for v in dict.fromkeys([*ir.outputs, *capture])})
            if note is not None:  # NaN/Inf fake-quant values: their codes and cosines would be garbage
                left_out[i] = note
                outputs.append(None)
                logger.warning("sample %d is left out of the consistency check: its fake-quantized values hold NaN or "
                               "Inf (%s)", i, note)
                continue
            b = integer.run(ir, sample, capture=capture)
            overflows.update(integer.last_stats.overflows)
            fallbacks.update(integer.last_stats.float_fallback)
            outputs.append(min(cosine_similarity(a[o], b[o]) for o in ir.outputs))
            # every quantizer forced to its fake-quant codes: each segment computes from exactly the
            # fake-quant inputs, and the value captured at a quantizer is what its segment computed
            forced = integer.run(ir, sample, capture=capture, forced={c.name: a[c.output] for c in cals})
            for c in cals:
                _accumulate(per_node[c.name], a[c.output], b[c.output], c)
                _accumulate(own[c.name], a[c.output], forced[c.output], c)
        if left_out and len(left_out) == len(self.samples):
            raise InputError(f"every sample's fake-quantized values hold NaN or Inf ({left_out[0]} on sample 0): "
                             "nothing to compare; check the data for NaN or infinite values")
        rows = self._rows(ir, cals, per_node, own, overflows)
        scored = [(cos, i) for i, cos in enumerate(outputs) if cos is not None]
        worst = min(scored)[1] if scored else None
        report = ConsistencyReport(self.profile.name, len(self.samples), [ConsistencyRow(**r) for r in rows], outputs,
                                   worst, fallbacks, dict(overflows),
                                   _summary(rows, [c for c, _ in scored], self.profile.name),
                                   {str(i): why for i, why in left_out.items()})
        return report

    def _rows(self, ir: QIR, cals: list[CalibRecord], per_node: dict, own: dict, overflows) -> list[dict]:
        boundaries = {c.output: c for c in cals}
        rows = []
        for c in cals:
            stats, mine = per_node[c.name], own[c.name]
            ops = _segment(ir, c, boundaries)
            starts = bool(mine["differ"])
            dot, na, nb = stats["dots"]
            producer = ir.producer(c.input)
            rows.append({
                "node": c.name, "op": getattr(producer, "name", None), "op_type": getattr(producer, "op_type", "input"),
                "segment": [op.name for op in reversed(ops)], "mode": c.mode.value, "max_step": int(stats["max_step"]),
                "differ": stats["differ"] / max(stats["count"], 1),
                "cosine": float(dot / np.sqrt(na * nb)) if na and nb else 1.0,
                "own_max_step": int(mine["max_step"]), "own_differ": mine["differ"] / max(mine["count"], 1),
                "introduced": starts,
                "cause": _cause(ops, self.profile, overflows) if starts else ("inherited" if stats["differ"] else ""),
            })
        return rows


def _stats() -> dict:
    return {"differ": 0, "count": 0, "max_step": 0, "dots": [0.0, 0.0, 0.0]}


def _accumulate(stats: dict, fake: np.ndarray, integer: np.ndarray, cal: CalibRecord) -> None:
    delta = np.abs(_codes(fake, cal) - _codes(integer, cal))
    stats["differ"] += int(np.count_nonzero(delta))
    stats["count"] += delta.size
    stats["max_step"] = max(stats["max_step"], int(delta.max(initial=0)))
    a, b = np.asarray(fake, np.float64).ravel(), np.asarray(integer, np.float64).ravel()
    stats["dots"] = [stats["dots"][0] + float(a @ b), stats["dots"][1] + float(a @ a), stats["dots"][2] + float(b @ b)]


def _summary(rows: list[dict], outputs: list[float], march: str) -> str:
    """What the comparison means, in two or three sentences."""
    if not rows:
        return "the model has no integer activation quantizers: nothing to compare"
    differing = [r for r in rows if r["differ"]]
    if not differing:
        return f"the integer level on {march} computes exactly what fake quantization computes (every code equal)."
    starts = [r for r in rows if r["introduced"]]
    causes: dict[str, int] = {}
    for r in starts:
        causes[r["cause"]] = causes.get(r["cause"], 0) + 1
    worst = max(rows, key=lambda r: (r["max_step"], r["differ"]))
    text = (f"{len(differing)} of {len(rows)} quantized values differ between fake quantization and {march}'s integer "
            f"arithmetic; {len(starts)} of them introduce a deviation of their own ("
            + ", ".join(f"{n} {c}" for c, n in sorted(causes.items(), key=lambda kv: -kv[1])) + "). "
            f"The largest is {worst['max_step']} step(s) at {worst['node']} ({worst['differ']:.1%} of its codes). "
            f"Model outputs agree with cosine {min(outputs):.6f} at worst. ")
    if min(outputs) >= 0.999:
        text += "These are rounding-level differences: accuracy measured in fake quantization carries over."
    else:
        text += ("The deployed model will score differently from the fake-quant model: check the nodes where the "
                 "deviation starts (raise their precision, or use a march setting closer to the hardware).")
    return text
