"""Both runtimes: agreement, captures, feed checks, freeing, errors that name the node."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import qir
from qir.errors import ExecutionError, InputError, NotFoundError, UnsupportedOpError
from qir.kinds import NodeKind
from qir.runtimes.base import get_runtime
from qir.runtimes.numpy_ref.interpreter import execution_plan

from ..conftest import REPO, model_from_text

DIGITS = REPO / "qir" / "examples" / "digits"


@pytest.fixture(scope="module")
def digits():
    return qir.load(DIGITS / "model.onnx")


def rel_err(a, b):
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-12))


def test_numpy_and_ort_agree_on_the_bundled_example(digits):
    images = np.load(DIGITS / "eval_images.npy")[:20]
    for x in images:
        a = qir.run(digits, {"input": x}, runtime="numpy")["logits"]
        b = qir.run(digits, {"input": x}, runtime="ort")["logits"]
        assert rel_err(a, b) <= 1e-4


def test_captures_are_keyed_by_value_name_even_for_inputs_weights_outputs(digits):
    x = np.load(DIGITS / "eval_images.npy")[0]
    names = ["relu2_out", "input", "fc.bias", "logits", "relu2_out"]
    got = {rt: qir.run(digits, {"input": x}, runtime=rt, capture=names) for rt in ("numpy", "ort")}
    for rt, out in got.items():
        assert list(out) == ["logits", "relu2_out", "input", "fc.bias"], rt
        np.testing.assert_array_equal(out["input"], x)
        np.testing.assert_array_equal(out["fc.bias"], digits.weight_array("fc.bias"))
    assert rel_err(got["numpy"]["relu2_out"], got["ort"]["relu2_out"]) <= 1e-5
    with pytest.raises(NotFoundError, match="did you mean 'relu2_out'"):
        qir.run(digits, {"input": x}, capture=["relu2_ot"])


def test_dead_values_are_freed_unless_kept(digits):
    keep = frozenset({"logits", "relu2_out"})
    steps = execution_plan(digits, keep, fold_batchnorm=False).steps
    freed = [v for s in steps for v in s.free]
    activations = {v.name for v in digits.values(NodeKind.ACTIVATION)}
    assert len(freed) == len(set(freed))
    assert set(freed) == activations - keep  # every other activation is dropped after its last reader


def test_batchnorm_folds_only_where_nothing_observes_the_conv_output(digits):
    x = np.load(DIGITS / "eval_images.npy")[5]
    folded = execution_plan(digits, frozenset({"logits"}), fold_batchnorm=True)
    assert not any(s.rec.op_type == "BatchNormalization" for s in folded.steps)
    # capturing conv1's output adds an unfolded conv1 that computes it; bn1 stays folded
    kept = execution_plan(digits, frozenset({"logits", "conv1_out"}), fold_batchnorm=True)
    assert not any(s.rec.op_type == "BatchNormalization" for s in kept.steps)
    assert [s.rec.name for s in kept.steps].count("conv1") == 2
    plain = get_runtime("numpy", fold_batchnorm=False).run(digits, {"input": x}, capture=["relu5_out", "conv1_out"])
    fast = get_runtime("numpy").run(digits, {"input": x}, capture=["relu5_out", "conv1_out"])
    alone = get_runtime("numpy").run(digits, {"input": x})
    for name in ("logits", "relu5_out"):
        assert rel_err(fast[name], plain[name]) <= 1e-5
    np.testing.assert_array_equal(fast["conv1_out"], plain["conv1_out"])  # the true conv output
    np.testing.assert_array_equal(fast["logits"], alone["logits"])  # captures never change results


@pytest.mark.parametrize("runtime", ["numpy", "ort"])
def test_feed_checks(digits, runtime):
    rt = get_runtime(runtime)
    x = np.zeros((1, 1, 8, 8), np.float64)  # float64 is converted
    assert rt.run(digits, {"input": x})["logits"].dtype == np.float32
    with pytest.raises(InputError, match="did you mean 'input'"):
        rt.run(digits, {"inputs": x})
    with pytest.raises(InputError, match="no data for model input"):
        rt.run(digits, {})
    with pytest.raises(InputError, match="expects float32, got int32"):
        rt.run(digits, {"input": x.astype(np.int32)})
    with pytest.raises(InputError, match="dimension 2 differs"):
        rt.run(digits, {"input": np.zeros((1, 1, 9, 8), np.float32)})


BROKEN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[5,2] y) {
    shape = Constant <value = int64[2] {5, 2}> ()
    y = Reshape(x, shape)
}
"""


def test_execution_errors_name_the_node():
    ir = qir.import_onnx(model_from_text(BROKEN), normalize=False)  # keep the bad Reshape
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ExecutionError, match=r"while executing node 'Reshape_0' \(Reshape\) on inputs "
                                             r"\(float32\[2, 3\], int64\[2\]\)"):
        qir.run(ir, {"x": x}, runtime="numpy")
    with pytest.raises(ExecutionError, match="Reshape_0"):
        qir.run(ir, {"x": x}, runtime="ort")


def test_ops_without_a_numpy_kernel_are_reported_before_running():
    node = helper.make_node("Gelu", ["x"], ["y"], name="g1", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    ir = qir.load(model)
    with pytest.raises(UnsupportedOpError, match=r"no kernel for com.microsoft::Gelu \(nodes g1\).*--runtime ort"):
        qir.run(ir, {"x": np.zeros(4, np.float32)}, runtime="numpy")
    assert qir.run(ir, {"x": np.zeros(4, np.float32)}, runtime="ort")["y"].shape == (4,)


def test_fake_quant_levels_in_the_numpy_runtime(digits):
    ir = digits.clone()
    cal = ir.insert_calibration("relu1_out", "relu1.cal", threshold=0.5)
    x = np.load(DIGITS / "eval_images.npy")[3]
    ref = qir.run(ir, {"input": x}, level="float", capture=["relu1_out~q", "relu1_out"])
    np.testing.assert_array_equal(ref["relu1_out~q"], ref["relu1_out"])
    q = qir.run(ir, {"input": x}, capture=["relu1_out~q", "relu1_out"])
    scale = np.float32(0.5) / np.float32(127)
    expected = np.clip(np.rint(q["relu1_out"] / scale), -128, 127) * scale
    np.testing.assert_array_equal(q["relu1_out~q"], expected.astype(np.float32))
    assert np.abs(q["relu1_out~q"]).max() <= 0.5 + 1e-6  # clipped at the threshold
    cal.mode = qir.CalibMode.FP16
    ir.touch()
    h = qir.run(ir, {"input": x}, capture=["relu1_out~q", "relu1_out"])
    np.testing.assert_array_equal(h["relu1_out~q"], h["relu1_out"].astype(np.float16).astype(np.float32))
    assert not np.array_equal(q["logits"], ref["logits"])  # quantization changed the result


@pytest.mark.parametrize("opset", [17, 18])
def test_min_max_equals_that_of_the_captured_values_at_every_rank(opset):
    """The in-graph reductions (row-wise for rank >= 2) give exactly the min and max of the full tensors."""
    import onnx.parser

    import qir
    from qir.runtimes.base import get_runtime

    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    ranks (float[2, 3, 4, 5] x) => (float d, float[6, 20] b) {{
        a = Neg(x)
        b = Flatten<axis = 2>(a)
        shape = Constant<value = int64[3] {{6, 4, 5}}>()
        c = Reshape(x, shape)
        e = Sin(c)
        d = ReduceMax<keepdims = 0>(e)
    }}
    """
    ir = qir.load(onnx.parser.parse_model(text))
    x = np.random.default_rng(opset).standard_normal((2, 3, 4, 5)).astype(np.float32)
    x[1, 2, 3, 4] = -9.5  # the largest |x| is negative
    rt = get_runtime("ort", level="float")
    values = ["x", "a", "b", "c", "e", "d"]
    got = rt.min_max(ir, {"x": x}, values)
    full = rt.run(ir, {"x": x}, capture=values)
    assert got == {v: (float(np.min(full[v])), float(np.max(full[v]))) for v in values}
    assert got["a"][1] == 9.5 and got["x"][0] == -9.5


@pytest.mark.parametrize("opset", [17, 18])
def test_global_average_pool_runs_as_reduce_mean_on_onnxruntime(opset):
    """With ``layout_stable`` (the engine's setting) qir writes GlobalAveragePool as ReduceMean
    for onnxruntime (one kernel whatever the layout; the engine's guard on PP-OCRv4 det fails
    without it): the same mean as the original op, and a session holding only the pool
    computes what the whole model computes."""
    import onnx.parser
    import onnxruntime as ort
    from onnx import numpy_helper

    from qir.io.onnx_export import export_onnx, export_subgraph
    from qir.runtimes.ort.backend import new_session
    from qir.runtimes.ort.lowering import lower_layout_stable

    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    se (float[1, 32, 24, 24] x) => (float[1, 32, 1, 1] y) {{
        c = Conv<pads = [1, 1, 1, 1]>(x, w)
        y = GlobalAveragePool(c)
    }}
    """
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(opset)
    model.graph.initializer.append(numpy_helper.from_array((rng.standard_normal((32, 32, 3, 3)) * 3).astype(np.float32), "w"))
    ir = qir.load(model)
    x = (rng.standard_normal((1, 32, 24, 24)) * 10 + 5).astype(np.float32)
    whole_model = export_onnx(ir, lower_op=lower_layout_stable)
    assert [n.op_type for n in whole_model.graph.node if n.op_type != "Constant"] == ["Conv", "ReduceMean"]
    whole = new_session(whole_model).run(["y"], {"x": x})[0]
    conv, pool = ir.producer("c"), ir.producer("y")
    c = new_session(export_subgraph(ir, [conv], ["x"], ["c"])).run(["c"], {"x": x})[0]
    part = new_session(export_subgraph(ir, [pool], ["c"], ["y"], lower_op=lower_layout_stable)).run(["y"], {"c": c})[0]
    assert np.array_equal(whole, part)
    assert np.array_equal(get_runtime("ort", layout_stable=True).run(ir, {"x": x})["y"], whole)
    assert not any(n.op_type == "ReduceMean" for n in export_onnx(ir).graph.node)  # by default, the model's own op
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    assert rel_err(whole, original) <= 1e-6


def test_a_thread_limit_holds_for_runtimes_made_before_it_and_ends_with_it():
    from qir.runtimes.ort.backend import OrtRuntime, thread_limit

    made_before, own = OrtRuntime(), OrtRuntime(threads=3)
    assert made_before.session_threads is None
    with thread_limit(1):
        assert made_before.session_threads == 1 and own.session_threads == 3  # (a runtime's own count wins)
        with thread_limit(None):
            assert made_before.session_threads == 1  # (no count: the enclosing limit stays)
        with thread_limit(2):
            assert made_before.session_threads == 2
        assert made_before.session_threads == 1
    assert made_before.session_threads is None


def test_the_engine_runs_as_many_calls_at_once_as_the_thread_limit_allows():
    from qir.runtimes.engine import Engine, EngineOptions
    from qir.runtimes.ort.backend import thread_limit

    from ..conftest import DIGITS_DATA, calibrate_for_nash_e

    ir = calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA, "max")
    with thread_limit(1):
        assert Engine(ir, DIGITS_DATA, EngineOptions(data_num=1, progress=False)).workers == 1
        assert Engine(ir, DIGITS_DATA, EngineOptions(data_num=1, threads=2, progress=False)).workers == 2  # (its own wins)
