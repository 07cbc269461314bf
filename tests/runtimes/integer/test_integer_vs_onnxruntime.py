"""The integer level's machinery, proved on onnxruntime's integer kernels (the ``ort`` profile).

Real models quantized by onnxruntime's ``quantize_static`` run in onnxruntime's default session
as fused QLinear* kernels. With ``reduce_range=True`` (7-bit weights: onnxruntime's u8s8 GEMM
cannot saturate its 16-bit pair sums on CPUs without VNNI, so it is exact itself), qir's integer
level with ``march="ort"`` must give onnxruntime's integer codes for every quantized tensor
(>= 99.9% of elements each) and its outputs (cosine >= 0.99999). The codes are read from
onnxruntime by making every QuantizeLinear output a graph output (the QDQ fusion still happens:
checked through the optimized graph's QLinearConv count).
"""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import qir
from qir.runtimes.integer import IntegerRuntime
from qir.runtimes.integer.qtensor import params_of

from ...qir.io.test_qdq_import import REAL, cosine, real_qdq


def _session_with_codes(qdq_path, tmp_path) -> tuple[ort.InferenceSession, list[str], collections.Counter]:
    """onnxruntime's default session over the model with every Q output also a graph output."""
    model = onnx.load(str(qdq_path))
    existing = {o.name for o in model.graph.output}
    inits = {i.name: i for i in model.graph.initializer}
    q_nodes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    for node in q_nodes:
        zero_point = inits.get(node.input[2]) if len(node.input) > 2 else None
        dtype = zero_point.data_type if zero_point is not None else TensorProto.UINT8
        if node.output[0] not in existing:
            model.graph.output.append(helper.make_tensor_value_info(node.output[0], dtype, None))
    q_outputs = [n.output[0] for n in q_nodes]
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
    return session, q_outputs, ops


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL))
def test_integer_level_reproduces_onnxruntime_integer_kernels(name, tmp_path):
    _, qdq_path, feeds = real_qdq(name, tmp_path, reduce_range=True)
    session, q_outputs, ops = _session_with_codes(qdq_path, tmp_path)
    assert ops["QLinearConv"] + ops["QLinearAdd"] > 20  # the integer kernels really ran
    ir = qir.load(qdq_path)
    q_input = {n.output[0]: n.input[0] for n in onnx.load(str(qdq_path)).graph.node if n.op_type == "QuantizeLinear"}
    by_input = {c.input: c for c in ir.calibrations()}
    pairs = [(q, by_input[q_input[q]]) for q in q_outputs if q_input[q] in by_input]
    assert len(pairs) > 150
    runtime = IntegerRuntime("ort")
    _, feed = feeds[0]
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    got = runtime.run(ir, feed, capture=[c.output for _, c in pairs])
    assert cosine(got[ir.outputs[0]], expected[session.get_outputs()[0].name]) >= 0.99999
    worst = []
    for q, cal in pairs:
        params = params_of(cal)
        codes = np.rint(got[cal.output] / params.scale).astype(np.int64) + int(params.zero_point)
        ref = expected[q].astype(np.int64) - (128 if expected[q].dtype == np.uint8 else 0)
        worst.append((float(np.mean(codes == ref)), cal.name))
    assert min(worst) >= (0.999, ""), sorted(worst)[:5]
