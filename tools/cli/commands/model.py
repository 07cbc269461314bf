"""``qir dump`` and ``qir run``: look at a model's IR, run it on data."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from qir.errors import InputError
from qir.tools.cli.options import (
    add_data_num,
    add_force,
    add_input_shape,
    add_level,
    add_runtime,
    outputs,
    parse_input_shapes,
    resolve_level,
    resolve_shapes,
)

ORDER = 10


def cmd_dump(args: argparse.Namespace) -> int:
    import qir
    from qir.dot import render

    fmt = args.format
    if fmt in ("svg", "png") and not args.output:
        raise InputError(f"--format {fmt} needs -o PATH")
    out = outputs(args).plan(args.output).check() if args.output else None
    ir = qir.load(args.model, input_shapes=resolve_shapes(args.model, parse_input_shapes(args.input_shape)))
    if fmt == "text":
        text = str(ir)
    elif fmt == "json":
        text = json.dumps(ir.to_json(), indent=1, allow_nan=False) + "\n"
    else:
        text = ir.to_dot()
    if out is None:
        sys.stdout.write(text)
        return 0
    if fmt in ("svg", "png"):
        path = out.write(args.output, lambda tmp: render(text, tmp, fmt))
    else:
        path = out.write_text(args.output, text)
    print(f"wrote {path}")
    return 0


def _stats_table(results: list[dict[str, np.ndarray]]) -> str:
    """One row per output: shape, dtype and min/max/mean/std over every sample."""
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
    from qir.data import check_fit, load_samples, save_outputs
    from qir.tools.progress import run_samples

    execution = resolve_level(args)
    runtime, level, march = execution.runtime, execution.level, execution.march
    target = None
    if args.output:
        path = Path(args.output)
        target = path if path.suffix == ".npz" else path.with_name(path.name + ".npz")
        out = outputs(args).plan(target).check()
    # shapes stay as the model declares them unless given: samples may differ in size
    shapes = resolve_shapes(args.model, parse_input_shapes(args.input_shape))
    ir = qir.load(args.model, input_shapes=shapes)
    ranks = {n: (len(ir.value(n).shape) if ir.value(n).shape is not None else None) for n in ir.inputs}
    samples = load_samples(args.data, ir.inputs, ranks)
    if args.data_num is not None:
        samples = samples[: args.data_num]
    if not len(samples):
        raise InputError(f"{args.data} holds no samples")
    check_fit(ir, samples)  # (samples may differ in size: the first is checked before any run)
    start = time.perf_counter()
    results = run_samples(ir, samples, runtime, desc=f"{runtime}", level=level, march=march)
    elapsed = time.perf_counter() - start
    print(f"{ir.name}: {len(samples)} sample(s) on the {runtime} runtime{execution.describe()} in {elapsed:.2f}s")
    print(_stats_table(results))
    if target is not None:
        out.write(target, lambda tmp: save_outputs(tmp, results))
        print(f"wrote {target} (entries '<output>/<sample index>')")
    return 0


def add_commands(sub) -> None:
    """``dump`` and ``run``."""
    p = sub.add_parser("dump", help="print or write the IR of a model")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("--format", choices=["text", "json", "dot", "svg", "png"], default="text",
                   help="the IR's text form (default), its JSON, or the graph as DOT / SVG / PNG (those two need -o)")
    p.add_argument("-o", "--output", help="write to this file instead of standard output")
    add_input_shape(p)
    add_force(p)
    p.set_defaults(func=cmd_dump)

    p = sub.add_parser("run", help="run a model on data and print output statistics")
    p.add_argument("model", help="an .onnx model")
    p.add_argument("data", help="DIR/<input>/<i>.npy folder, an .npz, or an .npy (single input)")
    add_runtime(p, default="numpy", choices=("numpy", "ort"))
    add_level(p)
    p.add_argument("-o", "--output", help="save outputs to this .npz ('<output>/<i>' entries)")
    add_input_shape(p)
    add_data_num(p, default=None, help="use only the first N samples", old=("--limit",))
    add_force(p)
    p.set_defaults(func=cmd_run)
