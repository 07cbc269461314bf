"""The text dump is a stable contract: golden text, JSON schema, DOT."""
from __future__ import annotations

import json
import shutil
import textwrap

import numpy as np
import pytest

import qir
from qir.dot import render
from qir.errors import QirError
from qir.json_dump import SCHEMA, SCHEMA_VERSION

from ..conftest import model_from_text

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
block (float[1,3,8,8] x) => (float[1,4,4,4] y) {
    c = Conv <pads=[1,1,1,1], kernel_shape=[3,3]> (x, w, b)
    r = Relu(c)
    y = MaxPool <kernel_shape=[2,2], strides=[2,2]> (r)
}
"""
WEIGHTS = {"w": (4, 3, 3, 3), "b": (4,)}

GOLDEN = """\
qir "block" opset=17
  input  %x : f32[1,3,8,8]
  weight @b : f32[4] = [-2.25014,0.38637,-0.581641,0.10928]
  weight @w : f32[4,3,3,3]
{
     0  x.cal: %x~q : f32[1,3,8,8] = calib<int8 activation threshold=2.5>(%x)
     1  Conv_0: %c : f32[1,4,8,8] = Conv(%x, @w, @b) {kernel_shape=[3,3], pads=[1,1,1,1]}
     2  Relu_0: %r : f32[1,4,8,8] = Relu(%c)
     3  MaxPool_0: %y : f32[1,4,4,4] = MaxPool(%r) {kernel_shape=[2,2], strides=[2,2]}
  return %y
}
"""


def load_block():
    return qir.load(model_from_text(MODEL, WEIGHTS))


def test_golden_text_with_a_calibration_node():
    ir = load_block()
    ir.insert_calibration("x", "x.cal", threshold=2.5, uses=[])
    assert str(ir) == GOLDEN


def test_derived_symbolic_dims_print_as_short_names_with_a_legend():
    # the model names one of its own dims d0: the short names skip it
    from onnx import TensorProto, helper

    half = "floor(d0/2 - 1/2) + 1"
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2], strides=[2], name="pool"),
         helper.make_node("Flatten", ["p"], ["y"], axis=1, name="flat")], "sym",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "d0"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", f"({half})*3"])],
        value_info=[helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 3, half])])
    ir = qir.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert ir.value("y").shape == ("batch", f"({half})*3")  # the IR keeps the expressions
    assert str(ir) == textwrap.dedent("""\
        qir "sym" opset=17
          input  %x : f32[batch,3,d0]
          dim    d1 = floor(d0/2 - 1/2) + 1
          dim    d2 = (d1)*3
        {
             0  pool: %p : f32[batch,3,d1] = MaxPool(%x) {kernel_shape=[2], strides=[2]}
             1  flat: %y : f32[batch,d2] = Flatten(%p) {axis=1}
          return %y
        }
        """)


def test_dump_is_deterministic_across_imports():
    assert str(load_block()) == str(load_block())
    assert json.dumps(load_block().to_json()) == json.dumps(load_block().to_json())


def test_repr_is_one_line_of_counts():
    assert repr(load_block()) == ("QIR(name='block', opset=17, ops=3, calibrations=0, weights=2, "
                                  "activations=4, inputs=1, outputs=1)")


def test_per_channel_calibration_and_module_paths_print():
    ir = load_block()
    ir.insert_calibration("w", "w.cal", axis=0, threshold=np.array([1, 2, 3, 4], np.float32),
                          mode="int16", fixed=True)
    ir.op("Conv_0").module = "backbone.conv1"
    text = str(ir)
    assert "w.cal: %w~q : f32[4,3,3,3] = calib<int16 weight axis=0 threshold=f32[4][1,2,3,4] fixed>(@w)" in text
    assert "Conv(%x, %w~q, @b) {kernel_shape=[3,3], pads=[1,1,1,1]}  [backbone.conv1]" in text
    assert ir.node("backbone.conv1").name == "Conv_0"


def test_json_schema():
    ir = load_block()
    ir.insert_calibration("c", "c.cal", threshold=1.5)
    doc = ir.to_json()
    assert doc["schema"] == SCHEMA and doc["version"] == SCHEMA_VERSION
    assert doc["inputs"] == ["x"] and doc["outputs"] == ["y"]
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert nodes["Conv_0"]["attrs"] == {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    assert nodes["c.cal"] == {"index": 1, "name": "c.cal", "kind": "calibration",
                              "role": "activation", "mode": "int8", "inputs": ["c"],
                              "outputs": ["c~q"], "threshold": 1.5, "scale": None, "zero_point": None,
                              "implied_clip": None, "axis": None,
                              "fixed": False, "feeds": ["Relu_0"]}
    w = {v["name"]: v for v in doc["values"]}["w"]
    arr = ir.weight_array("w")
    assert w["stats"]["numel"] == 108 and w["stats"]["max"] == pytest.approx(float(arr.max()))
    assert "data" not in w
    json.dumps(doc)  # plain JSON types only


def test_dot_text_and_rendering():
    ir = load_block()
    dot = ir.to_dot()
    assert dot.startswith('digraph "block" {')
    assert '"Conv_0" -> "Relu_0" [label="f32[1,4,8,8]"];' in dot
    assert '"in:x" -> "Conv_0"' in dot and '"MaxPool_0" -> "out:y";' in dot


def test_svg_needs_graphviz(tmp_path):
    dot = load_block().to_dot()
    if shutil.which("dot") is None:
        with pytest.raises(QirError, match="Graphviz"):
            render(dot, tmp_path / "m.svg", "svg")
    else:
        assert "<svg" in render(dot, tmp_path / "m.svg", "svg").read_text()


def test_golden_is_not_trivially_equal():
    # the golden text must change when the model does
    ir = load_block()
    ir.op("Conv_0").attrs["group"] = 1
    assert str(ir) != textwrap.dedent(GOLDEN)
