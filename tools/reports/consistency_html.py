"""``consistency_result.html``: the consistency check (:mod:`qir.passes.consistency`) as one
self-contained page (:func:`qir.tools.reports.html.page`): its summary as the headline, the graph
panel coloured by where the integer level deviates from fake quantization, and the table of every
quantized value (``consistency_result.txt``'s), each row findable from the graph. With the viz
extra the panel's overlays are also written as Model Explorer node data
(``model_explorer/consistency_step.json``, ``model_explorer/consistency_cosine.json``), as are
those of the comparison with onnxruntime (:func:`write_ort_node_data`:
``model_explorer/ort_step.json``)."""
from __future__ import annotations

from pathlib import Path

from qir.runtimes.integer.against_ort import OrtComparison
from qir.tools.reports import model_explorer
from qir.tools.reports.graph_panel import ModelGraph
from qir.tools.reports.html import page, table
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.overlays import CONSISTENCY_KEYS, ORT_KEYS, consistency_overlays, graph_section, ort_overlays

__all__ = ["FILE", "files", "ort_files", "write_page", "write_ort_node_data"]

FILE = "consistency_result.html"
COLUMNS = ["node", "op", "op_type", "mode", "own_max_step", "own_differ", "max_step", "differ", "cosine", "cause"]


def files() -> list[str]:
    """What :func:`write_page` may write, to plan: the page and, with the viz extra, its node data."""
    return [FILE, *model_explorer.files(CONSISTENCY_KEYS)]


def ort_files() -> list[str]:
    """What :func:`write_ort_node_data` may write, to plan (nothing without the viz extra)."""
    return model_explorer.files(ORT_KEYS)


def write_page(rows: list[dict], headline: list[str], graph: ModelGraph | None, save_dir: Outputs | str | Path) -> Path:
    """The page of the report's ``rows`` under the ``headline`` lines, and with the viz extra its
    overlays as node data, through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    overlays = consistency_overlays(rows, graph) if graph else []
    sections = [*graph_section(graph, overlays),
                ("values", "Every quantized value", "<p>own: from the fake-quant inputs; total: with what it "
                 "inherits.</p>" + table(rows, [c for c in COLUMNS if not rows or c in rows[0]], limit=None, node="op"))]
    written = out.write_text(FILE, page("qir consistency report", headline, sections))
    if graph:
        model_explorer.write_overlays(out, overlays, graph.name)
    return written


def write_ort_node_data(report: OrtComparison, graph: ModelGraph, save_dir: Outputs | str | Path) -> list[Path]:
    """The comparison with onnxruntime drawn on ``graph`` (the QDQ model's) as Model Explorer node
    data, with the viz extra; the files written."""
    return model_explorer.write_overlays(as_outputs(save_dir), ort_overlays(report.values, graph), graph.name)
