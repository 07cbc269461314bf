"""The ``qir tune`` report (:mod:`qir.passes.tune`): ``tune_report.txt`` (the outcome, the bounds,
the changes with reasons and gains, the verification, the reproducing commands),
``tune_report.json`` (schema ``qir.tune`` v1: the pass's report plus the commands),
``tune_report.html`` (one self-contained page: the same, with the plot embedded),
``tune_curve.png`` (cost against the metric of every configuration tried, the Pareto front
highlighted), ``tune_history.csv`` (one row per configuration tried), ``tune_sensitivity.csv``
(the sensitivity order with its bootstrap intervals) and, with the viz extra, the page's graph
overlays as Model Explorer node data (``model_explorer/precision.json``: the precision chosen per
op; ``model_explorer/tune_sensitivity.json``: each unit's loss). The pass computes; only this
module writes."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qir.execution import Level
from qir.tools.reports import model_explorer
from qir.tools.reports.output import Outputs
from qir.tools.reports.overlays import TUNE_KEYS
from qir.tools.reports.plots import pyplot

if TYPE_CHECKING:
    from qir.passes.tune.report import TuneReport

__all__ = ["FILES", "files", "format_report", "write_report", "outcome"]

#: A reached target with a margin below this many standard errors of the mean gets a caution.
CAUTION_ERRORS = 2.0

FILES = ("tune_report.txt", "tune_report.json", "tune_report.html", "tune_curve.png", "tune_history.csv",
         "tune_sensitivity.csv")
SENSITIVITY_KEYS = ("rank", "unit", "loss", "mean_change", "change_low", "change_high", "rank_low", "rank_high")
SHOWN = 10  # sensitivity rows in the text report


def files() -> list[str]:
    """Every file :func:`write_report` may write, to plan: :data:`FILES` and, with the viz extra,
    the node data of :data:`~qir.tools.reports.overlays.TUNE_KEYS`."""
    return [*FILES, *model_explorer.files(TUNE_KEYS)]


def outcome(report: TuneReport) -> str:
    """One line: reached and verified, or why not. (This module reads the report by key, as its
    JSON document reads: :class:`~qir.passes.base.Report`.)"""
    final, ver = report["final"], report.get("verification") or {}
    head = (f"{report['target']} on {report['samples']} evaluation sample(s): {final['mean']:.6g} "
            f"(worst sample {final['worst']:.6g})")
    if not report["reached"]:
        return (f"NOT REACHED: {head}; the best configuration found. The upper bound (every unit at its last "
                f"integer level) scores {report['upper_bound']['mean']:.6g}, the ceiling {report['ceiling']['mean']:.6g}")
    integer = ver.get(Level.INTEGER)
    if ver and not ver["agrees"]:
        why = "; ".join(ver["roundtrip"][:3]) or (f"the emitted model scores {ver['mean']:.6g} in onnxruntime, the "
                                                  f"search measured {ver['searched']:.6g}")
        if not ver["roundtrip"] and integer and not integer["meets"] and ver["mean"] == ver["mean"]:
            why = (f"it scores {ver['mean']:.6g} in onnxruntime but {integer['mean']:.6g} at {integer['march']}'s "
                   "integer level, what the NPU computes, and no search for a tighter target (within the "
                   "bounds) made up the difference (qir compare --consistency names the ops where the two part)")
            failed = (report.get("integer_repair") or {}).get("failed_verification")
            if failed:
                raised = report["integer_repair"]["raised"]
                (mean, worst), (imean, iworst) = failed["onnxruntime"], failed[Level.INTEGER]
                why += (f"; the search at the integer level found {len(raised)} raise(s) ({_first(raised)}"
                        f") that meet it there ({imean:.6g}, worst {iworst:.6g}), "
                        f"but with them the emitted model scores {mean:.6g} (worst {worst:.6g}) in onnxruntime")
        return f"VERIFICATION FAILED: {head}; {why}"
    checked = f"; verified in onnxruntime: {ver['mean']:.6g}, margin {ver['margin']:.3g}" if ver else ""
    if integer:
        checked += f", and at {integer['march']}'s integer level: {integer['mean']:.6g}"
    if report.get("search_target"):
        checked += f" (searched for {report['search_target']}, so that it holds at the integer level)"
    repaired = [c["node"] for c in report.get("changes") or () if c["reason"] == "integer level"]
    if repaired:
        checked += (f" (the search at the integer level raised {', '.join(repaired)}: fake quantization alone "
                    "met the target where the integer level did not)")
    back = report.get("backtracked")
    if back:
        where = (f"pruning's cheapest with {back['raised_back'][0]} raised back to where its last step found it"
                 if back["raised_back"] else f"the configuration {back['steps']} pruning step(s) before the cheapest")
        checked += f" ({where}: the cheapest missed at the integer level)"
    return f"reached: {head}{checked}" + _thin_margin(report) + _unseen(report)


def _unseen(report: TuneReport) -> str:
    """The result on the check data (samples the search never saw), when there was some."""
    u = report.get("unseen")
    if not u:
        return ""
    return (f"\non {u['samples']} check sample(s) the search never saw: {u['mean']:.6g} (worst sample {u['worst']:.6g}): "
            + ("holds" if u["meets"] else "MISSES the target there"))


def _thin_margin(report: TuneReport) -> str:
    """A caution when the margin is within :data:`CAUTION_ERRORS` standard errors of the mean:
    other samples from the same source may then miss the target."""
    final = report["final"]
    error = final["standard_error"]
    if not error > 0 or final["margin"] >= CAUTION_ERRORS * error:
        return ""
    return (f"\nCAUTION: the margin ({final['margin']:.3g}) is {final['margin'] / error:.2g} standard error(s) of the "
            f"mean over {report['samples']} evaluation samples ({error:.3g}), and the search picked this configuration "
            "for its mean on them: on other data it may miss the target. Check it on samples the search did not see, "
            "tune on more evaluation samples, or ask for a higher target")


def _bounds_lines(r: TuneReport) -> list[str]:
    rows = [("calibrated (start)", r["calibrated"]), ("with clipping fixes", r["start"]),
            ("all-int16 activations", r["all_int16"]), ("upper bound", r["upper_bound"]),
            *([("ceiling", r["ceiling"])] if r["ceiling"] else []),
            *([("reference (searched from)", r["reference"])] if "reference" in r else []), ("result", r["final"])]
    base = r["calibrated"].get("time_us", r["calibrated"]["cost"]) or 1.0
    flop_base = r["calibrated"].get("flop_cost") or 1.0
    lines = [f"  {'configuration':<27}{'mean':>12}{'std error':>11}{'worst':>12}{'ms':>9}{'time':>7}{'FLOPs':>7}  levels"]
    for name, s in rows:
        levels = ", ".join(f"{k} {v}" for k, v in s["levels"].items())
        flops = f"{s['flop_cost'] / flop_base:>7.3f}" if "flop_cost" in s else f"{'-':>7}"
        lines.append(f"  {name:<27}{s['mean']:>12.6g}{s['standard_error']:>11.2g}{s['worst']:>12.6g}"
                     f"{s.get('time_us', s['cost']) / 1000.0:>9.3f}{s.get('time_us', s['cost']) / base:>7.3f}{flops}  {levels}")
    return lines


def _time_line(r: TuneReport) -> str:
    """The result's estimated time against all-int8 and all-int16, and its FLOP-weighted cost."""
    final, ms = r["final"], r.get("time_ms")
    text = f"cost x{final['cost_vs_start']:.3f} of the start, x{final['cost_vs_int16']:.3f} of all-int16"
    if ms:
        text = (f"estimated time {ms['final']:.3f} ms (all-int8 {ms['all_int8']:.3f} ms, all-int16 "
                f"{ms['all_int16']:.3f} ms" + (f"; {ms['measured_groups']} group(s) from the latency table"
                                               if ms.get("measured_groups") else "") + ")")
    if final.get("flop_cost_vs_start") is not None:
        text += (f"; FLOP-weighted cost x{final['flop_cost_vs_start']:.3f} of the start, "
                 f"x{final['flop_cost_vs_int16']:.3f} of all-int16")
    return text


def _transform_lines(r: TuneReport) -> list[str]:
    """The transforms stage: each trial's all-int8 score and gain, and what was kept."""
    stage = r.get("transforms")
    if not stage:
        return []
    base = stage["baseline"]
    if stage.get("skipped"):
        return ["", f"== transforms before precision: none tried ({stage['skipped']})"]
    lines = ["", "== transforms before precision (on the evaluation samples: all-int8 and its gain over the model as given; "
             "the upper bound, which must not get worse; the float function against the model as given)",
             f"  {'transforms':<48}{'mean':>12}{'worst':>12}{'gain':>12}{'upper mean':>12}{'upper worst':>12}"
             f"{'float mean':>12}{'s':>8}  helps  sites",
             f"  {'(none: the model as given)':<48}{base['mean']:>12.6g}{base['worst']:>12.6g}{0.0:>12.4g}"
             f"{base['upper_bound']['mean']:>12.6g}{base['upper_bound']['worst']:>12.6g}{base['float']['mean']:>12.6g}"]
    for t in stage["trials"]:
        name = ",".join(t["transforms"])
        if t.get("error"):
            lines.append(f"  {name:<48}could not run: {t['error']}")
            continue
        sites = ", ".join(f"{k} {v}" for k, v in t["sites"].items())
        lines.append(f"  {name:<48}{t['mean']:>12.6g}{t['worst']:>12.6g}{t['gain']:>12.4g}{t['upper_bound']['mean']:>12.6g}"
                     f"{t['upper_bound']['worst']:>12.6g}{t['float']['mean']:>12.6g}{t['seconds']:>8.1f}  "
                     f"{'yes' if t['helps'] else 'no':<5}  {sites}")
    if stage.get("stopped"):
        lines.append(f"stopped early: {stage['stopped']}")
    lines.append(f"kept: {', '.join(stage['chosen']) or 'none (no transform beat the model as given)'}; "
                 f"{stage['seconds']:.1f} s; the search below worked on " +
                 ("the transformed model (transformed_model.onnx)" if stage["chosen"] else "the model as given"))
    return lines


def format_report(report: TuneReport) -> str:
    """``tune_report.txt``."""
    r = report
    lines = [f"qir tune: {r['target']} on {r['march']}" + (" (float allowed)" if r["allow_float"] else ""), "",
             outcome(r), "", "== configurations (ms: estimated time on the march by the latency model; time and FLOPs: "
             "the estimated time and the FLOP-weighted cost, relative to the calibrated start)"]
    lines += _bounds_lines(r)
    lines += _transform_lines(r)
    ratio = r["ratio_search"]
    lines += ["", f"result: {r['raised']} unit(s) raised, {len([c for c in r['changes'] if c['reason'] == 'clipping'])} "
                  f"fixed threshold(s); {_time_line(r)}"]
    if ratio["raised"] is not None:
        picked = ratio["sensitivity_samples"]
        on = f"all {r['samples']} evaluation samples" if picked is None or len(picked) == r["samples"] else \
            f"evaluation samples {picked}"
        lines.append(f"ratio search: {ratio['raised']} of {ratio['units']} units raised in order of loss per cost (ranked on "
                     f"{on}), {ratio.get('cheap', 0)} cheap unit(s) raised with no search; then greedy refinement and pruning"
                     + (f" ({ratio['cheap_kept']} cheap unit(s) kept)" if "cheap_kept" in ratio else ""))
    if r.get("weight_tied"):
        modes = sorted(set(r["weight_tied"].values()))
        lines.append(f"{len(r['weight_tied'])} unit(s) kept their GEMMs' weights at {'/'.join(modes)}: a repair (bias-correct, "
                     "round-weights) fitted those layers to those weights, so int16+w16 and float were not offered")
    lines += _sensitivity_lines(r.get("sensitivity"))
    lines.append("calibration nodes per mode: " + ", ".join(f"{k} {v}" for k, v in r["calibration_modes"].items()))
    lines.append("GEMM ops per precision (input x weight): " + ", ".join(f"{k} {v}" for k, v in r["gemm_ops"].items()))
    on = r.get("attribution_samples")
    wide = max([34] + [len(c["change"]) + 2 for c in r["changes"]])
    lines += ["", "== changes (gain: the metric lost when this change alone is undone" +
              (f", on evaluation samples {on}" if on is not None else "") +
              "; per image: the same with each sample's change, up or down, counted as a loss, as the search counts it)",
              f"  {'node':<48}{'change':<{wide}}{'reason':<13}{'gain':>12}{'per image':>12}"]
    lines += [f"  {c['node']:<48}{c['change']:<{wide}}{c['reason']:<13}{c['gain']:>12.4g}{c['per_image']:>12.4g}"
              for c in r["changes"]]
    lines += _verification_lines(r.get("verification"))
    lines += _integer_search_lines(r.get("integer_repair"))
    if r.get("commands"):
        lines += ["", "== reproduce from the calibrated model"] + [f"  {c}" for c in r["commands"]]
    lines += ["", f"{r['configurations']} configurations in {r['engine_calls']} engine call(s), {r.get('seconds', 0)} s"]
    return "\n".join(lines) + "\n"


def _verification_lines(ver: dict[str, Any] | None) -> list[str]:
    """The report's verification section: onnxruntime's row says whether the emitted model agrees
    with the search there (``onnxruntime_agrees``: the integer level has its own row)."""
    if not ver:
        return []
    lines = ["", "== verification", f"  {ver['runtime']}: mean {ver['mean']:.6g}, worst {ver['worst']:.6g} "
             f"(sample {ver['worst_sample']}), margin {ver['margin']:.4g}; search {ver['searched']:.6g}, "
             f"difference {ver['difference']:.3g} (tolerance {ver['tolerance']:.3g}): "
             + ("agrees" if ver.get("onnxruntime_agrees", ver["agrees"]) else "DISAGREES")]
    if ver["roundtrip"]:
        lines.append("  re-import: " + "; ".join(ver["roundtrip"]))
    if ver.get(Level.INTEGER):
        i = ver[Level.INTEGER]
        lines.append(f"  integer level ({i['march']}, assumed arithmetic): mean {i['mean']:.6g}, worst {i['worst']:.6g}, "
                     f"margin {i['margin']:.4g}: " + ("meets the target" if i["meets"] else "MISSES the target"))
    return lines


def _first(names: list[str], shown: int = 4) -> str:
    """The first ``shown`` of ``names``, comma-separated, with ``, ...`` when there are more."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _integer_search_lines(repair: dict[str, Any] | None) -> list[str]:
    """What the search at the integer level did, when it ran: how many units it ranked of those
    below their reference level (the most departing first), what it found."""
    if not repair:
        return []
    found = (f"raised {len(repair['raised'])}: {_first(repair['raised'])}" if repair["raised"]
             else "no raise needed" if repair["found"] else "no raise met the target there")
    ranked, departing = repair.get("ranked"), repair.get("departing")
    ranked = (f"{repair['candidates']} unit(s) below their reference level" if not ranked else
              f"{ranked} of {repair['candidates']} unit(s) below their reference level raised alone" +
              (f", the {departing} whose own op departs from fake quantization first" if departing is not None else ""))
    return ["", "== the search at the integer level (run because verification found the result short of the target there)",
            f"  {ranked}; {found}"
            + (" (onnxruntime did not confirm them)" if repair.get("failed_verification") else "")]


def _figure(report: TuneReport):
    """Cost (relative to the start) against the metric of every configuration tried."""
    plt = pyplot()
    hist, base = report["history"], report["calibrated"]["cost"] or 1.0
    fig, ax = plt.subplots(figsize=(8, 5))
    front = sorted((hist[i] for i in report["pareto"]), key=lambda h: h["cost"])
    lo, hi = _band([h["mean"] for h in front] + [report["threshold"], report["final"]["mean"]])
    stages = list(dict.fromkeys(h["stage"] for h in hist))
    for k, stage in enumerate(stages):
        pts = [h for h in hist if h["stage"] == stage and h["mean"] == h["mean"]]
        inside = [h for h in pts if lo <= h["mean"] <= hi]
        ax.scatter([h["cost"] / base for h in inside], [h["mean"] for h in inside], s=14, alpha=0.6, label=stage,
                   color=plt.cm.tab10(k % 10))
        for edge, marker in ((lo, "v"), (hi, "^")):  # beyond the band: drawn on its edge
            out = [h for h in pts if (h["mean"] < lo if marker == "v" else h["mean"] > hi)]
            ax.scatter([h["cost"] / base for h in out], [edge] * len(out), s=18, marker=marker, alpha=0.6,
                       color=plt.cm.tab10(k % 10))
    ax.plot([h["cost"] / base for h in front], [h["mean"] for h in front], "k-", lw=1.5, label="Pareto front")
    final = report["final"]
    ax.scatter([final["cost"] / base], [final["mean"]], s=120, facecolors="none", edgecolors="red", lw=2,
               label="result")
    ax.axhline(report["threshold"], color="red", ls="--", lw=1, label=report["target"])
    ax.set_xlabel(("estimated time on the march" if report.get("price", "latency") == "latency" else "FLOP-weighted cost")
                  + " (calibrated start = 1)")
    ax.set_ylim(lo - (hi - lo) * 0.03, hi + (hi - lo) * 0.03)
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_ylabel(f"{report['metric']}, mean over the evaluation samples")
    ax.set_title(f"qir tune on {report['march']}: every configuration tried (triangles: beyond this range)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _band(values: list[float]) -> tuple[float, float]:
    """The y range of the plot: the Pareto front, the threshold and the result, padded by a quarter
    of their span (configurations far below it would flatten the part that matters)."""
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    lo, hi = min(finite), max(finite)
    pad = (hi - lo) * 0.25 or abs(hi) * 1e-3 or 1e-3
    return lo - pad, hi + pad


def _transforms_html(report: TuneReport, table) -> list[str]:
    """The transforms stage as an HTML table (nothing when it did not run or tried nothing)."""
    stage = report.get("transforms")
    if not stage or not stage["trials"]:
        return []
    rows = [{"transforms": ",".join(t["transforms"]), "all-int8 mean": t["mean"], "worst": t["worst"], "gain": t["gain"],
             "upper bound": t["upper_bound"]["mean"], "float function": t["float"]["mean"],
             "helps": "yes" if t["helps"] else "no", "seconds": t["seconds"], "error": t.get("error", "")}
            for t in stage["trials"]]
    return ["<h2>Transforms before precision</h2>",
            f"<p>kept: {html.escape(', '.join(stage['chosen']) or 'none')}</p>", table(rows, list(rows[0]))]


def _sensitivity_lines(sens: dict[str, Any] | None) -> list[str]:
    """The sensitivity order's confidence: the stable top-k and the first rows with their intervals."""
    if not sens or not sens["rows"]:
        return []
    k, first = sens["stable_top_k"], sens["rows"][0]["unit"]
    if k is None:
        said = "ranked on one sample: how settled the order is is unknown"
    else:
        said = (f"stable top-{k} of {len(sens['rows'])} (the same set in >= {sens['level']:.0%} of {sens['resamples']} "
                f"bootstrap resamples of {sens['samples']} samples); " + (
                    f"{first} is the most sensitive unit" if sens["first_settled"] else
                    "no unit is settled as the most sensitive"))
    lines = [f"sensitivity order: {said}", f"  {'rank':<8}{'unit':<48}{'loss':>11}  mean change's 95% interval"]
    for row in sens["rows"][:SHOWN]:
        rank = str(row["rank_low"]) if row["rank_low"] == row["rank_high"] else f"{row['rank_low']}-{row['rank_high']}"
        lines.append(f"  {rank:<8}{row['unit']:<48}{row['loss']:>11.4g}  [{row['change_low']:.4g}, {row['change_high']:.4g}]")
    return lines


def _html(report: TuneReport, png: bytes, graph_html: str = "") -> str:
    def table(rows: list[dict], keys: list[str]) -> str:
        def cell(v):
            return f"{v:.6g}" if isinstance(v, float) else html.escape(str(v))
        head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
        body = "".join(f"<tr data-node='{html.escape(str(r.get('node', '')))}'>" + "".join(
            f"<td>{cell(r.get(k, ''))}</td>" for k in keys) + "</tr>" for r in rows)
        return f"<table><tr>{head}</tr>{body}</table>"

    text = format_report(report)
    img = base64.b64encode(png).decode("ascii")
    parts = [f"<h1>qir tune: {html.escape(report['target'])} on {html.escape(report['march'])}</h1>",
             f"<p><b>{html.escape(outcome(report))}</b></p>",
             f'<img alt="tune_curve.png" src="data:image/png;base64,{img}">',
             *_transforms_html(report, table),
             "<h2>Changes</h2>", table(report["changes"], ["node", "change", "reason", "gain", "per_image"]),
             *([f"<h2 id='graph'>The graph: the precision chosen</h2>{graph_html}"] if graph_html else []),
             *(["<h2>Sensitivity order</h2>", table((report.get("sensitivity") or {}).get("rows", [])[:50],
                                                    list(SENSITIVITY_KEYS))] if report.get("sensitivity") else []),
             "<h2>Reproduce</h2><pre>" + html.escape("\n".join(report.get("commands") or [])) + "</pre>",
             "<h2>Report</h2><pre>" + html.escape(text) + "</pre>"]
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left;font-size:90%}img{max-width:100%}pre{background:#f6f6f6;padding:.5em;overflow-x:auto}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>qir tune</title><style>{style}</style></head>"
            f"<body>{''.join(parts)}</body></html>\n")


def write_report(report: TuneReport, out: Outputs, graph: Any = None,
                 precisions: dict[str, str] | None = None) -> list[Path]:
    """The files of :func:`files`, through ``out`` (``tune_sensitivity.csv``: the sensitivity
    order with each unit's loss interval and rank interval; only its header when the search
    stopped before ranking); with the tuned model's ``graph``
    (:class:`~qir.tools.reports.graph_panel.ModelGraph`) and each quantizer's chosen mode
    (``precisions``), the page draws the graph coloured by the precision chosen (and each unit's
    loss), which the viz extra also writes as Model Explorer node data. Returns the files written."""
    from qir.tools.reports.graph_panel import panel
    from qir.tools.reports.overlays import tune_overlays

    fig = _figure(report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    pyplot().close(fig)
    written = [out.write_bytes("tune_curve.png", buf.getvalue()),
               out.write_text("tune_report.txt", format_report(report)),
               out.write_json("tune_report.json", "qir.tune", report)]
    ranked = (report.get("sensitivity") or {}).get("rows", [])
    overlays = tune_overlays(precisions or {}, graph, {r["unit"]: r["loss"] for r in ranked}) if graph is not None else []
    graph_html = panel(graph, overlays) if graph is not None else ""
    written.append(out.write_text("tune_report.html", _html(report, buf.getvalue(), graph_html)))
    keys = ["stage", "cost", "flop_cost", "mean", "worst", "worst_sample", "meets", "thresholds", "final"]
    rows = [[*keys, "levels"]] + [[h.get(k) for k in keys] + [" ".join(f"{a}:{b}" for a, b in h["levels"].items())]
                                  for h in report["history"]]
    written.append(out.write_csv("tune_history.csv", rows))
    written.append(out.write_csv("tune_sensitivity.csv",
                                 [list(SENSITIVITY_KEYS)] + [[r[k] for k in SENSITIVITY_KEYS] for r in ranked]))
    if graph is not None:
        written += model_explorer.write_overlays(out, overlays, graph.name)
    return written
