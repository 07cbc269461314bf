"""The model-check report (:mod:`qir.passes.model_check`): ``model_check_result.txt`` (the findings,
then the per-op configuration table) and ``model_check_result.json`` (schema ``qir.model_check``
v1). The pass computes; only this module writes."""
from __future__ import annotations

from pathlib import Path

from qir.json_dump import write_json

__all__ = ["format_report", "write_report"]


def format_report(report: dict) -> str:
    """``model_check_result.txt``: the findings, then the per-op configuration table."""
    lines = [f"model check for {report['march']}"]
    for section, title in (("unfused", "unfused patterns"), ("shared", "shared weights and modules"),
                           ("unusual", "unusual configurations")):
        items = report[section]
        lines += ["", f"== {title}: {len(items) or 'none'}"]
        lines += [f"  [{f['kind']}] {f['node']}: {f['detail']}" for f in items]
    lines += ["", "== calibration configuration per op",
              f"  {'node':<36}{'op':<20}{'inputs':<22}{'weights':<20}{'output':<14}method"]
    for r in report["config"]:
        ins = ",".join(e["mode"] for e in r["inputs"]) or "-"
        ws = ",".join(e["mode"] + (f"@{e['axis']}" if "axis" in e else "") for e in r["weights"]) or "-"
        name = r["node"] + (f" [{r['module']}]" if r.get("module") else "")
        lines.append(f"  {name:<36}{r['op_type']:<20}{ins:<22}{ws:<20}{','.join(r['output']):<14}"
                     f"{','.join(r['method']) or '-'}")
    return "\n".join(lines) + "\n"


def write_report(report: dict, save_dir: str | Path) -> list[Path]:
    """``model_check_result.txt`` and ``model_check_result.json`` (schema ``qir.model_check`` v1)."""
    out = Path(save_dir)
    out.mkdir(parents=True, exist_ok=True)
    txt = out / "model_check_result.txt"
    txt.write_text(format_report(report))
    return [txt, write_json(out / "model_check_result.json", "qir.model_check", report)]
