"""``qir data``: images, or an ``.npz`` / ``.npy``, as a data folder ``DIR/<input>/<i>.npy``."""
from __future__ import annotations

import argparse
from pathlib import Path

from qir.errors import InputError

ORDER = 15  # after dump and run, before calibrate: the data comes first

_IMAGE_OPTIONS = ("size", "channels", "scale", "mean", "std", "layout")


def _number(text: str) -> float:
    """An argparse ``type``: a number or a fraction (``1/255``)."""
    top, _, bottom = text.partition("/")
    try:
        return float(top) / float(bottom) if bottom else float(top)
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(f"expected a number or a fraction such as 1/255, got {text!r}") from None


def _numbers(text: str) -> list[float]:
    """An argparse ``type``: one number or a comma-separated list (one per channel)."""
    return [_number(t.strip()) for t in text.split(",") if t.strip()]


def _size(text: str) -> tuple[int, int]:
    """An argparse ``type``: ``H,W`` (or ``HxW``), or one number for a square."""
    try:
        dims = [int(t) for t in text.lower().replace("x", ",").split(",") if t.strip()]
    except ValueError:
        dims = []
    if len(dims) not in (1, 2) or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected HEIGHT,WIDTH (or one number), got {text!r}")
    return (dims[0], dims[-1])


def _model_inputs(model: str) -> dict[str, int | None]:
    """``{input name: rank}`` of an ONNX model's graph inputs (initializers excluded)."""
    from qir.io.onnx_proto import read_onnx

    proto = read_onnx(model)
    inits = {i.name for i in proto.graph.initializer}
    return {i.name: (len(i.type.tensor_type.shape.dim) if i.type.tensor_type.HasField("shape") else None)
            for i in proto.graph.input if i.name not in inits}


def cmd_data(args: argparse.Namespace) -> int:
    from qir.data_folder import arrays_to_folder, images_to_folder

    inputs = _model_inputs(args.model) if args.model else None
    arrays = [s for s in args.sources if Path(s).suffix.lower() in (".npz", ".npy")]
    given = [f"--{k}" for k in _IMAGE_OPTIONS if getattr(args, k) is not None]
    if arrays:
        if len(args.sources) > 1:
            raise InputError(f"give one .npz or .npy alone (got {len(args.sources)} sources)")
        if given:
            raise InputError(f"{', '.join(given)}: options for images; {arrays[0]} holds model inputs already")
        names = [args.input] if args.input else (list(inputs) if inputs else None)
        written = arrays_to_folder(arrays[0], args.output, input_names=names, ranks=inputs, overwrite=args.force)
    else:
        name = args.input
        if name is None and inputs is not None and len(inputs) == 1:
            name = next(iter(inputs))
        if name is None:
            raise InputError("name the model input the images are for: --input NAME (or --model MODEL "
                             "with one input)" + (f"; the model's inputs are {list(inputs)}" if inputs else ""))
        if inputs is not None and name not in inputs:
            raise InputError(f"{args.model} has no input {name!r}; its inputs are {list(inputs)}")
        options = {k: getattr(args, k) for k in _IMAGE_OPTIONS if getattr(args, k) is not None}
        written = images_to_folder(args.sources, args.output, name, overwrite=args.force, **options)
    _summary(written, Path(args.output))
    return 0


def _summary(written: list[Path], folder: Path) -> None:
    import numpy as np

    by_input: dict[str, list[Path]] = {}
    for path in written:
        by_input.setdefault(path.parent.name, []).append(path)
    for name, files in by_input.items():
        first = np.load(files[0], mmap_mode="r")
        print(f"wrote {len(files)} sample(s) of input {name!r} ({'x'.join(map(str, first.shape))} "
              f"{first.dtype}) to {folder / name}")
    print(f"use it as the data of any command, e.g. qir calibrate MODEL {folder} -o calibrated_model.onnx")


def add_commands(sub) -> None:
    """``data``."""
    p = sub.add_parser("data", help="make a data folder DIR/<input>/<i>.npy from images or an .npz/.npy")
    p.add_argument("sources", nargs="+",
                   help="image files and/or folders of images (png, jpg, ...), or one .npz (keys <input>/<i> or "
                        "<input> stacks) or .npy (a stack for one input)")
    p.add_argument("-o", "--output", required=True, help="the data folder to write (DIR/<input>/<i>.npy)")
    p.add_argument("--input", help="the model input the images (or the .npy) are for (default: the --model's only input)")
    p.add_argument("--model", help="an .onnx model: its input names, and ranks to split .npz/.npy stacks as qir reads them")
    p.add_argument("--size", type=_size, help="resize images to HEIGHT,WIDTH (bilinear, half-pixel centres)")
    p.add_argument("--channels", choices=["rgb", "bgr", "gray"], help="channel order of the samples (default rgb)")
    p.add_argument("--scale", type=_number, help="multiply pixel values (0..255) by this first (default 1/255)")
    p.add_argument("--mean", type=_numbers, help="subtract after scaling: one value or one per channel, e.g. 0.485,0.456,0.406")
    p.add_argument("--std", type=_numbers, help="then divide: one value or one per channel, e.g. 0.229,0.224,0.225")
    p.add_argument("--layout", type=str.upper, choices=["NCHW", "NHWC", "CHW", "HWC"],
                   help="axis order of each sample (default NCHW: a batch axis of 1, channels first)")
    p.add_argument("--force", action="store_true", help="replace .npy files that already exist")
    p.set_defaults(func=cmd_data)
