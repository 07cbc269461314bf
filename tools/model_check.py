"""``check_model`` (horizon ``check_qat_model``): run the ``model-check`` pass on a model file or
IR and write its report (:mod:`qir.tools.reports.model_check`) when a folder is given (an existing
file only with ``overwrite``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from qir.api import as_ir
from qir.passes.model_check import ModelCheckPass, ModelCheckReport
from qir.tools.reports.model_check import FILES, write_report
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["check_model"]


def check_model(model_or_file: Any, march: str = "nash-e", *, save_dir: Outputs | str | Path | None = None,
                overwrite: bool = False, names: tuple[str, str] = FILES) -> ModelCheckReport:
    """Run the checks on a model file or IR; write the report to ``save_dir`` when given, as
    ``names`` (default ``model_check_result.txt``/``.json``)."""
    if save_dir is not None:
        save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*names).check()
    report = ModelCheckPass(march)(as_ir(model_or_file)).report
    if save_dir is not None:
        write_report(report, save_dir, names)
    return report
