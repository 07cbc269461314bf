"""The layer-by-layer report (:mod:`qir.passes.layer_compare`): ``compare_per_layer_out.txt`` /
``.csv`` / ``.json``, ``abnormal_layer_advisor.txt`` / ``.json``, and the layers of both models
(``layers/``: one ``.npy`` per value with ``layers.json``). The pass computes; only this module
writes."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from qir.graph import QIR
from qir.passes.lib.layer_run import LayerRun, captured_values
from qir.tools.reports.output import Outputs, as_outputs
from qir.tools.reports.tables import write_table

__all__ = ["COLUMNS", "FILES", "format_advice", "helping_fixes", "write_report", "layer_files", "save_layers"]

FILES = ("compare_per_layer_out.txt", "compare_per_layer_out.csv", "compare_per_layer_out.json",
         "abnormal_layer_advisor.txt", "abnormal_layer_advisor.json")

COLUMNS = ("index", "mod_name", "base_op_type", "analy_op_type", "shape", "quant_dtype", "qscale", "Cosine", "MSE",
           "L1", "KL", "SQNR", "Atol", "Rtol", "max_atol_diff", "max_qscale_diff", "clip%", "round%", "inherited%",
           "base_model_min", "analy_model_min", "base_model_max", "analy_model_max", "base_model_mean",
           "analy_model_mean", "base_model_var", "analy_model_var", "ill_conditioned")

#: Columns read together, kept in one part of the text table (no wider than 160 characters).
GROUPS = (("base_op_type", "analy_op_type", "shape", "quant_dtype", "qscale"),
          ("Cosine", "MSE", "L1", "KL", "SQNR"), ("Atol", "Rtol", "max_atol_diff", "max_qscale_diff"),
          ("clip%", "round%", "inherited%", "ill_conditioned"),
          ("base_model_min", "analy_model_min", "base_model_max", "analy_model_max"),
          ("base_model_mean", "analy_model_mean", "base_model_var", "analy_model_var"))


def helping_fixes(findings: list[dict]) -> list[dict]:
    """The findings whose measured fix helps, one per fix, in the fixes' order (best first)."""
    seen: dict[int, dict] = {}
    for f in findings:
        rank = (f.get("fix") or {}).get("rank")
        if rank is not None and f["fix"].get("command"):
            seen.setdefault(rank, f)
    return [seen[k] for k in sorted(seen)]


def format_advice(findings: list[dict]) -> str:
    """``abnormal_layer_advisor.txt``: one ``[kind] layer: detail`` line per finding, and below it
    the measured fix where there is one (:func:`qir.tools.advice.fix_line`); then the fixes that
    help, numbered best first, with their commands."""
    from qir.tools.advice import fix_line

    if not findings:
        return "no abnormal layer found\n"
    text = "".join(f"[{f['kind']}] {f['layer']}: {f['detail']}\n"
                   + (f"    {fix_line(f['fix'], with_command=False)}\n" if f.get("fix") else "") for f in findings)
    helping = helping_fixes(findings)
    if helping:
        text += "\nfixes that help, measured on the bad case, best first:\n" + "".join(
            f"  {fix_line(f['fix'])}\n    for [{f['kind']}] {f['layer']}\n" for f in helping)
    return text


def write_report(rows: list[dict], findings: list[dict], out_dir: Outputs | str | Path) -> list[Path]:
    """``compare_per_layer_out.txt``/``.csv``/``.json`` and ``abnormal_layer_advisor.txt``/``.json``,
    through :class:`~qir.tools.reports.output.Outputs`."""
    out = as_outputs(out_dir)
    txt, csv_name, js, advisor, advisor_js = FILES
    files = write_table(out, txt, csv_name, COLUMNS, rows, "compare per layer (baseline vs analysis)",
                        keys=("index", "mod_name"), groups=GROUPS)
    files.append(out.write_json(js, "qir.compare_per_layer", {"rows": rows}))
    files += [out.write_text(advisor, format_advice(findings)),
              out.write_json(advisor_js, "qir.abnormal_layer_advisor", {"findings": findings})]
    return files


def layer_files(baseline: QIR, analysis: QIR | None) -> list[str]:
    """The files :func:`save_layers` (and the run that spills into the same folder) may write for
    these models: ``baseline/<k>.npy``, ``analysis/<k>.npy`` and ``layers.json``."""
    return ([f"baseline/{k}.npy" for k in range(len(captured_values(baseline)))]
            + [f"analysis/{k}.npy" for k in range(len(captured_values(analysis or baseline)))] + ["layers.json"])


def save_layers(run: LayerRun, out_dir: Outputs | str | Path) -> list[Path]:
    """``baseline/<k>.npy`` and ``analysis/<k>.npy`` (one file per value; a run made with
    ``store=out_dir`` has spilled them there already) and ``layers.json``: per model, which file
    holds which value, and each node's type, inputs and outputs."""
    out = as_outputs(out_dir)
    files, index = [], {}
    for name, ir, values in (("baseline", run.baseline, run.base_values),
                             ("analysis", run.analysis, run.analy_values)):
        order = {v: k for k, v in enumerate(captured_values(ir))}
        index[name] = {}
        for v, array in values.items():
            rel = f"{name}/{order[v]}.npy"
            path = out.path(rel)
            if isinstance(array, np.memmap) and Path(array.filename).resolve() == path.resolve():
                out.adopt(rel)  # spilled there by the run (planned and checked before it)
            else:
                path = out.save_npy(rel, array)
            index[name][v] = rel
            files.append(path)
    layers = {name: [{"node": r.name, "op_type": r.op_type, "inputs": list(r.inputs), "outputs": list(r.outputs),
                      "module": r.module} for r in ir.ops()]
              for name, ir in (("baseline", run.baseline), ("analysis", run.analysis))}
    files.append(out.write_json("layers.json", "qir.layers", {"levels": list(run.levels), "files": index,
                                                             "layers": layers}))
    return files
