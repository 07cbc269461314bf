"""Top-to-bottom layouts of a model's graph for the reports' graph panel
(:mod:`qir.tools.reports.graph_panel`): Graphviz ``dot`` when it is installed, a pure-Python
layered layout otherwise (or when ``dot`` fails or takes too long).

A graph here is its node names in execution order and its edges ``(tail, head)``; a layout gives
each node the centre of its box, in points, y growing downwards, and the size of the whole
drawing. The pure-Python layout is a small Sugiyama-style one: each node's layer is one below
its lowest predecessor (longest path from the inputs), nodes are ordered within a layer by the
mean position of their neighbours (a few down and up sweeps), then placed left to right and each
layer centred. It never crosses a layer in one edge, so long skip connections are straight lines
drawn over the layers between, which is what a reader of a network expects.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Layout", "layout", "layered", "graphviz", "NODE_W", "NODE_H"]

logger = logging.getLogger(__name__)

NODE_W, NODE_H = 110.0, 26.0  # a node's box, points
GAP_X, GAP_Y = 14.0, 22.0  # space between boxes in a layer, and between layers
SWEEPS = 4  # ordering sweeps (down and up) of the layered layout
DOT_TIMEOUT = 60.0  # seconds dot may take before the pure-Python layout is used


@dataclass(frozen=True)
class Layout:
    """Node centres ``{name: (x, y)}`` (points, y downwards), the drawing's ``width`` and
    ``height``, and the ``engine`` that placed them (``"dot"`` or ``"layered"``)."""

    positions: dict[str, tuple[float, float]]
    width: float
    height: float
    engine: str


def layout(nodes: Sequence[str], edges: Sequence[tuple[str, str]], *, engine: str = "auto") -> Layout:
    """The layout of the graph: ``engine="auto"`` uses Graphviz's ``dot`` when it is on the PATH
    and falls back to :func:`layered` when it is not or fails; ``"dot"`` or ``"layered"`` choose."""
    if engine in ("auto", "dot") and shutil.which("dot"):
        try:
            return graphviz(nodes, edges)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            logger.info("dot failed (%s); using the pure-Python layered layout", exc)
    return layered(nodes, edges)


def _layers(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> dict[str, int]:
    """Longest-path layering; ``nodes`` in execution order, so predecessors come first (an edge
    against that order, which a valid graph lacks, is ignored)."""
    order = {n: i for i, n in enumerate(nodes)}
    preds: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in order and b in order and order[a] < order[b]:
            preds[b].append(a)
    layer: dict[str, int] = {}
    for n in nodes:
        layer[n] = 1 + max((layer[p] for p in preds[n]), default=-1)
    return layer


def layered(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> Layout:
    """The pure-Python layered layout (see the module docstring)."""
    nodes = list(dict.fromkeys(nodes))
    layer = _layers(nodes, edges)
    rows: list[list[str]] = [[] for _ in range(1 + max(layer.values(), default=-1))]
    for n in nodes:
        rows[layer[n]].append(n)
    up: dict[str, list[str]] = {n: [] for n in nodes}
    down: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        if a in layer and b in layer and layer[a] < layer[b]:
            up[b].append(a)
            down[a].append(b)
    pos = {n: float(i) for row in rows for i, n in enumerate(row)}

    def sweep(seq: list[list[str]], links: dict[str, list[str]]) -> None:
        for row in seq:
            def key(n: str) -> float:
                near = links[n]
                return sum(pos[m] for m in near) / len(near) if near else pos[n]
            row.sort(key=key)
            for i, n in enumerate(row):
                pos[n] = float(i) - (len(row) - 1) / 2.0

    for row in rows:  # centre each layer before the first sweep
        for i, n in enumerate(row):
            pos[n] = float(i) - (len(row) - 1) / 2.0
    for _ in range(SWEEPS):
        sweep(rows[1:], up)
        sweep(list(reversed(rows[:-1])), down)
    widest = max((len(r) for r in rows), default=1)
    step = NODE_W + GAP_X
    width = widest * step + GAP_X
    positions = {n: (width / 2.0 + pos[n] * step, GAP_Y + NODE_H / 2.0 + layer[n] * (NODE_H + GAP_Y)) for n in nodes}
    height = len(rows) * (NODE_H + GAP_Y) + GAP_Y
    return Layout(positions, width, height, "layered")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot_text(nodes: Sequence[str], edges: Sequence[tuple[str, str]]) -> tuple[str, dict[str, str]]:
    """DOT text with node ids ``n0, n1, ...`` (names may hold any character), and id -> name."""
    ids = {n: f"n{i}" for i, n in enumerate(dict.fromkeys(nodes))}
    lines = ["digraph g {", "rankdir=TB; nodesep=0.2; ranksep=0.3;",
             f'node [shape=box, fixedsize=true, width={NODE_W / 72:.3f}, height={NODE_H / 72:.3f}, label=""];']
    lines += [f"{i};" for i in ids.values()]
    lines += [f"{ids[a]} -> {ids[b]};" for a, b in edges if a in ids and b in ids]
    lines.append("}")
    return "\n".join(lines), {i: n for n, i in ids.items()}


def graphviz(nodes: Sequence[str], edges: Sequence[tuple[str, str]], *, timeout: float = DOT_TIMEOUT) -> Layout:
    """The layout Graphviz's ``dot`` computes (``-Tplain``: inches, y upwards, turned here into
    points with y downwards). Raises ``OSError``/``SubprocessError`` when ``dot`` is missing or
    fails, ``ValueError`` when its output cannot be read."""
    text, names = _dot_text(nodes, edges)
    done = subprocess.run(["dot", "-Tplain"], input=text, capture_output=True, text=True, timeout=timeout, check=True)
    positions: dict[str, tuple[float, float]] = {}
    width = height = 0.0
    for line in done.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "graph":
            width, height = float(parts[2]) * 72, float(parts[3]) * 72
        elif parts and parts[0] == "node":
            positions[names[parts[1]]] = (float(parts[2]) * 72, float(parts[3]) * 72)
    if len(positions) != len(names) or not height:
        raise ValueError(f"dot placed {len(positions)} of {len(names)} nodes")
    flipped = {n: (x, height - y) for n, (x, y) in positions.items()}
    return Layout(flipped, width, height, "dot")
