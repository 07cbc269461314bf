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


def write_report(results: dict[str, dict], out_dir: Outputs | str | Path) -> list[Path]:
    """``numeric_suite.txt`` and ``numeric_suite.json``, through
    :class:`~qir.tools.reports.output.Outputs`; ``results`` is ``{"weights"|"outputs"|"stub": result}``
    and, when samples were left out (NaN or Inf float outputs), ``"left_out": {sample: why}`` (the
    ``numeric-suite`` pass's report): their count heads the text, the JSON lists them."""
    out = as_outputs(out_dir)
    left_out = results.get("left_out") or {}
    tables = {kind: summary(found) for kind, found in results.items() if kind != "left_out"}
    text = "\n".join(format_table(["name", "sqnr_db"], rows, f"{kind}: SQNR (dB), worst first")
                     for kind, rows in tables.items())
    if left_out:
        text = (f"{len(left_out)} sample(s) left out: their float outputs hold NaN or Inf ("
                + "; ".join(f"sample {i}: {why}" for i, why in left_out.items()) + ")\n\n" + text)
    doc = {**tables, "left_out": left_out} if left_out else tables
    return [out.write_text(FILES[0], text), out.write_json(FILES[1], "qir.numeric_suite", doc)]
