"""The profiler report (:mod:`qir.passes.profiler`): ``statistic.txt`` / ``.csv``, one histogram
PNG per op, and the same histograms as a TensorBoard event file. The pass computes; only this
module writes."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np

from qir.errors import InputError
from qir.passes.profiler import ProfileReport
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.plots import pyplot, safe_filename
from qir.tools.reports.tables import write_table

__all__ = ["COLUMNS", "files", "write_report", "write_histograms", "write_tensorboard"]

COLUMNS = ("op", "op_type", "module", "role", "value", "dtype", "scale", "min", "max", "mean", "var", "shape")


def files(ops: Iterable[str], *, histograms: bool = False) -> list[str]:
    """The files :func:`write_report` writes for the profiled ``ops`` (the TensorBoard event file
    is left out: its name is new every time, so it never replaces a file)."""
    return ["statistic.txt", "statistic.csv"] + ([f"histograms/{safe_filename(op)}.png" for op in ops]
                                                 if histograms else [])


def write_report(report: ProfileReport, save_dir: Outputs | str | Path, *, histograms: bool = False,
                 tensorboard: bool = False) -> list[Path]:
    """``statistic.txt``, ``statistic.csv``, (``histograms``) ``histograms/<op>.png`` and
    (``tensorboard``) an event file under ``tensorboard/``, through
    :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    written = write_table(out, "statistic.txt", "statistic.csv", COLUMNS, report.rows)
    if histograms:
        written += write_histograms(report.tensors, out.sub("histograms"))
    if tensorboard:
        written.append(write_tensorboard(report.tensors, out.path("tensorboard")))
    return written


def write_tensorboard(tensors: dict[str, dict[str, np.ndarray]], log_dir: str | Path, bins: int = 100) -> Path:
    """One TensorBoard histogram per tensor, tagged ``<op>/<role> <value>`` (open with
    ``tensorboard --logdir``). Needs the ``tensorboard`` package; not torch or TensorFlow.
    Buckets: ``bins`` equal-width bins over the finite values, as TensorBoard's
    ``HistogramProto`` (each bucket's right edge in ``bucket_limit``)."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import HistogramProto, Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        raise InputError("the TensorBoard export needs the tensorboard package: pip install tensorboard") from None
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(log_dir))
    for op, named in tensors.items():
        for label, array in named.items():
            x = np.asarray(array, np.float64).ravel()
            x = x[np.isfinite(x)]
            if not x.size:
                continue
            counts, edges = np.histogram(x, bins=bins)
            hist = HistogramProto(min=float(x.min()), max=float(x.max()), num=float(x.size), sum=float(x.sum()),
                                  sum_squares=float(np.dot(x, x)), bucket_limit=edges[1:].tolist(),
                                  bucket=counts.astype(np.float64).tolist())
            summary = Summary(value=[Summary.Value(tag=f"{op}/{label}", histo=hist)])
            writer.add_event(Event(step=0, wall_time=0.0, summary=summary))
    writer.close()
    return log_dir


def write_histograms(tensors: dict[str, dict[str, np.ndarray]], folder: Outputs | str | Path) -> list[Path]:
    """``<op>.png`` per op: each of its tensors' histogram (log counts)."""
    plt = pyplot()
    out = as_outputs(folder)
    paths = []
    for op, named in tensors.items():
        fig, axes = plt.subplots(1, len(named), figsize=(4.2 * max(1, len(named)), 3.4), squeeze=False)
        for ax, (label, array) in zip(axes[0], named.items()):
            x = array.ravel()
            ax.hist(x[np.isfinite(x)], bins=100, log=True)
            ax.set_title(label if len(label) < 40 else label[:37] + "...", fontsize="small")
            ax.grid(True, alpha=0.3)
        fig.suptitle(op)
        fig.tight_layout()
        paths.append(out.save_figure(f"{safe_filename(op)}.png", fig, dpi=90))
    return paths
