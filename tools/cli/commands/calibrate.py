"""``qir calibrate``, ``pipeline``, ``set-mode`` and ``emit``: run passes over a model and write it."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from qir.errors import InputError
from qir.files import JsonlStore
from qir.tools.cli.options import (
    CALIBRATED_MODEL_HELP,
    CALIBRATION_DATA_HELP,
    add_force,
    add_input_shape,
    add_march,
    outputs,
    parse_input_shapes,
    resolve_shapes,
)

if TYPE_CHECKING:
    from qir.passes import Pass, PipelineContext
    from qir.tools.reports.output import Outputs

ORDER = 20


def run_pipeline(args: argparse.Namespace, pipeline: str | Sequence[Pass], *, data: str | None = None,
                 context: PipelineContext | None = None, out: Outputs | None = None) -> int:
    """Load MODEL, run ``pipeline`` (a user's pipeline string, or pass instances) and save it to
    ``args.output``; ``data`` also fixes dynamic input shapes, ``context`` fills a string's options.
    The model, the IR dumps (``--dump-dir``) and the files of ``emit{path=...}`` steps are planned
    on ``out`` (a command's outputs with more files planned, or new ones) and checked first."""
    import qir
    from qir.data import model_samples
    from qir.passes import PassManager
    from qir.tools.emit import plan_reports, write_reports

    out = out if out is not None else outputs(args)
    manager = PassManager(pipeline, context=context, dump_dir=getattr(args, "dump_dir", None), write=out.write_text)
    plan_reports(manager.passes, out.plan(args.output, *manager.dump_files())).check()
    shapes = resolve_shapes(args.model, parse_input_shapes(getattr(args, "input_shape", None)), data)
    ir = qir.load(args.model, input_shapes=shapes)
    if data is not None:
        model_samples(ir, data)  # missing or unfitting data is an error before the first dump is written
    start = time.perf_counter()
    result = manager.run(ir)
    write_reports(result.report["passes"].values(), outputs=out)  # emit{path=...} steps
    for name, rep in result.report["passes"].items():
        details = ", ".join(f"{k}={_short(v)}" for k, v in rep.items() if k not in ("modified", "seconds"))
        print(f"  {name:<20} {'modified ' if rep['modified'] else 'unchanged'} {rep['seconds']:7.2f}s  {details}")
    path = out.write(args.output, lambda tmp: qir.save(ir, tmp))
    print(f"{ir!r}\nwrote {path} in {time.perf_counter() - start:.1f}s")
    return 0


def _short(value) -> str:
    """A pass report value in a few characters: lists and dicts by their sizes, a protobuf
    message (the ``emit`` pass's model) by its type and size."""
    if hasattr(value, "SerializeToString") and hasattr(value, "ByteSize"):
        return f"<{type(value).__name__}, {value.ByteSize()} bytes>"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {len(v) if isinstance(v, (list, dict)) else v}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return f"[{len(value)}]"
    return str(value)


#: The repair transforms ``--fixes`` takes, in the order they run: smooth and equalize on the float
#: model (before insert-calibration), round-weights and bias-correct on the calibrated one.
FIXES = ("smooth", "equalize", "round-weights", "bias-correct")
AFTER_CALIBRATE = ("round-weights", "bias-correct")


def parse_fixes(text: str | None) -> dict[str, dict[str, Any]]:
    """``--fixes``: comma-separated names of :data:`FIXES`, each with options in braces as in a
    pipeline (``smooth,bias-correct{mode=empirical}``); an unknown name is an error that lists
    them. Returns ``{name: options}`` in the order the transforms run."""
    from qir.passes import parse_pipeline

    if not text:
        return {}
    steps = dict(parse_pipeline(text))
    unknown = [n for n in steps if n not in FIXES]
    if unknown:
        raise InputError(f"--fixes: unknown transform {unknown[0]!r}; choose from {', '.join(FIXES)} "
                         "(comma-separated, options in braces: bias-correct{mode=empirical})")
    return {n: steps[n] for n in FIXES if n in steps}


class LayerStore(JsonlStore):
    """``round-weights``' per-layer choices in a ``.jsonl`` file (a header line, then one line a
    layer, appended as each is chosen): read back when the file exists, so an interrupted or
    time-bounded run goes on where it stopped. A file that is not such a store is refused."""

    HEADER = {"qir_round_weights_store": 1}

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        if self.path.exists():
            lines = self.path.read_text().splitlines()
            try:
                ours = bool(lines) and json.loads(lines[0]) == self.HEADER
            except json.JSONDecodeError:
                ours = False
            if not ours:
                raise InputError(f"{self.path} exists and is not a round-weights store; move it away or choose "
                                 "another -o")
            self._read(lines[1:])
        else:
            self.path.write_text(json.dumps(self.HEADER) + "\n")


def calibration_passes(data: Any, *, march: str, method: str, percentile: float,
                       fixes: Mapping[str, Mapping[str, Any]] | None = None) -> list[Pass]:
    """The passes ``qir calibrate`` runs, as instances: fold-bn, fuse, the float ``fixes``
    (smooth, equalize), insert-calibration, calibrate, then round-weights and bias-correct if asked for."""
    from qir.passes import get_pass

    fixes = fixes or {}
    made = {n: get_pass(n, **{"data": data, "march": march, **opts}) for n, opts in fixes.items()}
    before = [p for n, p in made.items() if n not in AFTER_CALIBRATE]
    after = [made[n] for n in AFTER_CALIBRATE if n in made]
    return [get_pass("fold-bn"), get_pass("fuse", march=march), *before, get_pass("insert-calibration", march=march),
            get_pass("calibrate", data=data, method=method, percentile=percentile), *after]


def cmd_calibrate(args: argparse.Namespace) -> int:
    from qir.tools.model_check import check_model
    from qir.tools.reports.model_check import files

    folder, names = Path(args.output).parent, files(args.output)  # the model check, beside the model, named after it
    out = outputs(args).plan(*(folder / name for name in names))
    fixes = parse_fixes(args.fixes)
    if "round-weights" in fixes:  # its per-layer choices, kept beside the model: a rerun only computes what is missing
        store = Path(args.output).with_suffix(".round_weights.jsonl")
        out.plan(store, replace=True).check()
        fixes["round-weights"] = {**fixes["round-weights"], "store": LayerStore(store)}
    passes = calibration_passes(args.data, march=args.march, method=args.method, percentile=args.percentile,
                                fixes=fixes)
    code = run_pipeline(args, passes, data=args.data, out=out)
    report = check_model(args.output, march=args.march, save_dir=out.sub(folder), names=names)
    issues = len(report.unfused) + len(report.shared) + len(report.unusual)
    print(f"model check: {issues} finding(s); {folder / names[0]}")
    return code


def cmd_pipeline(args: argparse.Namespace) -> int:
    from qir.passes import PipelineContext

    return run_pipeline(args, args.pipeline, data=args.data, context=PipelineContext(data=args.data, march=args.march))


def cmd_set_mode(args: argparse.Namespace) -> int:
    from qir.passes import get_pass

    set_mode = get_pass("set-mode", mode=args.mode, nodes=args.nodes, op_types=args.op_types,
                        role=args.role, from_file=args.from_file, threshold=args.threshold,
                        sensitive=args.sensitive, top_k=args.top_k, ratio=args.ratio, all=args.all)
    return run_pipeline(args, [set_mode])


def cmd_emit(args: argparse.Namespace) -> int:
    import qir
    from qir.tools.emit import emit_model

    out = outputs(args).plan(args.output).check()
    ir = qir.load(args.model)
    if not ir.calibrations():
        raise InputError(f"{args.model} has no calibration nodes; calibrate it first (qir calibrate)")
    report = emit_model(ir, args.output, int16=args.int16 or (), float=args.float or (), fp16=args.fp16 or (),
                        outputs=out, format=args.format)
    modes = ", ".join(f"{k}: {v}" for k, v in report.modes.items())
    print(f"wrote {report.path} (opset {report.opset}; calibration nodes by mode: {modes})")
    if args.format == "qoperator":
        forms = ", ".join(f"{k} {v}" for k, v in (report.forms or {}).items()) or "none"
        kept = ", ".join(f"{k} {v}" for k, v in (report.kept_qdq or {}).items()) or "none"
        print(f"integer ops written: {forms}; ops reading quantized values left in QDQ form: {kept}")
    return 0


def _add_calibrate(sub) -> None:
    p = sub.add_parser("calibrate", help="fold, fuse, insert calibration nodes and calibrate")
    p.add_argument("model", help="a float .onnx model")
    p.add_argument("data", help=CALIBRATION_DATA_HELP)
    p.add_argument("-o", "--output", required=True, help="the calibrated model to write (.onnx)")
    p.add_argument("--method", choices=["max", "percentile", "kl", "mse", "mix"], default="max",
                   help="how activation thresholds are chosen (default max; see the README's calibration section)")
    p.add_argument("--percentile", type=float, default=99.99, help="for --method percentile")
    p.add_argument("--fixes", metavar="NAMES",
                   help="repair transforms to apply, comma-separated: smooth (move activation outliers into the "
                        "next GEMMs' weights), equalize (cross-layer equalization of Conv pairs), bias-correct "
                        "(remove the output shift quantized weights cause; bias-correct{mode=empirical}: the "
                        "whole mean shift), round-weights (each GEMM's int8 weight rounding chosen by its output "
                        "error: AdaRound with torch, a threshold search without; its per-layer choices are kept in "
                        "OUTPUT's .round_weights.jsonl, which a rerun continues; round-weights{time_budget_s=600}); "
                        "options in braces as in a pipeline; each reports what it changed")
    add_march(p)
    add_input_shape(p)
    p.add_argument("--dump-dir", help="write the IR after each pass here")
    add_force(p)
    p.set_defaults(func=cmd_calibrate)


def _add_pipeline(sub) -> None:
    p = sub.add_parser("pipeline", help="run a pass pipeline, e.g. \"fold-bn,fuse,insert-calibration\"")
    p.add_argument("model", help="an .onnx model (float or calibrated)")
    p.add_argument("pipeline", help="passes separated by commas, options in braces: calibrate{method=kl}")
    p.add_argument("--data", help="data for passes that need it (calibrate)")
    add_march(p, help="march for passes that take one")
    p.add_argument("-o", "--output", required=True, help="the model to write (.onnx)")
    add_input_shape(p)
    p.add_argument("--dump-dir", help="write the IR after each pass here (NNN_<pass>.qir.txt)")
    add_force(p)
    p.set_defaults(func=cmd_pipeline)


def _add_set_mode(sub) -> None:
    p = sub.add_parser("set-mode", help="set calibration nodes to int8/int16/fp16/float or a fixed threshold")
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("-o", "--output", required=True, help="the model to write (.onnx)")
    p.add_argument("--mode", choices=["int8", "int16", "fp16", "float"],
                   help="the precision to set (float: not quantized); give --mode, --threshold or both")
    p.add_argument("--nodes", help="comma-separated names or globs (calibration nodes, ops, module paths); "
                                   "each must match something")
    p.add_argument("--op-types", help="comma-separated op types, e.g. Conv,MatMul")
    p.add_argument("--role", choices=["weight", "activation"], help="only weight or only activation calibration nodes")
    p.add_argument("--all", action="store_true", help="every calibration node (instead of a selection)")
    p.add_argument("--from-file", help="a file with one node name per line")
    p.add_argument("--threshold", type=float, help="a fixed threshold (kept by calibration)")
    p.add_argument("--sensitive", help="a sensitive_ops.json (qir compare): take its most sensitive rows")
    p.add_argument("--top-k", type=int, help="with --sensitive: the top K rows of each output's table")
    p.add_argument("--ratio", type=float, help="with --sensitive: the top share (0-1] of each output's table")
    add_force(p)
    p.set_defaults(func=cmd_set_mode)


def _add_emit(sub) -> None:
    p = sub.add_parser("emit", help="write a partially-quantized ONNX model (QDQ or integer ops / fp16 casts / float)")
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("-o", "--output", required=True, help="the ONNX model to write")
    for mode in ("int16", "float", "fp16"):
        p.add_argument(f"--{mode}", help=f"nodes to emit as {mode}: names/globs of calibration nodes, ops or modules")
    p.add_argument("--format", choices=["qdq", "qoperator"], default="qdq",
                   help="qdq (default): QuantizeLinear/DequantizeLinear pairs; qoperator: integer ONNX ops "
                        "(QLinearConv, QGemm, ConvInteger, ...) where they exist, the rest QDQ")
    add_force(p)
    p.set_defaults(func=cmd_emit)


def add_commands(sub) -> None:
    """``calibrate``, ``pipeline``, ``set-mode`` and ``emit``."""
    _add_calibrate(sub)
    _add_pipeline(sub)
    _add_set_mode(sub)
    _add_emit(sub)
