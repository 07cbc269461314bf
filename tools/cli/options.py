"""The options several commands share, each defined once, and the helpers that read them.

``add_*`` functions put one flag (or one group of flags) on a subcommand's parser; the
``parse_*`` / ``resolve_*`` / ``check_*`` helpers turn what the user wrote into values, raising
:class:`~qir.errors.InputError` (one line, exit code 2) for what the user can fix.

**One meaning per flag.** :data:`FLAG_MEANINGS` declares what each short flag means; in every
command it stands for that long option, and a short flag not in the table is not used. ``-o`` is
always ``--output``, where the command writes: its output file, or its output folder when it
writes several files (the debugger commands take it as a synonym of ``-s/--save-dir``). The hmct
debugger commands under their hmct names (:data:`HMCT_COMMANDS`) keep hmct's own flags instead,
as its documentation defines them (there ``-o`` is the output node, ``-n`` the node type, ...).
``tests/tools/test_cli_flags.py`` walks every subcommand and checks both rules and that every
option has help text.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import logging
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from qir.errors import InputError, shown
from qir.execution import Execution, Level, Runtime
from qir.tools.reports.output import Outputs

__all__ = [
    "SHAPE_HELP", "SAMPLES_HELP", "CALIBRATION_DATA_HELP", "CALIBRATED_MODEL_HELP", "MARCH_HELP",
    "OVERWRITE_HELP", "OLD_SAMPLE_FLAGS", "add_force", "add_runtime", "add_input_shape", "add_march", "add_data_num",
    "add_analysis_command", "positive_int", "nonnegative_int", "positive_float", "finite_float", "parse_bool",
    "parse_list", "parse_input_shapes",
    "resolve_shapes", "FLAG_MEANINGS", "HMCT_COMMANDS", "flags_epilog", "seed_flag", "outputs",
]

logger = logging.getLogger("qir.cli")

SHAPE_HELP = "fix a dynamic input shape: NAME=1,3,224,224 (repeatable; NAME= optional for one input)"
SAMPLES_HELP = "samples: DIR/<input>/<i>.npy, .npz or .npy"
CALIBRATION_DATA_HELP = "calibration data: DIR/<input>/<i>.npy, .npz or .npy"
CALIBRATED_MODEL_HELP = "a calibrated .onnx model"
MARCH_HELP = "march profile (see `qir profiles`)"
#: What every analysis with a graph panel also writes in its output folder (say it in its -o help).
NODE_DATA_HELP = "with the viz extra also model_explorer/*.json: the graph's overlays as Model Explorer node data (qir view)"

# short flag -> (the long option(s) it stands for, what it means): the same in every command
FLAG_MEANINGS: dict[str, tuple[tuple[str, ...], str]] = {
    "-o": (("--output",), "where the command writes: its output file, or its output folder when it writes several"),
    "-s": (("--save-dir",), "the output folder (hmct's name for it)"),
    "-d": (("--data-num",), "how many samples to use"),
    "-m": (("--metric", "--metrics"), "the metric, or metrics (the first ranks)"),
    "-v": (("--verbose",), "say more: log progress (qir -v), or print the whole table"),
    "-i": (("--interested-nodes",), "only these nodes"),
    "-q": (("--quantize-node",), "only these nodes quantized"),
    "-nq": (("--non-quantize-node",), "these nodes back to float"),
    "-a": (("--axis",), "the channel axis"),
    "-p": (("--prefixes",), "only ops whose names start with these"),
    "-t": (("--types",), "only ops of these types"),
    "-c": (("--cluster",), "where the engine's work runs: a Ray cluster (auto, ray://HOST:PORT) or torchrun's ranks (torch)"),
    "-h": (("--help",), "show the command's help"),
}
# the hmct debugger's own command names: their flags are hmct's (see the module docstring)
HMCT_COMMANDS = frozenset({"get-sensitivity-of-nodes", "plot-acc-error", "plot-distribution",
                           "get-channelwise-data-distribution", "sensitivity-analysis", "runall"})


def seed_flag(hmct: bool, short: str, long: str) -> tuple[str, ...]:
    """The option strings of a flag hmct defines as ``short``/``long``: both under an hmct command
    name; under qir's own name the short one only where it means the same in every qir command
    (:data:`FLAG_MEANINGS`), else the long one alone."""
    if hmct or long in FLAG_MEANINGS.get(short, ((), ""))[0]:
        return short, long
    return (long,)


def flags_epilog() -> str:
    """The table of short flags for ``qir --help``."""
    rows = [f"  {short:<4} {'/'.join(longs):<20} {meaning}" for short, (longs, meaning) in FLAG_MEANINGS.items()]
    return ("flags mean the same in every command:\n" + "\n".join(rows) + "\nexcept under hmct's command names ("
            + ", ".join(sorted(HMCT_COMMANDS)) + "), which take hmct's own flags")
OVERWRITE_HELP = "replace output files that already exist"


# ------------------------------------------------------------------------------ value types
def positive_int(text: str) -> int:
    """An argparse ``type``: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


# argparse names the type in its message for a non-integer ("invalid _positive_int value: 'x'"): kept as it was
positive_int.__name__ = "_positive_int"


def positive_float(text: str) -> float:
    """An argparse ``type``: a finite number above 0 (``nan``, ``inf``, 0 and below are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {text!r}") from None
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def nonnegative_int(text: str) -> int:
    """An argparse ``type``: an integer of at least 0 (a count of rows to show, 0 for none)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """An argparse ``type``: any finite number (``nan``, ``inf`` and words refused): a threshold
    compared with metric values, which ``nan`` would silently never pass."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not np.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def parse_bool(text: str) -> bool:
    """An argparse ``type`` for hmct-style flags that take ``True``/``False`` (or 1/0, yes/no, on/off)."""
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")


def parse_list(text: str | None) -> list | None:
    """A list option as the hmct CLI writes it: ``"['a','b']"`` (read with ``ast.literal_eval``,
    never evaluated), or ``a,b`` (empty items dropped). Items are names, or lists of names (groups);
    anything else, or a list that names nothing, is an InputError: an empty list must not read as
    "no restriction"."""
    import ast

    if text is None:
        return None
    text = text.strip()
    if text.startswith("["):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise InputError(f"cannot read the list {shown(text)}; write ['a','b'] or a,b") from None
        if not isinstance(value, list):
            raise InputError(f"{shown(text)} is not a list")
    else:
        value = [t.strip() for t in text.split(",") if t.strip()]
    for item in value:
        odd = [v for v in (item if isinstance(item, list) else [item]) if not isinstance(v, str)]
        if odd or item == []:
            raise InputError(f"the list {shown(text)} holds {(odd or [item])[0]!r}, not a name; write names in "
                             "quotes: ['a','b'] (or [['a','b'],'c'] for groups)")
    if not value:
        raise InputError(f"the list {shown(text)} names nothing; give at least one name, or leave the option out "
                         "for its default")
    return value


def parse_input_shapes(items: Sequence[str] | None) -> dict[str, list[int]] | list[int] | None:
    """``["x=1,3,224,224", ...]`` → ``{"x": [1,3,224,224]}``; a lone ``1,3,224,224`` → list. Every
    dimension is a whole number of at least 1 (else an InputError: the shape is meant static)."""
    if not items:
        return None
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, _, dims = item.rpartition("=")
        try:
            shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            raise InputError(f"cannot read input shape {item!r}; write NAME=1,3,224,224") from None
        if not shape or min(shape) < 1:
            raise InputError(f"input shape {item!r} needs every dimension a whole number of at least 1 "
                             "(a static shape, e.g. 1,3,224,224)")
        if not name:
            if len(items) > 1:
                raise InputError("with several --input-shape options each needs NAME=dims")
            return shape
        shapes[name] = shape
    return shapes


def resolve_shapes(model: str, given, data: str | None = None) -> dict[str, list[int]] | None:
    """Input shapes to import with: as given, else (for dynamic inputs) from the first sample."""
    from qir.data import check_shape, load_samples
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
    for i in inputs:
        if i.name in dynamic:
            declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                        for d in i.type.tensor_type.shape.dim]
            check_shape(i.name, declared, np.shape(first[i.name]), samples.source)
    return {n: list(np.shape(first[n])) for n in dynamic}


def outputs(args: argparse.Namespace, folder: str | Path = ".") -> Outputs:
    """The files a command writes (in ``folder``; paths the user gave are relative to the current
    folder), under the one rule of :class:`~qir.tools.reports.output.Outputs`: plan them, ``check()``
    before the long work, write through it; ``--force`` lets them replace existing files."""
    return Outputs(folder, overwrite=bool(getattr(args, "force", False)))


# ------------------------------------------------------------------------------ flags
def add_force(p: argparse.ArgumentParser, help: str = OVERWRITE_HELP) -> None:  # noqa: A002
    """``--force``: allow overwriting what the command writes."""
    p.add_argument("--force", action="store_true", help=help)


def add_runtime(p: argparse.ArgumentParser, default: str = "ort", choices: Sequence[str] = ("ort", "numpy")) -> None:
    """``--runtime``: the runtime that runs the model (choices in the order help shows them)."""
    p.add_argument("--runtime", choices=list(choices), default=default,
                   help=f"onnxruntime (ort) or qir's numpy reference interpreter (default {default})")


def add_input_shape(p: argparse.ArgumentParser) -> None:
    """``--input-shape`` (repeatable): fix dynamic input shapes; read with :func:`parse_input_shapes`."""
    p.add_argument("--input-shape", action="append", help=SHAPE_HELP)


def add_march(p: argparse.ArgumentParser, help: str = MARCH_HELP) -> None:  # noqa: A002
    """``--march`` (default ``nash-e``): the march profile."""
    p.add_argument("--march", default="nash-e", help=f"{help} (default nash-e)")


def add_data_num(p: argparse.ArgumentParser, short: str = "-d", *, default: int | None = 1,
                 help: str | None = None, old: Sequence[str] = ()) -> None:  # noqa: A002
    """``-d/--data-num``, the sample count of every command (``args.data_num``). ``old``: the names a
    command used before (``--limit``, ``-n/--num``, ``-n/--num-steps``), still read, listed in
    :data:`OLD_SAMPLE_FLAGS` and left out of the help."""
    p.add_argument(short, "--data-num", type=positive_int, default=default,
                   help=help or (f"samples to use (default {default})" if default else "use at most N samples"))
    if old:
        p.add_argument(*old, dest="data_num", type=positive_int, help=argparse.SUPPRESS)


#: Sample-count flags commands took before they all took ``-d/--data-num``: still read, not shown.
OLD_SAMPLE_FLAGS = frozenset({"--limit", "-n", "--num", "--num-steps"})


def add_analysis_command(sub, name: str, aliases: list[str], help: str, save_dir: str,  # noqa: A002
                         save_flags: tuple[str, ...] = ("-s",), listed: bool = True,
                         data_optional: bool = False) -> argparse.ArgumentParser:
    """A debugger subcommand: MODEL DATA, -d/--data-num, -s/--save-dir, --runtime and --force
    (``data_optional``: DATA may be left out, for a mode of the command that needs none)."""
    p = sub.add_parser(name, aliases=aliases, description=help, **({"help": help} if listed else {}))
    p.add_argument("model", help=CALIBRATED_MODEL_HELP)
    p.add_argument("data", help=CALIBRATION_DATA_HELP, **({"nargs": "?"} if data_optional else {}))
    add_data_num(p, "-d")
    p.add_argument(*save_flags, "--save-dir", dest="save_dir", default=save_dir, help=f"output folder (default {save_dir})")
    add_runtime(p)
    add_force(p)
    return p


# ------------------------------------------------------------------------------ level
__all__ += ["add_level", "resolve_level"]


def add_level(p: argparse.ArgumentParser, levels: Sequence[str] = ("float", "fakequant", "integer")) -> None:
    """``--level`` and ``--march`` (read with :func:`resolve_level`), on a parser that has
    ``--runtime`` already: its default then follows the level (numpy at the integer level, which
    only qir's numpy interpreter computes; the command's own default otherwise)."""
    default = _DefaultRuntime(p.get_default("runtime"))
    what = {"float": "calibration nodes ignored", "fakequant": "fake quantization",
            "integer": "integer codes as the --march NPU computes them, on the numpy runtime"}
    p.add_argument("--level", choices=list(levels), default="fakequant",
                   help="what the model computes: " + "; ".join(f"{lv} ({what[lv]})" for lv in levels)
                   + " (default fakequant)")
    p.add_argument("--march", help=f"{MARCH_HELP} whose integer arithmetic --level integer emulates (default nash-e)")
    p.set_defaults(runtime=default)


class _DefaultRuntime(str):
    """A ``--runtime`` left at the command's default (equal to it as a string): the level may choose
    another (:func:`resolve_level`), where a runtime the user wrote is kept or refused."""


def resolve_level(args: argparse.Namespace, *, march_alone: bool = False) -> Execution:
    """The :class:`~qir.execution.Execution` of :func:`add_level`'s flags (resolved by
    :meth:`Execution.resolve <qir.execution.Execution.resolve>`): the integer level runs on the
    numpy runtime (``--runtime ort`` with it is an InputError; left out, numpy is chosen and the log
    says so) with ``--march`` (default nash-e); a ``--march`` without ``--level integer`` is an
    InputError unless the command uses it otherwise (``march_alone``; then it comes back as given)."""
    runtime, level, march = args.runtime, args.level, args.march
    chosen = not isinstance(runtime, _DefaultRuntime)
    if level == Level.INTEGER:
        if chosen and runtime != Runtime.NUMPY:
            raise InputError(f"--level integer runs on the numpy runtime only (onnxruntime computes float and "
                             f"fake quantization), not --runtime {runtime}; leave --runtime out or write "
                             "--runtime numpy")
        if not chosen and runtime != Runtime.NUMPY:
            logger.info("--level integer: running on the numpy runtime (qir's integer level)")
        return Execution.resolve(None, level, march)
    if march is not None and not march_alone:
        raise InputError(f"--march {march} applies to --level integer only (here --level {level}); "
                         "add --level integer, or leave --march out")
    return Execution.resolve(str(runtime), level, march, march_alone=march_alone)


# ------------------------------------------------------------------------------ cluster
__all__ += ["add_cluster", "on_cluster"]

CLUSTER_HELP = ("where the analysis' variants and bad-case samples run: auto (the Ray cluster this machine belongs to), "
                "ray://HOST:PORT (a Ray cluster's client address), ray (a new Ray on this machine) or torch (the ranks "
                "of the torchrun job this runs in: torchrun --nproc_per_node=N -m qir ...); default: here. Workers read "
                "the model and data from the same paths (a shared filesystem); needs pip install 'qir[ray]' for Ray")


def add_cluster(p: argparse.ArgumentParser, hmct: bool = False) -> None:
    """``-c/--cluster`` (``--cluster`` alone under an hmct command name), read with :func:`on_cluster`."""
    p.add_argument(*(("--cluster",) if hmct else ("-c", "--cluster")), metavar="WHERE", help=CLUSTER_HELP)


@contextlib.contextmanager
def on_cluster(args: argparse.Namespace, output: str) -> Iterator[None]:
    """Run the command's analyses on ``args.cluster`` (:func:`qir.runtimes.engine.cluster.use_cluster`:
    a bad address is one error before any work). Under torchrun every rank runs the command; rank 0
    writes and prints, the others compute their shards with their output folder (the attribute
    ``output`` of ``args``) in a temporary folder, printing nothing and logging only errors."""
    from qir.runtimes.engine.cluster import executor_for, use_cluster

    with use_cluster(getattr(args, "cluster", None)) as cluster:
        if cluster is None or executor_for(cluster).driver:
            yield
            return
        qir_logger = logging.getLogger("qir")
        level = qir_logger.level
        qir_logger.setLevel(logging.ERROR)
        try:
            with tempfile.TemporaryDirectory(prefix="qir-rank-") as tmp, contextlib.redirect_stdout(io.StringIO()):
                setattr(args, output, tmp)
                yield
        finally:
            qir_logger.setLevel(level)
