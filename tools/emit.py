"""Writing the emitted model: the ``emit`` pass returns the QDQ ONNX model, these functions put it
in a file (``qir emit``, the demo). Passes never write; files are written through
:class:`~qir.tools.reports.output.Outputs` (an existing file only with ``overwrite``, atomically).

::

    emit_model(ir, "partial.onnx", int16=["conv2"], float="fc")   # modes set on a clone, then written
    emit(ir, "qdq.onnx")                                           # the IR's modes as they are
    emit(ir, "int.onnx", format="qoperator")                       # QLinearConv, QGemm, ... where they exist
"""
from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

import onnx

from qir.errors import InputError
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.emit import EmitPass, EmitReport
from qir.passes.lib.selection import as_name_list, select_calibrations
from qir.tools.reports.output import Outputs

__all__ = ["emit", "emit_model", "write_model", "plan_reports", "write_reports"]

logger = logging.getLogger(__name__)


def write_model(model: onnx.ModelProto, path: str | Path, *, overwrite: bool = False,
                outputs: Outputs | None = None) -> Path:
    """``model`` saved to ``path`` (its folder created, atomically) through ``outputs`` (default: a
    new :class:`~qir.tools.reports.output.Outputs`): an existing file only with ``overwrite``."""
    out = outputs if outputs is not None else Outputs(overwrite=overwrite)
    return out.write(path, lambda tmp: onnx.save(model, str(tmp)))


def plan_reports(passes: Iterable[Any], outputs: Outputs) -> Outputs:
    """Plan, on ``outputs``, the file of every ``emit`` pass of a pipeline that names a ``path``
    (an ``emit{path=...}`` step; its own ``overwrite=True`` lets it replace that file)."""
    for p in passes:
        if isinstance(p, EmitPass) and p.path:
            outputs.plan(p.path, replace=p.overwrite)
    return outputs


def write_reports(reports: Iterable[dict[str, Any]], *, overwrite: bool = False,
                  outputs: Outputs | None = None) -> list[Path]:
    """Write the model of every ``emit`` report that names a ``path`` (an ``emit{path=...}`` step
    of a pipeline), replacing an existing file when the step or ``overwrite`` allows it; the
    report then holds the path instead of the model."""
    written = []
    for report in reports:
        if report.get("path") and "model" in report:
            model = report.pop("model")
            out = outputs if outputs is not None else Outputs(overwrite=overwrite)
            if report.get("overwrite"):
                out.plan(report["path"], replace=True)
            written.append(write_model(model, report["path"], outputs=out))
    return written


def emit(ir: QIR, path: str | Path, *, opset: int | None = None, overwrite: bool = False,
         outputs: Outputs | None = None, format: str = "qdq") -> EmitReport:  # noqa: A002
    """Emit ``ir`` (:class:`qir.passes.emit.EmitPass`; ``format`` ``qdq`` or ``qoperator``) and
    write the model to ``path`` (through ``outputs``, a command's, when given: then ``path`` is in
    its folder). Returns the pass's report with ``path`` in place of the model. An existing
    ``path`` is refused before anything is built unless ``overwrite``. ``ir`` is not changed."""
    emit_pass = EmitPass(opset=opset, format=format)  # a bad format is refused before anything else
    out = (outputs if outputs is not None else Outputs(overwrite=overwrite)).plan(path).check()  # before building
    built: EmitReport = emit_pass(ir).report  # type: ignore[assignment]
    path = write_model(built.model, path, outputs=out)
    report = replace(built, model=None, overwrite=None, path=str(path))
    logger.info("emit: %s (opset %d): %s", report.path, report.opset, report.modes)
    if format == "qoperator":
        logger.info("emit: integer forms %s; kept QDQ %s", report.forms, report.kept_qdq)
    return report


def emit_model(ir: QIR, path: str | Path, *, int16: str | Iterable[str] = (), float: str | Iterable[str] = (),  # noqa: A002
               fp16: str | Iterable[str] = (), opset: int | None = None, overwrite: bool = False,
               outputs: Outputs | None = None, format: str = "qdq") -> EmitReport:  # noqa: A002
    """Set the chosen calibration nodes' modes on a clone of ``ir`` and emit it to ``path`` in
    ``format`` (``qdq``, or ``qoperator``: integer ONNX ops where they exist, :func:`emit`).

    ``int16`` / ``float`` / ``fp16``: names or globs of calibration nodes, of the ops they feed,
    or module paths (as ``set-mode`` selects them; a comma-separated string or a list); every
    other node keeps its mode. A node chosen for two modes is an error. Returns the emit
    report (:func:`emit`) plus ``selected`` (mode → node names). ``ir`` is not changed.
    """
    clone = ir.clone()
    chosen: dict[str, CalibMode] = {}
    for mode, names in ((CalibMode.INT16, int16), (CalibMode.FLOAT, float), (CalibMode.FP16, fp16)):
        names = as_name_list(names)
        if not names:
            continue
        for cal in select_calibrations(clone, names):
            if cal.name in chosen and chosen[cal.name] is not mode:
                raise InputError(f"calibration node {cal.name!r} is selected for both "
                                 f"{chosen[cal.name].value} and {mode.value}")
            chosen[cal.name] = mode
    for name, mode in chosen.items():
        clone.set_calibration(name, mode=mode)
    report = emit(clone, path, opset=opset, overwrite=overwrite, outputs=outputs, format=format)
    report.selected = {m.value: sorted(n for n, mm in chosen.items() if mm is m)
                          for m in (CalibMode.INT16, CalibMode.FLOAT, CalibMode.FP16)}
    return report
