"""Plain-text and CSV tables for the analysis reports (one row a dict, columns chosen by key)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from qir.tools.reports.output import Outputs

__all__ = ["cell", "format_table", "write_table"]


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


def write_table(out: Outputs, txt: str, csv_name: str, columns: Sequence[str], rows: list[dict],
                title: str | None = None) -> list[Path]:
    """The table as aligned text and as CSV (same columns; CSV cells unrounded), the files ``txt``
    and ``csv_name`` of ``out``."""
    cells = [["" if r.get(c) is None else "x".join(map(str, r[c])) if isinstance(r.get(c), (list, tuple))
              else r[c] for c in columns] for r in rows]
    return [out.write_text(txt, format_table(columns, rows, title)), out.write_csv(csv_name, [list(columns), *cells])]
