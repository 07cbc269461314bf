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

__all__ = ["QIR", "NodeKind", "CalibMode", "CalibRole", "QirError", "load", "run", "save", "from_torch",
           "import_onnx", "export_onnx", "verify", "__version__"]

__version__ = "0.1.0"
