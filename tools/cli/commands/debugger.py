"""The hmct debugger commands: ``sensitivity``, ``acc-error``, ``distribution``, ``channelwise``,
``sensitivity-analysis`` and ``runall`` (each also under its hmct name, e.g. ``get-sensitivity-of-nodes``).
Each calls its facade in ``qir.tools.hmct`` (``runall``: ``qir.tools.runall``) and prints a summary."""
from __future__ import annotations

import argparse

from qir.tools.cli.options import (
    CALIBRATED_MODEL_HELP,
    CALIBRATION_DATA_HELP,
    add_analysis_command,
    add_data_num,
    add_force,
    add_runtime,
    parse_bool,
    parse_list,
)

ORDER = 40


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from qir.tools.hmct import get_sensitivity_of_nodes

    table = get_sensitivity_of_nodes(
        args.model, args.data, metrics=parse_list(args.metrics), output_node=args.output_node,
        node_type=args.node_type, data_num=args.data_num, verbose=args.table,
        interested_nodes=parse_list(args.interested_nodes), start=getattr(args, "from"),
        runtime=args.runtime, save_dir=args.save_dir, progress=True, overwrite=args.force)
    if not args.table:
        first = parse_list(args.metrics)[0]
        for node, values in list(table.items())[:10]:
            print(f"{node}  {first}={values[first]:.6g}")
    print(f"{len(table)} node(s); results in {args.save_dir}")
    return 0


def cmd_acc_error(args: argparse.Namespace) -> int:
    from qir.tools.hmct import plot_acc_error

    curves = plot_acc_error(args.data, args.model, quantize_node=parse_list(args.quantize_node),
                            non_quantize_node=parse_list(args.non_quantize_node), metric=args.metric,
                            average_mode=args.average_mode, save_dir=args.save_dir, data_num=args.data_num,
                            runtime=args.runtime, overwrite=args.force)
    for name, curve in curves.items():
        points = [y for y in curve if y is not None]
        last = f"{points[-1]:.6g}" if points else "-"
        print(f"{name}: {args.metric} at the last node {last}")
    print(f"wrote acc_error_{args.metric}.png, acc_error.csv and acc_error.json to {args.save_dir}")
    return 0


def cmd_distribution(args: argparse.Namespace) -> int:
    from qir.tools.hmct import plot_distribution

    nodes = plot_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                              data_num=args.data_num, runtime=args.runtime, overwrite=args.force)
    for name, entry in nodes.items():
        print(f"{name} ({entry['type']}): {entry['png']}")
    return 0


def cmd_channelwise(args: argparse.Namespace) -> int:
    from qir.tools.hmct import get_channelwise_data_distribution

    nodes = get_channelwise_data_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                                              args.axis, data_num=args.data_num, runtime=args.runtime,
                                              overwrite=args.force)
    for name, entry in nodes.items():
        bad = entry["outlier_channels"]
        print(f"{name}: {entry['channels']} channels on axis {entry['axis']}, outlier channels: "
              f"{bad[:10] if bad else 'none'} ({entry['png']})")
    return 0


def cmd_sensitivity_analysis(args: argparse.Namespace) -> int:
    from qir.tools.hmct import sensitivity_analysis

    result = sensitivity_analysis(args.model, args.data, metric=args.metric, pick_threshold=args.pick_threshold,
                                  data_num=args.data_num, sensitive_nodes=parse_list(args.sensitive_nodes),
                                  qtype=args.qtype, save_dir=args.save_dir, runtime=args.runtime, overwrite=args.force)
    if not result:
        print(f"no node is below pick_threshold {args.pick_threshold}; nothing to analyse")
    for node, values in result.items():
        print(f"{node}: only it quantized {values['single']:.6g}; raised together with those above "
              f"{values['cumulative']:.6g}")
    print(f"wrote partial_quantization.png, sensitivity_analysis.csv and .json to {args.save_dir}")
    return 0


def cmd_runall(args: argparse.Namespace) -> int:
    from qir.tools.runall import runall

    runall(args.model, args.data, save_dir=args.save_dir, ns_metrics=parse_list(args.ns_metrics),
           output_node=args.output_node, node_type=parse_list(args.node_type), data_num=args.data_num,
           verbose=args.table, interested_nodes=parse_list(args.interested_nodes),
           dis_nodes_list=parse_list(args.dis_nodes_list), cw_nodes_list=parse_list(args.cw_nodes_list),
           axis=args.axis, quantize_node=parse_list(args.quantize_node),
           non_quantize_node=parse_list(args.non_quantize_node), ae_metric=args.ae_metric,
           average_mode=args.average_mode, pick_threshold=args.pick_threshold,
           sensitive_nodes=parse_list(args.sensitive_nodes), runtime=args.runtime, overwrite=args.force)
    return 0


def _add_sensitivity(sub) -> None:
    p = add_analysis_command(sub, "sensitivity", ["get-sensitivity-of-nodes"], "per-node quantization sensitivity "
                             "(hmct get_sensitivity_of_nodes)", "./debug_result/node_sensitivity")
    p.add_argument("-m", "--metrics", default="cosine-similarity",
                   help="metric or list, e.g. \"['cosine-similarity','mse']\" or cosine-similarity,mse (the first ranks)")
    p.add_argument("-o", "--output-node", help="compare this node's output instead of the model outputs")
    p.add_argument("-n", "--node-type", choices=["node", "weight", "activation"], default="node")
    p.add_argument("-v", "--verbose", dest="table", nargs="?", const=True, default=False, type=parse_bool,
                   help="print the table (-v or -v True)")
    p.add_argument("-i", "--interested-nodes", help="only these nodes, e.g. \"['Conv_2','Conv_90']\"")
    p.add_argument("--from", choices=["float", "quantized"], default="float",
                   help="float: only this node quantized (hmct); quantized: only this node back to float")
    p.set_defaults(func=cmd_sensitivity)


def _add_acc_error(sub) -> None:
    p = add_analysis_command(sub, "acc-error", ["plot-acc-error"], "accumulated-error curves along the graph "
                             "(hmct plot_acc_error)", "./debug_result/accumulate_error")
    p.add_argument("-q", "--quantize-node", help="only these quantized, one curve each: \"['Conv_2','Conv_90']\", "
                   "nested lists for groups, or 'weight'/'activation'")
    p.add_argument("-nq", "--non-quantize-node", help="these back to float in the quantized model, one curve each")
    p.add_argument("-m", "--metric", default="cosine-similarity")
    p.add_argument("-a", "--average-mode", nargs="?", const=True, default=False, type=parse_bool,
                   help="plot the running mean (-a or -a True)")
    p.set_defaults(func=cmd_acc_error)


def _add_distribution(sub) -> None:
    p = add_analysis_command(sub, "distribution", ["plot-distribution"], "data distributions at nodes "
                             "(hmct plot_distribution)", "./debug_result/data_distribution")
    p.add_argument("-n", "--nodes-list", required=True,
                   help="calibration and/or general nodes: \"['relu1_out_calib','conv2']\" or a,b")
    p.set_defaults(func=cmd_distribution)


def _add_channelwise(sub) -> None:
    p = add_analysis_command(sub, "channelwise", ["get-channelwise-data-distribution"], "per-channel box plots of "
                             "calibration node inputs (hmct get_channelwise_data_distribution)",
                             "./debug_result/channelwise_distribution")
    p.add_argument("-n", "--nodes-list", required=True, help="calibration nodes: \"['relu1_out_calib']\" or a,b")
    p.add_argument("-a", "--axis", type=int, help="channel axis (default: 1 for activations, the node's axis for weights)")
    p.set_defaults(func=cmd_channelwise)


def _add_sensitivity_analysis(sub) -> None:
    p = add_analysis_command(sub, "sensitivity-analysis", [], "recovery as the most sensitive nodes are raised "
                             "(hmct sensitivity_analysis)", "./debug_result/sensitivity_analysis", ("-s", "-sd"))
    p.add_argument("-m", "--metric", default="cosine-similarity")
    p.add_argument("-p", "--pick-threshold", type=float, default=0.999,
                   help="nodes whose sensitivity is no better than this are analysed (default 0.999)")
    p.add_argument("-sn", "--sensitive-nodes", help="analyse these nodes, in this order: \"['Conv_2','Conv_9']\"")
    p.add_argument("-q", "--qtype", choices=["float", "float32", "int16", "fp16"], default="float",
                   help="what the sensitive nodes are raised to (default float: not quantized)")
    p.set_defaults(func=cmd_sensitivity_analysis)


def _add_runall(sub) -> None:
    p = sub.add_parser("runall", help="every debugger analysis and one index.html (hmct runall)")
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("data", help=CALIBRATION_DATA_HELP)
    p.add_argument("-s", "--save-dir", default="./debug_result/")
    p.add_argument("-nm", "--ns-metrics", default="cosine-similarity", help="node sensitivity metric(s)")
    p.add_argument("-o", "--output-node", help="compare this node's output instead of the model outputs")
    p.add_argument("-nt", "--node-type", help="node sensitivity types (default: ['weight','activation'])")
    add_data_num(p, "-dn")
    p.add_argument("-v", "--verbose", dest="table", nargs="?", const=True, default=False, type=parse_bool)
    p.add_argument("-i", "--interested-nodes")
    p.add_argument("-dnl", "--dis-nodes-list", help="nodes for data distributions (default: top 5 per type)")
    p.add_argument("-cn", "--cw-nodes-list", help="calibration nodes for box plots (default: the same)")
    p.add_argument("-a", "--axis", type=int)
    p.add_argument("-qn", "--quantize-node", help="accumulated error whitelist (default ['weight','activation'])")
    p.add_argument("-nqn", "--non-quantize-node")
    p.add_argument("-am", "--ae-metric", default="cosine-similarity")
    p.add_argument("-avm", "--average-mode", nargs="?", const=True, default=False, type=parse_bool)
    p.add_argument("-pt", "--pick-threshold", type=float, default=0.999)
    p.add_argument("-sn", "--sensitive-nodes")
    add_runtime(p)
    add_force(p)
    p.set_defaults(func=cmd_runall)


def add_commands(sub) -> None:
    """The six debugger commands, with their hmct aliases."""
    _add_sensitivity(sub)
    _add_acc_error(sub)
    _add_distribution(sub)
    _add_channelwise(sub)
    _add_sensitivity_analysis(sub)
    _add_runall(sub)
