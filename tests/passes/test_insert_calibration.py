"""insert-calibration on graph shapes that once broke it: an op reading one value twice, and a
graph output that ops also read (``outputs=True``)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import qir
from qir.passes import PassManager, PipelineContext
from qir.records import CalibRecord


def _model(nodes, outputs):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    return qir.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_an_op_reading_a_value_twice_gets_one_quantizer_on_both_reads():
    ir = _model([helper.make_node("Relu", ["x"], ["c"]), helper.make_node("Add", ["c", "c"], ["y"])], ["y"])
    PassManager("insert-calibration").run(ir)
    on_c = [r for r in ir.consumers("c") if isinstance(r, CalibRecord)]
    assert len(on_c) == 1 and tuple(ir.node("Add_0").inputs) == (on_c[0].output,) * 2


def test_a_graph_output_read_by_ops_takes_their_quantized_value():
    ir = _model([helper.make_node("Relu", ["x"], ["z"]), helper.make_node("Sigmoid", ["z"], ["y"])], ["z", "y"])
    PassManager("insert-calibration{outputs=true}").run(ir)
    on_z = [r for r in ir.consumers("z") if isinstance(r, CalibRecord)]
    assert len(on_z) == 1 and ir.outputs[0] == on_z[0].output
    assert isinstance(ir.producer(ir.outputs[1]), CalibRecord)  # y quantized too
    x = {"x": np.array([[-1.0, 0.5, 2.0, 3.0]], np.float32)}
    PassManager("calibrate{method=max,progress=False}", context=PipelineContext(data=[x])).run(ir)
    got = qir.run(ir, x)
    assert set(got) == set(ir.outputs) and float(got[ir.outputs[0]].max()) == 3.0
