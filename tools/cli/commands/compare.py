"""``qir profile``, ``bad-case``, ``compare`` and ``numeric-suite``: a quantized model against its baseline."""
from __future__ import annotations

import argparse
from pathlib import Path

from qir.errors import InputError
from qir.tools.cli.options import (
    MARCH_HELP,
    NODE_DATA_HELP,
    SAMPLES_HELP,
    add_analysis_command,
    add_cluster,
    add_data_num,
    add_force,
    add_input_shape,
    add_level,
    add_runtime,
    on_cluster,
    outputs,
    parse_input_shapes,
    parse_list,
    resolve_level,
)

ORDER = 70


def _same_file(a: str, b: str) -> bool:
    """Both arguments name one model: compare it float against itself quantized."""
    return Path(a).resolve() == Path(b).resolve()


def cmd_profile(args: argparse.Namespace) -> int:
    from qir.tools.profiler import profile_model

    if args.cost:
        return _cost(args)
    if args.data is None:
        raise InputError("qir profile MODEL DATA needs the data to profile; without data, "
                         "--cost MODEL prints the latency model's estimate")
    given = [flag for flag, value in (("--march", args.march), ("--input-shape", args.input_shape),
                                      ("--latency-table", args.latency_table), ("--totals", args.totals)) if value]
    if given:
        raise InputError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --cost only; add --cost, "
                         "or leave them out")
    rows = profile_model(args.model, args.data, save_dir=args.save_dir, data_num=args.data_num,
                         prefixes=parse_list(args.prefixes), types=parse_list(args.types),
                         histograms=args.histograms, tensorboard=args.tensorboard, runtime=args.runtime,
                         overwrite=args.force)
    ops = len({r["op"] for r in rows})
    print(f"{len(rows)} tensor(s) of {ops} op(s): {Path(args.save_dir) / 'statistic.txt'}"
          + (f" and histograms/ ({ops} PNG)" if args.histograms else "")
          + (f"; tensorboard --logdir {Path(args.save_dir) / 'tensorboard'}" if args.tensorboard else ""))
    return 0


def _cost(args: argparse.Namespace) -> int:
    from qir.tools.cost import model_cost
    from qir.tools.reports.cost import format_cost

    if args.data is not None:
        raise InputError(f"--cost estimates time from the model alone; leave out the data ({args.data})")
    report = model_cost(args.model, args.march or "nash-e", input_shapes=parse_input_shapes(args.input_shape),
                        latency_table=args.latency_table)
    print(format_cost(report, rows=not args.totals), end="")
    return 0


def cmd_bad_case(args: argparse.Namespace) -> int:
    with on_cluster(args, "output"):
        return _bad_case(args)


def _bad_case(args: argparse.Namespace) -> int:
    from qir.passes.bad_case import find_bad_cases
    from qir.tools.reports.bad_case import FILES, write_report

    out = outputs(args, args.output).plan(*FILES).check()
    report = find_bad_cases(args.model, args.analysis, args.data, num_steps=args.data_num, metric=args.metric,
                            runtime=args.runtime)
    write_report(report, out)
    worst = report["worst_output"][args.metric]
    print(f"{report['samples']} sample(s): by {args.metric}, the bad case is sample {worst['index']} "
          f"(output {worst['output']}); tables in {Path(args.output) / 'badcase.txt'}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    with on_cluster(args, "output"):
        return _compare(args)


def _compare(args: argparse.Namespace) -> int:
    from qir.tools.advice import fix_line
    from qir.tools.compat.quant_analysis import compare
    from qir.tools.reports.compare import human_size
    from qir.tools.reports.layer_compare import helping_fixes

    execution = resolve_level(args, march_alone=args.consistency)
    runtime, level, march = execution.runtime, execution.level, execution.march
    analysis = None if _same_file(args.baseline, args.analysis) else args.analysis
    summary = compare(args.baseline, analysis, args.data, args.output, num_steps=args.data_num, metric=args.metric,
                      prefixes=parse_list(args.prefixes) or (), types=parse_list(args.types) or (),
                      sensitivity=not args.no_sensitivity, runtime=runtime, replay_discrete=not args.no_replay,
                      overwrite=args.force, level=level, march=march, consistency=args.consistency,
                      keep_layers=args.layers, values=parse_list(args.values) or ())
    out = Path(args.output)
    for line in summary["headline"]:  # (a collapsed output, then each output worst first)
        print(line)
    print(f"bad case: sample {summary['bad_case_index']}{execution.describe()} ({out / 'badcase.txt'})")
    advice = summary.get("advisor", [])
    print(f"{summary['layers']} layers compared ({out / 'compare_per_layer_out.txt'}); "
          f"{len(advice)} finding(s) in {out / 'abnormal_layer_advisor.txt'}")
    for f in advice[:8]:
        print(f"  [{f['kind']}] {f['layer']}: {f['detail']}")
        if f.get("fix"):
            print(f"      {fix_line(f['fix'], with_command=False)}")
    helping = helping_fixes(advice)
    if helping:
        print("fixes that help, measured on the bad case, best first:")
    for f in helping[:5]:
        print(f"  {fix_line(f['fix'])}  [{f['kind']}] {f['layer']}")
    if "consistency" in summary:
        print(f"fake quantization vs {summary['consistency']['march']}'s integer level on the bad case: output cosine "
              f"{summary['consistency']['output_cosine']:.6f} ({out / 'consistency_result.txt'})")
    for name, rows in summary.get("sensitivity", {}).items():
        top = ", ".join(f"{r['op_name']} ({r['sensitive_type']})" for r in rows[:5])
        print(f"most sensitive for {name}: {top}  ({out / 'sensitive_ops.txt'})")
    values = summary["layer_values"]
    print(f"per-layer values: {out / 'layers'} ({human_size(values['bytes'])})" if values["kept"] else
          f"per-layer values not kept ({human_size(values['bytes'])}; --layers writes them to {out / 'layers'})")
    print(f"report: {summary['index']}")
    return 0


def cmd_numeric_suite(args: argparse.Namespace) -> int:
    import qir
    from qir.data import model_samples
    from qir.passes import numeric_suite as ns
    from qir.tools.reports.numeric_suite import FILES, write_report

    out = outputs(args, args.output).plan(*FILES).check()
    quantized = qir.load(args.quantized)
    float_model = None if _same_file(args.float_model, args.quantized) else qir.load(args.float_model)
    results = {"weights": ns.compare_weights(float_model, quantized)}
    samples = model_samples(quantized, args.data, args.data_num)
    results.update(ns.compare_on_inputs(float_model, quantized, samples, runtime=args.runtime))
    write_report(results, out)
    for kind, found in results.items():
        if kind == "left_out":
            print(f"{len(found)} of {len(samples)} sample(s) left out (NaN or Inf float outputs): {', '.join(found)}")
            continue
        worst = ns.summary(found)[:3]
        print(f"{kind}: {len(found)} entries; worst " + ", ".join(f"{r['name']} {r['sqnr_db']:.1f} dB" for r in worst))
    print(f"tables in {Path(args.output) / 'numeric_suite.txt'}")
    return 0


def _add_profile(sub) -> None:
    p = add_analysis_command(sub, "profile", ["model-profiler"], "per-op statistics of inputs, weights, biases and "
                             "outputs (horizon ModelProfiler); with --cost MODEL (no data): the latency model's "
                             "time per op on the march", "./debug_result/profiler", ("-o", "--output", "-s"),
                             data_optional=True)
    p.add_argument("-p", "--prefixes", help="only ops whose names start with these: \"['backbone','head']\" or a,b")
    p.add_argument("-t", "--types", help="only these op types: Conv,Gemm")
    p.add_argument("--histograms", action="store_true", help="also one PNG of histograms per op")
    p.add_argument("--tensorboard", action="store_true",
                   help="also the histograms as a TensorBoard event file (needs: pip install tensorboard)")
    cost = p.add_argument_group("latency model (--cost MODEL, no data)")
    cost.add_argument("--cost", action="store_true",
                      help="print the latency model's table instead: per group the march runs as one, FLOPs, bytes, "
                           "compute- or memory-bound, time at int8/int16/fp16 (and the calibrated precisions)")
    cost.add_argument("--march", help=f"{MARCH_HELP} whose peak rates, bandwidth and fusions price the ops "
                                      "(default nash-e)")
    add_input_shape(cost)
    cost.add_argument("--latency-table", metavar="FILE",
                      help="CSV of measured times (op name or type, input precision, weight precision, time_us) that "
                           "override the model for the ops it lists")
    cost.add_argument("--totals", action="store_true", help="print the totals only, not a row per group")
    p.set_defaults(func=cmd_profile)


def _add_bad_case(sub) -> None:
    p = sub.add_parser("bad-case", help="the input where the quantized model strays furthest (auto_find_bad_case)")
    p.add_argument("model", help="the baseline model; alone, it is compared float vs calibrated")
    p.add_argument("data", help=SAMPLES_HELP)
    p.add_argument("--analysis", help="a second model to compare with the baseline (same inputs and outputs)")
    add_data_num(p, default=None, help="use at most N samples", old=("-n", "--num-steps"))
    p.add_argument("-m", "--metric", default="L1", choices=["Cosine", "MSE", "L1", "KL", "SQNR", "ATOL"],
                   help="the metric that picks the bad case (default L1)")
    p.add_argument("-o", "--output", default="./qir_quant_analysis", help="folder for badcase.txt/.json/.npz")
    add_runtime(p)
    add_force(p)
    add_cluster(p)
    p.set_defaults(func=cmd_bad_case)


def _add_compare(sub) -> None:
    p = sub.add_parser("compare", help="QuantAnalysis: bad case, layer-by-layer table with advisor, op sensitivity")
    p.add_argument("baseline", help="the baseline model (float, or a calibrated model you trust)")
    p.add_argument("analysis", help="the model to analyse (calibrated or QDQ); the baseline's own file again "
                                    "compares it float vs fake-quantized")
    p.add_argument("data", help=SAMPLES_HELP)
    p.add_argument("-o", "--output", default="./qir_quant_analysis", help=f"output folder; {NODE_DATA_HELP}")
    add_data_num(p, default=None, help="search the bad case in at most N samples", old=("-n", "--num-steps"))
    p.add_argument("-m", "--metric", default="L1", type=str.upper,
                   choices=["COSINE", "MSE", "L1", "KL", "SQNR", "ATOL"], help="bad case and sensitivity metric")
    p.add_argument("--prefixes", help="compare only layers whose name or module path starts with these")
    p.add_argument("--types", help="compare only layers of these op types, e.g. Conv,Add")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the op sensitivity table")
    p.add_argument("--layers", action="store_true",
                   help="also keep every value of both models on the bad case in layers/ (.npy files; large: about "
                        "119 MB for YOLOv8n at 320x320, 1.38 GB for PP-OCRv4 det at 640x640; the size is printed)")
    p.add_argument("--no-replay", action="store_true",
                   help="do not replay the baseline's TopK/ArgMax/NonZero/NMS indices in the analysis model")
    p.add_argument("--values", metavar="VALUE,...",
                   help="activations to score beside the model outputs, in the bad-case search and the headline: a "
                        "branch the outputs concatenate, e.g. a detector's class scores /model.22/Sigmoid_output_0")
    p.add_argument("--consistency", action="store_true",
                   help="also compare the analysis model's fake quantization with the --march integer level on the "
                        "bad case, value by value (consistency_result.txt/.json)")
    add_runtime(p)
    add_level(p, ("fakequant", "integer"))
    add_force(p)
    add_cluster(p)
    p.set_defaults(func=cmd_compare)


def _add_numeric_suite(sub) -> None:
    p = sub.add_parser("numeric-suite", help="Numeric Suite: weight, layer-output and shadow (stub) SQNR")
    p.add_argument("float_model", help="the float model (the quantized model's own file: it runs in float)")
    p.add_argument("quantized", help="the calibrated or QDQ model")
    p.add_argument("data", help=SAMPLES_HELP)
    p.add_argument("-o", "--output", default="./qir_numeric_suite", help="folder for numeric_suite.txt/.json")
    add_data_num(p, default=4, help="samples to run (default 4)", old=("-n", "--num-steps"))
    add_runtime(p)
    add_force(p)
    p.set_defaults(func=cmd_numeric_suite)


def add_commands(sub) -> None:
    """``profile`` (alias ``model-profiler``), ``bad-case``, ``compare`` and ``numeric-suite``."""
    _add_profile(sub)
    _add_bad_case(sub)
    _add_compare(sub)
    _add_numeric_suite(sub)
