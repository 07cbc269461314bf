"""Measured per-op latencies (``--latency-table FILE``): a CSV of times profiled on a board that
override the latency model for the ops it lists.

Format: one row per measurement, ``op,input,weight,time_us``:

* ``op``: an op name (any op of a fused group names the group) or an op type (``Conv``, or a
  fused group's types joined with ``+``: ``Conv+Add+Relu``);
* ``input``: the input precision (``int8 int16 fp16 float``; ``*`` for any);
* ``weight``: the weight precision; ``*`` or empty for any, ``-`` or ``none`` for an op without
  a weight;
* ``time_us``: the measured time in microseconds (a header ``op,input,weight,time_ms`` reads
  milliseconds instead).

An optional header row names the four columns; blank lines and lines starting with ``#`` are
skipped. A group takes the first row that matches it, trying its op names (head first), then its
joined type, then its head's type; its precision must match the row's.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from qir.errors import InputError
from qir.runtimes.march import normalize_dtype

__all__ = ["LatencyEntry", "LatencyTable", "read_latency_table", "ANY", "NO_WEIGHT"]

ANY = "*"
NO_WEIGHT = "none"
_EXAMPLE = "write op,input,weight,time_us rows, e.g. Conv,int8,int8,12.5 or Add,int16,-,3.1"
_HEADER_OPS = ("op", "op_name", "op_type", "name")
_UNITS = {"time_us": 1.0, "time": 1.0, "time_ms": 1000.0}


@dataclass(frozen=True)
class LatencyEntry:
    """One measured row: ``op`` (name or type), precisions (:data:`ANY`, :data:`NO_WEIGHT` or a
    dtype) and its time in µs; ``line`` is its line in the file."""

    op: str
    input: str
    weight: str
    time_us: float
    line: int

    def matches(self, input_dtype: str, weight_dtype: str | None) -> bool:
        """Whether the row's precisions fit an op at (``input_dtype``, ``weight_dtype``)."""
        if self.input not in (ANY, input_dtype):
            return False
        if self.weight == ANY:
            return True
        return self.weight == (weight_dtype or NO_WEIGHT)


@dataclass(frozen=True)
class LatencyTable:
    """The rows of a latency table file."""

    path: str
    entries: tuple[LatencyEntry, ...]

    def lookup(self, keys: tuple[str, ...], input_dtype: str, weight_dtype: str | None) -> LatencyEntry | None:
        """The first row whose op is one of ``keys`` (tried in order) and whose precisions fit."""
        for key in keys:
            for entry in self.entries:
                if entry.op == key and entry.matches(input_dtype, weight_dtype):
                    return entry
        return None


def _fail(path: str, line: int, what: str) -> InputError:
    return InputError(f"latency table {path}, line {line}: {what}; {_EXAMPLE}")


def _dtype(path: str, line: int, text: str, column: str, *, weight: bool = False) -> str:
    t = text.strip().lower()
    if t in ("", ANY) and (weight or t == ANY):
        return ANY
    if weight and t in ("-", NO_WEIGHT):
        return NO_WEIGHT
    try:
        return normalize_dtype(t)
    except ValueError:
        allowed = "int8, int16, fp16, float, * (any)" + (", - (no weight)" if weight else "")
        raise _fail(path, line, f"{column} precision {text!r} is not one of {allowed}") from None


def _time(path: str, line: int, text: str, scale: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(path, line, f"time {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise _fail(path, line, f"time {text!r} must be a finite number of 0 or more")
    return value * scale


def _header_scale(row: list[str]) -> float | None:
    """The time unit's scale to µs when ``row`` is a header, else None."""
    cells = [c.strip().lower() for c in row]
    if not cells or cells[0] not in _HEADER_OPS:
        return None
    if len(cells) != 4 or cells[3] not in _UNITS:
        return math.nan
    return _UNITS[cells[3]]


def read_latency_table(path: str | Path) -> LatencyTable:
    """Read a latency table (see the module docstring).

    Raises:
        InputError: the file cannot be read, or a row is malformed: the message names the file,
            the line, what is wrong and the expected form; two rows for one (op, input, weight).
    """
    path = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise InputError(f"cannot read latency table {path}: {e.strerror or e}") from None
    entries: list[LatencyEntry] = []
    seen: dict[tuple[str, str, str], int] = {}
    scale = 1.0
    reader = csv.reader(text.splitlines())
    for row in reader:
        line = reader.line_num
        if not any(c.strip() for c in row) or row[0].lstrip().startswith("#"):
            continue
        header = _header_scale(row) if not entries else None
        if header is not None:
            if math.isnan(header):
                raise _fail(path, line, f"header {','.join(row)!r} must be op,input,weight,time_us (or time_ms)")
            scale = header
            continue
        if len(row) != 4:
            raise _fail(path, line, f"expected 4 fields (op, input, weight, time), found {len(row)}")
        op = row[0].strip()
        if not op:
            raise _fail(path, line, "the op name or type is empty")
        entry = LatencyEntry(op, _dtype(path, line, row[1], "input"), _dtype(path, line, row[2], "weight", weight=True),
                             _time(path, line, row[3].strip(), scale), line)
        key = (entry.op, entry.input, entry.weight)
        if key in seen:
            raise _fail(path, line, f"{op},{entry.input},{entry.weight} is also on line {seen[key]}; keep one")
        seen[key] = line
        entries.append(entry)
    if not entries:
        raise InputError(f"latency table {path} has no rows; {_EXAMPLE}")
    return LatencyTable(path, tuple(entries))
