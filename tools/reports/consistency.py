"""The consistency report (:mod:`qir.passes.consistency`): ``consistency_result.txt`` (what the
comparison means, then one row per quantized value in execution order) and
``consistency_result.json`` (schema ``qir.consistency`` v1). The pass computes; only this module
writes."""
from __future__ import annotations

from pathlib import Path

from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILES", "format_report", "write_report"]

FILES = ("consistency_result.txt", "consistency_result.json")


def format_report(report: dict) -> str:
    """``consistency_result.txt``: the summary, where deviations start, and the full table."""
    rows = report["rows"]
    lines = [f"fake quantization vs the integer level of {report['march']} on {report['samples']} sample(s)", "",
             report["summary"], ""]
    if report.get("left_out"):
        lines.append(f"{len(report['left_out'])} sample(s) left out, their fake-quantized values hold NaN or Inf: "
                     + "; ".join(f"sample {i}: {why}" for i, why in report["left_out"].items()))
    if report["bad_case"] is not None:
        lines.append(f"bad case: sample {report['bad_case']} (output cosine "
                     f"{report['output_cosine'][report['bad_case']]:.6f})")
    if report["float_fallback"]:
        lines.append("ran in float (no integer kernel): " + "; ".join(
            f"{op} ({len(names)})" for op, names in sorted(report["float_fallback"].items())))
    if report["overflows"]:
        lines.append("accumulator overflow: " + ", ".join(f"{n} ({c})" for n, c in report["overflows"].items()))
    starts = sorted((r for r in rows if r["introduced"]), key=lambda r: (-r["own_max_step"], -r["own_differ"]))
    lines += ["", f"== where deviations are introduced (from the fake-quant inputs): {len(starts) or 'nowhere'}"]
    lines += [f"  {r['node']} ({r['op_type']} {r['op']}): {r['cause']}, max {r['own_max_step']} step(s), "
              f"{r['own_differ']:.2%} of codes" for r in starts[:20]]
    if len(starts) > 20:
        lines.append(f"  ... {len(starts) - 20} more in the table below")
    lines += ["", "== every quantized value (own: from the fake-quant inputs; total: with what it inherits)",
              f"  {'node':<44}{'op':<20}{'mode':<7}{'own max':>8}{'own diff':>9}{'max step':>9}{'differ':>9}"
              f"{'cosine':>12}  cause"]
    for r in rows:
        lines.append(f"  {r['node']:<44}{r['op_type']:<20}{r['mode']:<7}{r['own_max_step']:>8}{r['own_differ']:>9.2%}"
                     f"{r['max_step']:>9}{r['differ']:>9.2%}{r['cosine']:>12.7f}  {r['cause']}")
    return "\n".join(lines) + "\n"


def write_report(report: dict, save_dir: Outputs | str | Path) -> list[Path]:
    """``consistency_result.txt`` and ``consistency_result.json``, through
    :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(FILES[0], format_report(report)), out.write_json(FILES[1], "qir.consistency", report)]
