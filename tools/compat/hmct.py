"""hmct's debugger functions, under hmct's names and signatures: ``get_sensitivity_of_nodes``,
``plot_acc_error``, ``plot_distribution``, ``get_channelwise_data_distribution`` and
``sensitivity_analysis``.

Each is a facade, one rule for all: read the model, check the files it will write (none may
exist unless ``overwrite=True``: :class:`~qir.tools.reports.output.Outputs`), build the analysis
pass (``qir.passes.<analysis>``), run it, write its files with the writer of
``qir.tools.reports.<analysis>``, print where hmct prints (``verbose``), and return what hmct
returns. The passes compute; only this layer writes and prints. hmct's positional signatures are
kept; ``overwrite`` and qir's other options are keywords. What hmct returns are dicts keyed by
node (or variant): those are translated here from qir's typed reports (``report.to_json()``) and
are the compatibility surface, not qir's own types.
"""
from __future__ import annotations

from pathlib import Path

from qir.api import as_ir
from qir.execution import Level, Runtime
from qir.json_dump import JsonValue
from qir.passes.acc_error import AccErrorPass
from qir.passes.channelwise import ChannelwisePass
from qir.passes.distribution import DistributionPass
from qir.passes.node_sensitivity import NodeSensitivityPass
from qir.passes.sensitivity_analysis import SensitivityAnalysisPass
from qir.tools.reports import acc_error, channelwise, distribution, node_sensitivity
from qir.tools.reports import sensitivity_analysis as sensitivity_report
from qir.tools.reports.output import as_outputs

__all__ = ["get_sensitivity_of_nodes", "plot_acc_error", "plot_distribution", "get_channelwise_data_distribution",
           "sensitivity_analysis"]


def get_sensitivity_of_nodes(model_or_file, calibrated_data, metrics="cosine-similarity", output_node=None,
                             node_type="node", data_num=1, verbose=False, interested_nodes=None, *,
                             start="float", runtime=None, save_dir=None, threads=None, progress=True,
                             overwrite=False, level=Level.FAKEQUANT, march=None,
                             settle: int = 1) -> dict[str, dict[str, float]]:
    """hmct's ``get_sensitivity_of_nodes``: ``{node: {metric: value}}`` worst first; prints the
    table when ``verbose``; writes ``node_sensitivity.{txt,csv,json}`` to ``save_dir``. ``runtime``:
    ``ort`` by default, ``numpy`` at ``level="integer"`` (with ``march``: as that NPU computes it).
    ``data_num="auto"``: samples in rounds, worst first, until the top ``settle`` rows are settled;
    the line saying how many were used and why it stopped is printed first."""
    ir = as_ir(model_or_file, calibrated=True)
    if save_dir is not None:
        save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*node_sensitivity.files()).check()
    report = NodeSensitivityPass(calibrated_data, metrics, output_node=output_node, node_type=node_type,
                                 data_num=data_num, interested_nodes=interested_nodes, start=start, runtime=runtime,
                                 threads=threads, progress=progress, level=level, march=march,
                                 settle=settle).analyse(ir)
    if report.sampling is not None:
        print(report.sampling.line("node sensitivity"))
    if verbose:
        print(node_sensitivity.format_table(report), end="")
    if save_dir is not None:
        node_sensitivity.write_report(report, save_dir)
    return {r["node"]: {m: r[m] for m in report.metrics} for r in report.rows}


def plot_acc_error(calibrated_data, model_or_file, quantize_node=None, non_quantize_node=None,
                   metric: str = "cosine-similarity", average_mode: bool = False,
                   save_dir: str | Path = "./debug_result/", *, data_num: int | None = 1, runtime: str = Runtime.ORT,
                   threads: int | None = None, progress: bool = True,
                   overwrite: bool = False) -> dict[str, list[float | None]]:
    """hmct's ``plot_acc_error``: writes the plot and numbers to ``save_dir`` and returns
    ``{variant: curve}``."""
    ir = as_ir(model_or_file, calibrated=True)
    save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*acc_error.files(metric)).check()
    report = AccErrorPass(calibrated_data, quantize_node, non_quantize_node=non_quantize_node, metric=metric,
                          average_mode=average_mode, data_num=data_num, runtime=runtime, threads=threads,
                          progress=progress)(ir).report
    acc_error.write_report(report, save_dir)
    return report.curves


def plot_distribution(save_dir, model_or_file, calibrated_data, nodes_list, *, data_num: int | None = 1,
                      runtime: str = Runtime.ORT, overwrite: bool = False) -> dict[str, dict[str, JsonValue]]:
    """hmct's ``plot_distribution``: one PNG per node in ``save_dir``; returns the statistics."""
    ir = as_ir(model_or_file)
    save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*distribution.files(_names(nodes_list))).check()
    result = DistributionPass(calibrated_data, nodes_list, data_num=data_num, runtime=runtime)(ir)
    return distribution.write_report(result, save_dir).to_json()["nodes"]


def get_channelwise_data_distribution(save_dir, model_or_file, calibrated_data, nodes_list, axis=None, *,
                                      data_num: int | None = 1, runtime: str = Runtime.ORT,
                                      overwrite: bool = False) -> dict[str, dict[str, JsonValue]]:
    """hmct's ``get_channelwise_data_distribution``: box plots in ``save_dir``; returns the
    per-node channel statistics and outlier channels (of calibration nodes: the model must be calibrated)."""
    ir = as_ir(model_or_file, calibrated=True)
    save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*channelwise.files(_names(nodes_list))).check()
    result = ChannelwisePass(calibrated_data, nodes_list, axis=axis, data_num=data_num, outlier_ratio=4.0,
                             runtime=runtime)(ir)
    return channelwise.write_report(result, save_dir).to_json()["nodes"]


def sensitivity_analysis(model_or_file, calibrated_data, metric="cosine-similarity", pick_threshold=0.999,
                         data_num=1, sensitive_nodes=None, qtype="float", save_dir="./debug_result/", *,
                         runtime=Runtime.ORT, threads=None, progress=True,
                         overwrite=False) -> dict[str, dict[str, float]]:
    """hmct's ``sensitivity_analysis``: writes the chart and numbers to ``save_dir`` and returns
    ``{node: {"single": value, "cumulative": value}}`` in order."""
    ir = as_ir(model_or_file, calibrated=True)
    save_dir = as_outputs(save_dir, overwrite=overwrite).plan(*sensitivity_report.FILES).check()
    report = SensitivityAnalysisPass(calibrated_data, metric, pick_threshold=pick_threshold, data_num=data_num,
                                     sensitive_nodes=sensitive_nodes, qtype=qtype, runtime=runtime, threads=threads,
                                     progress=progress)(ir).report
    sensitivity_report.write_report(report, save_dir)
    return {n: {"single": report.single[n], "cumulative": report.cumulative[k + 1]} for k, n in enumerate(report.nodes)}


def _names(nodes_list) -> list[str]:
    """A node list as the passes read it: one name, or a list of names."""
    return [nodes_list] if isinstance(nodes_list, str) else list(nodes_list or [])
