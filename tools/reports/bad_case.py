"""The bad-case report (:mod:`qir.passes.bad_case`): ``badcase.txt`` with the three tables,
``badcase.json`` with every per-sample value, ``badcase.npz`` with the chosen case's inputs, and
reading such a case back (a file the user gives). The pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from qir.errors import InputError
from qir.passes.bad_case import BadCaseReport
from qir.passes.lib.model_pair import BAD_CASE_METRICS
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILES", "write_report", "save_bad_case", "load_bad_case"]

FILES = ("badcase.txt", "badcase.json", "badcase.npz")


def _fmt(v: float) -> str:
    return f"{v:.6g}"


def format_report(report: BadCaseReport) -> str:
    """``badcase.txt``: the bad case per output and metric, the metric values on it, the worst
    output per metric."""
    metrics = list(BAD_CASE_METRICS)
    lines = ["bad case input index of each output", "Name/Index  " + "  ".join(metrics)]
    for name, per in report.bad_case.items():
        lines.append(f"{name}  " + "  ".join(str(per[m]) for m in metrics))
    lines += ["", f"metric results of each badcase (bad case by {report.metric})", "Name/Index  " + "  ".join(metrics)]
    for name, per in report.bad_case.items():
        i = per[report.metric]
        lines.append(f"{name}/{i}  " + "  ".join(_fmt(report.values[name][m][i]) for m in metrics))
    lines += ["", "bad case input index of the worst output", "metric  output  index"]
    for m, entry in report.worst_output.items():
        lines.append(f"{m}  {entry['output']}  {entry['index']}")
    return "\n".join(lines) + "\n"


def write_report(report: BadCaseReport, out_dir: Outputs | str | Path) -> list[Path]:
    """``badcase.txt`` (three tables), ``badcase.json`` and ``badcase.npz`` (the chosen case),
    through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(out_dir)
    txt, js, npz = FILES
    return [out.write_text(txt, format_report(report)),
            out.write_json(js, "qir.badcase", report),
            save_bad_case(report.data[report.chosen], npz, out)]


def save_bad_case(sample: Mapping[str, np.ndarray], path: str | Path, out: Outputs | None = None) -> Path:
    """One sample's inputs as ``.npz`` (``{input name: array}``), the file ``path`` of ``out``
    (default: a new :class:`~qir.tools.reports.output.Outputs`, which refuses an existing file)."""
    return (out or Outputs()).save_npz(path, sample)


def load_bad_case(path: str | Path) -> dict[str, np.ndarray]:
    """The inputs saved by :func:`save_bad_case` (read without pickle)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no bad case file at {path}")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}
