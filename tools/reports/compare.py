"""``qir compare``'s ``index.html``: one self-contained page like runall's
(:func:`qir.tools.reports.html.page`), read from the summary :func:`qir.tools.compat.quant_analysis.compare`
returns and the per-layer rows.

It leads with the headline (``summary["headline"]``: lines another analysis adds, e.g. an output
that collapsed; then the output cosine on the bad case and the best measured fix), a table of
contents, the measured fixes (numbered as their output files, best first, with their commands),
then the advisor's findings, the worst layers of the layer-by-layer table, the bad case, the op
sensitivity, the consistency check when it ran, and the files written (``layers/`` with its size,
or the size it would have taken).
"""
from __future__ import annotations

import html
from pathlib import Path

from qir.tools.reports import model_explorer
from qir.tools.reports.graph_panel import ModelGraph, Overlay
from qir.tools.reports.headline import best_fix_line
from qir.tools.reports.html import Section, command, page, table
from qir.tools.reports.layer_compare import helping_fixes
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.overlays import better_of, graph_section, on_ops, op_sensitivity_key
from qir.tools.results import CompareSummary

__all__ = ["write_index", "human_size"]

WORST = 20  # layers shown from the layer-by-layer table


def human_size(n: int) -> str:
    """A size in bytes as people read it: ``119 MB``, ``1.38 GB``."""
    for unit, size in (("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n / 1e3:.3g} kB"


def _headline(summary: CompareSummary) -> list[str]:
    """The headline's lines: ``summary["headline"]`` first, then the output cosine on the bad case
    and the best measured fix."""
    lines = list(summary.get("headline") or [])
    cos = summary.get("output_cosine")
    if cos is not None:
        lines.append(f"output cosine on the bad case (sample {summary.get('bad_case_index')}): {cos:.5f} "
                     "(analysis vs baseline, mean over outputs)")
    fixes = helping_fixes(summary.get("advisor") or [])
    if fixes:
        best = fixes[0]["fix"]
        lines.append(best_fix_line(len(fixes), best["fix"], fixes[0]["layer"], best["before"], best["after"]))
    else:
        lines.append("no measured fix helps on the bad case")
    return lines


def _fixes(summary: CompareSummary) -> str:
    fixes = helping_fixes(summary.get("advisor") or [])
    if not fixes:
        return "<p>No fix that was tried helps on the bad case (the findings below say what was tried).</p>"
    items = "".join(
        f"<li value='{f['fix']['rank']}'><b>{html.escape(f['fix']['fix'])}</b> for [{html.escape(f['kind'])}] "
        f"{html.escape(f['layer'])}<br>measured: output cosine on the bad case {f['fix']['before']:.5f} &rarr; "
        f"<b>{f['fix']['after']:.5f}</b> ({f['fix']['gain']:+.5f}){command(f['fix']['command'])}</li>" for f in fixes)
    return ("<p>Each fix was measured on the bad case before it is listed; best first, numbered as the files "
            f"its command writes.</p><ol>{items}</ol>")


def _findings(summary: CompareSummary) -> str:
    findings = summary.get("advisor") or []
    if not findings:
        return "<p>No abnormal layer found.</p>"

    def _measured(f: dict) -> str:
        fix = f.get("fix")
        if not fix:
            return "-"
        verdict = f"fix {fix['rank']}" if fix.get("command") else (fix.get("reason") or "does not help")
        return f"{fix['fix']}: {fix['before']:.5f} -> {fix['after']:.5f} ({verdict})"

    rows = [{"kind": f["kind"], "layer": f["layer"], "detail": f["detail"], "fix measured": _measured(f)}
            for f in findings]
    return table(rows, list(rows[0]), limit=None)


def _layers(rows: list[dict]) -> str:
    scored = [r for r in rows if isinstance(r.get("Cosine"), float)]
    worst = sorted(scored, key=lambda r: r["Cosine"])[:WORST]
    keys = ["index", "mod_name", "analy_op_type", "quant_dtype", "Cosine", "SQNR", "clip%", "round%", "inherited%"]
    return (f"<p>The {len(worst)} layers of {len(rows)} whose output cosine (analysis vs baseline) is lowest; "
            "the whole table: compare_per_layer_out.txt / .csv.</p>" + table(worst, keys, limit=None, node="mod_name"))


def _bad_case(summary: CompareSummary) -> str:
    bc = summary.get("bad_case") or {}
    rows = [{"output": out, **per} for out, per in (bc.get("bad_case") or {}).items()]
    text = (f"<p>Sample {summary.get('bad_case_index')} of {bc.get('samples')}, chosen by {html.escape(str(bc.get('metric')))}. "
            "The worst sample per output and metric:</p>")
    return text + (table(rows, list(rows[0]), limit=None) if rows else "")


def _sensitivity(summary: CompareSummary) -> str:
    parts = []
    for out, rows in (summary.get("sensitivity") or {}).items():
        keys = [k for k in ("op_name", "sensitive_type", "op_type", "quant_dtype") if rows and k in rows[0]]
        metric = [k for k in (rows[0] if rows else {}) if k not in keys and k not in
                  ("module", "calibrations", "flops", "flops_text")]
        parts.append(f"<h3>{html.escape(out)}</h3>" + table(rows, keys + metric, limit=None, node="op_name"))
    return "".join(parts) or "<p>Not computed (--no-sensitivity, or no quantized calibration node).</p>"


def _files(summary: CompareSummary) -> str:
    lv = summary.get("layer_values") or {}
    names = ["badcase.txt/.json/.npz", "compare_per_layer_out.txt/.csv/.json", "abnormal_layer_advisor.txt/.json",
             "sensitive_ops.txt/.json", "compare.json"]
    items = "".join(f"<li><code>{n}</code></li>" for n in names)
    if lv:
        size = human_size(lv["bytes"])
        items += (f"<li><code>layers/</code>: every value of both models on the bad case, {size}</li>" if lv["kept"]
                  else f"<li><code>layers/</code> not written ({size} of per-layer values; --layers keeps them)</li>")
    return f"<ul>{items}</ul>"


def write_index(summary: CompareSummary, rows: list[dict], save_dir: Outputs | Path,
                graph: ModelGraph | None = None, overlays: list[Overlay] = (),
                sensitivity: dict[str, list[dict]] | None = None) -> Path:
    """``index.html`` (written through :class:`~qir.tools.reports.output.Outputs`); with the
    analysis model's ``graph``, a graph panel of the per-layer values, the op sensitivity and
    any other ``overlays`` (the consistency check's), and with the viz extra each of them also
    as ``model_explorer/<key>.json`` (:func:`~qir.tools.reports.overlays.compare_keys`).
    ``sensitivity``: every op's sensitivity rows per output (the summary keeps the top 10) to draw."""
    out = as_outputs(save_dir)
    drawn = [*_overlays(summary, rows, graph, sensitivity), *overlays] if graph is not None else []
    sections: list[Section] = [("fixes", "Measured fixes", _fixes(summary)),
                               *graph_section(graph, drawn),
                               ("findings", "Advisor findings", _findings(summary)),
                               ("layers", "Layer by layer: the worst layers", _layers(rows)),
                               ("bad-case", "Bad case", _bad_case(summary)),
                               ("sensitivity", "Op sensitivity on the bad case", _sensitivity(summary))]
    if summary.get("consistency"):
        c = summary["consistency"]
        sections.append(("consistency", "Fake quantization vs the integer level",
                         f"<p>{html.escape(str(c.get('summary')))}</p><p>output cosine {c.get('output_cosine')}</p>"))
    sections.append(("files", "Files", _files(summary)))
    index = out.write_text("index.html", page("qir compare report", _headline(summary), sections))
    if graph is not None:  # the overlays as Model Explorer node data, with the viz extra
        model_explorer.write_overlays(out, drawn, graph.name)
    return index


def _overlays(summary: CompareSummary, rows: list[dict], graph: ModelGraph,
              sensitivity: dict[str, list[dict]] | None = None) -> list[Overlay]:
    """compare: each layer's output cosine and clipping share on the bad case (an op with several
    outputs keeps its worst), then the op sensitivity per output."""
    from qir.passes.layer_compare import row_op

    found = []
    for col, key, name, label in (
            ("Cosine", "layer_cosine", "layer output cosine", "cosine of this op's output, analysis vs baseline"),
            ("clip%", "layer_clipping", "clipping share (%)", "share of this op's output values clipped")):
        better = "max" if col == "Cosine" else "min"
        found.append(Overlay(name, on_ops(((row_op(r["mod_name"]), r.get(col)) for r in rows), graph, better), better,
                             label, key=key))
    for out, srows in (sensitivity or summary.get("sensitivity") or {}).items():
        keys = {"op_name", "sensitive_type", "op_type", "quant_dtype", "module", "calibrations", "flops", "flops_text"}
        metrics = [k for k in (srows[0] if srows else {}) if k not in keys]
        if metrics:
            better = better_of(metrics[0])
            found.append(Overlay(f"op sensitivity: {out} ({metrics[0]})",
                                 on_ops(((r["op_name"], r.get(metrics[0])) for r in srows), graph, better), better,
                                 f"{metrics[0]} of {out} with only this op quantized", key=op_sensitivity_key(out)))
    return found

