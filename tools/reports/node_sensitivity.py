"""The node-sensitivity report as files: the seed's verbose table (``.txt``, also what ``-v``
prints), ``.csv`` (one row per node) and ``.json`` (schema ``qir.node_sensitivity`` v1).

The report is the ``NodeSensitivityPass`` report; this module only formats and writes it. The
table keeps the seed's own layout (a centred ``=`` title, metrics to 5 decimals) rather than the
generic one of :mod:`qir.tools.reports.tables`.
"""
from __future__ import annotations

import csv
from pathlib import Path

from qir.json_dump import write_json

__all__ = ["FILE_STEM", "format_table", "write_report"]

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
    title = " node sensitivity ".center(len(line(head)), "=")
    return "\n".join([title, line(head), "-" * len(line(head))] + [line(b) for b in body]) + "\n"


def write_report(report: dict, save_dir: str | Path, stem: str = FILE_STEM) -> list[Path]:
    """``<stem>.txt`` (the table), ``.csv`` and ``.json`` (schema ``qir.node_sensitivity`` v1:
    ``{"schema", "version", "node_type", "start", "metrics", "compare", "samples", "rows"}``, and
    ``saturated`` when the ranking moved to the logits; the engine's statistics are left out);
    the stem defaults to ``node_sensitivity``."""
    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    txt, csv_path, js = (out / f"{stem}.{ext}" for ext in ("txt", "csv", "json"))
    txt.write_text(format_table(report))
    keys = list(dict.fromkeys(k for r in report["rows"] for k in r)) or ["node"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(report["rows"])
    write_json(js, "qir.node_sensitivity", {k: v for k, v in report.items() if k != "engine"})
    return [txt, csv_path, js]
