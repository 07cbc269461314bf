"""Plain-text and CSV tables for the analysis reports (one row a dict, columns chosen by key)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from qir.tools.reports.output import Outputs

__all__ = ["cell", "format_table", "format_parts", "write_table", "WIDTH"]

WIDTH = 160  # the widest a text table gets before it is split into parts (format_parts)


def cell(v: Any) -> str:
    """A value as table text: ``-`` for None, floats to 6 significant digits, shapes as ``AxB``."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v))
    return str(v)


def format_table(columns: Sequence[str], rows: Iterable[dict], title: str | None = None) -> str:
    """Left-aligned columns separated by two spaces, a rule under the header."""
    table = [list(columns)] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "-" * len(lines[0]))
    if title:
        lines.insert(0, title)
    return "\n".join(lines) + "\n"


def format_parts(columns: Sequence[str], rows: Iterable[dict], title: str | None = None, *,
                 keys: Sequence[str] = (), groups: Sequence[Sequence[str]] = (), width: int = WIDTH) -> str:
    """:func:`format_table`, split into parts no wider than ``width`` where it would be wider:
    each part repeats the ``keys`` columns (the row's name) first, then as many of the other
    columns as fit, in order, a group of ``groups`` (columns read together) kept in one part."""
    rows = list(rows)

    def col_width(c: str) -> int:
        return max([len(c)] + [len(cell(r.get(c))) for r in rows]) + 2

    keys = [k for k in keys if k in columns]
    grouped = {c for g in groups for c in g}
    units = [list(g) for g in groups] + [[c] for c in columns if c not in grouped and c not in keys]
    units.sort(key=lambda g: min(columns.index(c) for c in g))
    base = sum(col_width(k) for k in keys)
    parts: list[list[str]] = [[]]
    used = base
    for unit in units:
        w = sum(col_width(c) for c in unit)
        if parts[-1] and used + w > width:
            parts.append([])
            used = base
        parts[-1] += unit
        used += w
    if len(parts) == 1:
        return format_table(columns, rows, title)
    text = [f"{title} ({len(parts)} parts of at most {width} characters; the .csv holds them side by side)"
            if title else None]
    for k, part in enumerate(parts, 1):
        text.append(format_table([*keys, *part], rows, f"part {k} of {len(parts)}: {', '.join(part)}"))
    return "\n".join(t for t in text if t)


def write_table(out: Outputs, txt: str, csv_name: str, columns: Sequence[str], rows: list[dict],
                title: str | None = None, keys: Sequence[str] = (), groups: Sequence[Sequence[str]] = ()) -> list[Path]:
    """The table as aligned text and as CSV (same columns; CSV cells unrounded), the files ``txt``
    and ``csv_name`` of ``out``; with ``keys`` (the columns that name a row) a text table wider
    than :data:`WIDTH` is split into parts (:func:`format_parts`)."""
    cells = [["" if r.get(c) is None else "x".join(map(str, r[c])) if isinstance(r.get(c), (list, tuple))
              else r[c] for c in columns] for r in rows]
    text = format_parts(columns, rows, title, keys=keys, groups=groups) if keys else format_table(columns, rows, title)
    return [out.write_text(txt, text), out.write_csv(csv_name, [list(columns), *cells])]
