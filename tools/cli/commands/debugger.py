"""The hmct debugger commands: ``sensitivity``, ``acc-error``, ``distribution``, ``channelwise``,
``sensitivity-analysis`` and ``runall``; the first four also under their hmct names (e.g.
``get-sensitivity-of-nodes``), which take hmct's own flags (see :mod:`qir.tools.cli.options`).
Each calls its facade in ``qir.tools.compat.hmct`` (``runall``: ``qir.tools.runall``) and prints a summary."""
from __future__ import annotations

import argparse

from qir.tools.cli.options import (
    CALIBRATED_MODEL_HELP,
    CALIBRATION_DATA_HELP,
    NODE_DATA_HELP,
    add_analysis_command,
    add_cluster,
    add_data_num,
    add_force,
    add_level,
    add_runtime,
    finite_float,
    on_cluster,
    parse_bool,
    parse_list,
    positive_float,
    positive_int,
    resolve_level,
    seed_flag,
)

ORDER = 40

TIME_BUDGET = 120.0  # seconds runall's analyses aim at when -dn is not given


def cmd_sensitivity(args: argparse.Namespace) -> int:
    with on_cluster(args, "save_dir"):
        return _sensitivity(args)


def _sensitivity(args: argparse.Namespace) -> int:
    from qir.tools.compat.hmct import get_sensitivity_of_nodes

    execution = resolve_level(args)
    runtime, level, march = execution.runtime, execution.level, execution.march
    table = get_sensitivity_of_nodes(
        args.model, args.data, metrics=parse_list(args.metrics), output_node=args.output_node,
        node_type=args.node_type, data_num="auto" if args.samples == "auto" else args.data_num, verbose=args.table,
        interested_nodes=parse_list(args.interested_nodes), start=getattr(args, "from"),
        runtime=runtime, save_dir=args.save_dir, progress=True, overwrite=args.force, level=level, march=march,
        settle=args.settle)
    if not args.table:
        first = parse_list(args.metrics)[0]
        for node, values in list(table.items())[:10]:
            print(f"{node}  {first}={values[first]:.6g}")
    print(f"{len(table)} node(s){execution.describe()}; results in {args.save_dir}")
    return 0


def cmd_acc_error(args: argparse.Namespace) -> int:
    from qir.tools.compat.hmct import plot_acc_error

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
    from qir.tools.compat.hmct import plot_distribution

    nodes = plot_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                              data_num=args.data_num, runtime=args.runtime, overwrite=args.force)
    for name, entry in nodes.items():
        print(f"{name} ({entry['type']}): {entry['png']}")
    return 0


def cmd_channelwise(args: argparse.Namespace) -> int:
    from qir.tools.compat.hmct import get_channelwise_data_distribution

    nodes = get_channelwise_data_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                                              args.axis, data_num=args.data_num, runtime=args.runtime,
                                              overwrite=args.force)
    for name, entry in nodes.items():
        bad = entry["outlier_channels"]
        print(f"{name}: {entry['channels']} channels on axis {entry['axis']}, outlier channels: "
              f"{bad[:10] if bad else 'none'} ({entry['png']})")
    return 0


def cmd_sensitivity_analysis(args: argparse.Namespace) -> int:
    from qir.tools.compat.hmct import sensitivity_analysis

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
    with on_cluster(args, "save_dir"):
        return _runall(args)


def _runall(args: argparse.Namespace) -> int:
    from qir.tools.runall import runall

    runall(args.model, args.data, save_dir=args.save_dir, ns_metrics=parse_list(args.ns_metrics),
           output_node=args.output_node, node_type=parse_list(args.node_type), data_num=args.data_num,
           verbose=args.table, interested_nodes=parse_list(args.interested_nodes),
           dis_nodes_list=parse_list(args.dis_nodes_list), cw_nodes_list=parse_list(args.cw_nodes_list),
           axis=args.axis, quantize_node=parse_list(args.quantize_node),
           non_quantize_node=parse_list(args.non_quantize_node), ae_metric=args.ae_metric,
           average_mode=args.average_mode, pick_threshold=args.pick_threshold,
           sensitive_nodes=parse_list(args.sensitive_nodes), runtime=args.runtime, overwrite=args.force,
           time_budget=args.time_budget, resume=args.resume)
    return 0


# Each analysis is built twice: under qir's name, whose short flags mean what they mean in every qir
# command (seed_flag drops hmct's others to their long form), and under hmct's name, unlisted in
# `qir --help`, with hmct's own flags (-o the output node, -n the node type, ...).
_QIR_OUTPUT = ("-o", "--output", "-s")  # qir's names: -o/--output is the output folder too


def _debugger_command(sub, name: str, hmct_name: str, what: str, save_dir: str, hmct: bool):
    """The parser of one analysis: under ``hmct_name`` (unlisted) or under qir's ``name``."""
    if hmct:
        return add_analysis_command(sub, hmct_name, [], f"{what}: `qir {name}` with hmct's flags", save_dir,
                                    listed=False)
    return add_analysis_command(sub, name, [], f"{what} (hmct {hmct_name.replace('-', '_')}; with hmct's flags: "
                                f"qir {hmct_name})", save_dir, _QIR_OUTPUT)


def _add_sensitivity(sub, hmct: bool) -> None:
    p = _debugger_command(sub, "sensitivity", "get-sensitivity-of-nodes", "per-node quantization sensitivity",
                          "./debug_result/node_sensitivity", hmct)
    p.add_argument("-m", "--metrics", default="cosine-similarity",
                   help="metric or list, e.g. \"['cosine-similarity','mse']\" or cosine-similarity,mse (the first ranks)")
    p.add_argument(*seed_flag(hmct, "-o", "--output-node"), help="compare this node's output instead of the model outputs")
    p.add_argument(*seed_flag(hmct, "-n", "--node-type"), choices=["node", "weight", "activation"], default="node",
                   help="rank general nodes (each with its calibration nodes), or only weight or activation "
                        "calibration nodes (default node)")
    p.add_argument("-v", "--verbose", dest="table", nargs="?", const=True, default=False, type=parse_bool,
                   help="print the table (-v or -v True)")
    p.add_argument("-i", "--interested-nodes", help="only these nodes, e.g. \"['Conv_2','Conv_90']\"")
    p.add_argument("--from", choices=["float", "quantized"], default="float",
                   help="float: only this node quantized (hmct); quantized: only this node back to float")
    p.add_argument("--samples", choices=["auto"], help="auto: samples in rounds, worst first, until the top --settle "
                   "rows are the same set in 95%% of bootstrap resamples, or every sample is used (-d is then ignored)")
    p.add_argument("--settle", type=positive_int, default=1, metavar="K",
                   help="with --samples auto: the top K rows to settle (default 1: which node is the cause)")
    add_level(p, ("fakequant", "integer"))
    add_cluster(p, hmct)
    p.set_defaults(func=cmd_sensitivity)


def _add_acc_error(sub, hmct: bool) -> None:
    p = _debugger_command(sub, "acc-error", "plot-acc-error", "accumulated-error curves along the graph",
                          "./debug_result/accumulate_error", hmct)
    p.add_argument("-q", "--quantize-node", help="only these quantized, one curve each: \"['Conv_2','Conv_90']\", "
                   "nested lists for groups, or 'weight'/'activation'")
    p.add_argument("-nq", "--non-quantize-node", help="these back to float in the quantized model, one curve each")
    p.add_argument("-m", "--metric", default="cosine-similarity",
                   help="cosine-similarity, mse, mre, sqnr or chebyshev (default cosine-similarity)")
    p.add_argument(*seed_flag(hmct, "-a", "--average-mode"), nargs="?", const=True, default=False, type=parse_bool,
                   help="plot the running mean (--average-mode, or with a value: True/False)")
    p.set_defaults(func=cmd_acc_error)


def _add_distribution(sub, hmct: bool) -> None:
    p = _debugger_command(sub, "distribution", "plot-distribution", "data distributions at nodes",
                          "./debug_result/data_distribution", hmct)
    p.add_argument(*seed_flag(hmct, "-n", "--nodes-list"), required=True,
                   help="calibration and/or general nodes: \"['relu1_out_calib','conv2']\" or a,b")
    p.set_defaults(func=cmd_distribution)


def _add_channelwise(sub, hmct: bool) -> None:
    p = _debugger_command(sub, "channelwise", "get-channelwise-data-distribution", "per-channel box plots of "
                          "calibration node inputs", "./debug_result/channelwise_distribution", hmct)
    p.add_argument(*seed_flag(hmct, "-n", "--nodes-list"), required=True,
                   help="calibration nodes: \"['relu1_out_calib']\" or a,b")
    p.add_argument("-a", "--axis", type=int, help="channel axis (default: 1 for activations, the node's axis for weights)")
    p.set_defaults(func=cmd_channelwise)


def _add_sensitivity_analysis(sub) -> None:
    p = add_analysis_command(sub, "sensitivity-analysis", [], "recovery as the most sensitive nodes are raised "
                             "(hmct sensitivity_analysis, with its flags)", "./debug_result/sensitivity_analysis",
                             ("-s", "-sd"))
    p.add_argument("-m", "--metric", default="cosine-similarity",
                   help="cosine-similarity, mse, mre, sqnr or chebyshev (default cosine-similarity)")
    p.add_argument("-p", "--pick-threshold", type=finite_float, default=0.999,
                   help="nodes whose sensitivity is no better than this are analysed (default 0.999)")
    p.add_argument("-sn", "--sensitive-nodes", help="analyse these nodes, in this order: \"['Conv_2','Conv_9']\"")
    p.add_argument("-q", "--qtype", choices=["float", "float32", "int16", "fp16"], default="float",
                   help="what the sensitive nodes are raised to (default float: not quantized)")
    p.set_defaults(func=cmd_sensitivity_analysis)


def _add_runall(sub) -> None:
    what = ("every debugger analysis and one index.html (hmct runall, with hmct's flags: -s/--save-dir is the output "
            "folder, -o/--output-node the node compared, -dn/--data-num the sample count)")
    p = sub.add_parser("runall", help=what, description=what)
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("data", help=CALIBRATION_DATA_HELP)
    p.add_argument("-s", "--save-dir", default="./debug_result/",
                   help=f"output folder (default ./debug_result/); {NODE_DATA_HELP}")
    p.add_argument("-nm", "--ns-metrics", default="cosine-similarity", help="node sensitivity metric(s)")
    p.add_argument("-o", "--output-node", help="compare this node's output instead of the model outputs")
    p.add_argument("-nt", "--node-type", help="node sensitivity types (default: ['weight','activation'])")
    add_data_num(p, "-dn", default=None, help="samples to analyse (default: all of them, or as many as fit "
                 "--time-budget; hmct's default is 1); the first line printed says how many")
    p.add_argument("--time-budget", type=positive_float, default=TIME_BUDGET, metavar="SECONDS",
                   help=f"without -dn: analyse as many samples as fit about this many seconds (default {TIME_BUDGET:g})")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted run in the same folder: its finished steps are read back, "
                        "its partial files replaced")
    p.add_argument("-v", "--verbose", dest="table", nargs="?", const=True, default=False, type=parse_bool,
                   help="print the node sensitivity table (-v or -v True)")
    p.add_argument("-i", "--interested-nodes", help="node sensitivity of only these nodes")
    p.add_argument("-dnl", "--dis-nodes-list", help="nodes for data distributions (default: top 5 per type)")
    p.add_argument("-cn", "--cw-nodes-list", help="calibration nodes for box plots (default: the same)")
    p.add_argument("-a", "--axis", type=int, help="channel axis of the box plots (default: 1, a weight's own axis)")
    p.add_argument("-qn", "--quantize-node", help="accumulated error whitelist (default ['weight','activation'])")
    p.add_argument("-nqn", "--non-quantize-node", help="accumulated error: these back to float, one curve each")
    p.add_argument("-am", "--ae-metric", default="cosine-similarity", help="accumulated error metric")
    p.add_argument("-avm", "--average-mode", nargs="?", const=True, default=False, type=parse_bool,
                   help="accumulated error: plot the running mean (-avm or -avm True)")
    p.add_argument("-pt", "--pick-threshold", type=finite_float, default=0.999,
                   help="sensitivity analysis: nodes no better than this (default 0.999)")
    p.add_argument("-sn", "--sensitive-nodes", help="sensitivity analysis: these nodes, in this order")
    add_runtime(p)
    add_force(p)
    add_cluster(p, hmct=True)
    p.set_defaults(func=cmd_runall)


def add_commands(sub) -> None:
    """The six debugger commands; four also under their hmct names (with hmct's flags)."""
    for hmct in (False, True):
        _add_sensitivity(sub, hmct)
        _add_acc_error(sub, hmct)
        _add_distribution(sub, hmct)
        _add_channelwise(sub, hmct)
    _add_sensitivity_analysis(sub)
    _add_runall(sub)
