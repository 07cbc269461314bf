"""The parts the HTML reports share (``runall``'s and ``compare``'s ``index.html``): one
self-contained page with a title, the headline, a table of contents and sections.

:func:`page` lays it out: the headline first (a list of lines: ``headline`` lines a caller adds,
e.g. an output that collapsed, then the report's own: the output cosine, the best measured fix),
then the contents (one link per section), then the sections in the order given. Commands are
shown in ``<pre>`` blocks that wrap only between words and scroll sideways when one word is
wider than the page, so a path or a node list is never cut mid-token.
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

__all__ = ["STYLE", "img", "table", "command", "page", "Section"]

STYLE = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
         "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;"
         "text-align:left;font-size:90%}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"
         "li{margin:.6em 0}pre.cmd{white-space:pre-wrap;word-break:normal;overflow-wrap:normal;"
         "overflow-x:auto;background:#f6f6f6;padding:4px 8px;margin:.3em 0}pre.cmd .w{white-space:nowrap}"
         "#headline{border-left:4px solid #c60;padding:.2em 1em;background:#fff8f0}"
         "nav.toc{border:1px solid #ddd;padding:.2em 1em;margin:1em 0}nav.toc li{margin:.15em 0}")

Section = tuple[str, str, str]  # (anchor id, title, HTML body)


def img(path: Path | str) -> str:
    """``path`` (a PNG) embedded as base64."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(Path(path).name)}" src="data:image/png;base64,{data}">'


def table(rows: list[dict], keys: list[str], limit: int | None = 10, node: str | None = None) -> str:
    """``rows`` (dicts) as a table of the columns ``keys``, the first ``limit`` rows; with ``node``
    (a key) each row carries ``data-node`` (its value), where the graph panel's click lands."""
    def cell(v):
        return f"{v:.6g}" if isinstance(v, float) else html.escape(str(v))

    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    def tr(r):
        return f'<tr data-node="{html.escape(str(r[node]))}">' if node and r.get(node) is not None else "<tr>"

    body = "".join(tr(r) + "".join(f"<td>{cell(r.get(k, ''))}</td>" for k in keys) + "</tr>" for r in rows[:limit])
    return f"<table><tr>{head}</tr>{body}</table>"


def command(text: str) -> str:
    """A shell command, wrapped only between words: each word unbreakable (a browser would break
    ``set-mode{...}`` after its hyphen), a word wider than the page scrolled sideways."""
    words = " ".join(f'<span class="w">{html.escape(w)}</span>' for w in text.split(" "))
    return f'<pre class="cmd">{words}</pre>'


def page(title: str, headline: list[str], sections: list[Section]) -> str:
    """The page: ``title``, the ``headline`` lines, the table of contents, the ``sections``."""
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in headline)
    toc = "".join(f'<li><a href="#{sid}">{html.escape(name)}</a></li>' for sid, name, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{html.escape(name)}</h2>{part}</section>' for sid, name, part in sections)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f'<section id="headline"><h2>Headline</h2><ul>{lines}</ul></section>'
            f'<nav class="toc"><b>Contents</b><ol>{toc}</ol></nav>{body}</body></html>\n')
