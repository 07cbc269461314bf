"""Writing the emitted model: the ``emit`` pass returns the QDQ ONNX model, these functions put it
in a file (``qir emit``, the demo). Passes never write; this is where ``overwrite`` is decided.

::

    emit_model(ir, "partial.onnx", int16=["conv2"], float="fc")   # modes set on a clone, then written
    emit(ir, "qdq.onnx")                                           # the IR's modes as they are
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

import onnx

from qir.errors import InputError
from qir.graph import QIR
from qir.kinds import CalibMode
from qir.passes.emit import EmitPass
from qir.passes.lib.selection import as_name_list, select_calibrations

__all__ = ["emit", "emit_model", "write_model", "write_reports"]

logger = logging.getLogger(__name__)


def write_model(model: onnx.ModelProto, path: str | Path, *, overwrite: bool = False) -> Path:
    """``model`` saved to ``path`` (its folder created); an existing file only with ``overwrite``."""
    path = _writable(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _writable(path: str | Path, overwrite: bool) -> Path:
    """``path``, unless it exists and ``overwrite`` is off, or is a folder: then one clear error."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise InputError(f"{path} exists; choose another output path or pass overwrite=True")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give the path of an .onnx file")
    return path


def write_reports(reports: Iterable[dict[str, Any]], *, overwrite: bool = False) -> list[Path]:
    """Write the model of every ``emit`` report that names a ``path`` (an ``emit{path=...}`` step
    of a pipeline), replacing an existing file when the step or ``overwrite`` allows it; the
    report then holds the path instead of the model."""
    written = []
    for report in reports:
        if report.get("path") and "model" in report:
            model = report.pop("model")
            written.append(write_model(model, report["path"], overwrite=overwrite or bool(report.get("overwrite"))))
    return written


def emit(ir: QIR, path: str | Path, *, opset: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Emit ``ir`` (:class:`qir.passes.emit.EmitPass`) and write the model to ``path``. Returns the
    pass's report with ``path`` in place of the model. An existing ``path`` is refused before
    anything is built unless ``overwrite``. ``ir`` is not changed."""
    path = _writable(path, overwrite)  # refused before the model is built
    found = dict(EmitPass(opset=opset)(ir).report)
    write_model(found.pop("model"), path, overwrite=True)
    found.pop("overwrite")
    report = {**found, "path": str(path)}
    logger.info("emit: %s (opset %d): %s", report["path"], report["opset"], report["modes"])
    return report


def emit_model(ir: QIR, path: str | Path, *, int16: str | Iterable[str] = (), float: str | Iterable[str] = (),  # noqa: A002
               fp16: str | Iterable[str] = (), opset: int | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Set the chosen calibration nodes' modes on a clone of ``ir`` and emit it to ``path``.

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
    report = emit(clone, path, opset=opset, overwrite=overwrite)
    report["selected"] = {m.value: sorted(n for n, mm in chosen.items() if mm is m)
                          for m in (CalibMode.INT16, CalibMode.FLOAT, CalibMode.FP16)}
    return report
