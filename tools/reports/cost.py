"""The text of ``qir profile --cost`` (:mod:`qir.tools.cost`): one row per group the march runs
(its FLOPs, the bytes it moves at int8, and its time in each column with what bounds it), the
totals, how much of the time memory bounds, and which figures the latency table measured."""
from __future__ import annotations

from qir.passes.lib.latency import Bound, GroupCost
from qir.tools.cost import CostReport

__all__ = ["format_cost", "LEGEND"]

_MARK = {Bound.COMPUTE: "C", Bound.MEMORY: "M", Bound.FREE: "-", Bound.MEASURED: "*"}
LEGEND = ("C: compute-bound, M: memory-bound (bytes / bandwidth > FLOPs / peak rate), *: measured (latency table), "
          "-: a view op (no cost)")


def _size(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def _cell(g: GroupCost) -> str:
    return f"{g.time_us:10.2f} {_MARK[g.bound]}"


def _header(report: CostReport) -> list[str]:
    p = report.march
    return [f"latency model of {report.model} on {p.name}: per group the march runs as one, "
            "time = max(FLOPs / peak rate, bytes / bandwidth) + overhead",
            f"  peak int8 x int8 {p.peak_tops['int8 x int8']:g} TOPS, int16 x int8 {p.peak_tops['int16 x int8']:g}, "
            f"fp16 {p.peak_tops['fp16']:g}; bandwidth {p.memory_gbps:g} GB/s; overhead {p.op_overhead_us:g} µs per "
            f"group ({', '.join(f for f in ('peak_tops', 'memory_gbps', 'op_overhead_us') if p.provenance[f].assumed)}"
            f" partly assumed: qir profiles {p.name} --notes)"]


def format_cost(report: CostReport, *, rows: bool = True) -> str:
    """The report's text; ``rows=False`` leaves out the per-group rows (totals only)."""
    names = list(report.columns)
    first = report.columns[names[0]]
    width = max([len(g.name) for g in first.groups] + [5])
    type_w = max([len(g.group.op_type) for g in first.groups] + [4])
    lines = _header(report)
    head = f"{'group':<{width}}  {'type':<{type_w}}  {'MFLOPs':>9}  {'bytes@int8':>10}"
    head += "".join(f"  {c + ' µs':>12}" for c in names)
    lines += ["", head]
    if rows:
        for i, g in enumerate(first.groups):
            row = f"{g.name:<{width}}  {g.group.op_type:<{type_w}}  {g.flops / 1e6:9.3f}  {_size(g.bytes):>10}"
            lines.append(row + "".join(f"  {_cell(report.columns[c].groups[i])}" for c in names))
    total = (f"{'total':<{width}}  {str(len(first.groups)) + ' groups':<{type_w}}  {first.flops / 1e6:9.3f}  "
             f"{_size(first.bytes):>10}")
    lines.append(total + "".join(f"  {report.columns[c].total_us:10.2f}  " for c in names))
    lines += ["", LEGEND, "", "totals:"]
    for c in names:
        cost = report.columns[c]
        share = cost.time_of(Bound.MEMORY) / cost.total_us if cost.total_us else 0.0
        lines.append(f"  {c:<10} {cost.total_ms:10.4f} ms; memory-bound {cost.count(Bound.MEMORY)} of "
                     f"{len(cost.groups)} groups ({share:.0%} of the time), compute-bound {cost.count(Bound.COMPUTE)}"
                     + (f", measured {cost.count(Bound.MEASURED)}" if report.table else ""))
    lines += _table_lines(report)
    return "\n".join(lines) + "\n"


def _table_lines(report: CostReport) -> list[str]:
    out = []
    if report.table is not None:
        measured = {g.name for c in report.columns.values() for g in c.groups if g.measured}
        out.append(f"measured: {len(measured)} group(s) take their time from {report.table.path} (marked *); "
                   "the rest are the model's estimates")
        if report.unused_rows:
            out.append(f"  rows that matched no group: lines {', '.join(map(str, report.unused_rows))} "
                       "(an op name, type or precision not in this model)")
    if report.unknown_shapes:
        out.append(f"{len(report.unknown_shapes)} value(s) without a static shape count 0 "
                   f"(first: {report.unknown_shapes[0]}); give --input-shape")
    return out
