"""The consistency report (:mod:`qir.passes.consistency`): ``consistency_result.txt`` (what the
comparison means, then one row per quantized value in execution order) and
``consistency_result.json`` (schema ``qir.consistency`` v1). The pass computes; only this module
writes."""
from __future__ import annotations

from pathlib import Path

from qir.passes.consistency import ConsistencyReport
from qir.runtimes.integer.against_ort import OrtComparison
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILES", "ORT_FILES", "format_ort_report", "format_report", "write_ort_report", "write_report"]

FILES = ("consistency_result.txt", "consistency_result.json")
ORT_FILES = ("ort_consistency.txt", "ort_consistency.json")


def format_report(consistency: ConsistencyReport) -> str:
    """``consistency_result.txt``: the summary, where deviations start, and the full table."""
    report = consistency.to_json()
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


def write_report(report: ConsistencyReport, save_dir: Outputs | str | Path) -> list[Path]:
    """``consistency_result.txt`` and ``consistency_result.json``, through
    :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(FILES[0], format_report(report)),
            out.write_json(FILES[1], "qir.consistency", report.to_json())]


def format_ort_report(report: OrtComparison) -> str:
    """``ort_consistency.txt``: the first departing op, then every quantized value with the
    kernel onnxruntime ran for it."""
    first, own = report.first, report.first_own
    lines = [f"the integer level of {report.march} vs onnxruntime's default CPU session on {report.samples} sample(s)",
             "", f"output codes equal: {report.output_codes_agree:.4%}; output cosine {report.output_cosine:.7f}"]
    lines += [f"note: {n}" for n in report.notes]
    if own is None:
        lines.append("no op departs from onnxruntime: every compared code is equal"
                     if first is None else "no op departs by itself; differences are inherited")
    else:
        lines.append(f"first op that departs by itself: {own.op} ({own.op_type}; onnxruntime ran {own.ort_kernel}): "
                     f"{own.own_differ} code(s) differ, up to {own.own_max_step} step(s)")
        lines.append(f"{len(report.departing)} op(s) depart by themselves; first difference at "
                     f"{first.op if first else '-'}")
    lines += ["", "onnxruntime's kernels: " + ", ".join(f"{k} {n}" for k, n in sorted(report.kernels.items())), "",
              f"  {'op':<60}{'onnxruntime ran':<26}{'own diff':>9}{'own max':>8}{'differ':>9}{'max':>5}"]
    for v in report.values:
        lines.append(f"  {v.op or v.node:<60}{v.ort_kernel:<26}{v.own_differ:>9}{v.own_max_step:>8}"
                     f"{v.differ / max(v.count, 1):>9.3%}{v.max_step:>5}")
    return "\n".join(lines) + "\n"


def write_ort_report(report: OrtComparison, save_dir: Outputs | str | Path) -> list[Path]:
    """``ort_consistency.txt`` and ``ort_consistency.json`` (schema ``qir.ort-consistency`` v1)."""
    out = as_outputs(save_dir)
    return [out.write_text(ORT_FILES[0], format_ort_report(report)),
            out.write_json(ORT_FILES[1], "qir.ort-consistency", report.to_json())]
