"""qir.backend: ONNX's Backend interface over qir.load and the runtimes, and what
qir.runtimes.support refuses before anything runs."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.reference
import pytest
from onnx import TensorProto, helper, numpy_helper

from qir.backend import NumpyBackend, OrtBackend, QirBackend, backend_for
from qir.errors import InputError, UnsupportedOpError

BACKENDS = [NumpyBackend, OrtBackend]


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem=TensorProto.FLOAT, shape=(2, 3)):
    return helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_model_returns_outputs_in_model_order(backend, rng):
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"])],
                   [_vi("x")], [_vi("n"), _vi("r")])
    x = rng.standard_normal((2, 3)).astype(np.float32)
    n, r = backend.run_model(model, [x])
    np.testing.assert_array_equal(n, -x)
    np.testing.assert_array_equal(r, np.maximum(x, 0))
    assert backend.prepare(model).run({"x": x})[1].tolist() == r.tolist()  # a mapping by name too


@pytest.mark.parametrize("backend", BACKENDS)
def test_object_arrays_and_tensor_protos_become_the_declared_type(backend):
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
                   [_vi("x", TensorProto.INT32)], [_vi("y")])
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=object)
    (y,) = backend.run_model(model, [x])
    assert y.dtype == np.float32 and y.tolist() == [[1, 2, 3], [4, 5, 6]]
    (y,) = backend.run_model(model, [numpy_helper.from_array(np.ones((2, 3), np.int32))])
    assert y.tolist() == [[1.0] * 3] * 2
    with pytest.raises(InputError, match="input 'x' expects int32; the object array given does not convert"):
        backend.run_model(model, [np.array([["a"] * 3] * 2, dtype=object)])


def test_inputs_are_counted_and_devices_checked():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x")], [_vi("y")])
    with pytest.raises(InputError, match="the model takes 1 inputs \\['x'\\], 2 were given"):
        NumpyBackend.run_model(model, [np.zeros((2, 3), np.float32)] * 2)
    assert QirBackend.supports_device("CPU") and not QirBackend.supports_device("CUDA")
    with pytest.raises(InputError, match="device 'CUDA' is not supported"):
        NumpyBackend.prepare(model, "CUDA")
    with pytest.raises(NotImplementedError, match="wrap the node in a model"):
        NumpyBackend.run_node(model.graph.node[0], [np.zeros((2, 3), np.float32)])
    assert backend_for("ort") is OrtBackend
    with pytest.raises(InputError, match="no qir backend for runtime 'tpu'"):
        backend_for("tpu")


def _dropout(training) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.array(0.5, np.float32), "ratio")]
    inputs = [_vi("x")]
    if training is None:
        inputs.append(helper.make_tensor_value_info("mode", TensorProto.BOOL, []))
    else:
        inits.append(numpy_helper.from_array(np.array(training), "mode"))
    node = helper.make_node("Dropout", ["x", "ratio", "mode"], ["y"], name="drop", seed=0)
    return _model([node], inputs, [_vi("y")], inits, opset=13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_modes_are_refused_before_running(backend):
    for training, why in ((True, "is true"), (None, "is not a constant")):
        with pytest.raises(UnsupportedOpError, match=f"'drop' \\(Dropout\\): the training_mode input {why}"):
            backend.prepare(_dropout(training))
    x = np.ones((2, 3), np.float32)
    assert backend.run_model(_dropout(False), [x])[0].tolist() == x.tolist()  # inference: the identity
    bn = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn", training_mode=1)
    inits = [numpy_helper.from_array(np.ones(3, np.float32), n) for n in "sbmv"]
    with pytest.raises(UnsupportedOpError, match="'bn' \\(BatchNormalization\\): attribute training_mode=1"):
        backend.prepare(_model([bn], [_vi("x", shape=(2, 3, 4))], [_vi("y", shape=(2, 3, 4))], inits, opset=15))


@pytest.mark.parametrize("backend", BACKENDS)
def test_narrow_types_cross_the_boundary_and_cast_as_onnx_says(backend):
    """bfloat16 / float8 graph inputs and outputs (ml_dtypes arrays) go through both runtimes;
    float8 casts saturate as ONNX's reference does."""
    import ml_dtypes

    x = np.array([[1.0, -2.5, 3.1], [448.0, 1e6, -1e6]], np.float32)
    for to, dtype in ((TensorProto.BFLOAT16, ml_dtypes.bfloat16), (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn)):
        model = _model([helper.make_node("Cast", ["x"], ["y"], to=to)], [_vi("x")], [_vi("y", to)], opset=19)
        (y,) = backend.run_model(model, [x])
        want = onnx.reference.ReferenceEvaluator(model).run(None, {"x": x})[0]
        assert y.dtype == dtype and np.array_equal(y.astype(np.float32), want.astype(np.float32))
        back = _model([helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)], [_vi("y", to)], [_vi("z")], opset=19)
        assert np.array_equal(backend.run_model(back, [y])[0], y.astype(np.float32))
    assert backend.run_model(model, [x])[0].astype(np.float32)[1].tolist() == [448.0, 448.0, -448.0]  # saturated


@pytest.mark.parametrize("backend", BACKENDS)
def test_unsupported_types_and_ops_are_refused_naming_them(backend):
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.COMPLEX64)], [_vi("x")],
                   [_vi("y", TensorProto.COMPLEX64)])
    with pytest.raises(UnsupportedOpError, match="value 'y' has element type complex64"):
        backend.prepare(model)
    dft = helper.make_node("DFT", ["x"], ["y"], name="fft")
    model = _model([dft], [_vi("x", shape=(1, 8, 1))], [_vi("y", shape=(1, 8, 2))], opset=17)
    with pytest.raises(UnsupportedOpError, match="'fft' \\(DFT\\): qir does not run DFT: signal processing"):
        backend.prepare(model)


def test_numpy_computes_narrow_types_only_in_casts():
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", TensorProto.BFLOAT16)],
                   [_vi("y", TensorProto.BFLOAT16)])
    with pytest.raises(UnsupportedOpError, match="node 'r' \\(Relu\\) reads or writes 'x' of type bfloat16"):
        NumpyBackend.prepare(model)


def test_numpy_refuses_an_op_without_a_kernel_in_prepare():
    model = _model([helper.make_node("Det", ["x"], ["y"], name="det")], [_vi("x", shape=(3, 3))], [_vi("y", shape=())])
    with pytest.raises(UnsupportedOpError, match="no kernel for Det \\(nodes det\\); run this model with the ort"):
        NumpyBackend.prepare(model)
    assert OrtBackend.run_model(model, [np.eye(3, dtype=np.float32)])[0] == pytest.approx(1.0)


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
def test_qir_run_refuses_before_running_too(runtime):
    """The runtimes apply the same checks when they build their plan or session."""
    import qir

    with pytest.raises(UnsupportedOpError, match="'drop' \\(Dropout\\): the training_mode input is true"):
        qir.run(qir.load(_dropout(True)), {"x": np.ones((2, 3), np.float32)}, runtime=runtime)
