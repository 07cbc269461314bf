"""What the reports share to turn per-node values into graph overlays
(:class:`~qir.tools.reports.graph_panel.Overlay`): :func:`on_ops` (a quantizer's value drawn on
the ops it feeds), the overlays of tune (the precision it chose) and of the consistency check
(integer vs fake-quant deviation), and the report section. runall's and compare's own overlays
are read from their results by their writers (:mod:`qir.tools.reports.runall`,
:mod:`qir.tools.reports.compare`).

Values measured on a quantizer are drawn on the ops it feeds; an op fed by several keeps the worst.
The first overlay of each list is the one a report shows first: where the model goes wrong most.
"""
from __future__ import annotations

from typing import Any, Iterable

from qir.metrics import BETTER
from qir.tools.reports.graph_panel import ModelGraph, Overlay, panel

__all__ = ["better_of", "on_ops", "runall_node_data", "COMPARE_NODE_DATA", "tune_overlays", "consistency_overlays",
           "graph_section"]


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


COMPARE_NODE_DATA = ("layer_cosine", "layer_clipping")  # compare's overlays written as Model Explorer node data


def runall_node_data(node_types: Iterable[str]) -> list[str]:
    """The keys of the overlays runall writes as Model Explorer node data (the sensitivity ones,
    whose names are known before it runs): the worst of any type, then one per type."""
    return ["sensitivity", *(f"sensitivity_{nt}" for nt in node_types)]


def tune_overlays(precisions: dict[str, str], graph: ModelGraph) -> list[Overlay]:
    """tune: the precision chosen for each quantizer (``{quantizer: mode}``), drawn on the ops it
    feeds (the widest wins where an op has several)."""
    rank = {"float": 3, "fp16": 2, "int16": 1, "int8": 0}
    op_of, chosen = graph.op_of(), {}
    for q, mode in precisions.items():
        for op in op_of.get(q, []):
            if rank.get(mode, -1) > rank.get(chosen.get(op, ""), -1):
                chosen[op] = mode
    order = tuple(m for m in ("int8", "int16", "fp16", "float") if m in chosen.values())
    return [Overlay("precision tune chose", chosen, categories=order,
                    label="widest precision among the quantizers that feed this op")]


def consistency_overlays(rows: list[dict], graph: ModelGraph) -> list[Overlay]:
    """consistency (its report's ``rows``): per quantized value, drawn on the op that computes it,
    the largest step by which the integer level deviates from fake quantization where it starts
    (own), and the cosine between the two."""
    return [Overlay("integer vs fake-quant: own max step",
                    on_ops(((r.get("op") or r["node"], r.get("own_max_step")) for r in rows), graph, "min"), "min",
                    "largest step (in codes) this op's own integer computation deviates by", key="consistency_step"),
            Overlay("integer vs fake-quant: cosine",
                    on_ops(((r.get("op") or r["node"], r.get("cosine")) for r in rows), graph, "max"), "max",
                    "cosine of this op's integer and fake-quantized output", key="consistency_cosine")]


def graph_section(graph: ModelGraph | None, overlays: list[Overlay], *, engine: str = "auto") -> list[tuple[str, str, str]]:
    """The report section ``("graph", "The graph", panel)``, or none without a graph."""
    if graph is None or not graph.nodes:
        return []
    return [("graph", "The graph: where it goes wrong", panel(graph, overlays, engine=engine))]
