"""qir: find why a quantized neural network lost accuracy, and fix it.

One quantized IR (:class:`QIR`), passes over it (:mod:`qir.passes`), and runtimes that execute
it (:mod:`qir.runtimes`: a numpy reference interpreter and onnxruntime).

    import qir
    ir = qir.load("model.onnx", input_shapes={"images": [1, 3, 320, 320]})
    outs = qir.run(ir, {"images": x}, runtime="numpy")
"""
from __future__ import annotations

from .api import from_torch, load, run, save
from .errors import QirError
from .graph import QIR
from .kinds import CalibMode, CalibRole, NodeKind
from .onnx_export import export_onnx
from .onnx_import import import_onnx
from .verify import verify

__all__ = ["QIR", "NodeKind", "CalibMode", "CalibRole", "QirError", "load", "run", "save", "from_torch",
           "import_onnx", "export_onnx", "verify", "__version__"]

__version__ = "0.1.0"
