"""``qir diff``'s report (:mod:`qir.tools.diff`): ``diff.txt`` (what the command prints),
``diff.html`` (the same as one page: the headline side by side, then per table its movers,
appeared and vanished rows) and ``diff.json`` (schema ``qir.diff`` v1)."""
from __future__ import annotations

import html
from pathlib import Path

from qir.tools.diff import Row, RunDiff
from qir.tools.reports.html import page, table
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILES", "format_text", "format_html", "write_report"]

FILES = ("diff.txt", "diff.html", "diff.json")
LISTED = 20  # appeared/vanished rows named per table


def _cell(v) -> str:
    return f"{v:.6g}" if isinstance(v, float) else "-" if v is None else str(v)


def _row(r: Row) -> str:
    interval = f" [{r.low:.5g}, {r.high:.5g}]" if r.low is not None and r.high is not None else ""
    rank = "" if r.rank is None else f" rank {r.rank}" if r.rank_low == r.rank_high else \
        f" rank {r.rank} ({r.rank_low}-{r.rank_high})"
    return f"{r.value:.5g}{interval}{rank}"


def _names(keys: list[str]) -> str:
    return ", ".join(keys[:LISTED]) + (f" and {len(keys) - LISTED} more" if len(keys) > LISTED else "")


def format_text(d: RunDiff) -> str:
    """The diff as text: the verdict first, the headline side by side, then each table."""
    moved = sum(len(t.movers) for t in d.tables)
    verdict = (f"{moved} row(s) moved beyond their intervals" if moved else "no row moved beyond its interval") + (
        "" if d.changed else "; nothing appeared or vanished: no change")
    lines = [f"qir diff ({d.a.kind}): {verdict}", f"  A: {d.a.path}", f"  B: {d.b.path}", ""]
    wide = max([8] + [len(n) for n, _, _ in d.headline])
    lines.append(f"{'':<{wide}}  {'A':>14}  {'B':>14}")
    lines += [f"{n:<{wide}}  {_cell(x):>14}  {_cell(y):>14}" + ("" if x == y else "  *") for n, x, y in d.headline]
    for t in d.tables:
        lines += ["", f"== {t.name} ({t.metric}; stable top-k A {_cell(t.stable[0])}, B {_cell(t.stable[1])})"]
        if not t.changed:
            lines.append("  no change beyond the intervals")
        for m in t.movers:
            lines.append(f"  moved ({m.why}): {m.key}: {_row(m.a)} -> {_row(m.b)} ({m.change:+.5g})")
        if t.reordered:
            lines.append(f"  reordered only (value within its interval, others moved past it): "
                         f"{_names([f'{m.key} rank {m.a.rank} -> {m.b.rank}' for m in t.reordered])}")
        if t.appeared:
            lines.append(f"  appeared in B: {_names(t.appeared)}")
        if t.vanished:
            lines.append(f"  vanished from B: {_names(t.vanished)}")
    return "\n".join(lines) + "\n"


def format_html(d: RunDiff) -> str:
    """The diff as one page (:func:`qir.tools.reports.html.page`)."""
    head = [{"": n, "A": _cell(x), "B": _cell(y), "changed": "" if x == y else "*"} for n, x, y in d.headline]
    sections = [("headline", "Headline, side by side", table(head, ["", "A", "B", "changed"], limit=None))]
    for i, t in enumerate(d.tables):
        rows = [{"row": m.key, "why": m.why, "A": _row(m.a), "B": _row(m.b), "change": m.change} for m in t.movers]
        part = (f"<p>stable top-k: A {_cell(t.stable[0])}, B {_cell(t.stable[1])}; {t.metric}.</p>"
                + (table(rows, ["row", "why", "A", "B", "change"], limit=None) if rows else
                   "<p>No row moved beyond its interval.</p>"))
        for what, keys in (("Reordered only", [f"{m.key} rank {m.a.rank} -> {m.b.rank}" for m in t.reordered]),
                           ("Appeared in B", t.appeared), ("Vanished from B", t.vanished)):
            if keys:
                part += f"<p><b>{what}</b>: {html.escape(_names(keys))}</p>"
        sections.append((f"table-{i}", t.name, part))
    return page(f"qir diff ({d.a.kind}): {d.a.path} vs {d.b.path}", format_text(d).splitlines()[:1], sections)


def write_report(d: RunDiff, save_dir: Outputs | str | Path) -> list[Path]:
    """``diff.txt``, ``diff.html`` and ``diff.json``, through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(FILES[0], format_text(d)), out.write_text(FILES[1], format_html(d)),
            out.write_json(FILES[2], "qir.diff", d.to_json())]
