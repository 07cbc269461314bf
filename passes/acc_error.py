"""``acc-error``: how quantization error accumulates along the graph (hmct ``plot_acc_error``).

Rule (``plot_acc_error`` in Horizon OpenExplorer's Accuracy Debug Tool documentation), computed by the analysis engine:

1. Variants. ``quantize_node`` (a whitelist, from the float model): every entry is one variant
   in which only its nodes are quantized. An entry is a name (a general node: the calibration
   nodes feeding it; a calibration node: itself) or a list of names quantized together; the
   special entries ``"weight"`` and ``"activation"`` quantize every weight or activation
   calibration node (both given: also the two together). ``non_quantize_node`` (a blacklist,
   from the calibrated model): every entry is one variant with those nodes back to float; the
   special entries are an error there. At least one of the two is needed.
2. For each variant and each general node's output, in topological order, ``metric(float
   output, variant output)`` on the first ``data_num`` samples (mean over samples).
3. ``average_mode``: the running mean of that curve instead. ±inf points are left out. A sample
   whose float values hold NaN or Inf is left out with a warning (the report's ``left_out``); a
   value near zero or constant on a sample is left out of that point's cosine/SQNR mean unless
   it is so on every sample (:class:`qir.runtimes.engine.EngineResult`).
4. One PNG with a curve per variant, and the numbers as CSV and JSON: written from the report by
   ``qir.tools.reports.acc_error`` (the pass only computes); hmct's ``plot_acc_error`` lives in
   ``qir.tools.compat.hmct``.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from qir import metrics as qmetrics
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.lib.selection import calibrations_of
from qir.runtimes.engine import Engine, Variant

__all__ = ["AccErrorPass", "AccErrorReport"]

logger = logging.getLogger(__name__)

SPECIAL = ("weight", "activation")


def _entries(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


@dataclass
class AccErrorReport(Report):
    """The accumulated-error curves: ``metric``, ``average_mode``, ``nodes`` (general nodes in
    topological order), ``values`` (their outputs), ``curves`` (``{variant: [metric per node]}``,
    None where a point was left out), ``engine`` (the engine's statistics per reference) and
    ``left_out`` (``{sample: why}``, present when a sample was left out)."""

    metric: str
    average_mode: bool
    nodes: list[str]
    values: list[str]
    curves: dict[str, list[float | None]]
    engine: dict[str, dict[str, float]]
    left_out: dict[str, str] | None = None

    optional = ("left_out",)


@register_pass
class AccErrorPass(AnalysisPass):
    """Accumulated-error curves (see the module docstring). The report holds ``nodes`` (general
    nodes in topological order), ``values`` (their outputs) and ``curves``:
    ``{variant: [metric per node]}`` (null where a point was left out)."""

    name = "acc-error"

    def __init__(self, data: Any = None, quantize_node=None, *, non_quantize_node=None,
                 metric: str = "cosine-similarity", average_mode: bool = False, data_num: int | None = 1,
                 runtime: str = Runtime.ORT, threads: int | None = None, progress: bool = True) -> None:
        if data is None:
            raise InputError("acc-error needs calibration data (a folder, .npz, .npy or samples)")
        self.quantize, self.non_quantize = _entries(quantize_node), _entries(non_quantize_node)
        if not self.quantize and not self.non_quantize:
            raise InputError("give quantize_node or non_quantize_node (they cannot both be empty)")
        if any(e in SPECIAL for e in self.non_quantize):
            raise InputError("non_quantize_node cannot hold 'weight' or 'activation'; "
                             "use quantize_node=['weight'] or ['activation']")
        self.metric = qmetrics.check_metrics(metric)[0]
        self.data, self.average_mode, self.data_num = data, bool(average_mode), data_num
        self.runtime, self.threads, self.progress = runtime, threads, progress
        self.options = {"metric": self.metric, "average_mode": self.average_mode, "data_num": data_num}

    def check(self, ir: QIR) -> None:
        """One clear error for an entry of ``quantize_node``/``non_quantize_node`` that names no
        calibration node or op of ``ir`` (``runall`` calls it up front)."""
        self._whitelist(ir)
        self._blacklist(ir)

    def curve_names(self, ir: QIR) -> list[str]:
        """The names :meth:`run` gives its curves on ``ir`` (one per variant), known before it runs."""
        return [v.name for v in (*self._whitelist(ir), *self._blacklist(ir))]

    def run(self, ir: QIR) -> PassResult:
        nodes = [op for op in ir.ops() if op.outputs and op.outputs[0]]
        values = [op.outputs[0] for op in nodes]
        curves: dict[str, list[float | None]] = {}
        stats, left_out = {}, {}
        for reference, variants in (("float", self._whitelist(ir)), ("quantized", self._blacklist(ir))):
            if not variants:
                continue
            with Engine(ir, self.data, runtime=self.runtime, reference=reference, compare=values,
                        metrics=[self.metric], data_num=self.data_num, threads=self.threads,
                        progress=self.progress and f"accumulated error (from {reference})") as engine:
                result = engine.evaluate(variants)
            stats[reference] = result.stats.to_json() if result.stats is not None else {}
            left_out.update({str(s): why for s, why in result.left_out.items()})
            for v in variants:
                means = result.per_value(v.name)
                curves[v.name] = self._finish([means[val][self.metric] for val in values])
        return PassResult(ir, False, AccErrorReport(self.metric, self.average_mode, [op.name for op in nodes], values,
                                                    curves, stats, left_out or None))

    # ------------------------------------------------------------------ pieces
    def _finish(self, curve: list[float]) -> list[float | None]:
        finite = [x if math.isfinite(x) else None for x in curve]
        if not self.average_mode:
            return finite
        out, total, count = [], 0.0, 0
        for x in finite:
            if x is not None:
                total, count = total + x, count + 1
            out.append(total / count if count else None)
        return out

    def _whitelist(self, ir: QIR) -> list[Variant]:
        variants = []
        for entry in self.quantize:
            if entry in SPECIAL:
                variants.append(Variant(f"only_{entry}_calibrated", _on(ir.calibrations(entry))))
            else:
                names = [entry] if isinstance(entry, str) else list(entry)
                cals = [c for n in names for c in calibrations_of(ir, n)]
                variants.append(Variant(_label(names), _on(cals)))
        if all(s in self.quantize for s in SPECIAL):
            variants.append(Variant("weight_activation_calibrated", _on(ir.calibrations())))
        return variants

    def _blacklist(self, ir: QIR) -> list[Variant]:
        variants = []
        for entry in self.non_quantize:
            names = [entry] if isinstance(entry, str) else list(entry)
            cals = [c for n in names for c in calibrations_of(ir, n)]
            variants.append(Variant(f"without {_label(names)}", {c.name: CalibMode.FLOAT.value for c in cals}))
        return variants


def _on(cals) -> dict[str, str]:
    return {c.name: c.mode.value for c in cals}


def _label(names: list[str]) -> str:
    return "+".join(names)
