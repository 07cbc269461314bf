"""The public entry points: ``qir.load``, ``qir.run``, ``qir.save`` (docs/architecture.md, "The public surface")."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx

from qir.execution import Level, Runtime
from qir.files import atomic_write, check_outputs
from qir.graph import QIR
from qir.io.onnx_export import export_onnx
from qir.io.onnx_import import import_onnx
from qir.io.sources import remember

__all__ = ["load", "run", "save", "from_torch", "as_ir"]


def load(model: str | Path | onnx.ModelProto, *,
         input_shapes: Mapping[str, Sequence[int]] | None = None) -> QIR:
    """Load an ONNX model into a QIR.

    Args:
        model: path of an ``.onnx`` file, or a ``ModelProto``.
        input_shapes: ``{input: shape}`` to make dynamic inputs static (recommended for NPUs:
            shape-computation chains then fold away).
    """
    ir = import_onnx(model, input_shapes=input_shapes)
    if isinstance(model, (str, Path)):
        remember(ir, model, input_shapes)  # (a cluster's workers can read the same file: qir.io.sources)
    return ir


def as_ir(model: QIR | str | Path | onnx.ModelProto, *, calibrated: bool = False) -> QIR:
    """``model`` itself when it is a QIR, else :func:`load` of it; with ``calibrated``, a model
    without calibration nodes is an InputError (every analysis needs a calibrated model)."""
    from qir.errors import InputError

    ir = model if isinstance(model, QIR) else load(model)
    if calibrated and not ir.calibrations():
        what = f"the model {ir.name!r}" if isinstance(model, (QIR, onnx.ModelProto)) else str(model)
        raise InputError(f"{what} has no calibration nodes; calibrate it first (qir calibrate)")
    return ir


def from_torch(module, example_inputs, **options) -> QIR:
    """A PyTorch ``nn.Module`` as a QIR, with module paths on every op (needs the torch extra;
    see :func:`qir.io.torch_import.from_torch` for the options)."""
    from qir.io.torch_import import from_torch as _from_torch

    return _from_torch(module, example_inputs, **options)


def run(ir: QIR, feeds: Mapping[str, np.ndarray], *, runtime: str = Runtime.NUMPY,
        level: str = Level.FAKEQUANT, capture: Iterable[str] = (), march: str | None = None) -> dict[str, np.ndarray]:
    """Execute ``ir`` once; returns the outputs (and captured values) by name.

    Args:
        runtime: ``numpy`` (reference interpreter) or ``ort`` (onnxruntime).
        level: ``fakequant`` applies calibration nodes, ``float`` ignores them, ``integer``
            (numpy runtime) computes on integer codes as the ``march`` profile says.
        capture: names of intermediate values to return as well.
        march: the profile the integer level emulates (``nash-e``, ``ort``, ...; default ``nash-e``: :mod:`qir.execution`).
    """
    from qir.runtimes.base import get_runtime

    return get_runtime(runtime, level=level, march=march).run(ir, feeds, capture=capture)


def save(ir: QIR, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write ``ir`` as an ONNX model that onnxruntime runs; returns the path.

    An existing ``path`` (``ir``'s own input file too) is refused with an
    :class:`~qir.errors.OutputError` unless ``overwrite``, as the command line refuses it without
    ``--force``. The file is written atomically (:func:`qir.files.atomic_write`): a failed write
    leaves the old file as it was.
    """
    path = Path(path)
    check_outputs([path], overwrite=overwrite)
    model = export_onnx(ir)
    return atomic_write(path, lambda tmp: onnx.save(model, str(tmp)))
