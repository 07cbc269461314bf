"""The layer-by-layer report (:mod:`qir.passes.layer_compare`): ``compare_per_layer_out.txt`` /
``.csv`` / ``.json``, ``abnormal_layer_advisor.txt`` / ``.json``, and the layers of both models
(``layers/``: one ``.npy`` per value with ``layers.json``). The pass computes; only this module
writes."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from qir.json_dump import write_json
from qir.passes.lib.layer_run import LayerRun, captured_values
from qir.tools.reports.tables import write_table

__all__ = ["COLUMNS", "format_advice", "write_report", "save_layers"]

COLUMNS = ("index", "mod_name", "base_op_type", "analy_op_type", "shape", "quant_dtype", "qscale", "Cosine", "MSE",
           "L1", "KL", "SQNR", "Atol", "Rtol", "max_atol_diff", "max_qscale_diff", "clip%", "round%", "inherited%",
           "base_model_min", "analy_model_min", "base_model_max", "analy_model_max", "base_model_mean",
           "analy_model_mean", "base_model_var", "analy_model_var")


def format_advice(findings: list[dict]) -> str:
    """``abnormal_layer_advisor.txt``: one ``[kind] layer: detail`` line per finding."""
    if not findings:
        return "no abnormal layer found\n"
    return "".join(f"[{f['kind']}] {f['layer']}: {f['detail']}\n" for f in findings)


def write_report(rows: list[dict], findings: list[dict], out_dir: str | Path) -> list[Path]:
    """``compare_per_layer_out.txt``/``.csv``/``.json`` and ``abnormal_layer_advisor.txt``/``.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = write_table(out / "compare_per_layer_out.txt", out / "compare_per_layer_out.csv", COLUMNS, rows,
                        "compare per layer (baseline vs analysis)")
    files.append(write_json(out / "compare_per_layer_out.json", "qir.compare_per_layer", {"rows": rows}))
    advisor = out / "abnormal_layer_advisor.txt"
    advisor.write_text(format_advice(findings))
    files += [advisor, write_json(out / "abnormal_layer_advisor.json", "qir.abnormal_layer_advisor",
                                  {"findings": findings})]
    return files


def save_layers(run: LayerRun, out_dir: str | Path) -> list[Path]:
    """``baseline/<k>.npy`` and ``analysis/<k>.npy`` (one file per value; a run made with
    ``store=out_dir`` has spilled them there already) and ``layers.json``: per model, which file
    holds which value, and each node's type, inputs and outputs."""
    out = Path(out_dir)
    files, index = [], {}
    for name, ir, values in (("baseline", run.baseline, run.base_values),
                             ("analysis", run.analysis, run.analy_values)):
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        order = {v: k for k, v in enumerate(captured_values(ir))}
        index[name] = {}
        for v, array in values.items():
            path = folder / f"{order[v]}.npy"
            if not (isinstance(array, np.memmap) and Path(array.filename).resolve() == path.resolve()):
                np.save(path, np.asarray(array), allow_pickle=False)
            index[name][v] = f"{name}/{path.name}"
            files.append(path)
    layers = {name: [{"node": r.name, "op_type": r.op_type, "inputs": list(r.inputs), "outputs": list(r.outputs),
                      "module": r.module} for r in ir.ops()]
              for name, ir in (("baseline", run.baseline), ("analysis", run.analysis))}
    files.append(write_json(out / "layers.json", "qir.layers",
                            {"levels": list(run.levels), "files": index, "layers": layers}))
    return files
