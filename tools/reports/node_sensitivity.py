"""The node-sensitivity report as files: the seed's verbose table (``.txt``, also what ``-v``
prints), ``.csv`` (one row per node) and ``.json`` (schema ``qir.node_sensitivity`` v1).

The report is the ``NodeSensitivityPass`` report; this module only formats and writes it. The
table keeps the seed's own layout (a centred ``=`` title, metrics to 5 decimals) rather than the
generic one of :mod:`qir.tools.reports.tables`.
"""
from __future__ import annotations

from pathlib import Path

from qir.execution import Level
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILE_STEM", "files", "format_table", "write_report"]

FILE_STEM = "node_sensitivity"


def format_table(report: dict) -> str:
    """The seed's verbose table: node [consumers threshold bit] metrics, worst first."""
    rows, metrics = report["rows"], report["metrics"]
    extra = [k for k in ("consumers", "module", "threshold", "bit") if rows and k in rows[0]]
    head = ["weight" if report["node_type"] == "weight" else "activation" if report["node_type"] == "activation"
            else "node"] + (["node"] if "consumers" in extra else []) + [k for k in extra if k != "consumers"] + metrics
    body = [[r["node"]] + ([r["consumers"]] if "consumers" in extra else [])
            + [str(r[k]) for k in extra if k != "consumers"] + [f"{r[m]:.5f}" for m in metrics] for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    level = f" ({report['level']} level, {report['march']})" if report.get("level") == Level.INTEGER else ""
    title = f" node sensitivity{level} ".center(len(line(head)), "=")
    return "\n".join([title, line(head), "-" * len(line(head))] + [line(b) for b in body]) + "\n"


def files(stem: str = FILE_STEM) -> list[str]:
    """The files :func:`write_report` writes with ``stem``."""
    return [f"{stem}.{ext}" for ext in ("txt", "csv", "json")]


def write_report(report: dict, save_dir: Outputs | str | Path, stem: str = FILE_STEM) -> list[Path]:
    """``<stem>.txt`` (the table), ``.csv`` and ``.json`` (schema ``qir.node_sensitivity`` v1:
    ``{"schema", "version", "node_type", "start", "metrics", "compare", "samples", "rows", "level"}``,
    ``march`` at the integer level, and ``saturated`` when the ranking moved to the logits; the engine's statistics are left out);
    the stem defaults to ``node_sensitivity``. Written through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    txt, csv_name, js = files(stem)
    keys = list(dict.fromkeys(k for r in report["rows"] for k in r)) or ["node"]
    rows = [keys] + [[r.get(k, "") for k in keys] for r in report["rows"]]
    return [out.write_text(txt, format_table(report)), out.write_csv(csv_name, rows),
            out.write_json(js, "qir.node_sensitivity", {k: v for k, v in report.items() if k != "engine"})]
