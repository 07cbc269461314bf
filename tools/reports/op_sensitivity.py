"""The op-sensitivity report (:mod:`qir.passes.op_sensitivity`): ``sensitive_ops.txt`` (one table
per model output, with the metric's 95% bootstrap interval, the rank interval and the stable
top-k when the report rests on several samples) and ``sensitive_ops.json`` (schema
``qir.sensitive_ops`` v1, which ``set-mode --sensitive`` reads back). The pass computes; only this
module writes."""
from __future__ import annotations

from pathlib import Path

from qir.passes.op_sensitivity import OpSensitivityReport
from qir.tools.reports.node_sensitivity import interval_cells, stable_line
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.tables import format_table

__all__ = ["write_report", "format_report", "FILE_STEM", "FILES"]

FILE_STEM = "sensitive_ops"
FILES = (f"{FILE_STEM}.txt", f"{FILE_STEM}.json")


def format_report(report: OpSensitivityReport) -> str:
    """``sensitive_ops.txt``: per output, ``op_name, sensitive_type, op_type, <metric>, quant_dtype,
    flops``, most sensitive first (on several samples also the interval and the rank)."""
    m = report.metric
    columns = ["op_name", "sensitive_type", "op_type", m, "quant_dtype", "flops"]
    several = report.samples > 1
    if several:
        columns += ["95% interval", "rank"]
    parts = []
    for name in report.outputs:
        rows = []
        for r in report.table_rows(name):
            row = {**r, "flops": r["flops_text"]}
            if several:
                row["95% interval"], row["rank"] = interval_cells(r[f"{m}_low"], r[f"{m}_high"], r["rank_low"],
                                                                  r["rank_high"])
            rows.append(row)
        parts.append(format_table(columns, rows, f"output {name}: most sensitive first by {m}")
                     + stable_line(report.confidence.get(name), "op"))
    return "\n".join(parts)


def write_report(report: OpSensitivityReport, save_dir: Outputs | str | Path) -> list[Path]:
    """``sensitive_ops.txt`` (one table per output) and ``sensitive_ops.json``, through
    :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(FILES[0], format_report(report)),
            out.write_json(FILES[1], "qir.sensitive_ops", report.to_json())]
