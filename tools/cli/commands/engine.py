"""``qir evaluate``: many model variants (calibration-node mode changes) at once, with the engine."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from qir.errors import InputError, OutputError
from qir.tools.cli.options import (
    CALIBRATED_MODEL_HELP,
    SAMPLES_HELP,
    add_cluster,
    add_data_num,
    add_force,
    add_level,
    add_runtime,
    nonnegative_int,
    on_cluster,
    outputs,
    positive_float,
    positive_int,
    resolve_level,
)

ORDER = 30


def _variant_rows(metrics: list[str], ranked: list) -> list[list]:
    """variants.csv: rank, variant and each metric, worst first."""
    return [["rank", "variant", *metrics]] + [[rank, name, *(f"{values[m]:.9g}" for m in metrics)]
                                              for rank, (name, values) in enumerate(ranked, 1)]


def cmd_evaluate(args: argparse.Namespace) -> int:
    with on_cluster(args, "output"):
        return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> int:
    import qir
    from qir.runtimes.engine import Engine, load_variants, one_at_a_time
    from qir.runtimes.engine.results import RESULTS_FILE

    execution = resolve_level(args)
    runtime, level, march = execution.runtime, execution.level, execution.march
    out = Path(args.output)
    # --resume continues the results file of that run (the engine checks it is the same analysis)
    # and rewrites its summaries: the one exception to the rule of Outputs
    files = outputs(args, out).plan(RESULTS_FILE, "variants.csv", "engine_stats.json", replace=args.resume)
    try:
        files.check()
    except OutputError as exc:
        hint = "; or pass --resume to continue that run" if (out / RESULTS_FILE).exists() else ""
        raise OutputError(f"{exc}{hint}") from None
    ir = qir.load(args.model)
    if not ir.calibrations():
        raise InputError(f"{args.model} has no calibration nodes; calibrate it first (qir calibrate)")
    mode = args.mode or ("int8" if args.reference == "float" else "float")
    variants = load_variants(args.variants) if args.variants else one_at_a_time(ir, mode, args.each)
    if not variants:
        raise InputError(f"no variants: {args.model} has no {args.each} calibration nodes")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    with Engine(ir, args.data, runtime=runtime, reference=args.reference, baseline=args.baseline,
                compare=args.compare, metrics=metrics, data_num=args.data_num, threads=args.threads,
                batch=args.batch, memory_budget=int(args.memory_budget * 2**20), progress=not args.quiet,
                level=level, march=march) as engine:
        result = engine.evaluate(variants, out, resume=args.resume, force=args.force)
    ranked = result.ranked()
    files.write_csv("variants.csv", _variant_rows(result.metrics, ranked))
    files.write_text("engine_stats.json", json.dumps(result.stats.to_json(), indent=2, sort_keys=True) + "\n")
    width = max([len("variant"), *(len(n) for n, _ in ranked[: args.top])])
    print(f"{'variant':<{width}}  " + "  ".join(f"{m:>17}" for m in result.metrics))
    for name, values in ranked[: args.top]:
        print(f"{name:<{width}}  " + "  ".join(f"{values[m]:>17.9g}" for m in result.metrics))
    st = result.stats
    print(f"{len(variants)} variant(s) x {len(engine.samples)} sample(s){execution.describe()} in {st.seconds:.2f} s "
          f"(peak RSS {st.peak_rss_bytes / 2**20:.0f} MB); worst first, all in {out / 'variants.csv'}")
    return 0


def add_commands(sub) -> None:
    """``evaluate``."""
    p = sub.add_parser("evaluate", help="evaluate model variants (calibration-node mode changes) with the engine")
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("data", help=SAMPLES_HELP)
    p.add_argument("-o", "--output", required=True, help="folder for engine_results.jsonl, variants.csv, engine_stats.json")
    p.add_argument("--variants", help="JSON file {name: {calibration node: change}}, a change being a mode (int16), "
                   "a mode and fixed threshold (int8@2.5) or a threshold in the node's own mode (@2.5) "
                   "(default: one node at a time)")
    p.add_argument("--each", choices=["activation", "weight", "all"], default="activation",
                   help="without --variants: which calibration nodes get a variant each")
    p.add_argument("--mode", choices=["int8", "int16", "fp16", "float"],
                   help="without --variants: the mode each variant sets (default int8 from float, float from quantized)")
    p.add_argument("--reference", choices=["float", "quantized"], default="float",
                   help="what variants change: the float model or the quantized one")
    p.add_argument("--baseline", choices=["float", "reference"], default="float", help="what results are compared with")
    p.add_argument("--compare", nargs="+", help="values to compare (default: the model outputs)")
    p.add_argument("--metrics", default="cosine-similarity", help="comma-separated; the first ranks")
    add_runtime(p)
    add_level(p, ("fakequant", "integer"))
    add_data_num(p, default=None, help="use at most N samples")
    p.add_argument("--threads", type=positive_int, help="cores to use (default: all)")
    p.add_argument("--memory-budget", type=positive_float, default=2048,
                   help="MB of cached reference values (default 2048)")
    p.add_argument("--batch", type=positive_int,
                   help="most variants per onnxruntime call (default: from the model's activation sizes)")
    p.add_argument("--top", type=nonnegative_int, default=20, help="rows to print")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in the same folder")
    add_force(p, help="overwrite the results of an earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cluster(p)
    p.set_defaults(func=cmd_evaluate)
