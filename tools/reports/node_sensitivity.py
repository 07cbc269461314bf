"""The node-sensitivity report as files: the seed's verbose table (``.txt``, also what ``-v``
prints), ``.csv`` (one row per node) and ``.json`` (schema ``qir.node_sensitivity`` v1).

The report is the ``NodeSensitivityPass`` report (:class:`~qir.passes.node_sensitivity.NodeSensitivityReport`);
this module only formats and writes it. The table keeps the seed's own layout (a centred ``=``
title, metrics to 5 decimals) rather than the generic one of :mod:`qir.tools.reports.tables`,
with two columns more: the first metric's 95% bootstrap interval and the row's rank interval,
and a last line naming the stable top-k (:mod:`qir.passes.lib.confidence`).
"""
from __future__ import annotations

from pathlib import Path

from qir.execution import Level
from qir.passes.lib.confidence import Ranking
from qir.passes.node_sensitivity import NodeSensitivityReport
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILE_STEM", "files", "format_table", "write_report", "interval_cells", "stable_line"]

FILE_STEM = "node_sensitivity"


def interval_cells(low: float, high: float, rank_low: int, rank_high: int) -> tuple[str, str]:
    """A row's ``[low, high]`` interval and its rank (``3`` or ``2-5``) as table cells."""
    return f"[{low:.5f}, {high:.5f}]", str(rank_low) if rank_low == rank_high else f"{rank_low}-{rank_high}"


def stable_line(confidence: Ranking | None, what: str = "node") -> str:
    """The table's last line: how settled its order is."""
    if confidence is None:
        return ""
    if confidence.stable_top_k is None:
        return f"{confidence.summary()}\n"
    k = confidence.stable_top_k
    named = (f"the first {what} is the cause" if confidence.settled(1) else
             f"no single {what} is settled first: the top {k} together" if k else f"no top set is settled: "
             f"more samples would say which {what}s matter")
    return f"{confidence.summary()}: {named}\n"


def format_table(report: NodeSensitivityReport) -> str:
    """The seed's verbose table: node [consumers threshold bit] metrics, worst first, then the
    first metric's interval and the rank interval."""
    rows, metrics, conf = report.rows, report.metrics, report.confidence
    extra = [k for k in ("consumers", "module", "threshold", "bit") if rows and k in rows[0]]
    head = ["weight" if report.node_type == "weight" else "activation" if report.node_type == "activation"
            else "node"] + (["node"] if "consumers" in extra else []) + [k for k in extra if k != "consumers"] + metrics
    if conf is not None:
        head += [f"{metrics[0]} 95% interval", "rank"]
    body = []
    for i, r in enumerate(rows):
        cells = ([r["node"]] + ([r["consumers"]] if "consumers" in extra else [])
                 + [str(r[k]) for k in extra if k != "consumers"] + [f"{r[m]:.5f}" for m in metrics])
        if conf is not None:
            c = conf.rows[i]
            cells += list(interval_cells(c.low, c.high, c.rank_low, c.rank_high))
        body.append(cells)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    level = f" ({report.level} level, {report.march})" if report.level == Level.INTEGER else ""
    title = f" node sensitivity{level} ".center(len(line(head)), "=")
    return "\n".join([title, line(head), "-" * len(line(head))] + [line(b) for b in body]) + "\n" + stable_line(conf)


def files(stem: str = FILE_STEM) -> list[str]:
    """The files :func:`write_report` writes with ``stem``."""
    return [f"{stem}.{ext}" for ext in ("txt", "csv", "json")]


def write_report(report: NodeSensitivityReport, save_dir: Outputs | str | Path, stem: str = FILE_STEM) -> list[Path]:
    """``<stem>.txt`` (the table), ``.csv`` and ``.json`` (schema ``qir.node_sensitivity`` v1:
    ``{"schema", "version", "node_type", "start", "metrics", "compare", "samples", "rows", "level",
    "confidence"}``, ``march`` at the integer level, and ``saturated`` when the ranking moved to
    the logits; each row with ``<metric>_low``, ``<metric>_high``, ``rank``, ``rank_low`` and
    ``rank_high``; the engine's statistics are left out); the stem defaults to
    ``node_sensitivity``. Written through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    txt, csv_name, js = files(stem)
    doc = report.to_json()
    keys = list(dict.fromkeys(k for r in doc["rows"] for k in r)) or ["node"]
    rows = [keys] + [[r.get(k, "") for k in keys] for r in doc["rows"]]
    return [out.write_text(txt, format_table(report)), out.write_csv(csv_name, rows),
            out.write_json(js, "qir.node_sensitivity", doc)]
