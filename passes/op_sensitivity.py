"""``op-sensitivity``: how much quantizing one op's output, or its weights, alone costs on the bad
case (horizon QuantAnalysis ``sensitivity``), one table per model output.

Rule (QuantAnalysis ``sensitivity`` in Horizon's Accuracy Tuning Tool Guide), computed by
the analysis engine from the float configuration of the calibrated model:

1. Candidates, per general node ``op``: ``activation``, the calibration nodes quantizing its
   output (in the IR, the activation calibration nodes reading that value; a quantized model
   input is a row of its own with op type ``input``); ``weight``, the weight calibration nodes
   feeding it. Only candidates with a calibration node in an integer or fp16 mode count.
2. Each candidate is one variant: every calibration node in float except the candidate's, in
   their calibrated modes. Its outputs on the bad case are compared with the float model's.
3. Per model output, rows sort most sensitive first by ``metric`` (L1, ATOL, MSE, KL: larger is
   worse; Cosine, SQNR: smaller is worse); ``reverse=True`` puts the least sensitive first (to
   pick int16 nodes that can go back to int8).
4. Columns: ``op_name, sensitive_type, op_type, <metric>, quant_dtype, flops`` with flops as
   ``N(p%)`` of the whole model (:func:`qir.runtimes.engine.cost.op_flops`).

``sample`` may also be several samples (the bad cases): each row is then the mean over them, and
its first metric's 95% bootstrap interval and rank interval come with it, with the table's stable
top-k per output (:mod:`qir.passes.lib.confidence`; on one sample: none, said so).

The pass returns the report and writes nothing; :mod:`qir.tools.reports.op_sensitivity` writes
``sensitive_ops.txt`` (a table per output) and ``sensitive_ops.json`` (schema
``qir.sensitive_ops`` v1: the rows with their calibration node names, which
``set-mode --sensitive FILE --top-k N`` (or ``--ratio``) reads to raise those nodes to int16).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import NodeKind
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.passes.lib.confidence import Ranking, rank_confidence
from qir.passes.lib.fusion import unit_of, unit_type
from qir.passes.lib.model_pair import BAD_CASE_METRICS, replay_setup
from qir.records import OpRecord
from qir.runtimes.engine import Engine, Variant
from qir.runtimes.engine.cost import op_flops

__all__ = ["OpSensitivityPass", "OpSensitivityReport", "op_sensitivity", "candidates"]

logger = logging.getLogger(__name__)


def candidates(ir: QIR) -> list[dict[str, Any]]:
    """``{"op_name", "sensitive_type", "op_type", "calibrations", "flops"}`` per candidate; an
    op ending a fusion group stands for the group (its types joined, its FLOPs summed)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for cal in ir.calibrations():
        if not cal.quantizes:
            continue
        if ir.value(cal.input).kind is NodeKind.WEIGHT:
            for op in (r for r in ir.consumers(cal.output) if isinstance(r, OpRecord)):
                found.setdefault((op.name, "weight"), {"op": op, "cals": []})["cals"].append(cal.name)
        else:
            producer = ir.producer(cal.input)
            key = (producer.name, "activation") if isinstance(producer, OpRecord) else (cal.input, "activation")
            found.setdefault(key, {"op": producer if isinstance(producer, OpRecord) else None, "cals": []})[
                "cals"].append(cal.name)
    out = []
    for (name, kind), entry in found.items():
        op = entry["op"]
        out.append({"op_name": name, "sensitive_type": kind, "op_type": unit_type(ir, op) if op else "input",
                    "module": op.module if op else None, "calibrations": entry["cals"],
                    "quant_dtype": ",".join(sorted({ir.calibration(c).mode.value for c in entry["cals"]})),
                    "flops": sum(op_flops(ir, o) for o in unit_of(ir, op)) if op else 0})
    return out


@dataclass
class OpSensitivityReport:
    """:func:`op_sensitivity`'s report: per model output, its rows most sensitive first
    (``{"op_name", "sensitive_type", "op_type", "module", "calibrations", "quant_dtype", "flops",
    <metric>, "flops_text"}``) and their ``confidence``. :meth:`to_json` is the
    ``qir.sensitive_ops`` v1 document, each row with ``<metric>_low``/``_high``, ``rank``,
    ``rank_low`` and ``rank_high``, and ``confidence`` ``{output: {"samples", "stable_top_k", ...}}``."""

    metric: str
    reverse: bool
    outputs: dict[str, list[dict[str, Any]]]
    total_flops: int
    samples: int = 1
    confidence: dict[str, Ranking] = field(default_factory=dict)

    def table_rows(self, output: str) -> list[dict[str, Any]]:
        rows, conf = self.outputs[output], self.confidence.get(output)
        if conf is None:
            return [dict(r) for r in rows]
        m = self.metric
        return [{**r, f"{m}_low": c.low, f"{m}_high": c.high, "rank": c.rank, "rank_low": c.rank_low,
                 "rank_high": c.rank_high} for r, c in zip(rows, conf.rows)]

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "reverse": self.reverse, "samples": self.samples,
                "outputs": {out: self.table_rows(out) for out in self.outputs}, "total_flops": self.total_flops,
                "confidence": {out: {k: v for k, v in c.to_json().items() if k != "rows"}
                               for out, c in self.confidence.items()}}


def op_sensitivity(ir: QIR, sample: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]], *, metric: str = "L1",
                   reverse: bool = False, runtime: str = Runtime.ORT, threads: int | None = None, progress: bool = True,
                   replay_discrete: bool = True) -> OpSensitivityReport:
    """The report (module docstring) on ``sample``, or on each of several samples (the mean over
    them, with intervals). ``replay_discrete``: sort/top-k/arg-max indices come from the float
    model's run (:mod:`.discrete`), in the variants and in the float baseline alike."""
    if metric not in BAD_CASE_METRICS:
        raise InputError(f"unknown sensitivity metric {metric!r}; choose one of {', '.join(BAD_CASE_METRICS)}")
    samples = [dict(sample)] if isinstance(sample, Mapping) else [dict(s) for s in sample]
    model, replay = replay_setup(ir, ir) if replay_discrete else (ir, [])
    cands = candidates(model)  # (replaying may prune quantizers that fed only an index)
    if not cands:
        raise InputError("the analysis model has no quantized calibration node; sensitivity needs a calibrated model")
    qname = BAD_CASE_METRICS[metric]
    variants = [Variant(f"{c['op_name']}|{c['sensitive_type']}", {n: model.calibration(n).mode.value
                                                                  for n in c["calibrations"]}) for c in cands]
    if replay:
        from qir.passes.lib.discrete import with_replay

        samples = with_replay(ir, "float", samples, replay, runtime)
    with Engine(model, samples, runtime=runtime, reference="float", metrics=[qname], threads=threads,
                progress=progress and "op sensitivity") as engine:
        result = engine.evaluate(variants)
    per: dict[str, dict[str, list[float]]] = {}  # variant -> output -> value per sample
    for row in sorted(result.rows, key=lambda r: r["sample"]):
        for out, values in row["values"].items():
            per.setdefault(row["variant"], {}).setdefault(out, []).append(values[qname])
    total = sum(op_flops(model, op) for op in model.ops()) or 1
    outputs, confidence = {}, {}
    descending = (qmetrics.BETTER[qname] == "min") != reverse
    for out in model.outputs:
        rows = []
        for c, v in zip(cands, variants):
            values = [x for x in per[v.name][out] if x == x]
            rows.append({**c, metric: sum(values) / len(values) if values else float("nan"),
                         "flops_text": f"{c['flops']}({100 * c['flops'] / total:.2f}%)", "_variant": v.name})
        rows.sort(key=lambda r: qmetrics.worst_first(qname, r[metric]), reverse=reverse)
        confidence[out] = rank_confidence({r["_variant"]: per[r["_variant"]][out] for r in rows}, descending=descending)
        outputs[out] = [{k: x for k, x in r.items() if k != "_variant"} for r in rows]
    return OpSensitivityReport(metric, reverse, outputs, total, len(samples), confidence)


@register_pass
class OpSensitivityPass(AnalysisPass):
    """``op-sensitivity``: each op's activation and weight quantizers alone, ranked by the
    output error they cause on ``sample`` (:func:`op_sensitivity`)."""

    name = "op-sensitivity"

    def __init__(self, sample: Mapping[str, Any], metric: str = "L1", *, reverse: bool = False,
                 runtime: str = Runtime.ORT, threads: int | None = None, progress: bool = True,
                 replay_discrete: bool = True) -> None:
        self.sample = sample
        self.options = {"metric": metric, "reverse": reverse, "runtime": runtime, "threads": threads,
                        "progress": progress, "replay_discrete": replay_discrete}

    def run(self, ir: QIR) -> PassResult:
        return PassResult(ir, False, op_sensitivity(ir, self.sample, **self.options).to_json())
