"""``node-sensitivity``: how much quantizing each node alone costs (hmct ``get_sensitivity_of_nodes``).

Rule (``get_sensitivity_of_nodes`` in Horizon OpenExplorer's Accuracy Debug Tool documentation), computed by the analysis engine:

1. Candidates by ``node_type``: ``node``, every general node fed by calibration nodes (the
   variant switches all of them: its input activations and its weights); ``weight`` or
   ``activation``, every calibration node of that role on its own. ``interested_nodes`` (general
   or calibration node names) replaces the candidates.
2. ``start="float"`` (hmct's semantics): the float model with only the candidate's calibration
   nodes in their calibrated modes. ``start="quantized"``: the calibrated model with only those
   nodes back to float.
3. Each variant's outputs (or ``output_node``'s output) are compared with the float model on the
   first ``data_num`` samples; per metric, the mean over outputs per sample, then over samples.
   A sample whose float outputs hold NaN or Inf is left out with a warning (the report's
   ``left_out``: ``{sample: why}``; ``samples`` counts those scored); none left is an error.
   A sample on which a compared float value is near zero or constant
   (:func:`qir.metrics.ill_conditioned`) is left out of cosine/SQNR means (unless every
   sample is), with a warning naming the metric to use instead; the report's
   ``ill_conditioned`` lists them: ``{sample: {value: why}}``.
4. Rows come most to blame first, by the first metric: from float, the worst model first; from
   quantized, the best recovered model first (the node whose de-quantization helps most).
5. Saturated outputs: when every candidate scores the same (within 1e-9) (a saturated softmax or
   sigmoid hides all differences; peers then print 100 dB for every node) and no
   ``output_node`` was given, the analysis is redone on the value entering the model's final
   Softmax/LogSoftmax/Sigmoid (the logits), and the report says so under ``saturated``. Without
   such an activation the report only warns, naming the outputs to replace with ``output_node``.
6. Confidence (:mod:`qir.passes.lib.confidence`): the first metric's per-sample values, already
   computed, are bootstrapped: each row gets the 95% interval of its mean (``<metric>_low``,
   ``<metric>_high``) and its rank interval (``rank``, ``rank_low``, ``rank_high``), and the
   report the ``stable_top_k`` (``confidence``).
7. ``data_num="auto"`` (``--samples auto``): the samples in rounds, worst first, until the top
   ``settle`` rows (default 1: which node is the cause) are a settled set or every sample is
   used (:mod:`qir.passes.lib.adaptive`); the report's ``sampling`` says how many were used and
   why it stopped.
8. ``level="integer"`` with a ``march`` asks it as the NPU computes it: every variant runs on the
   integer level of that march profile (:mod:`qir.runtimes.engine.whole`), compared with the float
   model; the report names the ``level`` (and ``march``).

The pass only computes: the table text and the ``.txt``/``.csv``/``.json`` files are written by
``qir.tools.reports.node_sensitivity``, and hmct's ``get_sensitivity_of_nodes`` lives in
``qir.tools.compat.hmct``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qir import metrics as qmetrics
from qir.calibration import max_threshold
from qir.data import model_samples
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.execution import Level
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.base import AnalysisPass, PassResult, register_pass
from qir.passes.lib.adaptive import Sampling, rank_in_rounds
from qir.passes.lib.confidence import Ranking, rank_confidence
from qir.passes.lib.selection import calibrations_of
from qir.records import CalibRecord, OpRecord
from qir.runtimes.engine import Engine, Variant

__all__ = ["NodeSensitivityPass", "NodeSensitivityReport", "NODE_TYPES"]

logger = logging.getLogger(__name__)

NODE_TYPES = ("node", "weight", "activation")


@dataclass
class NodeSensitivityReport:
    """What :class:`NodeSensitivityPass` found: ``rows`` (``{"node", "type", ["consumers",
    "module", "threshold", "bit"], <metric>: mean}``, most to blame first) and their ``confidence``
    (None when there is no row). :meth:`to_json` is the ``qir.node_sensitivity`` v1 document (the
    pass's report, less the engine statistics): the rows with their intervals, ``confidence`` the
    table's (``{"metric", "level", "resamples", "samples", "stable_top_k"}``)."""

    node_type: str
    start: str
    metrics: list[str]
    compare: list[str]
    samples: int
    rows: list[dict[str, Any]]
    level: str
    confidence: Ranking | None = None
    march: str | None = None
    saturated: dict[str, list[str]] | None = None
    left_out: dict[str, str] = field(default_factory=dict)
    ill_conditioned: dict[str, dict[str, str]] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    sampling: Sampling | None = None  # how ``data_num="auto"`` sampled

    def table_rows(self) -> list[dict[str, Any]]:
        """The rows, each with its interval and rank interval (when there is a confidence)."""
        if self.confidence is None:
            return [dict(r) for r in self.rows]
        m = self.metrics[0]
        return [{**r, f"{m}_low": c.low, f"{m}_high": c.high, "rank": c.rank, "rank_low": c.rank_low,
                 "rank_high": c.rank_high} for r, c in zip(self.rows, self.confidence.rows)]

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"node_type": self.node_type, "start": self.start, "metrics": list(self.metrics),
                               "compare": list(self.compare), "samples": self.samples, "rows": self.table_rows(),
                               "level": self.level}
        if self.confidence is not None:
            c = self.confidence
            doc["confidence"] = {"metric": self.metrics[0], "level": c.level, "resamples": c.resamples,
                                 "samples": c.samples, "stable_top_k": c.stable_top_k}
        for key in ("march", "saturated"):
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        for key in ("left_out", "ill_conditioned"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        if self.sampling is not None:
            doc["sampling"] = self.sampling.to_json()
        return doc


def _module_of(ir: QIR, op_name: str | None, cal: CalibRecord) -> str | None:
    """The source-framework module path(s) of a general node, or of the ops a calibration node
    feeds (``;``-joined), when the model came from PyTorch."""
    if op_name is not None:
        return ir.op(op_name).module
    paths = [r.module for r in ir.consumers(cal.output) if isinstance(r, OpRecord) and r.module]
    return ";".join(dict.fromkeys(paths)) or None


def _readers(ir: QIR, cal: CalibRecord) -> str:
    return ";".join(r.name for r in ir.consumers(cal.output))


@register_pass
class NodeSensitivityPass(AnalysisPass):
    """Per-node quantization sensitivity (see the module docstring). The report holds ``rows``:
    ``{"node", "type", ["consumers", "threshold", "bit"], <metric>: value}``, most to blame first."""

    name = "node-sensitivity"

    def __init__(self, data: Any = None, metrics: str | list[str] = "cosine-similarity", *,
                 output_node: str | None = None, node_type: str = "node", data_num: int | str | None = 1,
                 interested_nodes: list[str] | None = None, start: str = "float", runtime: str | None = None,
                 threads: int | None = None, progress: bool = True, level: str = Level.FAKEQUANT,
                 march: str | None = None, settle: int = 1) -> None:
        if data is None:
            raise InputError("node sensitivity needs calibration data (a folder, .npz, .npy or samples)")
        if node_type not in NODE_TYPES:
            raise InputError(f"unknown node_type {node_type!r}; choose one of {', '.join(NODE_TYPES)}")
        if start not in ("float", "quantized"):
            raise InputError(f"unknown start {start!r}; choose float or quantized")
        if isinstance(data_num, str) and data_num != "auto":
            raise InputError(f"data_num {data_num!r}: give a number of samples or 'auto'")
        self.data, self.metrics = data, qmetrics.check_metrics(metrics)
        self.output_node, self.node_type, self.data_num = output_node, node_type, data_num
        self.interested = list(interested_nodes or [])
        self.start, self.runtime, self.threads, self.progress = start, runtime, threads, progress
        self.level, self.march, self.settle = level, march, settle
        self.options = {"metrics": list(self.metrics), "node_type": node_type, "data_num": data_num,
                        "start": start, "runtime": runtime, "level": level, "march": march}

    def run(self, ir: QIR) -> PassResult:
        report = self.analyse(ir)
        return PassResult(ir, False, {**report.to_json(), "engine": report.engine})

    def analyse(self, ir: QIR) -> NodeSensitivityReport:
        """The report as a :class:`NodeSensitivityReport` (:meth:`run`'s report is its JSON form)."""
        candidates = self._candidates(ir)
        if not candidates:
            raise InputError(f"the model has no {self.node_type} candidates with calibration nodes")
        variants = [Variant(name, {c.name: self._mode(c) for c in cals}) for name, (_, cals) in candidates.items()]
        sampling = None
        if self.data_num == "auto":
            result, samples, sampling = self._evaluate_auto(ir, variants, self._compare(ir))
        else:
            result, samples = self._evaluate(ir, variants, self._compare(ir))
        saturated = None
        if self.output_node is None and len(variants) > 1 and _all_equal(result, self.metrics[0]):
            logits = _pre_activations(ir)
            saturated = {"outputs": list(ir.outputs), "ranked_on": logits}
            if logits:
                logger.warning("every node scores the same on the saturated outputs %s; ranking on the "
                               "values entering their final activation instead: %s", list(ir.outputs), logits)
                result, samples = self._evaluate(ir, variants, logits, sampling)
            else:
                logger.warning("every node scores the same on the outputs %s (saturated?); choose an "
                               "output_node before the saturating op", list(ir.outputs))
        ranked = result.ranked()
        if self.start == "quantized":
            ranked.reverse()
        rows = [self._row(ir, name, candidates[name], values) for name, values in ranked]
        confidence = self._confidence(result, [name for name, _ in ranked])
        return NodeSensitivityReport(
            "node" if self.interested else self.node_type, self.start, list(self.metrics), list(result.compare),
            samples, rows, self.level, confidence, march=(self.march or "generic") if self.level == Level.INTEGER else None,
            saturated=saturated, left_out={str(s): why for s, why in result.left_out.items()},
            ill_conditioned={str(s): ill for s, ill in result.ill_conditioned.items()},
            engine=result.stats.to_json() if result.stats is not None else {},
            sampling=sampling)

    def _confidence(self, result, names: list[str]) -> Ranking:
        """The bootstrap of the table whose rows are ``names`` (in its order), on the first metric."""
        first = self.metrics[0]
        per_sample = result.per_sample(first)
        return rank_confidence({name: per_sample[name] for name in names},
                               descending=(qmetrics.BETTER[first] == "min") != (self.start == "quantized"))

    @staticmethod
    def _row(ir: QIR, name: str, candidate: tuple[str, list[CalibRecord]], values: dict[str, float]) -> dict[str, Any]:
        kind, cals = candidate
        row: dict[str, Any] = {"node": name, "type": kind}
        if kind != "node":
            row["consumers"] = _readers(ir, cals[0])
        module = _module_of(ir, name if kind == "node" else None, cals[0])
        if module:
            row["module"] = module
        if kind == "activation":
            cal = cals[0]
            th = float(np.max(cal.threshold)) if cal.threshold is not None else max_threshold(cal)
            row["threshold"] = None if th is None else round(th, 5)
            row["bit"] = {CalibMode.INT8: 8, CalibMode.INT16: 16}.get(cal.mode, cal.mode.value)
        row.update(values)
        return row

    def _evaluate(self, ir: QIR, variants: list[Variant], compare, sampling: Sampling | None = None, *,
                  data: Any = None, reference: str | None = None, what: str = ""):
        """The variants on the data (``data``; the samples ``sampling`` used; else the pass's)."""
        if sampling is not None:
            samples = list(model_samples(ir, self.data))
            data = [samples[i] for i in sampling.order]
        with Engine(ir, self.data if data is None else data, runtime=self.runtime, reference=reference or self.start,
                    compare=compare, metrics=self.metrics, data_num=self.data_num if data is None else None,
                    threads=self.threads, progress=self.progress and f"node sensitivity ({self.node_type}){what}",
                    level=self.level, march=self.march) as engine:
            result = engine.evaluate(variants)
            return result, len(engine.samples) - len(result.left_out)

    def _evaluate_auto(self, ir: QIR, variants: list[Variant], compare) -> tuple[Any, int, Sampling]:
        """``data_num="auto"`` (module docstring, step 7): the model as it is scored on every
        sample, then the variants in rounds on the worst samples first."""
        samples = list(model_samples(ir, self.data))
        whole, _ = self._evaluate(ir, [Variant("as it is", {})], compare, data=samples, reference="quantized",
                                  what=": ordering samples")
        scores = whole.per_sample(self.metrics[0])["as it is"]
        scored = sorted({r["sample"] for r in whole.rows})
        by_index = dict(zip(scored, scores))

        def evaluate(indices: list[int]):
            return self._evaluate(ir, variants, compare, data=[samples[i] for i in indices],
                                  what=f": {len(indices)} more sample(s)")[0]

        def confidence(result) -> Ranking:
            ranked = result.ranked()
            names = [name for name, _ in (reversed(ranked) if self.start == "quantized" else ranked)]
            return self._confidence(result, names)

        result, sampling = rank_in_rounds([by_index.get(i, float("nan")) for i in range(len(samples))], evaluate,
                                          confidence, higher_is_better=qmetrics.BETTER[self.metrics[0]] == "max",
                                          need=self.settle)
        logger.info("%s", sampling.line("node sensitivity"))
        return result, sampling.used - len(result.left_out), sampling

    # ------------------------------------------------------------------ pieces
    def _mode(self, cal: CalibRecord) -> str:
        return cal.mode.value if self.start == "float" else CalibMode.FLOAT.value

    def _candidates(self, ir: QIR) -> dict[str, tuple[str, list[CalibRecord]]]:
        if self.interested:
            out = {}
            for name in self.interested:
                if not ir.has_node(name):
                    raise NotFoundError(did_you_mean(name, [r.name for r in ir.runnables()], "node"))
                rec = ir.node(name)
                kind = rec.role.value if isinstance(rec, CalibRecord) else "node"
                out[name] = (kind, calibrations_of(ir, name))
            return out
        if self.node_type == "node":
            serving: dict[str, list[CalibRecord]] = {}
            for c in ir.calibrations():
                for op in c.feeds:
                    serving.setdefault(op, []).append(c)
            return {op.name: ("node", serving[op.name]) for op in ir.ops() if op.name in serving}
        return {c.name: (self.node_type, [c]) for c in ir.calibrations(self.node_type)}

    def _compare(self, ir: QIR) -> list[str] | None:
        if self.output_node is None:
            return None
        if ir.has_value(self.output_node):
            return [self.output_node]
        if ir.has_node(self.output_node):
            return [ir.node(self.output_node).outputs[0]]
        raise NotFoundError(did_you_mean(self.output_node, [r.name for r in ir.runnables()], "output node"))


_SATURATING = ("Softmax", "LogSoftmax", "Sigmoid", "HardSigmoid")


def _all_equal(result, metric: str) -> bool:
    values = [v[metric] for v in result.per_variant().values()]
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values):  # e.g. sqnr = +inf for every node
        return len(set(values)) == 1
    return max(finite) - min(finite) <= 1e-9 * max(1.0, abs(float(np.median(finite))))


def _pre_activations(ir: QIR) -> list[str]:
    """For each graph output produced (through shape-only ops and calibration nodes) by a
    saturating activation, the value entering that activation."""
    out = []
    for value in ir.outputs:
        rec = qmetrics.final_activation(ir, value)
        if rec is not None and rec.op_type in _SATURATING and rec.inputs[0] not in out:
            out.append(rec.inputs[0])
    return out
