"""``qir runall``: every debugger analysis in the order hmct's ``runall`` uses, then one
self-contained ``index.html``.

Steps and folders under ``save_dir`` (defaults as hmct's, ``../shared/reference/horizon-semantics.md`` §1.8):

1. ``node_sensitivity/``: node sensitivity per node type (default: weight, then activation),
   ``sensitivity_of_<type>.{txt,csv,json}``.
2. ``data_distribution/``: distributions of ``dis_nodes_list``, default the 5 most sensitive
   nodes of each type.
3. ``channelwise_distribution/``: per-channel box plots of ``cw_nodes_list``, default the same
   calibration nodes.
4. ``accumulate_error/``: accumulated-error curves, default ``quantize_node=["weight", "activation"]``.
5. ``sensitivity_analysis/``: recovery as the sensitive nodes are raised.

``index.html`` (written by ``qir.tools.reports.runall``) embeds every plot (base64 PNG, no
network needed), the top of each table, and a short "what to try next" derived from the numbers
(:func:`advice`). The passes compute; the writers of ``qir.tools.reports`` write each step's files.
Every file it may write (:func:`plan_files`) is checked before step 1: none may exist unless
``overwrite=True`` (``--force``), and nothing is created before the analyses have read the data.
"""
from __future__ import annotations

import logging
import time
from typing import Any

__all__ = ["runall", "plan_files", "advice"]

logger = logging.getLogger(__name__)

TOP = 5


def runall(model_or_file, calibrated_data, save_dir="./debug_result/", ns_metrics="cosine-similarity",
           output_node=None, node_type=None, data_num=1, verbose=False, interested_nodes=None,
           dis_nodes_list=None, cw_nodes_list=None, axis=None, quantize_node=None, non_quantize_node=None,
           ae_metric="cosine-similarity", average_mode=False, pick_threshold=0.999, sensitive_nodes=None,
           *, runtime: str = "ort", progress: bool = True, log=print, overwrite: bool = False) -> dict[str, Any]:
    """Run the five analyses and write ``index.html``; returns every step's results. ``save_dir``
    is a folder or a :class:`~qir.tools.reports.output.Outputs` (the demo's)."""
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

    ir = as_ir(model_or_file, calibrated=True)
    metrics = [ns_metrics] if isinstance(ns_metrics, str) else list(ns_metrics)
    types = [node_type] if isinstance(node_type, str) else list(node_type or ["weight", "activation"])
    out = plan_files(as_outputs(save_dir, overwrite=overwrite), ir, types, dis_nodes_list, cw_nodes_list,
                     ae_metric).check()
    results: dict[str, Any] = {"model": str(model_or_file) if not hasattr(model_or_file, "calibrations") else ir.name,
                               "sensitivity": {}}
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
    results["seconds"] = round(time.perf_counter() - started, 2)
    results["advice"] = advice(results, pick_threshold)
    results["index"] = str(write_index(results, out))
    log(f"report: {results['index']}")
    return results


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
    return out.plan("index.html")


def advice(results: dict[str, Any], pick_threshold: float = 0.999) -> list[str]:
    """Short, concrete next steps read off the numbers (each names the command to run)."""
    tips: list[str] = []
    sa = results.get("sensitivity_analysis") or {}
    nodes, cumulative = sa.get("nodes", []), sa.get("cumulative", [])
    if nodes and cumulative:
        reach = next((k for k, v in enumerate(cumulative[1:], 1) if v >= pick_threshold), None)
        if reach is not None:
            chosen = ",".join(nodes[:reach])
            tips.append(f"Keeping {reach} node(s) in float ({chosen}) brings the output cosine from "
                        f"{cumulative[0]:.5f} to {cumulative[reach]:.5f}: "
                        f"qir emit calibrated_model.onnx -o partial.onnx --float {chosen}")
        else:
            tips.append(f"Even with all {len(nodes)} sensitive node(s) in float the cosine only reaches "
                        f"{cumulative[-1]:.5f}: the error is spread over many nodes; try another calibration "
                        "method (qir calibrate --method mix) or int16 for whole blocks.")
    elif sa:
        tips.append(f"No single node is below cosine {pick_threshold}: quantization error is spread thin. "
                    "If accuracy is still short, compare calibration methods (qir calibrate --method mix).")
    act = (results.get("sensitivity") or {}).get("activation", {}).get("rows", [])
    if act and "cosine-similarity" in act[0] and act[0]["cosine-similarity"] < pick_threshold:
        r = act[0]
        tips.append(f"The activation quantizer {r['node']} (before {r.get('consumers', '?')}) costs the most "
                    f"(cosine {r['cosine-similarity']:.5f}); int16 keeps its range with finer steps: "
                    f"qir emit calibrated_model.onnx -o partial.onnx --int16 {r['node']}")
    for name, entry in (results.get("distribution") or {}).items():
        share = entry.get("clipped_fraction")
        if share is not None and share > 1e-3:
            tips.append(f"{name} clips {100 * share:.2g}% of its input (threshold {entry['threshold']:.4g}, max |x| "
                        f"{entry['input']['abs_max']:.4g}): its threshold is too small; recalibrate it (qir calibrate "
                        f"--method max or percentile) or give it a fixed threshold (qir set-mode --nodes {name} "
                        f"--threshold {entry['input']['abs_max']:.4g}).")
    for name, entry in (results.get("channelwise") or {}).items():
        if entry.get("outlier_channels"):
            tips.append(f"{name} has outlier channels {entry['outlier_channels'][:8]} (max |x| over 4x the median "
                        "channel): per-tensor quantization wastes range there; prefer int16 for it, or rebalance "
                        "the channels before quantizing.")
    acc = results.get("acc_error") or {}
    curves = acc.get("curves", {})
    w, a = curves.get("only_weight_calibrated"), curves.get("only_activation_calibrated")
    if w and a and acc.get("metric") == "cosine-similarity":
        last = lambda c: next((v for v in reversed(c) if v is not None), None)  # noqa: E731
        lw, la = last(w), last(a)
        if lw is not None and la is not None:
            worse = "weights" if lw < la else "activations"
            tips.append(f"At the output, quantizing only the weights gives cosine {lw:.5f} and only the activations "
                        f"{la:.5f}: the {worse} cost more.")
    return tips
