"""The numeric-suite report (:mod:`qir.passes.numeric_suite`): ``numeric_suite.txt`` (per
comparison, the mean SQNR per entry, worst first) and ``numeric_suite.json`` (those rows). The
pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path

from qir.passes.numeric_suite import summary
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.tables import format_table

__all__ = ["FILES", "write_report"]

FILES = ("numeric_suite.txt", "numeric_suite.json")


def write_report(results: dict[str, dict[str, dict]], out_dir: Outputs | str | Path) -> list[Path]:
    """``numeric_suite.txt`` and ``numeric_suite.json``, through
    :class:`~qir.tools.reports.output.Outputs`; ``results`` is ``{"weights"|"outputs"|"stub": result}``
    (the ``numeric-suite`` pass's report)."""
    out = as_outputs(out_dir)
    tables = {kind: summary(found) for kind, found in results.items()}
    text = "\n".join(format_table(["name", "sqnr_db"], rows, f"{kind}: SQNR (dB), worst first")
                     for kind, rows in tables.items())
    return [out.write_text(FILES[0], text), out.write_json(FILES[1], "qir.numeric_suite", tables)]
