"""The ``runall`` debug report as one self-contained ``index.html``: plots embedded as base64
PNG (readable offline), the top of each table, and the "what to try next" list; read from the
results ``qir.tools.runall.runall`` gathers and the files its steps wrote under the same folder."""
from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["write_index"]


def _img(path: Path) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{data}">'


def _table(rows: list[dict], keys: list[str], limit: int = 10) -> str:
    def cell(v):
        return f"{v:.6g}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(k, ''))}</td>" for k in keys) + "</tr>" for r in rows[:limit])
    return f"<table><tr>{head}</tr>{body}</table>"


def write_index(results: dict[str, Any], save_dir: Outputs | Path) -> Path:
    """``index.html``: one page, plots embedded, readable offline (written through
    :class:`~qir.tools.reports.output.Outputs`)."""
    out = as_outputs(save_dir)
    parts = [f"<h1>qir debug report</h1><p>model: <code>{html.escape(str(results.get('model')))}</code>; "
             f"{results.get('seconds', 0)} s</p>"]
    parts.append("<h2>What to try next</h2><ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in results["advice"])
                 + "</ul>")
    for nt, report in results["sensitivity"].items():
        keys = [k for k in ("node", "consumers", "threshold", "bit") if report["rows"] and k in report["rows"][0]]
        parts.append(f"<h2>Node sensitivity: {html.escape(nt)}</h2><p>only this node quantized, compared with the "
                     f"float model on {', '.join(report['compare'])}; most sensitive first (top 10 of "
                     f"{len(report['rows'])}).</p>" + _table(report["rows"], keys + report["metrics"]))
        if report.get("saturated"):
            parts.append(f"<p><b>Saturated outputs</b>: ranked on {html.escape(str(report['saturated']['ranked_on']))}.</p>")
    sa = results.get("sensitivity_analysis") or {}
    parts.append("<h2>Sensitivity analysis</h2>")
    png = out.path("sensitivity_analysis/partial_quantization.png")
    if png.exists():
        parts.append(_img(png))
    if sa.get("nodes"):
        rows = [{"node": n, "only this node quantized": sa["single"][n],
                 "calibrated, raised up to here": sa["cumulative"][k + 1]} for k, n in enumerate(sa["nodes"])]
        parts.append(_table(rows, list(rows[0]), limit=50))
    else:
        parts.append(f"<p>No node is below the pick threshold {sa.get('pick_threshold')}.</p>")
    acc = out.path(f"accumulate_error/acc_error_{results['acc_error']['metric']}.png")
    parts.append("<h2>Accumulated error</h2>" + (_img(acc) if acc.exists() else ""))
    if results.get("distribution"):
        parts.append("<h2>Data distributions</h2>" + "".join(f"<h3>{html.escape(n)}</h3>{_img(e['png'])}"
                                                             for n, e in results["distribution"].items()))
    if results.get("channelwise"):
        parts.append("<h2>Channel-wise distributions</h2>" + "".join(
            f"<h3>{html.escape(n)}</h3><p>outlier channels: {e['outlier_channels'] or 'none'}</p>{_img(e['png'])}"
            for n, e in results["channelwise"].items()))
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
             "text-align:left;font-size:90%}img{max-width:100%;border:1px solid #eee;margin:.5em 0}")
    page = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>qir debug report</title>"
            f"<style>{style}</style></head><body>{''.join(parts)}</body></html>\n")
    return out.write_text("index.html", page)
