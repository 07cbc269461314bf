"""The ``qir`` command line. Every command is a thin layer over the Python API.

Errors the user can fix (bad paths, corrupt files, unsupported ops, data that does not fit the
model) print one line ``qir: error: ...`` and exit with code 2; ``--debug`` shows tracebacks.
Output files are never overwritten unless ``--force`` is given.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from qir.errors import InputError, QirError
from qir.tools.progress import run_samples

__all__ = ["main", "build_parser"]

logger = logging.getLogger("qir.cli")

EXIT_USER_ERROR = 2


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too, with the usage first
        self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"qir: error: {message}\n")


def parse_input_shapes(items: Sequence[str] | None) -> dict[str, list[int]] | list[int] | None:
    """``["x=1,3,224,224", ...]`` → ``{"x": [1,3,224,224]}``; a lone ``1,3,224,224`` → list."""
    if not items:
        return None
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, _, dims = item.rpartition("=")
        try:
            shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise InputError(f"cannot read input shape {item!r}; write NAME=1,3,224,224") from None
        if not name:
            if len(items) > 1:
                raise InputError("with several --input-shape options each needs NAME=dims")
            return shape
        shapes[name] = shape
    return shapes


def _resolve_shapes(model: str, given, data: str | None = None) -> dict[str, list[int]] | None:
    """Input shapes to import with: as given, else (for dynamic inputs) from the first sample."""
    from qir.data import load_samples
    from qir.io.onnx_proto import read_onnx

    if given is None and data is None:
        return None
    proto = read_onnx(model)
    inits = {i.name for i in proto.graph.initializer}
    inputs = [i for i in proto.graph.input if i.name not in inits]
    if isinstance(given, list):
        if len(inputs) != 1:
            raise InputError(f"the model has {len(inputs)} inputs; write --input-shape NAME=dims")
        return {inputs[0].name: given}
    if given or data is None:
        return given
    dynamic = [i.name for i in inputs
               if any(not d.HasField("dim_value") or d.dim_value <= 0
                      for d in i.type.tensor_type.shape.dim)]
    if not dynamic:
        return None
    samples = load_samples(data, [i.name for i in inputs],
                           {i.name: len(i.type.tensor_type.shape.dim) for i in inputs})
    if not len(samples):
        raise InputError(f"{data} holds no samples")
    first = samples[0]
    shapes = {n: list(np.shape(first[n])) for n in dynamic}
    logger.info("fixing dynamic input shapes from the data: %s", shapes)
    return shapes


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _check_writable(path: Path, force: bool) -> Path:
    if path.exists() and not force:
        raise InputError(f"{path} already exists; choose another path or pass --force to overwrite")
    if not path.parent.exists():
        raise InputError(f"the folder {path.parent} does not exist")
    return path


# ---------------------------------------------------------------------------------- dump
def cmd_dump(args: argparse.Namespace) -> int:
    import qir
    from qir.dot import render

    ir = qir.load(args.model, input_shapes=_resolve_shapes(args.model, parse_input_shapes(args.input_shape)))
    fmt = args.format
    if fmt == "text":
        text = str(ir)
    elif fmt == "json":
        text = json.dumps(ir.to_json(), indent=1, allow_nan=False) + "\n"
    else:
        text = ir.to_dot()
    if fmt in ("svg", "png"):
        if not args.output:
            raise InputError(f"--format {fmt} needs -o PATH")
        out = _check_writable(Path(args.output), args.force)
        render(text, out, fmt)
        print(f"wrote {out}")
        return 0
    if args.output:
        out = _check_writable(Path(args.output), args.force)
        out.write_text(text)
        print(f"wrote {out}")
    else:
        sys.stdout.write(text)
    return 0


# ---------------------------------------------------------------------------------- run
def _stats_table(results: list[dict[str, np.ndarray]]) -> str:
    rows = [("output", "shape", "dtype", "min", "max", "mean", "std")]
    for name in results[0]:
        arrays = [np.asarray(r[name]) for r in results]
        shapes = {a.shape for a in arrays}
        shape = "x".join(map(str, arrays[0].shape)) or "scalar" if len(shapes) == 1 else "varies"
        f = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float64)
        stats = [f"{v:.6g}" for v in (f.min(), f.max(), f.mean(), f.std())] if f.size else ["-"] * 4
        rows.append((name, shape, arrays[0].dtype.name, *stats))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_run(args: argparse.Namespace) -> int:
    import qir
    from qir.data import load_samples, save_outputs

    out = None
    if args.output:
        path = Path(args.output)
        out = _check_writable(path if path.suffix == ".npz" else path.with_name(path.name + ".npz"), args.force)
    # shapes stay as the model declares them unless given: samples may differ in size
    shapes = _resolve_shapes(args.model, parse_input_shapes(args.input_shape))
    ir = qir.load(args.model, input_shapes=shapes)
    ranks = {n: (len(ir.value(n).shape) if ir.value(n).shape is not None else None) for n in ir.inputs}
    samples = load_samples(args.data, ir.inputs, ranks)
    if args.limit is not None:
        samples = samples[: args.limit]
    if not len(samples):
        raise InputError(f"{args.data} holds no samples")
    start = time.perf_counter()
    results = run_samples(ir, samples, args.runtime, desc=f"{args.runtime}")
    elapsed = time.perf_counter() - start
    print(f"{ir.name}: {len(samples)} sample(s) on the {args.runtime} runtime in {elapsed:.2f}s")
    print(_stats_table(results))
    if out:
        save_outputs(out, results)
        print(f"wrote {out} (entries '<output>/<sample index>')")
    return 0


# ---------------------------------------------------------------------------------- demo
def cmd_demo(args: argparse.Namespace) -> int:
    from qir.tools.demo import run_demo

    out = Path(args.output) if args.output else None
    if out is not None and out.exists() and any(out.iterdir()) and not args.force:
        raise InputError(f"{out} exists and is not empty; choose another folder or pass --force")
    return run_demo(out, runtimes=["numpy", "ort"] if args.runtime == "both" else [args.runtime])


# ---------------------------------------------------------------------------------- passes
def _pipeline_ir(args: argparse.Namespace, pipeline, context: dict) -> int:
    """Load MODEL, run ``pipeline`` (a string or passes) and save the model to ``args.output``."""
    import qir
    from qir.passes import PassManager

    out = _check_writable(Path(args.output), args.force)
    shapes = _resolve_shapes(args.model, parse_input_shapes(getattr(args, "input_shape", None)),
                             context.get("data"))
    ir = qir.load(args.model, input_shapes=shapes)
    start = time.perf_counter()
    result = PassManager(pipeline, context=context, dump_dir=getattr(args, "dump_dir", None)).run(ir)
    for name, rep in result.report["passes"].items():
        details = ", ".join(f"{k}={_short(v)}" for k, v in rep.items() if k not in ("modified", "seconds"))
        print(f"  {name:<20} {'modified ' if rep['modified'] else 'unchanged'} {rep['seconds']:7.2f}s  {details}")
    qir.save(ir, out)
    print(f"{ir!r}\nwrote {out} in {time.perf_counter() - start:.1f}s")
    return 0


def _short(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {len(v) if isinstance(v, (list, dict)) else v}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return f"[{len(value)}]"
    return str(value)


def cmd_pipeline(args: argparse.Namespace) -> int:
    context = {"data": args.data, "march": args.march} if args.data else {"march": args.march}
    return _pipeline_ir(args, args.pipeline, context)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from qir.passes.model_check import check_model, write_report

    pipeline = (f"fold-bn,fuse{{march={args.march}}},insert-calibration{{march={args.march}}},"
                f"calibrate{{method={args.method},percentile={args.percentile}}}")
    code = _pipeline_ir(args, pipeline, {"data": args.data})
    folder = Path(args.output).parent
    if (folder / "model_check_result.txt").exists() and not args.force:
        print(f"model check skipped: {folder / 'model_check_result.txt'} exists (--force rewrites it)")
        return code
    report = check_model(args.output, march=args.march)
    write_report(report, folder)
    issues = len(report["unfused"]) + len(report["shared"]) + len(report["unusual"])
    print(f"model check: {issues} finding(s); {folder / 'model_check_result.txt'}")
    return code


def cmd_check(args: argparse.Namespace) -> int:
    from qir.passes.model_check import check_model, format_report

    report = check_model(args.model, march=args.march, save_dir=args.save_dir)
    sys.stdout.write(format_report(report))
    if args.save_dir:
        print(f"wrote model_check_result.txt and .json to {args.save_dir}")
    return 0


def cmd_set_mode(args: argparse.Namespace) -> int:
    from qir.passes import get_pass

    set_mode = get_pass("set-mode", mode=args.mode, nodes=args.nodes, op_types=args.op_types,
                        role=args.role, from_file=args.from_file, threshold=args.threshold,
                        sensitive=args.sensitive, top_k=args.top_k, ratio=args.ratio)
    args.input_shape = None
    return _pipeline_ir(args, [set_mode], {})


def cmd_emit(args: argparse.Namespace) -> int:
    import qir
    from qir.passes.emit import emit_model

    out = _check_writable(Path(args.output), args.force)
    ir = qir.load(args.model)
    if not ir.calibrations():
        raise InputError(f"{args.model} has no calibration nodes; calibrate it first (qir calibrate)")
    report = emit_model(ir, out, int16=args.int16 or (), float=args.float or (), fp16=args.fp16 or (),
                        overwrite=True)
    modes = ", ".join(f"{k}: {v}" for k, v in report.get("modes", {}).items())
    print(f"wrote {out} (opset {report.get('opset')}; calibration nodes by mode: {modes})")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    import csv

    import qir
    from qir.runtimes.engine import Engine, load_variants, one_at_a_time

    out = Path(args.output)
    ir = qir.load(args.model)
    if not ir.calibrations():
        raise InputError(f"{args.model} has no calibration nodes; calibrate it first (qir calibrate)")
    mode = args.mode or ("int8" if args.reference == "float" else "float")
    variants = load_variants(args.variants) if args.variants else one_at_a_time(ir, mode, args.each)
    if not variants:
        raise InputError(f"no variants: {args.model} has no {args.each} calibration nodes")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    engine = Engine(ir, args.data, runtime=args.runtime, reference=args.reference, baseline=args.baseline,
                    compare=args.compare, metrics=metrics, data_num=args.data_num, threads=args.threads,
                    batch=args.batch, memory_budget=int(args.memory_budget * 2**20), progress=not args.quiet)
    try:
        result = engine.evaluate(variants, out, resume=args.resume, force=args.force)
    finally:
        engine.close()
    ranked = result.ranked()
    with open(out / "variants.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["rank", "variant", *result.metrics])
        for rank, (name, values) in enumerate(ranked, 1):
            writer.writerow([rank, name, *(f"{values[m]:.9g}" for m in result.metrics)])
    (out / "engine_stats.json").write_text(json.dumps(result.stats, indent=2, sort_keys=True) + "\n")
    width = max([len("variant"), *(len(n) for n, _ in ranked[: args.top])])
    print(f"{'variant':<{width}}  " + "  ".join(f"{m:>17}" for m in result.metrics))
    for name, values in ranked[: args.top]:
        print(f"{name:<{width}}  " + "  ".join(f"{values[m]:>17.9g}" for m in result.metrics))
    st = result.stats
    print(f"{len(variants)} variant(s) x {len(engine.samples)} sample(s) in {st['seconds']:.2f} s "
          f"(peak RSS {st['peak_rss_bytes'] / 2**20:.0f} MB); worst first, all in {out / 'variants.csv'}")
    return 0


def parse_list(text: str | None) -> list | None:
    """A list option as the hmct CLI writes it: ``"['a','b']"`` (read with ``ast.literal_eval``,
    never evaluated), or ``a,b``."""
    import ast

    if text is None:
        return None
    text = text.strip()
    if text.startswith("["):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise InputError(f"cannot read the list {text!r}; write ['a','b'] or a,b") from None
        if not isinstance(value, list):
            raise InputError(f"{text!r} is not a list")
        return value
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from qir.passes.node_sensitivity import get_sensitivity_of_nodes

    table = get_sensitivity_of_nodes(
        args.model, args.data, metrics=parse_list(args.metrics), output_node=args.output_node,
        node_type=args.node_type, data_num=args.data_num, verbose=args.table,
        interested_nodes=parse_list(args.interested_nodes), start=getattr(args, "from"),
        runtime=args.runtime, save_dir=args.save_dir, progress=True)
    if not args.table:
        first = parse_list(args.metrics)[0]
        for node, values in list(table.items())[:10]:
            print(f"{node}  {first}={values[first]:.6g}")
    print(f"{len(table)} node(s); results in {args.save_dir}")
    return 0


def cmd_acc_error(args: argparse.Namespace) -> int:
    from qir.passes.acc_error import plot_acc_error

    curves = plot_acc_error(args.data, args.model, quantize_node=parse_list(args.quantize_node),
                            non_quantize_node=parse_list(args.non_quantize_node), metric=args.metric,
                            average_mode=args.average_mode, save_dir=args.save_dir, data_num=args.data_num,
                            runtime=args.runtime)
    for name, curve in curves.items():
        points = [y for y in curve if y is not None]
        last = f"{points[-1]:.6g}" if points else "-"
        print(f"{name}: {args.metric} at the last node {last}")
    print(f"wrote acc_error_{args.metric}.png, acc_error.csv and acc_error.json to {args.save_dir}")
    return 0


def cmd_distribution(args: argparse.Namespace) -> int:
    from qir.passes.distribution import plot_distribution

    nodes = plot_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                              data_num=args.data_num, runtime=args.runtime)
    for name, entry in nodes.items():
        print(f"{name} ({entry['type']}): {entry['png']}")
    return 0


def cmd_channelwise(args: argparse.Namespace) -> int:
    from qir.passes.channelwise import get_channelwise_data_distribution

    nodes = get_channelwise_data_distribution(args.save_dir, args.model, args.data, parse_list(args.nodes_list),
                                              args.axis, data_num=args.data_num, runtime=args.runtime)
    for name, entry in nodes.items():
        bad = entry["outlier_channels"]
        print(f"{name}: {entry['channels']} channels on axis {entry['axis']}, outlier channels: "
              f"{bad[:10] if bad else 'none'} ({entry['png']})")
    return 0


def cmd_sensitivity_analysis(args: argparse.Namespace) -> int:
    from qir.passes.sensitivity_analysis import sensitivity_analysis

    result = sensitivity_analysis(args.model, args.data, metric=args.metric, pick_threshold=args.pick_threshold,
                                  data_num=args.data_num, sensitive_nodes=parse_list(args.sensitive_nodes),
                                  qtype=args.qtype, save_dir=args.save_dir, runtime=args.runtime)
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
           sensitive_nodes=parse_list(args.sensitive_nodes), runtime=args.runtime)
    return 0


def cmd_import_torch(args: argparse.Namespace) -> int:
    import qir
    from qir.io.torch_import import _torch, from_torch, load_factory
    from qir.runtimes.torch_check import check_against_torch

    out = _check_writable(Path(args.output), args.force)
    torch = _torch()
    module = load_factory(args.module)
    shapes = parse_input_shapes(args.example_shape)
    if shapes is None:
        raise InputError("give --example-shape (e.g. 1,3,224,224, or NAME=1,3,224,224 per input)")
    generator = torch.Generator().manual_seed(0)
    if isinstance(shapes, list):
        example = (torch.rand(*shapes, generator=generator),)
    else:
        example = {name: torch.rand(*shape, generator=generator) for name, shape in shapes.items()}
    ir = from_torch(module, example, opset=args.opset)
    qir.save(ir, out)
    named = sum(1 for op in ir.ops() if op.module)
    print(f"wrote {out}: {ir!r}; {named} of {len(ir.ops())} ops carry their module path")
    for name, calls in ir.meta["torch_call_warnings"].items():
        print(f"  module {name} ran {calls} time(s) in one forward pass")
    if args.check:
        diffs = check_against_torch(ir, module, example, runtime="ort")
        worst = max(diffs.values())
        print("agreement with torch (max |diff| / max |torch|): "
              + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
        if worst > 1e-4:
            raise InputError(f"the imported model differs from torch by {worst:.2e} (relative) > 1e-4")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from qir.passes.profiler import profile_model

    rows = profile_model(args.model, args.data, args.save_dir, data_num=args.data_num,
                         prefixes=parse_list(args.prefixes), types=parse_list(args.types),
                         histograms=args.histograms, tensorboard=args.tensorboard, runtime=args.runtime)
    ops = len({r["op"] for r in rows})
    print(f"{len(rows)} tensor(s) of {ops} op(s): {Path(args.save_dir) / 'statistic.txt'}"
          + (f" and histograms/ ({ops} PNG)" if args.histograms else "")
          + (f"; tensorboard --logdir {Path(args.save_dir) / 'tensorboard'}" if args.tensorboard else ""))
    return 0


def cmd_bad_case(args: argparse.Namespace) -> int:
    from qir.passes.bad_case import find_bad_cases, write_report

    report = find_bad_cases(args.model, args.analysis, args.data, num_steps=args.num_steps, metric=args.metric,
                            runtime=args.runtime)
    write_report(report, args.output)
    worst = report["worst_output"][args.metric]
    print(f"{report['samples']} sample(s): by {args.metric}, the bad case is sample {worst['index']} "
          f"(output {worst['output']}); tables in {Path(args.output) / 'badcase.txt'}")
    return 0


def _same_file(a: str, b: str) -> bool:
    """Both arguments name one model: compare it float against itself quantized."""
    return Path(a).resolve() == Path(b).resolve()


def cmd_compare(args: argparse.Namespace) -> int:
    from qir.tools.compare import compare

    analysis = None if _same_file(args.baseline, args.analysis) else args.analysis
    summary = compare(args.baseline, analysis, args.data, args.output, num_steps=args.num_steps, metric=args.metric,
                      prefixes=parse_list(args.prefixes) or (), types=parse_list(args.types) or (),
                      sensitivity=not args.no_sensitivity, runtime=args.runtime, replay_discrete=not args.no_replay)
    out = Path(args.output)
    print(f"bad case: sample {summary['bad_case_index']} ({out / 'badcase.txt'})")
    advice = summary.get("advisor", [])
    print(f"{summary['layers']} layers compared ({out / 'compare_per_layer_out.txt'}); "
          f"{len(advice)} finding(s) in {out / 'abnormal_layer_advisor.txt'}")
    for f in advice[:8]:
        print(f"  [{f['kind']}] {f['layer']}: {f['detail']}")
    for name, rows in summary.get("sensitivity", {}).items():
        top = ", ".join(f"{r['op_name']} ({r['sensitive_type']})" for r in rows[:5])
        print(f"most sensitive for {name}: {top}  ({out / 'sensitive_ops.txt'})")
    return 0


def cmd_numeric_suite(args: argparse.Namespace) -> int:
    import qir
    from qir.data import model_samples
    from qir.passes import numeric_suite as ns

    quantized = qir.load(args.quantized)
    float_model = None if _same_file(args.float_model, args.quantized) else qir.load(args.float_model)
    results = {"weights": ns.compare_weights(float_model, quantized)}
    samples = model_samples(quantized, args.data, args.num_steps)
    results["outputs"] = ns.compare_model_outputs(float_model, quantized, *samples, runtime=args.runtime)
    results["stub"] = ns.compare_model_stub(float_model, quantized, None, *samples, runtime=args.runtime)
    ns.write_report(results, args.output)
    for kind, found in results.items():
        worst = ns.summary(found)[:3]
        print(f"{kind}: {len(found)} entries; worst " + ", ".join(f"{r['name']} {r['sqnr_db']:.1f} dB" for r in worst))
    print(f"tables in {Path(args.output) / 'numeric_suite.txt'}")
    return 0


def cmd_profiles(args: argparse.Namespace) -> int:
    from qir.runtimes.profiles import format_profiles

    sys.stdout.write(format_profiles(args.names or None, notes=args.notes))
    return 0


# ---------------------------------------------------------------------------------- main
def _analysis_parser(sub, name: str, aliases: list[str], help: str, save_dir: str,  # noqa: A002
                     save_flags: tuple[str, ...] = ("-s",)) -> argparse.ArgumentParser:
    """A debugger subcommand: MODEL DATA, -d/--data-num, -s/--save-dir and --runtime."""
    p = sub.add_parser(name, aliases=aliases, help=help)
    p.add_argument("model", help="a calibrated .onnx model")
    p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-d", "--data-num", type=_positive_int, default=1, help="samples to use (default 1)")
    p.add_argument(*save_flags, "--save-dir", default=save_dir, help=f"output folder (default {save_dir})")
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="qir", description="Find why a quantized network lost accuracy.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgumentParser)

    shape_help = "fix a dynamic input shape: NAME=1,3,224,224 (repeatable; NAME= optional for one input)"
    p = sub.add_parser("dump", help="print or write the IR of a model")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("--format", choices=["text", "json", "dot", "svg", "png"], default="text")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    p.add_argument("--input-shape", action="append", help=shape_help)
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("run", help="run a model on data and print output statistics")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("data", help="DIR/<input>/<i>.npy folder, an .npz, or an .npy (single input)")
    p.add_argument("--runtime", choices=["numpy", "ort"], default="numpy")
    p.add_argument("-o", "--output", help="save outputs to this .npz ('<output>/<i>' entries)")
    p.add_argument("--input-shape", action="append", help=shape_help)
    p.add_argument("--limit", type=_positive_int, help="use only the first N samples")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("calibrate", help="fold, fuse, insert calibration nodes and calibrate")
    p.add_argument("model", help="a float .onnx model")
    p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-o", "--output", required=True, help="the calibrated model to write (.onnx)")
    p.add_argument("--method", choices=["max", "percentile", "kl", "mse", "mix"], default="max")
    p.add_argument("--percentile", type=float, default=99.99, help="for --method percentile")
    p.add_argument("--march", default="nash-e", help="march profile (see `qir profiles`)")
    p.add_argument("--input-shape", action="append", help=shape_help)
    p.add_argument("--dump-dir", help="write the IR after each pass here")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("pipeline", help="run a pass pipeline, e.g. \"fold-bn,fuse,insert-calibration\"")
    p.add_argument("model", help="an .onnx model (float or calibrated)")
    p.add_argument("pipeline", help="passes separated by commas, options in braces: calibrate{method=kl}")
    p.add_argument("--data", help="data for passes that need it (calibrate)")
    p.add_argument("--march", default="nash-e", help="march for passes that take one")
    p.add_argument("-o", "--output", required=True, help="the model to write (.onnx)")
    p.add_argument("--input-shape", action="append", help=shape_help)
    p.add_argument("--dump-dir", help="write the IR after each pass here (NNN_<pass>.qir.txt)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("set-mode", help="set calibration nodes to int8/int16/fp16/float or a fixed threshold")
    p.add_argument("model", help="a calibrated .onnx model")
    p.add_argument("-o", "--output", required=True, help="the model to write (.onnx)")
    p.add_argument("--mode", choices=["int8", "int16", "fp16", "float"])
    p.add_argument("--nodes", help="comma-separated names or globs (calibration nodes, ops, module paths)")
    p.add_argument("--op-types", help="comma-separated op types, e.g. Conv,MatMul")
    p.add_argument("--role", choices=["weight", "activation"])
    p.add_argument("--from-file", help="a file with one node name per line")
    p.add_argument("--threshold", type=float, help="a fixed threshold (kept by calibration)")
    p.add_argument("--sensitive", help="a sensitive_ops.json (qir compare): take its most sensitive rows")
    p.add_argument("--top-k", type=int, help="with --sensitive: the top K rows of each output's table")
    p.add_argument("--ratio", type=float, help="with --sensitive: the top share (0-1] of each output's table")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_set_mode)

    p = sub.add_parser("emit", help="write a partially-quantized ONNX model (QDQ / fp16 casts / float)")
    p.add_argument("model", help="a calibrated .onnx model")
    p.add_argument("-o", "--output", required=True, help="the ONNX model to write")
    for mode in ("int16", "float", "fp16"):
        p.add_argument(f"--{mode}", help=f"nodes to emit as {mode}: names/globs of calibration nodes, ops or modules")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_emit)

    p = sub.add_parser("evaluate", help="evaluate model variants (calibration-node mode changes) with the engine")
    p.add_argument("model", help="a calibrated .onnx model")
    p.add_argument("data", help="samples: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-o", "--output", required=True, help="folder for engine_results.jsonl, variants.csv, engine_stats.json")
    p.add_argument("--variants", help="JSON file {name: {calibration node: mode}} (default: one node at a time)")
    p.add_argument("--each", choices=["activation", "weight", "all"], default="activation",
                   help="without --variants: which calibration nodes get a variant each")
    p.add_argument("--mode", choices=["int8", "int16", "fp16", "float"],
                   help="without --variants: the mode each variant sets (default int8 from float, float from quantized)")
    p.add_argument("--reference", choices=["float", "quantized"], default="float",
                   help="what variants change: the float model or the quantized one")
    p.add_argument("--baseline", choices=["float", "reference"], default="float", help="what results are compared with")
    p.add_argument("--compare", nargs="+", help="values to compare (default: the model outputs)")
    p.add_argument("--metrics", default="cosine-similarity", help="comma-separated; the first ranks")
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    p.add_argument("--data-num", type=_positive_int, help="use at most N samples")
    p.add_argument("--threads", type=_positive_int, help="cores to use (default: all)")
    p.add_argument("--memory-budget", type=float, default=2048, help="MB of cached reference values (default 2048)")
    p.add_argument("--batch", type=_positive_int,
                   help="most variants per onnxruntime call (default: from the model's activation sizes)")
    p.add_argument("--top", type=int, default=20, help="rows to print")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in the same folder")
    p.add_argument("--force", action="store_true", help="overwrite the results of an earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_evaluate)

    for command, aliases in (("sensitivity", ["get-sensitivity-of-nodes"]),):
        p = _analysis_parser(sub, command, aliases, "per-node quantization sensitivity (hmct "
                             "get_sensitivity_of_nodes)", "./debug_result/node_sensitivity")
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

    p = _analysis_parser(sub, "acc-error", ["plot-acc-error"], "accumulated-error curves along the graph "
                         "(hmct plot_acc_error)", "./debug_result/accumulate_error")
    p.add_argument("-q", "--quantize-node", help="only these quantized, one curve each: \"['Conv_2','Conv_90']\", "
                   "nested lists for groups, or 'weight'/'activation'")
    p.add_argument("-nq", "--non-quantize-node", help="these back to float in the quantized model, one curve each")
    p.add_argument("-m", "--metric", default="cosine-similarity")
    p.add_argument("-a", "--average-mode", nargs="?", const=True, default=False, type=parse_bool,
                   help="plot the running mean (-a or -a True)")
    p.set_defaults(func=cmd_acc_error)

    p = _analysis_parser(sub, "distribution", ["plot-distribution"], "data distributions at nodes "
                         "(hmct plot_distribution)", "./debug_result/data_distribution")
    p.add_argument("-n", "--nodes-list", required=True,
                   help="calibration and/or general nodes: \"['relu1_out_calib','conv2']\" or a,b")
    p.set_defaults(func=cmd_distribution)

    p = _analysis_parser(sub, "channelwise", ["get-channelwise-data-distribution"], "per-channel box plots of "
                         "calibration node inputs (hmct get_channelwise_data_distribution)",
                         "./debug_result/channelwise_distribution")
    p.add_argument("-n", "--nodes-list", required=True, help="calibration nodes: \"['relu1_out_calib']\" or a,b")
    p.add_argument("-a", "--axis", type=int, help="channel axis (default: 1 for activations, the node's axis for weights)")
    p.set_defaults(func=cmd_channelwise)

    p = _analysis_parser(sub, "sensitivity-analysis", [], "recovery as the most sensitive nodes are raised "
                         "(hmct sensitivity_analysis)", "./debug_result/sensitivity_analysis", ("-s", "-sd"))
    p.add_argument("-m", "--metric", default="cosine-similarity")
    p.add_argument("-p", "--pick-threshold", type=float, default=0.999,
                   help="nodes whose sensitivity is no better than this are analysed (default 0.999)")
    p.add_argument("-sn", "--sensitive-nodes", help="analyse these nodes, in this order: \"['Conv_2','Conv_9']\"")
    p.add_argument("-q", "--qtype", choices=["float", "float32", "int16", "fp16"], default="float",
                   help="what the sensitive nodes are raised to (default float: not quantized)")
    p.set_defaults(func=cmd_sensitivity_analysis)

    p = sub.add_parser("runall", help="every debugger analysis and one index.html (hmct runall)")
    p.add_argument("model", help="a calibrated .onnx model")
    p.add_argument("data", help="calibration data: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-s", "--save-dir", default="./debug_result/")
    p.add_argument("-nm", "--ns-metrics", default="cosine-similarity", help="node sensitivity metric(s)")
    p.add_argument("-o", "--output-node", help="compare this node's output instead of the model outputs")
    p.add_argument("-nt", "--node-type", help="node sensitivity types (default: ['weight','activation'])")
    p.add_argument("-dn", "--data-num", type=_positive_int, default=1, help="samples to use (default 1)")
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
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    p.set_defaults(func=cmd_runall)

    p = sub.add_parser("import-torch", help="a PyTorch module (FILE.py:FACTORY) as an ONNX model with module paths")
    p.add_argument("module", help="FILE.py:FACTORY: a function (or class) returning the nn.Module, or a module object")
    p.add_argument("--example-shape", action="append", help="input shape, e.g. 1,3,224,224 (NAME=... per input)")
    p.add_argument("-o", "--output", required=True, help="the ONNX model to write")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--check", action="store_true", help="compare with torch on the example (fails above 1e-4)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    p.set_defaults(func=cmd_import_torch)

    p = sub.add_parser("check", aliases=["check-model"],
                       help="unfused patterns, shared weights/modules, per-op calibration config, unusual configs")
    p.add_argument("model", help="an .onnx model (float, calibrated or QDQ)")
    p.add_argument("--march", default="nash-e", help="march profile (see `qir profiles`)")
    p.add_argument("-s", "--save-dir", help="write model_check_result.txt and .json here")
    p.set_defaults(func=cmd_check)

    p = _analysis_parser(sub, "profile", ["model-profiler"], "per-op statistics of inputs, weights, biases and "
                         "outputs (horizon ModelProfiler)", "./debug_result/profiler")
    p.add_argument("-p", "--prefixes", help="only ops whose names start with these: \"['backbone','head']\" or a,b")
    p.add_argument("-t", "--types", help="only these op types: Conv,Gemm")
    p.add_argument("--histograms", action="store_true", help="also one PNG of histograms per op")
    p.add_argument("--tensorboard", action="store_true",
                   help="also the histograms as a TensorBoard event file (needs: pip install tensorboard)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("bad-case", help="the input where the quantized model strays furthest (auto_find_bad_case)")
    p.add_argument("model", help="the baseline model; alone, it is compared float vs calibrated")
    p.add_argument("data", help="samples: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("--analysis", help="a second model to compare with the baseline (same inputs and outputs)")
    p.add_argument("-n", "--num-steps", type=_positive_int, help="use at most N samples")
    p.add_argument("-m", "--metric", default="L1", choices=["Cosine", "MSE", "L1", "KL", "SQNR", "ATOL"],
                   help="the metric that picks the bad case (default L1)")
    p.add_argument("-o", "--output", default="./qir_quant_analysis", help="folder for badcase.txt/.json/.npz")
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    p.set_defaults(func=cmd_bad_case)

    p = sub.add_parser("compare", help="QuantAnalysis: bad case, layer-by-layer table with advisor, op sensitivity")
    p.add_argument("baseline", help="the baseline model (float, or a calibrated model you trust)")
    p.add_argument("analysis", help="the model to analyse (calibrated or QDQ); the baseline's own file again "
                                    "compares it float vs fake-quantized")
    p.add_argument("data", help="samples: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-o", "--output", default="./qir_quant_analysis", help="output folder")
    p.add_argument("-n", "--num-steps", type=_positive_int, help="search the bad case in at most N samples")
    p.add_argument("-m", "--metric", default="L1", type=str.upper,
                   choices=["COSINE", "MSE", "L1", "KL", "SQNR", "ATOL"], help="bad case and sensitivity metric")
    p.add_argument("--prefixes", help="compare only layers whose name or module path starts with these")
    p.add_argument("--types", help="compare only layers of these op types, e.g. Conv,Add")
    p.add_argument("--no-sensitivity", action="store_true", help="skip the op sensitivity table")
    p.add_argument("--no-replay", action="store_true",
                   help="do not replay the baseline's TopK/ArgMax/NonZero/NMS indices in the analysis model")
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("numeric-suite", help="Numeric Suite: weight, layer-output and shadow (stub) SQNR")
    p.add_argument("float_model", help="the float model (the quantized model's own file: it runs in float)")
    p.add_argument("quantized", help="the calibrated or QDQ model")
    p.add_argument("data", help="samples: DIR/<input>/<i>.npy, .npz or .npy")
    p.add_argument("-o", "--output", default="./qir_numeric_suite", help="folder for numeric_suite.txt/.json")
    p.add_argument("-n", "--num-steps", type=_positive_int, default=4, help="samples to run (default 4)")
    p.add_argument("--runtime", choices=["ort", "numpy"], default="ort")
    p.set_defaults(func=cmd_numeric_suite)

    p = sub.add_parser("profiles", help="show the march profiles and which parameters are assumed")
    p.add_argument("names", nargs="*", help="profiles to show (default: all)")
    p.add_argument("--notes", action="store_true", help="show where each parameter comes from")
    p.set_defaults(func=cmd_profiles)

    p = sub.add_parser("demo", help="run qir on the bundled digits example")
    p.add_argument("-o", "--output", help="folder for the demo's files (dumps, outputs)")
    p.add_argument("--runtime", choices=["numpy", "ort", "both"], default="both")
    p.add_argument("--force", action="store_true", help="write into a non-empty folder")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except QirError as exc:
        if args.debug:
            raise
        print(f"qir: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):
            sys.stderr.close()
            return 0
        if args.debug:
            raise
        print(f"qir: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("qir: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `qir dump model.onnx | head`: the reader is gone, not an error
        sys.stderr.close()
        return 0
    except Exception as exc:  # a bug in qir: say so in one line, traceback on --debug
        if args.debug:
            raise
        print(f"qir: internal error: {type(exc).__name__}: {exc} (rerun with --debug for the "
              "traceback, and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
