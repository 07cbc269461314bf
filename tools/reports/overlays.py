"""What the reports share to turn per-node values into graph overlays
(:class:`~qir.tools.reports.graph_panel.Overlay`): :func:`on_ops` (a quantizer's value drawn on
the ops it feeds), the overlays of tune (the precision it chose, each unit's loss) and of the
consistency check (integer vs fake-quant, or vs onnxruntime, deviation), the report section, and
each analysis's overlay keys. runall's and compare's own overlays are read from their results by
their writers (:mod:`qir.tools.reports.runall`, :mod:`qir.tools.reports.compare`).

Values measured on a quantizer are drawn on the ops it feeds; an op fed by several keeps the worst.
The first overlay of each list is the one a report shows first: where the model goes wrong most.

An overlay's key names its Model Explorer node data file (:mod:`qir.tools.reports.model_explorer`):
the keys are made here, by the functions a command plans its files with (:func:`runall_keys`,
:func:`compare_keys`, :data:`TUNE_KEYS`, :data:`CONSISTENCY_KEYS`, :data:`ORT_KEYS`) and the
writers use, so that what is planned is what is written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from qir.metrics import BETTER
from qir.tools.reports.graph_panel import ModelGraph, Overlay, panel

if TYPE_CHECKING:
    from qir.runtimes.integer.against_ort import QuantizedValue

__all__ = ["better_of", "on_ops", "runall_keys", "acc_error_key", "compare_keys", "op_sensitivity_key", "TUNE_KEYS",
           "CONSISTENCY_KEYS", "ORT_KEYS", "tune_overlays", "consistency_overlays", "ort_overlays", "graph_section"]


def better_of(metric: str) -> str:
    """``"max"`` when a larger ``metric`` is better (cosine, SQNR), else ``"min"``."""
    key = metric.lower()
    if key in BETTER:
        return BETTER[key]
    return "max" if "cos" in key or "sqnr" in key else "min"


def _keep_worst(into: dict[str, float], node: str, value: Any, better: str) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return
    old = into.get(node)
    if old is None or (value < old if better == "max" else value > old):
        into[node] = float(value)


def on_ops(pairs: Iterable[tuple[str, Any]], graph: ModelGraph, better: str) -> dict[str, float]:
    """Values keyed by op or quantizer name, drawn on ops (a quantizer's on the ops it feeds; an op
    fed by several keeps the worst)."""
    op_of, ops = graph.op_of(), {n.name for n in graph.nodes}
    found: dict[str, float] = {}
    for name, value in pairs:
        for op in ([name] if name in ops else op_of.get(name, [])):
            _keep_worst(found, op, value, better)
    return found


TUNE_KEYS = ("precision", "tune_sensitivity")
CONSISTENCY_KEYS = ("consistency_step", "consistency_cosine")
ORT_KEYS = ("ort_step",)


def acc_error_key(curve: str) -> str:
    """runall's accumulated-error curve ``curve`` (an acc-error variant's name)."""
    return f"acc_error_{curve}"


def runall_keys(node_types: Iterable[str], curves: Iterable[str]) -> list[str]:
    """The keys of runall's overlays: the sensitivity of the worst of any type, then one per
    type, each accumulated-error curve, the sensitivity analysis (each picked op alone) and the
    clipping share."""
    node_types = list(node_types)
    return ["sensitivity", *(f"sensitivity_{nt}" for nt in node_types), *map(acc_error_key, curves),
            "sensitivity_analysis", "clipping"]


def op_sensitivity_key(output: str) -> str:
    """compare's op sensitivity measured at the model output ``output``."""
    return f"op_sensitivity_{output}"


def compare_keys(outputs: Iterable[str], consistency: bool = False) -> list[str]:
    """The keys of compare's overlays: layer cosine and clipping, the op sensitivity per model
    output, and with ``consistency`` the consistency check's."""
    return ["layer_cosine", "layer_clipping", *map(op_sensitivity_key, outputs), *(CONSISTENCY_KEYS if consistency else ())]


def tune_overlays(precisions: dict[str, str], graph: ModelGraph, losses: dict[str, float] | None = None) -> list[Overlay]:
    """tune: the precision chosen for each quantizer (``{quantizer: mode}``), drawn on the ops it
    feeds (the widest wins where an op has several), and with the ``losses`` of its sensitivity
    stage (``{unit: loss}``) how much the score drops with only that unit (an activation
    quantizer) lowered, drawn on the ops it feeds."""
    rank = {"float": 3, "fp16": 2, "int16": 1, "int8": 0}
    op_of, chosen = graph.op_of(), {}
    for q, mode in precisions.items():
        for op in op_of.get(q, []):
            if rank.get(mode, -1) > rank.get(chosen.get(op, ""), -1):
                chosen[op] = mode
    order = tuple(m for m in ("int8", "int16", "fp16", "float") if m in chosen.values())
    found = [Overlay("precision tune chose", chosen, categories=order,
                     label="widest precision among the quantizers that feed this op", key=TUNE_KEYS[0])]
    if losses:
        found.append(Overlay("tune sensitivity: loss", on_ops(losses.items(), graph, "min"), "min",
                             "score lost with only this op's activation quantizer lowered (tune's sensitivity stage)",
                             key=TUNE_KEYS[1]))
    return found


def consistency_overlays(rows: list[dict], graph: ModelGraph) -> list[Overlay]:
    """consistency (its report's ``rows``): per quantized value, drawn on the op that computes it,
    the largest step by which the integer level deviates from fake quantization where it starts
    (own), and the cosine between the two."""
    return [Overlay("integer vs fake-quant: own max step",
                    on_ops(((r.get("op") or r["node"], r.get("own_max_step")) for r in rows), graph, "min"), "min",
                    "largest step (in codes) this op's own integer computation deviates by", key=CONSISTENCY_KEYS[0]),
            Overlay("integer vs fake-quant: cosine",
                    on_ops(((r.get("op") or r["node"], r.get("cosine")) for r in rows), graph, "max"), "max",
                    "cosine of this op's integer and fake-quantized output", key=CONSISTENCY_KEYS[1])]


def ort_overlays(values: Iterable[QuantizedValue], graph: ModelGraph) -> list[Overlay]:
    """consistency against onnxruntime (its comparison's ``values``): per quantized value, drawn
    on the op that computes it, the largest step by which the integer level departs from
    onnxruntime's kernels when it starts from onnxruntime's inputs (own)."""
    return [Overlay("integer vs onnxruntime: own max step",
                    on_ops(((v.op or v.node, v.own_max_step) for v in values), graph, "min"), "min",
                    "largest step (in codes) this op departs from onnxruntime by, from onnxruntime's inputs",
                    key=ORT_KEYS[0])]


def graph_section(graph: ModelGraph | None, overlays: list[Overlay], *, engine: str = "auto") -> list[tuple[str, str, str]]:
    """The report section ``("graph", "The graph", panel)``, or none without a graph."""
    if graph is None or not graph.nodes:
        return []
    return [("graph", "The graph: where it goes wrong", panel(graph, overlays, engine=engine))]
