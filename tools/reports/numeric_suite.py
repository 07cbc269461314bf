"""The numeric-suite report (:mod:`qir.passes.numeric_suite`): ``numeric_suite.txt`` (per
comparison, the mean SQNR per entry, worst first) and ``numeric_suite.json`` (those rows). The
pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path

from qir.json_dump import write_json
from qir.passes.numeric_suite import summary
from qir.tools.reports.tables import format_table

__all__ = ["write_report"]


def write_report(results: dict[str, dict[str, dict]], out_dir: str | Path) -> list[Path]:
    """``numeric_suite.txt`` and ``numeric_suite.json``; ``results`` is
    ``{"weights"|"outputs"|"stub": result}`` (the ``numeric-suite`` pass's report)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables = {kind: summary(found) for kind, found in results.items()}
    txt = out / "numeric_suite.txt"
    txt.write_text("\n".join(format_table(["name", "sqnr_db"], rows, f"{kind}: SQNR (dB), worst first")
                             for kind, rows in tables.items()))
    return [txt, write_json(out / "numeric_suite.json", "qir.numeric_suite", tables)]
