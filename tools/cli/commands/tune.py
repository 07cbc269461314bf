"""``qir tune``: from an accuracy target to the cheapest verified int8/int16/fp16 configuration of a
march (:mod:`qir.tools.tune`, the ``tune`` pass)."""
from __future__ import annotations

import argparse

from qir.passes.tune.space import DEFAULT_PRICE, PRICES
from qir.passes.tune.transforms import DEFAULT_TRANSFORMS
from qir.tools.cli.options import NODE_DATA_HELP, add_force, add_input_shape, add_march, positive_int

ORDER = 45  # after the debugger commands: the repair step

#: The exit code when the target is not reached, or verification disagrees with the search.
EXIT_NOT_REACHED = 3


def parse_transforms(text: str) -> list[str]:
    """``--transforms``: pipeline spellings (``smooth,bias-correct{mode=empirical}``), one per transform."""
    from qir.errors import InputError
    from qir.passes import parse_pipeline
    from qir.passes.tune.transforms import KNOWN_TRANSFORMS

    steps = parse_pipeline(text)
    unknown = [name for name, _ in steps if name not in KNOWN_TRANSFORMS]
    if unknown:
        raise InputError(f"--transforms: unknown transform {unknown[0]!r}; choose from {', '.join(KNOWN_TRANSFORMS)} "
                         "(comma-separated, options in braces: bias-correct{mode=empirical}), or 'none'")
    return [name + ("{" + ",".join(f"{k}={v}" for k, v in opts.items()) + "}" if opts else "") for name, opts in steps]


def _samples(text: str) -> int | str:
    """``--sensitivity-samples``: a positive number, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number or auto, got {text!r}") from None


def cmd_tune(args: argparse.Namespace) -> int:
    from qir.tools.cli.options import parse_input_shapes, resolve_shapes
    from qir.tools.reports.tune import outcome
    from qir.tools.tune import tune

    shapes = resolve_shapes(args.model, parse_input_shapes(args.input_shape), args.data)
    report = tune(args.model, args.data, args.eval, args.target, march=args.march, allow_float="float" in args.allow,
                  method=args.method, save_dir=args.save_dir, overwrite=args.force, resume=args.resume,
                  input_shapes=shapes, eval_num=args.data_num, threads=args.threads,
                  sensitivity_samples=args.sensitivity_samples,
                  integer=args.integer, check_data=args.check, latency_table=args.latency_table,
                  transforms=None if args.transforms.strip().lower() == "none" else parse_transforms(args.transforms),
                  price=args.price,
                  progress=not args.quiet)
    ms = report.time_ms
    print(outcome(report))
    print(f"{report.raised} unit(s) raised of {report.searchable_units}; calibration nodes per mode: "
          + ", ".join(f"{k} {v}" for k, v in report.calibration_modes.items())
          + f"; estimated time {ms['final']:.3f} ms (all-int8 {ms['all_int8']:.3f}, all-int16 {ms['all_int16']:.3f}), "
          f"FLOP-weighted cost x{report.final.flop_cost_vs_start:.3f} of the start; {report.seconds} s")
    print(f"wrote {args.save_dir}/tune_report.txt (and .json, .html), tuned_model.onnx, tuned_model_qdq.onnx, "
          "reproduce/commands.sh")
    verified = report.verification is None or report.verification.agrees
    return 0 if report.reached and verified else EXIT_NOT_REACHED


def add_commands(sub) -> None:
    """``tune``."""
    p = sub.add_parser("tune", help="find the cheapest int8/int16/fp16 configuration that meets an accuracy target, "
                                    "verified (exit code 3 when the target is not reached)")
    p.add_argument("model", help="a float .onnx model (calibrated first, with DATA) or a calibrated one")
    p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, .npz or .npy (clipping fixes are looked "
                                "for there; a float model is calibrated on it)")
    p.add_argument("--eval", required=True, help="evaluation data, where the target must be met (the mean over its "
                                                 "samples): DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("--target", required=True,
                   help="the accuracy target against the float model: METRIC>=VALUE or METRIC<=VALUE, e.g. "
                        "'cosine>=0.99' or 'mse<=1e-3'; add ',worst>=V' for a floor every sample must reach: "
                        "'cosine>=0.99,worst>=0.98'; add '@VALUE[,VALUE]' to score only those model outputs or "
                        "activations (a detector's class scores: 'cosine>=0.99@/model.22/Sigmoid_output_0')")
    add_march(p, help="the march whose mixed-precision pipeline and dtype rules to follow")
    p.add_argument("-o", "--output", "-s", "--save-dir", dest="save_dir", required=True,
                   help="the output folder: tuned model, emitted QDQ model, tune_report.txt/.json/.html, "
                        f"reproduce/commands.sh; {NODE_DATA_HELP}")
    p.add_argument("--allow", action="append", choices=["float"], default=[],
                   help="also allow float32 (the op on the CPU) as the last resort")
    p.add_argument("--method", choices=["max", "percentile", "kl", "mse", "mix"], default="max",
                   help="calibration method for a float model (default max)")
    p.add_argument("--percentile", type=float, default=99.99, help="for --method percentile")
    p.add_argument("-d", "--data-num", type=positive_int, help="use at most N evaluation samples")
    p.add_argument("--sensitivity-samples", type=_samples,
                   help="rank the quantizers on this many of the evaluation samples the upper bound scores worst "
                        "(default: all of them; auto: the 4 worst, then all of them unless the quantizers the search "
                        "needs are a settled set on those 4)")
    p.add_argument("--threads", type=positive_int, help="cores to use (default: all)")
    p.add_argument("--no-integer", dest="integer", action="store_false",
                   help="skip running the result at the march's integer level (what the NPU computes; by default it "
                        "must meet the target there too)")
    p.add_argument("--check", metavar="DATA", help="samples the search never sees (not the evaluation data): the "
                                                  "result is run on them too and the report says whether it holds there")
    p.add_argument("--transforms", default=",".join(DEFAULT_TRANSFORMS), metavar="NAMES",
                   help="repair transforms tried before any precision is raised, each alone, then the helpful ones "
                        "together; the best is kept when it beats the model as given on the evaluation data "
                        "(comma-separated, options in braces; 'none' to skip; default: %(default)s)")
    p.add_argument("--price", choices=list(PRICES), default=DEFAULT_PRICE,
                   help="what the search minimises: the FLOP-weighted cost (the tuning guide's proxy), or the latency "
                        "model's estimated time (bytes and fusions; on PP-OCRv4 det its result missed a floor at the "
                        "integer level); the report gives both (default: %(default)s)")
    p.add_argument("--latency-table", metavar="FILE",
                   help="measured per-op times (CSV: op name or type, input precision, weight precision, time) that "
                        "replace the latency model's estimate where they match (see qir profile --cost)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in the same folder")
    add_input_shape(p)
    add_force(p)
    p.add_argument("--quiet", action="store_true", help="no progress")
    p.set_defaults(func=cmd_tune)
