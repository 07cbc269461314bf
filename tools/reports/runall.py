"""The ``runall`` debug report as one self-contained ``index.html``: plots embedded as base64
PNG (readable offline), the top of each table, and the measured "what to try next" list; read
from the results ``qir.tools.runall.runall`` gathers and the files its steps wrote under the same
folder.

The page (:func:`qir.tools.reports.html.page`) opens with the headline (``results["headline"]``:
lines another analysis adds, e.g. an output that collapsed; then the float-vs-quantized output
cosine, the samples and the best measured fix), a table of contents, the measured fixes, and
what it is about (model file, calibration method, march, data, samples, runtime). Data
distributions show the activations that clip most first. Wherever a quantizer is named, the ops it feeds
are named beside it, and wherever an op is named, its quantizers (``results["quantizers"]``).
"""
from __future__ import annotations

import html
from dataclasses import asdict
from pathlib import Path

from qir.passes.acc_error import AccErrorReport
from qir.tools.reports import model_explorer
from qir.tools.reports.acc_error import dips
from qir.tools.reports.graph_panel import ModelGraph, Overlay
from qir.tools.reports.headline import best_fix_line
from qir.tools.reports.html import Section, command, page
from qir.tools.reports.html import img as _img
from qir.tools.reports.html import table as _table
from qir.tools.reports.node_sensitivity import interval_cells
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.overlays import acc_error_key, better_of, graph_section, on_ops
from qir.tools.results import Fix, RunallResults

__all__ = ["write_index", "distribution_order"]


class _Names:
    """Quantizer <-> op names from ``results["quantizers"]`` (``{quantizer: {"role", "feeds"}}``)."""

    def __init__(self, quantizers: dict[str, dict]) -> None:
        self.feeds = {q: list(v.get("feeds") or []) for q, v in quantizers.items()}
        self.of_op: dict[str, list[str]] = {}
        for q, ops in self.feeds.items():
            for op in ops:
                self.of_op.setdefault(op, []).append(q)

    def ops(self, quantizer: str) -> str:
        return ", ".join(self.feeds.get(quantizer, [])) or "-"

    def quantizers(self, op: str) -> str:
        return ", ".join(self.of_op.get(op, [])) or "-"

    def label(self, name: str) -> str:
        """``q (feeds a, b)`` for a quantizer, ``op (quantizers q1, q2)`` for an op."""
        if name in self.feeds:
            return f"{name} (feeds {self.ops(name)})"
        return f"{name} (quantizers {self.quantizers(name)})" if name in self.of_op else name


def _header(results: RunallResults) -> str:
    h = results.get("header") or {}
    samples = f"{h.get('samples')}" + (f" ({h['left_out']} left out: non-finite float outputs)" if h.get("left_out") else "")
    method = str(h.get("calibration_method"))
    if h.get("calibration_samples"):
        method += f" (on {h['calibration_samples']} samples)"
    rows = [("model", h.get("model", results.get("model"))), ("calibration method", method),
            ("march", h.get("march")), ("data", h.get("data")), ("samples analysed", samples),
            ("runtime", h.get("runtime")), ("calibration nodes", h.get("calibration_nodes")),
            (f"float vs quantized: {h.get('score_metric', 'output cosine')} (mean over samples)",
             f"{h['score']:.6f}" if isinstance(h.get("score"), float) else h.get("score")),
            ("time", f"{results.get('seconds', 0)} s")]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td><code>{html.escape(str(v))}</code></td></tr>" for k, v in rows)
    return f"<table class='header'>{body}</table>"


def _headline(results: RunallResults) -> list[str]:
    """The headline's lines: ``results["headline"]`` (lines another analysis adds, first), the
    output cosine, the samples analysed and the best measured fix."""
    h = results.get("header") or {}
    lines = list(results.get("headline") or [])
    if isinstance(h.get("score"), float):
        lines.append(f"float vs quantized {h.get('score_metric', 'output cosine')}: {h['score']:.5f} "
                     f"(mean over {h.get('samples')} sample(s))")
    if h.get("budget"):
        lines.append(h["budget"])
    advice = results.get("advice") or []
    if advice:
        best = advice[0]
        lines.append(best_fix_line(len(advice), best["fix"], best["cause"], best["before"], best["after"],
                                   best.get("settled")))
    else:
        lines.append("no fix that was tried helps")
    return lines


def _interval(fix: Fix) -> str:
    """A kept fix's gain interval and rank interval (the advisor's bootstrap), when it has them."""
    if fix.get("gain_low") is None:
        return ""
    _, rank = interval_cells(fix["gain_low"], fix["gain_high"], fix["rank_low"], fix["rank_high"])
    return f"; 95% interval {fix['gain_low']:+.5f} to {fix['gain_high']:+.5f}, rank {rank}"


def _advice(results: RunallResults) -> str:
    items = []
    for fix in results.get("advice", []):
        items.append(f"<li><b>{html.escape(fix['cause'])}</b>: {html.escape(fix['why'])}. Fix: {html.escape(fix['fix'])}."
                     f"<br>measured: output cosine {fix['before']:.5f} &rarr; <b>{fix['after']:.5f}</b> "
                     f"({fix['gain']:+.5f}{_interval(fix)}){command(fix['command'])}</li>")
    part = "<p>Each fix was measured on the same samples before it is listed; best first.</p>"
    part += f"<ol>{''.join(items)}</ol>" if items else "<p>No fix that was tried helps (see below).</p>"
    dropped = results.get("dropped") or []
    if dropped:
        rows = [{"cause": d["cause"], "fix": d["fix"], "quantizers": ", ".join(sorted(d.get("changes") or {})) or "all",
                 "output cosine": d["after"], "reason": d["reason"]} for d in dropped]
        part += (f"<details><summary>Tried and dropped: {len(dropped)}</summary>"
                 + _table(rows, list(rows[0]), limit=None) + "</details>")
    if results.get("notes"):
        part += "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in results["notes"]) + "</ul>"
    return part


def _sensitivity(results: RunallResults, names: _Names) -> list[Section]:
    parts = []
    for nt, report in results["sensitivity"].items():
        rows = [dict(r) for r in report["rows"]]
        if nt == "node":
            for r in rows:
                r["quantizers"] = names.quantizers(r["node"])
        keys = [k for k in ("node", "consumers", "quantizers", "threshold", "bit") if rows and k in rows[0]]
        first, extra = report["metrics"][0], []
        if rows and "rank_low" in rows[0]:  # (the bootstrap's interval and rank interval)
            extra = ["95% interval", "rank"]
            for r in rows:
                r["95% interval"], r["rank"] = interval_cells(r[f"{first}_low"], r[f"{first}_high"], r["rank_low"],
                                                              r["rank_high"])
        stable = (report.get("confidence") or {}).get("stable_top_k")
        part = (f"<p>only this node quantized, compared with the "
                f"float model on {', '.join(report['compare'])}; most sensitive first (top 10 of "
                f"{len(report['rows'])}; consumers: the ops a quantizer feeds)"
                + (f"; stable top-{stable} over bootstrap resamples of {report['samples']} samples" if stable is not None
                   else "") + ".</p>"
                + _table(rows, keys + report["metrics"] + extra, node="node"))
        if report.get("saturated"):
            part += f"<p><b>Saturated outputs</b>: ranked on {html.escape(str(report['saturated']['ranked_on']))}.</p>"
        parts.append((f"sensitivity-{nt}", f"Node sensitivity: {nt}", part))
    return parts


def _acc_error(results: RunallResults, out: Outputs, names: _Names) -> str:
    report = AccErrorReport.from_json(results["acc_error"])
    png = out.path(f"accumulate_error/acc_error_{report.metric}.png")
    part = _img(png) if png.exists() else ""
    worst = [dict(asdict(d), quantizers=names.quantizers(d.node)) for d in dips(report, 10)]
    if worst:
        part += "<p>Worst dips (the metric falls most from the node before):</p>" + _table(
            worst, ["index", "node", "quantizers", "curve", "before", "after"], limit=None, node="node")
    rows = [{"index": i, "node": n, "quantizers": names.quantizers(n),
             **{c: "" if v[i] is None else v[i] for c, v in report.curves.items()}}
            for i, n in enumerate(report.nodes)]
    if rows:
        part += (f"<details><summary>All {len(rows)} nodes</summary>"
                 + _table(rows, list(rows[0]), limit=None, node="node") + "</details>")
    return part


def _sensitivity_analysis(results: RunallResults, out: Outputs, names: _Names) -> str:
    sa = results.get("sensitivity_analysis") or {}
    png = out.path("sensitivity_analysis/partial_quantization.png")
    part = _img(png) if png.exists() else ""
    if sa.get("nodes"):
        rows = [{"op": n, "quantizers": names.quantizers(n), "only this op quantized": sa["single"][n],
                 "calibrated, raised up to here": sa["cumulative"][k + 1]} for k, n in enumerate(sa["nodes"])]
        return part + _table(rows, list(rows[0]), limit=50, node="op")
    return part + f"<p>No node is below the pick threshold {sa.get('pick_threshold')}.</p>"


def distribution_order(nodes: dict[str, dict]) -> list[str]:
    """The distribution plots' order: activations that clip, most clipped first, then the other
    activations, then general nodes, then weights (whose histograms rarely surprise)."""
    rank = {"activation": 0, "weight": 2}
    return sorted(nodes, key=lambda n: (-(nodes[n].get("clipped_fraction") or 0.0), rank.get(nodes[n].get("type"), 1)))


def write_index(results: RunallResults, save_dir: Outputs | Path, graph: ModelGraph | None = None) -> Path:
    """``index.html``: one page, plots embedded, readable offline (written through
    :class:`~qir.tools.reports.output.Outputs`). With the model's ``graph`` (a
    :class:`~qir.tools.reports.graph_panel.ModelGraph`) the page has the graph panel, and with the
    viz extra each of its overlays is also written as ``model_explorer/<key>.json``
    (:func:`~qir.tools.reports.overlays.runall_keys`)."""
    out = as_outputs(save_dir)
    names = _Names(results.get("quantizers") or {})
    overlays = _overlays(results, graph) if graph is not None else []
    sections: list[Section] = [("fixes", "Measured fixes: what to try next", _advice(results)),
                               *graph_section(graph, overlays),
                               ("about", "What was analysed", _header(results)), *_sensitivity(results, names),
                               ("sensitivity-analysis", "Sensitivity analysis", _sensitivity_analysis(results, out, names)),
                               ("accumulated-error", "Accumulated error", _acc_error(results, out, names))]
    dist = results.get("distribution") or {}
    if dist:
        sections.append(("distributions", "Data distributions", "<p>Clipped activations first.</p>" + "".join(
            f"<h3 data-node='{html.escape(n)}'>{html.escape(names.label(n))}</h3>{_img(dist[n]['png'])}"
            for n in distribution_order(dist))))
    if results.get("channelwise"):
        sections.append(("channelwise", "Channel-wise distributions", "".join(
            f"<h3 data-node='{html.escape(n)}'>{html.escape(names.label(n))}</h3>"
            f"<p>outlier channels: {e['outlier_channels'] or 'none'}</p>"
            f"{_img(e['png'])}" for n, e in results["channelwise"].items())))
    index = out.write_text("index.html", page("qir debug report", _headline(results), sections))
    if graph is not None:  # the overlays as Model Explorer node data, with the viz extra
        model_explorer.write_overlays(out, overlays, graph.name)
    return index


def _overlays(results: RunallResults, graph: ModelGraph) -> list[Overlay]:
    """runall: sensitivity per node type (and the worst of any type first, when there are
    several with one metric), each accumulated-error curve, the sensitivity analysis's ops alone,
    and the clipping share of the activations whose distribution was drawn."""
    found: list[Overlay] = []
    pooled: dict[str, list] = {}
    for nt, report in (results.get("sensitivity") or {}).items():
        metric = report["metrics"][0]
        better = better_of(metric)
        pairs = [(r["node"], r.get(metric)) for r in report["rows"]]
        pooled.setdefault(metric, []).extend(pairs)
        found.append(Overlay(f"sensitivity: {nt} ({metric})", on_ops(pairs, graph, better), better,
                             f"{metric} with only this op's {nt} quantizers quantized", key=f"sensitivity_{nt}"))
    if len(found) > 1 and len(pooled) == 1:
        metric, pairs = next(iter(pooled.items()))
        found.insert(0, Overlay(f"sensitivity: worst of any quantizer ({metric})", on_ops(pairs, graph, better_of(metric)),
                                better_of(metric), f"{metric}, the worst of this op's quantizers alone", key="sensitivity"))
    acc = results.get("acc_error") or {}
    for curve, values in (acc.get("curves") or {}).items():
        better = better_of(acc["metric"])
        found.append(Overlay(f"accumulated error: {curve}", on_ops(zip(acc["nodes"], values), graph, better), better,
                             f"{acc['metric']} at this op's output, {curve} quantized", key=acc_error_key(curve)))
    sa = results.get("sensitivity_analysis") or {}
    if sa.get("single"):
        better = better_of(sa.get("metric", "cosine-similarity"))
        found.append(Overlay(f"sensitivity analysis: only this op quantized ({sa.get('metric', 'cosine-similarity')})",
                             on_ops(sa["single"].items(), graph, better), better,
                             "the metric with only this op quantized (the ops picked by the threshold)",
                             key="sensitivity_analysis"))
    dist = results.get("distribution") or {}
    clipped = [(n, e.get("clipped_fraction")) for n, e in dist.items()]
    if any(v for _, v in clipped):
        found.append(Overlay("clipping share", on_ops(clipped, graph, "min"), "min",
                             "share of values the quantizer clips (drawn activations only)", key="clipping"))
    return found
