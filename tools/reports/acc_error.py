"""The accumulated-error report as files: ``acc_error_<metric>.png`` (a curve per variant),
``acc_error.csv`` and ``acc_error.json`` (schema ``qir.acc_error`` v1).

The report is the ``AccErrorPass`` report; this module only draws and writes it.
"""
from __future__ import annotations

import csv
from pathlib import Path

from qir.json_dump import write_json
from qir.tools.reports.plots import pyplot, save_figure

__all__ = ["write_report"]


def write_report(report: dict, save_dir: str | Path) -> list[Path]:
    """``acc_error_<metric>.png`` (a curve per variant), ``acc_error.csv`` (index, node, value,
    one column per variant) and ``acc_error.json`` (schema ``qir.acc_error`` v1: the report less
    the engine's statistics)."""
    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = plot_curves(report, out / f"acc_error_{report['metric']}.png")
    csv_path = out / "acc_error.csv"
    curves = report["curves"]
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["index", "node", "value", *curves])
        for i, (node, value) in enumerate(zip(report["nodes"], report["values"])):
            writer.writerow([i, node, value, *("" if c[i] is None else f"{c[i]:.9g}" for c in curves.values())])
    js = write_json(out / "acc_error.json", "qir.acc_error", {k: v for k, v in report.items() if k != "engine"})
    return [png, csv_path, js]


def plot_curves(report: dict, path: Path) -> Path:
    """The metric against the general node index, one curve per variant (points left out where null)."""
    plt = pyplot()
    metric, curves, nodes = report["metric"], report["curves"], report["nodes"]
    fig, ax = plt.subplots(figsize=(max(8.0, min(24.0, len(nodes) / 8)), 5))
    for name, curve in curves.items():
        xs = [i for i, y in enumerate(curve) if y is not None]
        ax.plot(xs, [curve[i] for i in xs], marker=".", markersize=3, linewidth=1, label=name)
    ax.set_xlabel("general node (topological order)")
    ax.set_ylabel(f"{'running mean of ' if report['average_mode'] else ''}{metric} vs float")
    ax.set_title(f"accumulated quantization error ({len(curves)} variant(s), {len(nodes)} nodes)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    fig.tight_layout()
    return save_figure(fig, path)
