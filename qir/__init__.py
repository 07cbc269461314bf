"""qir: find why a quantized neural network lost accuracy, and fix it.

One quantized IR (:class:`QIR`), passes over it (:mod:`qir.passes`), and runtimes that execute
it (:mod:`qir.runtimes`: a numpy reference interpreter and onnxruntime).

    import qir
    ir = qir.load("model.onnx", input_shapes={"images": [1, 3, 320, 320]})
    outs = qir.run(ir, {"images": x}, runtime="numpy")
"""
from __future__ import annotations

from qir.api import from_torch, load, run, save
from qir.errors import QirError
from qir.graph import QIR
from qir.io.onnx_export import export_onnx
from qir.io.onnx_import import import_onnx
from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.verify import verify

__all__ = ["QIR", "NodeKind", "CalibMode", "CalibRole", "QirError", "load", "run", "save", "from_torch", "tune",
           "import_onnx", "export_onnx", "verify", "__version__"]

__version__ = "0.1.0"


def tune(model, calib_data, eval_data, target, **options):
    """Tune ``model`` (float or calibrated) to the cheapest configuration of a march that meets
    ``target`` (``"cosine>=0.99"``, ``"mse<=1e-3"`` or ``(fn, ">=", value)``) on ``eval_data``, and
    verify it: ``qir tune`` in Python. The options (``march``, ``allow_float``, ``save_dir``, ...)
    and the report returned: :func:`qir.tools.tune.tune`. Defined here, not in :mod:`qir.api`,
    because it reaches the tools layer (lazily, at call time)."""
    from qir.tools.tune import tune as _tune

    return _tune(model, calib_data, eval_data, target, **options)
