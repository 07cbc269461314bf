"""``check_consistency``: fake quantization vs the integer level of a march, value by value (the
``consistency`` pass), with the report written when a folder is given (an existing file only with
``overwrite``): ``consistency_result.txt``/``.json`` and the page ``consistency_result.html``
(:mod:`qir.tools.reports.consistency_html`, with the graph panel); against onnxruntime
``ort_consistency.txt``/``.json``. With the viz extra, both also write their per-op deviation as
Model Explorer node data (``model_explorer/*.json``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qir.api import as_ir
from qir.data import model_samples
from qir.passes.consistency import ConsistencyPass, ConsistencyReport
from qir.runtimes.integer.against_ort import OrtComparison, compare_with_ort
from qir.tools.reports import consistency_html
from qir.tools.reports.consistency import FILES, ORT_FILES, write_ort_report, write_report
from qir.tools.reports.graph_panel import ModelGraph
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["check_against_ort", "check_consistency"]


def check_consistency(model_or_file: Any, data: Any, march: str = "nash-e", *, num: int | None = None,
                      save_dir: Outputs | str | Path | None = None, overwrite: bool = False) -> ConsistencyReport:
    """Compare a calibrated model's fake quantization with ``march``'s integer arithmetic on
    ``data`` (a data folder, .npy/.npz or samples; at most ``num`` samples)."""
    if save_dir is not None:
        save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*FILES, *consistency_html.files()).check()
    ir = as_ir(model_or_file, calibrated=True)
    report = ConsistencyPass(model_samples(ir, data, num), march).compare(ir)
    if save_dir is not None:
        write_report(report, save_dir)
        headline = [f"fake quantization vs the integer level of {report.march} on {report.samples} sample(s)",
                    report.summary]
        consistency_html.write_page(report.to_json()["rows"], headline, ModelGraph.from_ir(ir), save_dir)
    return report


def check_against_ort(model: str | Path, data: Any, march: str | None = None, *, num: int | None = None,
                      save_dir: Outputs | str | Path | None = None, overwrite: bool = False) -> OrtComparison:
    """Compare the integer level of ``march`` (default: onnxruntime's own profile) with
    onnxruntime's default CPU session on a QDQ ``model`` (quantized by onnxruntime's
    ``quantize_static``), quantized value by quantized value, naming the first op whose codes
    depart (:mod:`qir.runtimes.integer.against_ort`)."""
    if save_dir is not None:
        save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*ORT_FILES, *consistency_html.ort_files()).check()
    ir = as_ir(model, calibrated=True)
    report = compare_with_ort(model, ir, model_samples(ir, data, num), *([march] if march else []))
    if save_dir is not None:
        write_ort_report(report, save_dir)
        consistency_html.write_ort_node_data(report, ModelGraph.from_ir(ir), save_dir)
    return report
