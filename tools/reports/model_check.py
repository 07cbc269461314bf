"""The model-check report (:mod:`qir.passes.model_check`): ``model_check_result.txt`` (the findings,
then the per-op configuration table) and ``model_check_result.json`` (schema ``qir.model_check``
v1). ``qir calibrate`` writes the same report beside the model it writes, named after it
(``<model stem>.check.txt`` / ``.json``: :func:`files`), so two calibrated models in one folder
keep their own. The pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from qir.json_dump import JsonValue
from qir.passes.model_check import ModelCheckReport
from qir.tools.reports.output import Outputs, as_outputs

__all__ = ["FILES", "files", "format_report", "write_report"]

FILES = ("model_check_result.txt", "model_check_result.json")


def files(model: str | Path | None = None) -> tuple[str, str]:
    """The report's two file names: :data:`FILES`, or for a ``model`` file the names beside it
    (``yolo_max.onnx`` -> ``yolo_max.check.txt``, ``yolo_max.check.json``)."""
    if model is None:
        return FILES
    stem = Path(model).stem
    return (f"{stem}.check.txt", f"{stem}.check.json")


def format_report(report: ModelCheckReport | Mapping[str, JsonValue]) -> str:
    """``model_check_result.txt``: the findings, then the per-op configuration table (of a report,
    or of one read back from its JSON file)."""
    if not isinstance(report, ModelCheckReport):
        report = ModelCheckReport.from_json(report)
    lines = [f"model check for {report.march}"]
    for section, title in (("unfused", "unfused patterns"), ("shared", "shared weights and modules"),
                           ("unusual", "unusual configurations")):
        items = getattr(report, section)
        lines += ["", f"== {title}: {len(items) or 'none'}"]
        lines += [f"  [{f['kind']}] {f['node']}: {f['detail']}" for f in items]
    lines += ["", "== calibration configuration per op",
              f"  {'node':<36}{'op':<20}{'inputs':<22}{'weights':<20}{'output':<14}method"]
    for r in report.config:
        ins = ",".join(e["mode"] for e in r["inputs"]) or "-"
        ws = ",".join(e["mode"] + (f"@{e['axis']}" if "axis" in e else "") for e in r["weights"]) or "-"
        name = r["node"] + (f" [{r['module']}]" if r.get("module") else "")
        lines.append(f"  {name:<36}{r['op_type']:<20}{ins:<22}{ws:<20}{','.join(r['output']):<14}"
                     f"{','.join(r['method']) or '-'}")
    return "\n".join(lines) + "\n"


def write_report(report: ModelCheckReport, save_dir: Outputs | str | Path, names: tuple[str, str] = FILES) -> list[Path]:
    """``model_check_result.txt`` and ``model_check_result.json`` (schema ``qir.model_check`` v1),
    or the two ``names`` (:func:`files`), through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(save_dir)
    return [out.write_text(names[0], format_report(report)), out.write_json(names[1], "qir.model_check", report)]
