"""``qir diff A B``: two result folders of the same command, side by side.

A folder is recognised by the JSON its command wrote (by schema, not by name):

- ``sensitivity`` (``qir sensitivity``, and runall's ``node_sensitivity/``): each
  ``qir.node_sensitivity`` table, rows by node, the first metric;
- ``compare`` (``qir compare``): ``compare.json``'s headline and each output's op-sensitivity
  table of ``sensitive_ops.json`` (rows by op and type);
- ``tune`` (``qir tune``): ``tune_report.json``'s headline, its sensitivity order (rows by unit,
  the mean change) and its changes (rows by node, the gain).

For each table, a row in both runs **moved** when each run's value lies outside the other's 95%
bootstrap interval (the intervals the tables carry, :mod:`qir.passes.lib.confidence`; a table
without intervals, one sample, counts any change beyond rounding); movers are listed largest
change first. A row whose value stayed within but whose rank intervals no longer overlap is
**reordered** (others moved past it), listed apart. Rows in one run only **appeared** or
**vanished**. The headline metrics (samples, the model's score, the stable top-k, ...) are shown
side by side. Two runs of the same command on the same model and data report no change.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qir.errors import InputError

__all__ = ["Row", "Table", "Run", "Mover", "TableDiff", "RunDiff", "load_run", "diff_runs", "KINDS"]

KINDS = ("sensitivity", "compare", "tune")
ROUNDING = 1e-9  # a change this small (relative) is no change where a table has no intervals


@dataclass(frozen=True)
class Row:
    """One row of a ranked table: its value (a mean over samples), interval and rank interval
    (None where the table has none)."""

    value: float
    low: float | None = None
    high: float | None = None
    rank: int | None = None
    rank_low: int | None = None
    rank_high: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("value", "low", "high", "rank", "rank_low", "rank_high")}


@dataclass(frozen=True)
class Table:
    """A ranked table: ``rows`` by key, in the table's order; ``metric`` what the value is."""

    name: str
    metric: str
    rows: dict[str, Row]
    stable_top_k: int | None = None


@dataclass(frozen=True)
class Run:
    """A result folder: its command (``kind``), headline numbers and ranked tables."""

    path: str
    kind: str
    headline: dict[str, Any]
    tables: dict[str, Table]


@dataclass(frozen=True)
class Mover:
    key: str
    a: Row
    b: Row
    why: str

    @property
    def change(self) -> float:
        return self.b.value - self.a.value


@dataclass(frozen=True)
class TableDiff:
    name: str
    metric: str
    movers: list[Mover] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)
    stable: tuple[int | None, int | None] = (None, None)
    reordered: list[Mover] = field(default_factory=list)  # rank intervals apart, the value within (others moved)

    @property
    def changed(self) -> bool:
        return bool(self.movers or self.appeared or self.vanished)


@dataclass(frozen=True)
class RunDiff:
    a: Run
    b: Run
    tables: list[TableDiff]
    headline: list[tuple[str, Any, Any]]

    @property
    def changed(self) -> bool:
        return any(t.changed for t in self.tables)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.a.kind, "a": self.a.path, "b": self.b.path, "changed": self.changed,
                "headline": [{"name": n, "a": x, "b": y} for n, x, y in self.headline],
                "tables": [{"name": t.name, "metric": t.metric, "stable_top_k": list(t.stable), "appeared": t.appeared,
                            "vanished": t.vanished, "reordered": [m.key for m in t.reordered],
                            "movers": [{"key": m.key, "why": m.why, "change": m.change, "a": m.a.to_json(), "b": m.b.to_json()}
                                       for m in t.movers]}
                           for t in self.tables]}


# ------------------------------------------------------------------------------------------ reading
def _docs(folder: Path) -> dict[str, list[tuple[Path, dict]]]:
    """``{schema: [(path, document)]}`` of the qir JSON files in ``folder`` and one level below."""
    found: dict[str, list[tuple[Path, dict]]] = {}
    for path in sorted([*folder.glob("*.json"), *folder.glob("*/*.json")]):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("schema"), str):
            found.setdefault(doc["schema"], []).append((path, doc))
    return found


def _row(r: dict[str, Any], value: str, low: str, high: str) -> Row:
    return Row(float(r[value]) if r.get(value) is not None else math.nan, r.get(low), r.get(high), r.get("rank"),
               r.get("rank_low"), r.get("rank_high"))


def _node_table(name: str, doc: dict[str, Any]) -> Table:
    m = doc["metrics"][0]
    rows = {r["node"]: _row(r, m, f"{m}_low", f"{m}_high") for r in doc["rows"]}
    return Table(name, m, rows, (doc.get("confidence") or {}).get("stable_top_k"))


def _sensitivity(docs) -> tuple[dict, dict]:
    tables, headline = {}, {}
    for path, doc in docs.get("qir.node_sensitivity", []):
        t = _node_table(path.stem, doc)
        tables[t.name] = t
        first = next(iter(t.rows), None)
        headline.update({f"{t.name}: samples": doc.get("samples"), f"{t.name}: rows": len(t.rows),
                         f"{t.name}: most to blame": first, f"{t.name}: stable top-k": t.stable_top_k})
    return tables, headline


def _compare(docs) -> tuple[dict, dict]:
    (_, summary), = docs["qir.compare"][:1]
    headline = {"bad case (sample)": summary.get("bad_case_index"), "output cosine on the bad case":
                summary.get("output_cosine"), "layers compared": summary.get("layers")}
    tables = {}
    for _, doc in docs.get("qir.sensitive_ops", [])[:1]:
        m, conf = doc["metric"], doc.get("confidence") or {}
        for out, rows in doc["outputs"].items():
            name = f"op sensitivity: {out}"
            tables[name] = Table(name, m, {f"{r['op_name']} ({r['sensitive_type']})": _row(r, m, f"{m}_low", f"{m}_high")
                                           for r in rows}, (conf.get(out) or {}).get("stable_top_k"))
    return tables, headline


def _tune(docs) -> tuple[dict, dict]:
    (_, r), = docs["qir.tune"][:1]
    final = r.get("final") or {}
    headline = {"target": r.get("target"), "reached": r.get("reached"), "samples": r.get("samples"),
                "final mean": final.get("mean"), "final worst": final.get("worst"),
                "cost vs all-int16": final.get("cost_vs_int16"), "units raised": r.get("raised"),
                "seconds": r.get("seconds")}
    tables = {"changes": Table("changes", "gain", {c["node"]: Row(float(c["gain"])) for c in r.get("changes") or []})}
    sens = r.get("sensitivity")
    if sens:
        headline["sensitivity: stable top-k"] = sens.get("stable_top_k")
        tables["sensitivity order"] = Table("sensitivity order", "mean change", {
            x["unit"]: _row(x, "mean_change", "change_low", "change_high") for x in sens["rows"]}, sens.get("stable_top_k"))
    return tables, headline


def load_run(folder: str | Path) -> Run:
    """The result folder ``folder`` (see the module docstring); an InputError when it is not one."""
    path = Path(folder)
    if not path.is_dir():
        raise InputError(f"{folder} is not a folder; give two result folders of the same command "
                         f"({', '.join(KINDS)}), e.g. the -o folders of two qir sensitivity runs")
    docs = _docs(path)
    for kind, schema, read in (("tune", "qir.tune", _tune), ("compare", "qir.compare", _compare),
                               ("sensitivity", "qir.node_sensitivity", _sensitivity)):
        if schema in docs:
            tables, headline = read(docs)
            return Run(str(folder), kind, headline, tables)
    raise InputError(f"{folder} holds no qir result qir diff reads (node_sensitivity.json, compare.json or "
                     "tune_report.json); give the output folders of two runs of qir sensitivity, compare or tune")


# ------------------------------------------------------------------------------------------ comparing
def _outside(x: float, row: Row) -> bool:
    """``x`` lies outside ``row``'s interval (beyond rounding of its value when it has none)."""
    if row.low is None or row.high is None or row.low != row.low:
        return abs(x - row.value) > ROUNDING * max(1.0, abs(row.value)) if x == x and row.value == row.value \
            else (x == x) != (row.value == row.value)
    return x < row.low or x > row.high


def _moved(a: Row, b: Row) -> str | None:
    if _outside(b.value, a) and _outside(a.value, b):
        return "value" if a.low is not None else "value (no interval: one sample)"
    return None


def _reordered(a: Row, b: Row) -> bool:
    return None not in (a.rank_low, a.rank_high, b.rank_low, b.rank_high) and (
        b.rank_low > a.rank_high or a.rank_low > b.rank_high)


def _table_diff(a: Table, b: Table) -> TableDiff:
    both = [k for k in a.rows if k in b.rows]
    movers = [Mover(k, a.rows[k], b.rows[k], why) for k in both if (why := _moved(a.rows[k], b.rows[k])) is not None]
    movers.sort(key=lambda m: -abs(m.change) if m.change == m.change else -math.inf)
    moved = {m.key for m in movers}
    reordered = [Mover(k, a.rows[k], b.rows[k], "rank only") for k in both
                 if k not in moved and _reordered(a.rows[k], b.rows[k])]
    return TableDiff(a.name, a.metric, movers, [k for k in b.rows if k not in a.rows],
                     [k for k in a.rows if k not in b.rows], (a.stable_top_k, b.stable_top_k), reordered)


def diff_runs(a: Run, b: Run) -> RunDiff:
    """What moved between ``a`` and ``b`` (see the module docstring); an InputError when they are
    results of different commands."""
    if a.kind != b.kind:
        raise InputError(f"{a.path} holds a qir {a.kind} result and {b.path} a qir {b.kind} one; qir diff compares "
                         "two results of the same command")
    names = list(dict.fromkeys([*a.tables, *b.tables]))
    tables = [_table_diff(a.tables.get(n) or Table(n, b.tables[n].metric, {}), b.tables.get(n) or Table(n, "", {}))
              for n in names]
    keys = list(dict.fromkeys([*a.headline, *b.headline]))
    return RunDiff(a, b, tables, [(k, a.headline.get(k), b.headline.get(k)) for k in keys])
