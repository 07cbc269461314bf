"""``consistency_result.html``: the consistency check (:mod:`qir.passes.consistency`) as one
self-contained page (:func:`qir.tools.reports.html.page`): its summary as the headline, the graph
panel coloured by where the integer level deviates from fake quantization, and the table of every
quantized value (``consistency_result.txt``'s), each row findable from the graph."""
from __future__ import annotations

from pathlib import Path

from qir.tools.reports.graph_panel import ModelGraph
from qir.tools.reports.html import page, table
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.overlays import consistency_overlays, graph_section

__all__ = ["FILE", "write_page"]

FILE = "consistency_result.html"
COLUMNS = ["node", "op", "op_type", "mode", "own_max_step", "own_differ", "max_step", "differ", "cosine", "cause"]


def write_page(rows: list[dict], headline: list[str], graph: ModelGraph | None, save_dir: Outputs | str | Path) -> Path:
    """The page of the report's ``rows`` under the ``headline`` lines, through
    :class:`~qir.tools.reports.output.Outputs`."""
    sections = [*graph_section(graph, consistency_overlays(rows, graph) if graph else []),
                ("values", "Every quantized value", "<p>own: from the fake-quant inputs; total: with what it "
                 "inherits.</p>" + table(rows, [c for c in COLUMNS if not rows or c in rows[0]], limit=None, node="op"))]
    return as_outputs(save_dir).write_text(FILE, page("qir consistency report", headline, sections))
