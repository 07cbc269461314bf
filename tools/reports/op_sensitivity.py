"""The op-sensitivity report (:mod:`qir.passes.op_sensitivity`): ``sensitive_ops.txt`` (one table
per model output) and ``sensitive_ops.json`` (schema ``qir.sensitive_ops`` v1, which
``set-mode --sensitive`` reads back). The pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path

from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.tables import format_table

__all__ = ["write_report", "FILE_STEM", "FILES"]

FILE_STEM = "sensitive_ops"
FILES = (f"{FILE_STEM}.txt", f"{FILE_STEM}.json")


def format_report(report: dict) -> str:
    """``sensitive_ops.txt``: per output, ``op_name, sensitive_type, op_type, <metric>, quant_dtype,
    flops``, most sensitive first."""
    m = report["metric"]
    columns = ["op_name", "sensitive_type", "op_type", m, "quant_dtype", "flops"]
    return "\n".join(format_table(columns, [{**r, "flops": r["flops_text"]} for r in rows],
                                  f"output {name}: most sensitive first by {m}")
                     for name, rows in report["outputs"].items())


def write_report(report: dict, save_dir: Outputs | str | Path) -> list[Path]:
    """``sensitive_ops.txt`` (one table per output) and ``sensitive_ops.json``, through
    :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(FILES[0], format_report(report)), out.write_json(FILES[1], "qir.sensitive_ops", report)]
