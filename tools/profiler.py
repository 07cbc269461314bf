"""``profile_model`` (horizon ``ModelProfiler``): run the ``profiler`` pass on a model file or IR
and write its report (:mod:`qir.tools.reports.profiler`) when a folder is given (checked before
the model runs: an existing file only with ``overwrite``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qir.api import as_ir
from qir.execution import Runtime
from qir.passes.profiler import ProfilerPass
from qir.tools.reports.output import as_outputs
from qir.tools.reports.profiler import files, write_report

__all__ = ["profile_model"]


def profile_model(model_or_file: Any, data: Any, *, save_dir: str | Path | None = None, data_num: int | None = 1,
                  prefixes: list[str] | None = None, types: list[str] | None = None, histograms: bool = False,
                  tensorboard: bool = False, runtime: str = Runtime.ORT, overwrite: bool = False) -> list[dict]:
    """Profile a model file or IR; write the report to ``save_dir`` when given; return the rows."""
    ir = as_ir(model_or_file)
    profiler = ProfilerPass(data, data_num, prefixes=prefixes, types=types, runtime=runtime)
    if save_dir is not None:
        ops = [op.name for op in profiler.selected_ops(ir)]
        save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*files(ops, histograms=histograms)).check()
    report = profiler(ir).report
    if save_dir is not None:
        write_report(report, save_dir, histograms=histograms, tensorboard=tensorboard)
    return report.rows
