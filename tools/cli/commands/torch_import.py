"""``qir import-torch``: a PyTorch module as an ONNX model whose ops carry their module paths."""
from __future__ import annotations

import argparse

from qir.errors import InputError
from qir.tools.cli.options import add_force, outputs, parse_input_shapes

ORDER = 50


def cmd_import_torch(args: argparse.Namespace) -> int:
    import qir
    from qir.io.torch_import import _torch, from_torch, load_factory
    from qir.runtimes.torch_check import check_against_torch

    out = outputs(args).plan(args.output).check()
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
    ir = from_torch(module, example, opset=args.opset, dynamo=args.dynamo)
    path = out.write(args.output, lambda tmp: qir.save(ir, tmp))
    named = sum(1 for op in ir.ops() if op.module)
    print(f"wrote {path}: {ir!r}; {named} of {len(ir.ops())} ops carry their module path")
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


def add_commands(sub) -> None:
    """``import-torch``."""
    p = sub.add_parser("import-torch", help="a PyTorch module (FILE.py:FACTORY) as an ONNX model with module paths")
    p.add_argument("module", help="FILE.py:FACTORY: a function (or class) returning the nn.Module, or a module object")
    p.add_argument("--example-shape", action="append", help="input shape, e.g. 1,3,224,224 (NAME=... per input)")
    p.add_argument("-o", "--output", required=True, help="the ONNX model to write")
    p.add_argument("--opset", type=int, default=17, help="the ONNX opset to export with (default 17)")
    p.add_argument("--dynamo", action="store_true",
                   help="use torch's newer torch.export-based exporter (needs onnxscript; opset 18 or later)")
    p.add_argument("--check", action="store_true", help="compare with torch on the example (fails above 1e-4)")
    add_force(p)
    p.set_defaults(func=cmd_import_torch)
