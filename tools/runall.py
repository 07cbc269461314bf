"""``qir runall``: every debugger analysis in the order hmct's ``runall`` uses, then one
self-contained ``index.html``.

Steps and folders under ``save_dir`` (defaults as hmct's ``runall`` documents them):

1. ``node_sensitivity/``: node sensitivity per node type (default: weight, then activation),
   ``sensitivity_of_<type>.{txt,csv,json}``.
2. ``data_distribution/``: distributions of ``dis_nodes_list``, default the 5 most sensitive
   nodes of each type.
3. ``channelwise_distribution/``: per-channel box plots of ``cw_nodes_list``, default the same
   calibration nodes.
4. ``accumulate_error/``: accumulated-error curves, default ``quantize_node=["weight", "activation"]``.
5. ``sensitivity_analysis/``: recovery as the sensitive nodes are raised.

Then the advice (:mod:`qir.tools.advice`): candidate fixes read off those results (clipping ->
a fixed threshold, rounding -> int16, outlier channels, spread error -> several quantizers or
another calibration method), each measured on the engine on the same samples before it is shown;
those that help, with complete ``qir set-mode`` / ``qir pipeline`` commands, go to ``index.html``,
the log and ``advice.json`` (schema ``qir.advice`` v1, with the ones tried and dropped).

``index.html`` (written by ``qir.tools.reports.runall``) embeds every plot (base64 PNG, no
network needed), the top of each table and that advice, under a header (:func:`header`: the
model file, its calibration method and march where the model records them, the data, the
number of samples, the runtime and the float-vs-quantized output cosine). Quantizers are named
with the ops they feed and ops with their quantizers. The passes compute; the writers of
``qir.tools.reports`` write each step's files.
Every file it may write (:func:`plan_files`) is checked before step 1: none may exist unless
``overwrite=True`` (``--force``), and nothing is created before the analyses have read the data.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from qir.execution import Runtime
from qir.tools.advice import advise

__all__ = ["runall", "plan_files", "check_choices", "header", "notes"]

logger = logging.getLogger(__name__)

TOP = 5


def with_output_node(ir, output_node: str | None):
    """``ir``, or one clear error before any work for an ``output_node`` it does not have; runall takes
    hmct's flags, so an output folder given as ``-o`` lands here: the message says where it goes."""
    from qir.errors import NotFoundError, did_you_mean

    if output_node is not None and not (ir.has_node(output_node) or ir.has_value(output_node)):
        raise NotFoundError(did_you_mean(output_node, [r.name for r in ir.runnables()], "output node")
                            + " (runall takes hmct's flags: -o/--output-node is the node whose output is compared; "
                              "the output folder is -s/--save-dir)")
    return ir


def runall(model_or_file, calibrated_data, save_dir="./debug_result/", ns_metrics="cosine-similarity",
           output_node=None, node_type=None, data_num=1, verbose=False, interested_nodes=None,
           dis_nodes_list=None, cw_nodes_list=None, axis=None, quantize_node=None, non_quantize_node=None,
           ae_metric="cosine-similarity", average_mode=False, pick_threshold=0.999, sensitive_nodes=None,
           *, runtime: str = Runtime.ORT, progress: bool = True, log=print, overwrite: bool = False,
           model_path: str | None = None) -> dict[str, Any]:
    """Run the five analyses, measure the advice and write ``index.html`` and ``advice.json``;
    returns every step's results. ``save_dir`` is a folder or a
    :class:`~qir.tools.reports.output.Outputs` (the demo's). ``model_path``: the file the IR was
    read from, when ``model_or_file`` is an IR (the advice's commands name it)."""
    from qir.api import as_ir
    from qir.passes.acc_error import AccErrorPass
    from qir.passes.channelwise import ChannelwisePass
    from qir.passes.distribution import DistributionPass
    from qir.passes.node_sensitivity import NodeSensitivityPass
    from qir.passes.sensitivity_analysis import SensitivityAnalysisPass
    from qir.tools.reports import acc_error, channelwise, distribution, node_sensitivity
    from qir.tools.reports import sensitivity_analysis as sensitivity_report
    from qir.tools.reports.output import as_outputs
    from qir.tools.reports.runall import write_index

    ir = with_output_node(as_ir(model_or_file, calibrated=True), output_node)
    metrics = [ns_metrics] if isinstance(ns_metrics, str) else list(ns_metrics)
    types = [node_type] if isinstance(node_type, str) else list(node_type or ["weight", "activation"])
    out = plan_files(as_outputs(save_dir, overwrite=overwrite), ir, types, dis_nodes_list, cw_nodes_list,
                     ae_metric).check()
    check_choices(ir, calibrated_data, dis_nodes_list, cw_nodes_list, axis, quantize_node, non_quantize_node,
                  sensitive_nodes)
    if model_path is None and not hasattr(model_or_file, "calibrations"):
        model_path = str(model_or_file)
    results: dict[str, Any] = {"model": model_path or ir.name, "sensitivity": {},
                               "quantizers": {c.name: {"role": c.role.value, "feeds": list(c.feeds)}
                                              for c in ir.calibrations()}}
    started = time.perf_counter()

    log("[1/5] node sensitivity: " + ", ".join(types))
    for nt in types:
        report = NodeSensitivityPass(calibrated_data, metrics, output_node=output_node, node_type=nt, data_num=data_num,
                                     interested_nodes=interested_nodes, runtime=runtime, progress=progress)(ir).report
        node_sensitivity.write_report(report, out.sub("node_sensitivity"), stem=f"sensitivity_of_{nt}")
        if verbose:
            log(node_sensitivity.format_table(report).rstrip())
        results["sensitivity"][nt] = report

    top = [r["node"] for nt in types if nt != "node" for r in results["sensitivity"][nt]["rows"][:TOP]]
    dis_nodes = list(dis_nodes_list or top)
    log(f"[2/5] data distributions: {len(dis_nodes)} node(s)")
    results["distribution"] = distribution.write_report(
        DistributionPass(calibrated_data, dis_nodes, data_num=data_num, runtime=runtime)(ir),
        out.sub("data_distribution"))["nodes"] if dis_nodes else {}

    cw_nodes = list(cw_nodes_list or [n for n in top if ir.has_node(n) and n in {c.name for c in ir.calibrations()}])
    log(f"[3/5] channel-wise distributions: {len(cw_nodes)} node(s)")
    results["channelwise"] = channelwise.write_report(
        ChannelwisePass(calibrated_data, cw_nodes, axis=axis, data_num=data_num, runtime=runtime)(ir),
        out.sub("channelwise_distribution"))["nodes"] if cw_nodes else {}

    qn = quantize_node if quantize_node is not None or non_quantize_node is not None else ["weight", "activation"]
    log("[4/5] accumulated error")
    acc = AccErrorPass(calibrated_data, qn, non_quantize_node=non_quantize_node, metric=ae_metric,
                       average_mode=average_mode, data_num=data_num, runtime=runtime, progress=progress)(ir).report
    acc_error.write_report(acc, out.sub("accumulate_error"))
    results["acc_error"] = acc

    log("[5/5] sensitivity analysis")
    sa = SensitivityAnalysisPass(calibrated_data, "cosine-similarity", pick_threshold=pick_threshold,
                                 data_num=data_num, sensitive_nodes=sensitive_nodes, runtime=runtime,
                                 progress=progress)(ir).report
    sensitivity_report.write_report(sa, out.sub("sensitivity_analysis"))
    results["sensitivity_analysis"] = sa
    measured = advise(ir, results, calibrated_data, model_path=model_path, data_num=data_num, runtime=runtime,
                      pick_threshold=pick_threshold, progress=progress)
    results.update(advice=measured["advice"], dropped=measured["dropped"], notes=measured["notes"] + notes(results),
                   header=header(ir, model_path, calibrated_data, measured, runtime))
    results["seconds"] = round(time.perf_counter() - started, 2)
    out.write_json("advice.json", "qir.advice", {k: results[k] for k in ("header", "advice", "dropped", "notes")})
    _log_advice(results, log)
    results["index"] = str(write_index(results, out))
    log(f"report: {results['index']}")
    return results


def _log_advice(results: dict[str, Any], log) -> None:
    """The advice as lines: each kept fix, then what was tried and dropped."""
    h = results["header"]
    log(f"what to try next ({h['score_metric']} now {h['score']:.5f}, measured on {h['samples']} sample(s)):")
    for fix in results["advice"]:
        log(f"- {fix['text']}")
    if not results["advice"]:
        log("- no fix tried helps (see advice.json)")
    for fix in results["dropped"]:
        log(f"  tried and dropped ({fix['reason']}): {fix['fix']} for {_changed(fix)}: {fix['after']:.5f}")
    for note in results["notes"]:
        log(f"  note: {note}")


def _changed(fix: dict[str, Any]) -> str:
    names = sorted(fix.get("changes") or {})
    if not names:
        return "every quantizer"
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def header(ir, model_path: str | None, data, measured: dict[str, Any], runtime: str) -> dict[str, Any]:
    """What the report is about: the model file, its calibration method and march (as the model
    records them), the data, the samples used and left out, the runtime, and the score of the
    model as it is (output cosine vs float, mean over samples)."""
    calibration = ir.meta.get("calibration") or {}
    return {"model": str(model_path) if model_path else f"IR {ir.name!r} (in memory)",
            "calibration_method": calibration.get("method") or "not recorded in the model",
            "calibration_samples": calibration.get("samples"),
            "march": ir.meta.get("march") or "not recorded in the model",
            "data": str(data) if isinstance(data, (str, Path)) else "samples given in memory",
            "samples": measured["samples"], "left_out": measured["left_out"], "runtime": runtime,
            "score_metric": measured["metric"], "score": measured["before"],
            "calibration_nodes": len(ir.calibrations())}


def check_choices(ir, data, dis_nodes_list=None, cw_nodes_list=None, axis=None, quantize_node=None,
                  non_quantize_node=None, sensitive_nodes=None) -> None:
    """The user's node lists and axis, checked against ``ir`` before step 1 (each step's pass
    checks its own; a bad name in step 5 must not end the run after four steps wrote files)."""
    from qir.passes.acc_error import AccErrorPass
    from qir.passes.channelwise import ChannelwisePass
    from qir.passes.distribution import DistributionPass
    from qir.passes.sensitivity_analysis import SensitivityAnalysisPass

    if dis_nodes_list:
        DistributionPass(data, dis_nodes_list).check(ir)
    if cw_nodes_list:
        ChannelwisePass(data, cw_nodes_list, axis=axis).check(ir)
    elif axis is not None:  # the default nodes come from step 1: some must take the axis
        ranks = [len(ir.value(c.input).shape or ()) for c in ir.calibrations()]
        if ranks and not any(-r <= axis < r for r in ranks):
            from qir.errors import InputError
            raise InputError(f"axis {axis} is out of range for every calibration node's input "
                             f"(ranks {sorted(set(ranks))})")
    if quantize_node is not None or non_quantize_node is not None:
        AccErrorPass(data, quantize_node, non_quantize_node=non_quantize_node).check(ir)
    if sensitive_nodes:
        SensitivityAnalysisPass(data, sensitive_nodes=sensitive_nodes).check(ir)


def plan_files(out, ir, node_types: list[str], dis_nodes_list=None, cw_nodes_list=None,
               ae_metric: str = "cosine-similarity"):
    """Plan on ``out`` (an :class:`~qir.tools.reports.output.Outputs`) every file :func:`runall`
    may write, and return it. The default nodes of steps 2 and 3 are the most sensitive ones, known
    only after step 1, so every calibration node of the analysed roles is planned for them."""
    from qir.tools.reports import acc_error, channelwise, distribution, node_sensitivity
    from qir.tools.reports import sensitivity_analysis as sensitivity_report

    candidates = [c.name for c in ir.calibrations() if c.role.value in node_types]
    for nt in node_types:
        out.sub("node_sensitivity").plan(*node_sensitivity.files(f"sensitivity_of_{nt}"))
    dis_nodes, cw_nodes = list(dis_nodes_list or candidates), list(cw_nodes_list or candidates)
    if dis_nodes:
        out.sub("data_distribution").plan(*distribution.files(dis_nodes))
    if cw_nodes:
        out.sub("channelwise_distribution").plan(*channelwise.files(cw_nodes))
    out.sub("accumulate_error").plan(*acc_error.files(ae_metric))
    out.sub("sensitivity_analysis").plan(*sensitivity_report.FILES)
    return out.plan("advice.json", "index.html")


def notes(results: dict[str, Any]) -> list[str]:
    """Observations that are not fixes: whether weights or activations cost more at the output."""
    acc = results.get("acc_error") or {}
    curves = acc.get("curves", {})
    w, a = curves.get("only_weight_calibrated"), curves.get("only_activation_calibrated")
    if not (w and a and acc.get("metric") == "cosine-similarity"):
        return []
    lw, la = (next((v for v in reversed(c) if v is not None), None) for c in (w, a))
    if lw is None or la is None:
        return []
    worse = "weights" if lw < la else "activations"
    return [f"At the output, quantizing only the weights gives cosine {lw:.5f} and only the activations "
            f"{la:.5f}: the {worse} cost more."]
