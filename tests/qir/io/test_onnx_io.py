"""ONNX import (normalization, naming, weights in Constant nodes, clear errors) and export."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import qir
from qir.errors import ImportError_, InputError, UnsupportedOpError
from qir.io.onnx_export import export_onnx

from ...conftest import REPO, model_from_text

SHAPE_CHAIN = """
<ir_version: 8, opset_import: ["" : 13]>
flat (float[N,4,2,2] x) => (float[N,16] y) {
    s = Shape(x)
    zero = Constant <value = int64[1] {0}> ()
    n = Gather(s, zero)
    minus = Constant <value = int64[1] {-1}> ()
    shape = Concat <axis=0> (n, minus)
    y = Reshape(x, shape)
}
"""


def ort_run(model: onnx.ModelProto, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_static_input_shapes_fold_shape_chains_away():
    model = model_from_text(SHAPE_CHAIN)
    dynamic = qir.load(model)
    assert [r.op_type for r in dynamic.ops()] == ["Shape", "Gather", "Concat", "Reshape"]
    static = qir.load(model, input_shapes={"x": [2, 4, 2, 2]})
    assert [r.op_type for r in static.ops()] == ["Reshape"]
    assert static.value("y").shape == (2, 16)
    reshape_shape = static.op(static.ops()[0].name).inputs[1]
    assert static.weight_array(reshape_shape).tolist() == [2, -1]


def test_input_shape_errors_name_the_input():
    with pytest.raises(InputError, match="did you mean 'x'"):
        qir.load(model_from_text(SHAPE_CHAIN), input_shapes={"xx": [1, 4, 2, 2]})
    with pytest.raises(InputError, match="rank 4"):
        qir.load(model_from_text(SHAPE_CHAIN), input_shapes={"x": [1, 16]})
    for dims in ([0, 4, 2, 2], [-1, 4, 2, 2], [1.5, 4, 2, 2]):  # a static shape: whole dimensions of at least 1
        with pytest.raises(InputError, match=r"input 'x', \[.*\], needs every dimension a whole number of at least 1"):
            qir.load(model_from_text(SHAPE_CHAIN), input_shapes={"x": dims})


def test_constant_nodes_are_weights_and_unnamed_nodes_get_optype_n():
    w = helper.make_tensor("wv", TensorProto.FLOAT, [2, 2], [1, 2, 3, 4])
    nodes = [helper.make_node("Constant", [], ["w"], value=w),               # Paddle-style weight
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["r"], name="Relu_0"),          # takes the first id
             helper.make_node("Relu", ["r"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"], name="dup"),
             ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    ir = qir.load(model)
    assert ir.value("w").kind is qir.NodeKind.WEIGHT
    assert ir.weight_array("w").tolist() == [[1, 2], [3, 4]]
    assert [r.name for r in ir.ops()] == ["MatMul_0", "Relu_0", "Relu_1", "dup"]


def test_control_flow_is_refused_with_the_node_named():
    then = helper.make_graph([helper.make_node("Identity", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1])])
    node = helper.make_node("If", ["c"], ["y"], name="branchy", then_branch=then, else_branch=then)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="'branchy' \\(If\\) is control flow"):
        qir.load(model)


SLICED_SHAPE = """
<ir_version: 8, opset_import: ["" : 15]>
sliced ({dims} x) => (int64[2] y, float[?,3,4] z) {{
    y = Shape <start = 1, end = -1> (x)
    rest = Constant <value = int64[1] {{-1}}> ()
    shape = Concat <axis = 0> (rest, y)
    z = Reshape(x, shape)
}}
"""


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
@pytest.mark.parametrize("dims", ["float[2,3,4,5]", "float[N,3,4,M]"])
def test_shape_keeps_start_and_end(dims, runtime):
    """Shape's start/end (opset 15) survive the import: folded to the sliced shape when the input
    is static (onnx-graphsurgeon's own folding would return the whole shape), kept as they are
    when it is not."""
    ir = qir.load(onnx.parser.parse_model(SLICED_SHAPE.format(dims=dims)))
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    out = qir.run(ir, {"x": x}, runtime=runtime, level="float")
    assert out["y"].tolist() == [3, 4]
    assert out["z"].shape == (10, 3, 4)
    assert ("Shape" in {op.op_type for op in ir.ops()}) == dims.endswith("M]")


def test_sequences_are_refused_naming_the_node_or_value():
    node = helper.make_node("SequenceInsert", ["seq", "t"], ["out"], name="grow")
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    graph = helper.make_graph([node], "g", [seq, helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_sequence_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOpError, match="graph input 'seq' is a sequence"):
        qir.load(model)
    graph = model.graph  # tensors at the boundary: the op itself is refused
    graph.input[0].CopyFrom(helper.make_tensor_value_info("seq", TensorProto.FLOAT, [2]))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("out", TensorProto.FLOAT, [2]))
    with pytest.raises(UnsupportedOpError, match="'grow' \\(SequenceInsert\\) works on sequences"):
        qir.load(model)


def test_unknown_domain_and_old_opset_are_refused():
    node = helper.make_node("Magic", ["x"], ["y"], name="m1", domain="vendor.secret")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("vendor.secret", 1)])
    with pytest.raises(UnsupportedOpError, match="'m1' \\(Magic\\) is in the unknown domain 'vendor.secret'"):
        qir.load(model)
    old = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                                              graph.input, graph.output),
                            opset_imports=[helper.make_opsetid("", 9)])
    with pytest.raises(ImportError_, match="opset 9 is older than the supported 11"):
        qir.load(old)


def test_missing_and_corrupt_files(tmp_path):
    with pytest.raises(ImportError_, match="not found"):
        qir.load(tmp_path / "none.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 definitely not protobuf")
    with pytest.raises(ImportError_, match="not a readable ONNX model"):
        qir.load(bad)
    with pytest.raises(ImportError_, match="directory"):
        qir.load(tmp_path)


def test_attribute_types_survive_export():
    nodes = [helper.make_node("LeakyRelu", ["x"], ["a"], alpha=1.0),  # float that looks like an int
             helper.make_node("Cast", ["a"], ["b"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["b"], ["y"], to=TensorProto.FLOAT),
             ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = export_onnx(qir.load(model))
    onnx.checker.check_model(out, full_check=True)
    attrs = {a.name: a for n in out.graph.node for a in n.attribute}
    assert attrs["alpha"].type == onnx.AttributeProto.FLOAT
    assert attrs["to"].type == onnx.AttributeProto.INT


def test_round_trip_of_the_bundled_example_gives_identical_outputs():
    path = REPO / "qir" / "examples" / "digits" / "model.onnx"
    exported = export_onnx(qir.load(path))
    onnx.checker.check_model(exported, full_check=True)
    x = np.load(REPO / "qir" / "examples" / "digits" / "eval_images.npy")[:1][0]
    (a,), (b,) = ort_run(exported, {"input": x}), ort_run(onnx.load(path), {"input": x})
    np.testing.assert_array_equal(a, b)
    # and the exported model imports back to the same IR text
    assert str(qir.load(exported)) == str(qir.load(path))


def test_save_writes_a_model_onnxruntime_runs(tmp_path):
    ir = qir.load(model_from_text(SHAPE_CHAIN), input_shapes={"x": [1, 4, 2, 2]})
    path = qir.save(ir, tmp_path / "out.onnx")
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 2, 2)
    (y,) = ort_run(onnx.load(path), {"x": x})
    np.testing.assert_array_equal(y, x.reshape(1, 16))


UNNAMED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N,4] x) => (float[N,4] y) {
    s = Shape(x)
    zero = Constant <value = int64[1] {0}> ()
    n = Gather <axis=0> (s, zero)
    n2 = Add(n, zero)
    four = Constant <value = int64[1] {4}> ()
    shape = Concat <axis=0> (n2, four)
    y0 = Add(x, x)
    y1 = Add(y0, x)
    y = Reshape(y1, shape)
}
"""


def test_generated_names_do_not_depend_on_folding():
    model = model_from_text(UNNAMED)
    dynamic = sorted(r.name for r in qir.load(model).ops("Add"))
    static = sorted(r.name for r in qir.load(model, input_shapes={"x": [2, 4]}).ops("Add"))
    assert dynamic == ["Add_0", "Add_1", "Add_2"]  # Add_0 is in the shape chain
    assert static == ["Add_1", "Add_2"]            # folded away; the others keep their names


def test_newest_ir_version_still_folds_and_prints_nothing(capfd):
    model = model_from_text(SHAPE_CHAIN)
    model.ir_version = onnx.IR_VERSION  # newer than onnxruntime reads
    ir = qir.load(model, input_shapes={"x": [2, 4, 2, 2]})
    assert [r.op_type for r in ir.ops()] == ["Reshape"]
    out, err = capfd.readouterr()
    assert out == ""


def test_export_of_values_with_unknown_types_runs():
    ir = qir.load(model_from_text(SHAPE_CHAIN), input_shapes={"x": [1, 4, 2, 2]})
    ir.add_op("neg", "Neg", ["y"], ["z"])  # a pass adding a node without output_info
    ir.set_outputs(["z"])
    (z,) = ort_run(export_onnx(ir), {"x": np.ones((1, 4, 2, 2), np.float32)})
    np.testing.assert_array_equal(z, -np.ones((1, 16), np.float32))


def testconstant_value_float_and_ints_keep_their_types():
    import onnx.parser

    model = onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3] x) => (float[1,3] y) {
    k = Constant <value_float = 2.5> ()
    j = Constant <value_ints = [1, 3]> ()
    m = Mul (x, k)
    y = Reshape (m, j)
}''')
    ir = qir.import_onnx(model)
    assert ir.weight_array("k").dtype == np.float32 and ir.weight_array("j").dtype == np.int64
    x = np.ones((1, 3), np.float32)
    assert qir.run(ir, {"x": x}, runtime="ort")["y"].tolist() == [[2.5, 2.5, 2.5]]
