"""The op-sensitivity report (:mod:`qir.passes.op_sensitivity`): ``sensitive_ops.txt`` (one table
per model output) and ``sensitive_ops.json`` (schema ``qir.sensitive_ops`` v1, which
``set-mode --sensitive`` reads back). The pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path

from qir.json_dump import write_json
from qir.tools.reports.tables import format_table

__all__ = ["write_report", "FILE_STEM"]

FILE_STEM = "sensitive_ops"


def format_report(report: dict) -> str:
    """``sensitive_ops.txt``: per output, ``op_name, sensitive_type, op_type, <metric>, quant_dtype,
    flops``, most sensitive first."""
    m = report["metric"]
    columns = ["op_name", "sensitive_type", "op_type", m, "quant_dtype", "flops"]
    return "\n".join(format_table(columns, [{**r, "flops": r["flops_text"]} for r in rows],
                                  f"output {name}: most sensitive first by {m}")
                     for name, rows in report["outputs"].items())


def write_report(report: dict, save_dir: str | Path) -> list[Path]:
    """``sensitive_ops.txt`` (one table per output) and ``sensitive_ops.json``."""
    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    txt = out / f"{FILE_STEM}.txt"
    txt.write_text(format_report(report))
    return [txt, write_json(out / f"{FILE_STEM}.json", "qir.sensitive_ops", report)]
