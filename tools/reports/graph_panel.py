"""The graph panel of the HTML reports: the model's ops laid out top to bottom
(:mod:`qir.tools.reports.graph_layout`), each coloured by an analysis's per-node value, in one
self-contained block of HTML, SVG and JavaScript (no network, no server).

A :class:`ModelGraph` is the part of the IR the panel draws: the general ops in execution order,
an edge wherever one op's output reaches another's input (through any quantizers between them),
and the quantizers that feed each op. An :class:`Overlay` is one analysis's value per node:
numbers (a metric, with which way is better) or categories (a precision). :func:`panel` draws
them: a selector of overlays, a colour legend with its scale, hover for every overlay's value,
click to jump to the node's rows in the page's tables and the headings of its plots
(``<tr data-node=...>``, ``<h3 data-node=...>``: the op's name or one of its quantizers'), a
search box, and pan (drag) and zoom (wheel, buttons).

Numbers are coloured by how far each is from the best value of the overlay (on a log scale when
most nodes sit near the best and a few far off), so the worst node is always the darkest; a node
without a value is grey. The page carries the numbers (``data-t`` on each node: 0 best, 1 worst), which is what
the browser tests read.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from qir.tools.reports.graph_layout import NODE_H, NODE_W, layout

__all__ = ["GraphNode", "ModelGraph", "Overlay", "panel", "colour", "badness", "finite_values", "NO_VALUE"]

NO_VALUE = "#d9d9d9"  # a node the overlay has no value for
SCALE = ("#ffffcc", "#fed976", "#fd8d3c", "#e31a1c", "#800026")  # best .. worst
CATEGORY_COLOURS = ("#9ecae1", "#a1d99b", "#fdae6b", "#bcbddc", "#fdd0a2", "#c7e9c0", "#d9d9d9")
LOG_SPAN = 100.0  # values spanning more than this factor are coloured on a log scale
_SCRIPT = Path(__file__).with_name("graph_panel.js")


@dataclass(frozen=True)
class GraphNode:
    """One op: its ``name``, ``op_type``, source ``module`` path (if any) and the ``quantizers``
    that feed it."""

    name: str
    op_type: str
    module: str | None = None
    quantizers: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelGraph:
    """The ops of a model (execution order) and the edges between them."""

    nodes: tuple[GraphNode, ...]
    edges: tuple[tuple[str, str], ...]
    name: str = "main"  # the graph's name, as exported (Model Explorer's graph id)

    @classmethod
    def from_ir(cls, ir: Any) -> "ModelGraph":
        """The general ops of ``ir``; an edge joins an op to each op that reads its output, through
        the quantizers between them, which are listed with the op they feed."""
        from qir.records import CalibRecord

        nodes, edges = [], []
        for op in ir.ops():
            quantizers = []
            for v in op.inputs:
                src = ir.producer(v) if v else None
                while isinstance(src, CalibRecord):
                    quantizers.append(src.name)
                    src = ir.producer(src.input)
                if src is not None:
                    edges.append((src.name, op.name))
            nodes.append(GraphNode(op.name, op.op_type, op.module, tuple(dict.fromkeys(quantizers))))
        return cls(tuple(nodes), tuple(dict.fromkeys(edges)), ir.name)

    def op_of(self) -> dict[str, list[str]]:
        """Quantizer name -> the ops it feeds, as drawn."""
        found: dict[str, list[str]] = {}
        for n in self.nodes:
            for q in n.quantizers:
                found.setdefault(q, []).append(n.name)
        return found


@dataclass(frozen=True)
class Overlay:
    """One analysis's value per op. ``values``: numbers, or strings for a categorical overlay
    (``better`` is then ignored). ``better``: ``"max"`` (e.g. cosine) or ``"min"`` (an error).
    ``label``: what the number is (shown in the legend). ``key``: a short stable name (files)."""

    name: str
    values: dict[str, float | str]
    better: str = "max"
    label: str = ""
    categories: tuple[str, ...] = field(default=())
    key: str = ""

    @property
    def categorical(self) -> bool:
        return any(isinstance(v, str) for v in self.values.values())

    def worst(self) -> str | None:
        """The node with the worst value (numbers only), or None."""
        t = badness(self)
        return max(t, key=lambda n: t[n]) if t else None


def finite_values(values: Mapping[str, float | str | None]) -> dict[str, float]:
    return {n: float(v) for n, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


def _distances(overlay: Overlay) -> dict[str, float]:
    """Each numeric value's distance from the best value of the overlay (0 for the best)."""
    values = finite_values(overlay.values)
    if not values:
        return {}
    sign = 1.0 if overlay.better == "max" else -1.0
    best = max(sign * v for v in values.values())
    return {n: best - sign * v for n, v in values.items()}


def _log_scale(dist: dict[str, float]) -> bool:
    """Log when most nodes sit near the best and a few far off: the median positive distance is
    more than :data:`LOG_SPAN` times below the largest."""
    positive = sorted(d for d in dist.values() if d > 0)
    return bool(positive) and positive[len(positive) // 2] * LOG_SPAN < positive[-1]


def badness(overlay: Overlay) -> dict[str, float]:
    """Each numeric value as 0 (the best of the overlay) .. 1 (the worst): linear in the distance
    from the best, or on a log scale of it (four decades) when :func:`_log_scale` says so."""
    dist = _distances(overlay)
    top = max(dist.values(), default=0.0)
    if top <= 0:
        return {n: 0.0 for n in dist}
    if _log_scale(dist):
        eps = top / 1e4
        lo, hi = math.log(eps), math.log(top + eps)
        return {n: (math.log(d + eps) - lo) / (hi - lo) for n, d in dist.items()}
    return {n: d / top for n, d in dist.items()}


def colour(t: float) -> str:
    """The colour of ``t`` in 0..1 on :data:`SCALE` (linear between its stops)."""
    t = min(1.0, max(0.0, t)) * (len(SCALE) - 1)
    k = min(int(t), len(SCALE) - 2)
    a, b = SCALE[k], SCALE[k + 1]
    mix = [round(int(a[i:i + 2], 16) * (1 - (t - k)) + int(b[i:i + 2], 16) * (t - k)) for i in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in mix)


def _legend(overlay: Overlay) -> dict[str, Any]:
    if overlay.categorical:
        cats = list(overlay.categories) or sorted({str(v) for v in overlay.values.values()})
        return {"categories": [[c, CATEGORY_COLOURS[i % len(CATEGORY_COLOURS)]] for i, c in enumerate(cats)]}
    values = finite_values(overlay.values)
    if not values:
        return {"empty": True}
    best, worst = (max, min) if overlay.better == "max" else (min, max)
    return {"best": best(values.values()), "worst": worst(values.values()), "stops": list(SCALE),
            "log": _log_scale(_distances(overlay))}


def _overlay_doc(overlay: Overlay, names: list[str]) -> dict[str, Any]:
    """What the script needs of one overlay: per node (in drawing order) its shown value, its
    colour and its badness (null without a value)."""
    order = {n: i for i, n in enumerate(names)}
    shown, colours, ts = [None] * len(names), [NO_VALUE] * len(names), [None] * len(names)
    if overlay.categorical:
        legend = _legend(overlay)
        palette = dict((c, col) for c, col in legend["categories"])
        for n, v in overlay.values.items():
            if n in order and v is not None:
                shown[order[n]], colours[order[n]] = str(v), palette.get(str(v), NO_VALUE)
    else:
        legend = _legend(overlay)
        t = badness(overlay)
        for n, v in finite_values(overlay.values).items():
            if n in order:
                shown[order[n]], colours[order[n]], ts[order[n]] = float(f"{v:.6g}"), colour(t[n]), round(t[n], 4)
    return {"name": overlay.name, "label": overlay.label, "better": overlay.better, "legend": legend,
            "values": shown, "colours": colours, "t": ts}


def block_of(names: list[str]) -> dict[str, str] | None:
    """Each op's block: the shallowest prefix of the ``/``-separated names (``/model.15``,
    ``/backbone/encoder/layer.7``) that splits the ops into at least ``max(12, ops / 40)`` and
    fewer than ``ops / 3`` blocks (an op whose name is not that deep is a block of its own); None
    when no depth does (names without paths)."""
    for depth in range(1, 7):
        key = {n: "/".join(n.split("/")[:depth + 1]) if n.startswith("/") and n.count("/") > depth else n
               for n in names}
        count = len(set(key.values()))
        if max(12.0, len(names) / 40) <= count < len(names) / 3:
            return key
    return None


def _worst_of(values: list[float | str], better: str) -> float | str:
    if any(isinstance(v, str) for v in values):
        return max(set(map(str, values)), key=list(map(str, values)).count)
    return min(values) if better == "max" else max(values)


def _blocks(graph: ModelGraph, overlays: list[Overlay], engine: str) -> dict[str, Any] | None:
    """The blocks view: one node per block (:func:`block_of`) holding its ops' indices, an edge
    wherever an op edge crosses blocks, each overlay's worst value of the block's ops."""
    names = [n.name for n in graph.nodes]
    key = block_of(names)
    if key is None:
        return None
    members: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        members.setdefault(key[n], []).append(i)
    edges = list(dict.fromkeys((key[a], key[b]) for a, b in graph.edges if key.get(a) != key.get(b) and a in key and b in key))
    lay = layout(list(members), edges, engine=engine)
    order = {b: i for i, b in enumerate(members)}
    nodes = [[b, f"{b.rsplit('/', 1)[-1]} ({len(m)})" if len(m) > 1 else graph.nodes[m[0]].op_type,
              round(lay.positions[b][0], 1), round(lay.positions[b][1], 1), m, ""] for b, m in members.items()]
    docs = []
    for o in overlays:
        grouped = {}
        for b, m in members.items():
            vals = [o.values[names[i]] for i in m if names[i] in o.values and o.values[names[i]] is not None]
            if vals:
                grouped[b] = _worst_of(vals, o.better)
        docs.append(_overlay_doc(Overlay(o.name, grouped, o.better, o.label, o.categories, o.key), list(members)))
    return {"nodes": nodes, "edges": [[order[a], order[b]] for a, b in edges], "width": round(lay.width, 1),
            "height": round(lay.height, 1), "overlays": docs}


def _panel_data(graph: ModelGraph, overlays: Iterable[Overlay], *, engine: str = "auto") -> dict[str, Any]:
    """The panel's data (what the page embeds as JSON): nodes with their place, edges, overlays,
    and the blocks view where the names have paths."""
    overlays = list(overlays)
    names = [n.name for n in graph.nodes]
    lay = layout(names, list(graph.edges), engine=engine)
    index = {n: i for i, n in enumerate(names)}
    nodes = [[n.name, n.op_type, round(lay.positions[n.name][0], 1), round(lay.positions[n.name][1], 1),
              list(n.quantizers), n.module or ""] for n in graph.nodes]
    edges = [[index[a], index[b]] for a, b in graph.edges if a in index and b in index]
    return {"nodes": nodes, "edges": edges, "width": round(lay.width, 1), "height": round(lay.height, 1),
            "engine": lay.engine, "box": [NODE_W, NODE_H], "overlays": [_overlay_doc(o, names) for o in overlays],
            "blocks": _blocks(graph, overlays, engine)}


STYLE = (".qg{border:1px solid #ccc;position:relative}.qg .bar{padding:4px 6px;background:#f6f6f6;font-size:90%}"
         ".qg .bar>*{margin-right:.6em}.qg .body{display:flex}.qg svg.main{flex:1;height:640px;display:block;cursor:grab;"
         "background:#fff}.qg svg.mini{width:60px;height:640px;border-left:1px solid #ccc;background:#fafafa;cursor:pointer}"
         ".qg .tip{position:absolute;pointer-events:none;background:#fffffe;border:1px solid #999;padding:3px 6px;"
         "font-size:85%;display:none;max-width:480px;z-index:2}.qg .legend{font-size:85%;padding:2px 6px}"
         ".qg .legend .ramp{display:inline-block;width:180px;height:12px;vertical-align:middle;border:1px solid #999}"
         ".qg .legend .sw{display:inline-block;width:12px;height:12px;border:1px solid #999;vertical-align:middle}"
         ".qg g.n.hit rect{stroke:#06c;stroke-width:3}.qg g.n.sel rect{stroke:#000;stroke-width:3}"
         ".qg text{pointer-events:none}tr.qg-row td,h3.qg-row{background:#cfe8ff}")


def panel(graph: ModelGraph, overlays: list[Overlay], *, engine: str = "auto", pid: str = "graph") -> str:
    """The panel's HTML (a ``<div class="qg">`` with its data and script), to put in a report
    section; ``pid`` keeps two panels on one page apart."""
    data = json.dumps(_panel_data(graph, overlays, engine=engine), separators=(",", ":"), allow_nan=False)
    data = data.replace("</", "<\\/")
    count = len(graph.nodes)
    note = (f"<p>{count} ops, laid out top to bottom; colour: the selected analysis (legend below). Hover a node "
            "for its numbers, click it to jump to its rows, drag to pan, wheel or the buttons to zoom.</p>")
    return (f"{note}<style>{STYLE}</style><div class='qg' id='{html.escape(pid)}'>"
            "<div class='bar'><select class='view' aria-label='draw'></select><select class='ov' aria-label='colour by'></select>"
            "<input class='find' type='search' placeholder='find a node' size='24'>"
            "<button class='zin'>+</button><button class='zout'>&minus;</button><button class='fit'>fit</button>"
            "<button class='worst'>worst node</button><span class='info'></span></div>"
            "<div class='legend'></div><div class='body'><svg class='main' xmlns='http://www.w3.org/2000/svg'></svg>"
            "<svg class='mini' xmlns='http://www.w3.org/2000/svg'></svg></div><div class='tip'></div>"
            f"<script type='application/json' class='qg-data'>{data}</script></div>"
            f"<script>{_SCRIPT.read_text(encoding='utf-8')}</script>")
