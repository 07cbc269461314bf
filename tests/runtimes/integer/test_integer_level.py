"""The integer level on the digits example: what it computes against fake quantization, how it
follows the march profile, and its errors and reports."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import qir
from qir import once
from qir.kinds import CalibMode
from qir.runtimes.base import get_runtime
from qir.runtimes.integer import IntegerRuntime
from qir.runtimes.integer.interpreter import requant_targets
from qir.runtimes.integer.kernels import IntegerDtypeError
from qir.runtimes.integer.qtensor import params_of
from qir.runtimes.march import get_profile

from ...conftest import DIGITS


def _images(n: int = 40) -> np.ndarray:
    return np.load(DIGITS / "eval_images.npy")[:n].astype(np.float32)


def _outputs(ir, level: str, march: str | None = None, n: int = 40, capture=()) -> list[dict]:
    return [qir.run(ir, {"input": im}, level=level, march=march, capture=capture) for im in _images(n)]


def _cos(a, b) -> float:
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_integer_level_tracks_fake_quant_and_keeps_accuracy(digits_calibrated):
    labels = np.load(DIGITS / "eval_labels.npy")[:40]
    out = digits_calibrated.outputs[0]
    fq = np.array([o[out] for o in _outputs(digits_calibrated, "fakequant")]).reshape(40, -1)
    it = np.array([o[out] for o in _outputs(digits_calibrated, "integer", "nash-e")]).reshape(40, -1)
    assert _cos(fq, it) > 0.9999
    assert np.mean(it.argmax(1) == labels) >= np.mean(fq.argmax(1) == labels) - 0.05
    assert not np.array_equal(fq, it)  # requantization is not fake quantization


def test_every_quantized_value_is_on_its_grid(digits_calibrated):
    """Captured values of integer calibration nodes are exact multiples of their scale (codes)."""
    cals = [c for c in digits_calibrated.calibrations() if c.mode is CalibMode.INT8 and c.role.value == "activation"]
    got = _outputs(digits_calibrated, "integer", "nash-e", n=3, capture=[c.output for c in cals])
    for o in got:
        for c in cals:
            q = o[c.output] / params_of(c).scale
            assert np.allclose(q, np.rint(q), atol=1e-3), c.name
            assert q.min() >= -128.5 and q.max() <= 127.5


def test_nash_fuses_conv_add_into_the_accumulator(digits_calibrated):
    """nash-e's (Conv, Add) fusion: pw4 + the residual run as one accumulator, requantized into
    relu4's calibration node through the Relu; generic (no such fusion) adds in float."""
    rt = IntegerRuntime("nash-e")
    rt.run(digits_calibrated, {"input": _images(1)[0]})
    assert rt.last_stats.float_fallback == {}
    generic = IntegerRuntime("generic")
    generic.run(digits_calibrated, {"input": _images(1)[0]})
    assert list(generic.last_stats.float_fallback) == ["Add"]
    targets = requant_targets(digits_calibrated)
    assert targets["gap"].same_as(params_of(digits_calibrated.calibration("flatten_out_calib")))  # via Flatten
    assert targets["conv1"].same_as(params_of(digits_calibrated.calibration("relu1_out_calib")))  # via Relu


@pytest.mark.parametrize("node, mode", [("relu3_out_calib", "fp16"), ("pw4.weight_calib", "float"),
                                        ("relu3_out_calib", "float")])
def test_a_fused_conv_add_whose_conv_has_no_integer_input_runs_in_float(digits_calibrated, node, mode):
    """pw4 + add4 are one accumulator on nash-e; with pw4's input or weight not in an integer mode
    (a mixed-precision model, or an engine variant) the Conv runs in float, then the Add: what the
    two compute apart (a captured pw4_out is never fused). It once failed calling the float Conv
    with the Add's operand as a fourth input."""
    ir = digits_calibrated.clone()
    ir.set_calibration(node, mode=CalibMode(mode))
    feeds, out = {"input": _images(1)[0]}, digits_calibrated.outputs[0]
    rt = IntegerRuntime("nash-e")
    fused = rt.run(ir, feeds)
    if mode != "float" or node != "relu3_out_calib":  # (a float input is not a quantized op falling back)
        assert "pw4" in rt.last_stats.float_fallback["Conv"]
    apart = rt.run(ir, feeds, capture=["pw4_out"])
    assert np.array_equal(fused[out], apart[out])


@pytest.mark.parametrize("mode", ["fixed16", "fixed32"])
def test_fixed_point_requant_modes_stay_close_to_float(digits_calibrated, mode):
    out = digits_calibrated.outputs[0]
    prof = get_profile("nash-e").with_overrides(requant_mode=mode, high_precision_qpp=False)
    base = [o[out] for o in _outputs(digits_calibrated, "integer", "nash-e", n=10)]
    fixed = [IntegerRuntime(prof).run(digits_calibrated, {"input": im})[out] for im in _images(10)]
    assert _cos(base, fixed) > 0.999
    assert not all(np.array_equal(a, b) for a, b in zip(base, fixed))


def test_int16_activations_reduce_the_error(digits_calibrated):
    ir = digits_calibrated.clone()
    for c in ir.calibrations():
        if c.role.value == "activation":
            ir.set_calibration(c.name, mode="int16")
    out = ir.outputs[0]
    ref = [o[out] for o in _outputs(ir, "float", n=10)]
    e16 = [o[out] for o in _outputs(ir, "integer", "nash-e", n=10)]
    e8 = [o[out] for o in _outputs(digits_calibrated, "integer", "nash-e", n=10)]
    assert _cos(ref, e16) > _cos(ref, e8)


def test_a_dtype_pair_the_march_forbids_names_node_and_pair(digits_calibrated):
    ir = digits_calibrated.clone()
    ir.set_calibration("conv2.weight_calib", mode="int16")  # int8 activation x int16 weight
    with pytest.raises(IntegerDtypeError, match=r"conv2.*int8 × int16.*nash-e"):
        qir.run(ir, {"input": _images(1)[0]}, level="integer", march="nash-e")
    qir.run(ir, {"input": _images(1)[0]}, level="integer", march="generic")  # generic allows it


def test_accumulator_overflow_is_counted_and_handled_as_the_profile_says(digits_calibrated, caplog):
    ir = digits_calibrated.clone()
    for c in ir.calibrations():
        ir.set_calibration(c.name, mode="int16")
    feed = {"input": _images(1)[0]}
    narrow = get_profile("nash-e").with_overrides(acc_bits=16, acc_overflow="saturate")
    rt = IntegerRuntime(narrow)
    with caplog.at_level(logging.WARNING):
        saturated = rt.run(ir, feed)[ir.outputs[0]]
    assert rt.last_stats.overflows and all(n in {r.name for r in ir.ops()} for n in rt.last_stats.overflows)
    assert "accumulator overflow past 16 bits" in caplog.text
    exact = IntegerRuntime(narrow.with_overrides(acc_overflow="ignore")).run(ir, feed)[ir.outputs[0]]
    assert not np.array_equal(saturated, exact)


def test_ops_without_an_integer_kernel_run_in_float_with_one_warning(digits_calibrated, caplog):
    prof = get_profile("nash-e").with_overrides(integer_ops=("Conv",))
    with caplog.at_level(logging.WARNING):
        rt = IntegerRuntime(prof)
        rt.run(digits_calibrated, {"input": _images(1)[0]})
        rt.run(digits_calibrated, {"input": _images(2)[1]})
    assert set(rt.last_stats.float_fallback) == {"Gemm", "GlobalAveragePool", "MaxPool", "Relu"}
    assert caplog.text.count("ran in float") == 1


def test_levels_and_runtimes_are_checked():
    with pytest.raises(qir.errors.InputError, match="integer level only"):
        get_runtime("numpy", level="fakequant", march="nash-e")
    with pytest.raises(qir.errors.InputError, match="numpy runtime"):
        get_runtime("ort", level="integer")
    assert isinstance(get_runtime("numpy", level="integer", march="ort"), IntegerRuntime)


def _split_concat_block():
    """x -> Conv -> Sigmoid·Mul (SiLU) -> Split -> [a, b]; b -> Conv -> Add(b, .) ; Concat(a, b, add)
    -> Conv: the shape of YOLOv8's C2f block, where the SiLU's Mul and the Add are read only
    through Split/Concat (insert-calibration leaves shape ops' inputs unquantized)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)

    def w(name, co, ci):
        return numpy_helper.from_array((rng.standard_normal((co, ci, 1, 1)) * 0.4).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"]), helper.make_node("Sigmoid", ["c0"], ["s0"]),
             helper.make_node("Mul", ["c0", "s0"], ["m0"]),
             helper.make_node("Split", ["m0", "sizes"], ["a", "b"], axis=1),
             helper.make_node("Conv", ["b", "w1"], ["c1"]), helper.make_node("Add", ["b", "c1"], ["add"]),
             helper.make_node("Concat", ["a", "b", "add"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"])]
    init = [w("w0", 8, 3), w("w1", 4, 4), w("w2", 5, 12),
            numpy_helper.from_array(np.array([4, 4], np.int64), "sizes")]
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    from qir.passes import PassManager, get_pass
    ir = qir.load(model)
    PassManager("insert-calibration{march=nash-e}").run(ir)
    feeds = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(8)]
    get_pass("calibrate", data=feeds, method="max", progress=False)(ir)
    return ir, feeds


def test_values_read_through_split_and_concat_are_requantized_into_a_shared_scale():
    ir, feeds = _split_concat_block()
    targets = requant_targets(ir)
    concat_params = params_of(next(c for c in ir.calibrations() if c.input == "cat"))
    mul = next(r.name for r in ir.ops() if r.op_type == "Mul")
    add = next(r.name for r in ir.ops() if r.op_type == "Add")
    concat = next(r.name for r in ir.ops() if r.op_type == "Concat")
    # the Add reaches only the Concat's quantizer; the Concat requantizes into it
    assert targets[add].same_as(concat_params) and targets[concat].same_as(concat_params)
    # the Mul reaches the Conv input quantizer of b and the Concat's: the widest range of the two
    b_params = params_of(next(c for c in ir.calibrations() if c.input == "b"))
    widest = max((b_params, concat_params), key=lambda p: float(p.scale) * (p.qrange[1] - p.qrange[0]))
    assert targets[mul].same_as(widest)
    rt = IntegerRuntime("nash-e")
    got = [rt.run(ir, f)["y"] for f in feeds]
    assert not rt.last_stats.float_fallback  # every op computed on codes
    fq = [qir.run(ir, f, level="fakequant")["y"] for f in feeds]
    assert min(_cos(a, b) for a, b in zip(got, fq)) > 0.99


def test_a_constant_operand_of_an_add_is_quantized_like_a_calibrated_one():
    """HardSwish as exported (``x·clip(x + 3, 0, 6)/6``): the ``+ 3`` reads a constant, which an
    NPU holds as codes like any operand; the Add must not fall back to float."""
    from onnx import TensorProto, helper, numpy_helper

    from qir.passes import PassManager, get_pass
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Add", ["c", "three"], ["p"]),
             helper.make_node("Clip", ["p", "zero", "six"], ["r"]), helper.make_node("Mul", ["c", "r"], ["m"]),
             helper.make_node("Conv", ["m", "w2"], ["y"])]
    init = [numpy_helper.from_array((rng.standard_normal((4, 3, 1, 1)) * 0.5).astype(np.float32), "w"),
            numpy_helper.from_array((rng.standard_normal((2, 4, 1, 1)) * 0.5).astype(np.float32), "w2"),
            *(numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("three", 3), ("zero", 0), ("six", 6)))]
    graph = helper.make_graph(nodes, "hswish", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    ir = qir.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    PassManager("insert-calibration{march=nash-e}").run(ir)
    feeds = [{"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)} for _ in range(6)]
    get_pass("calibrate", data=feeds, method="max", progress=False)(ir)
    rt = IntegerRuntime("nash-e")
    got = [rt.run(ir, f)["y"] for f in feeds]
    assert "Add" not in rt.last_stats.float_fallback
    fq = [qir.run(ir, f, level="fakequant")["y"] for f in feeds]
    assert min(_cos(a, b) for a, b in zip(got, fq)) > 0.999  # the scalar 3 is exact: code 127 at 3/127


def test_a_clip_into_a_finer_scale_cuts_at_the_bound_on_the_output_grid():
    """``clip(x, 0, 6)`` read at step 0.65 and quantized at step 6/127: clamping the input codes
    would cut at 9·0.65 = 5.85 (3 output steps short of 6); the integer level rescales first."""
    from onnx import TensorProto, helper, numpy_helper

    from qir.passes import PassManager
    nodes = [helper.make_node("Clip", ["x", "zero", "six"], ["c"]), helper.make_node("Conv", ["c", "w"], ["y"])]
    init = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("zero", 0), ("six", 6))]
    init.append(numpy_helper.from_array(np.ones((1, 1, 1, 1), np.float32), "w"))
    graph = helper.make_graph(nodes, "clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    ir = qir.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    PassManager("insert-calibration{march=nash-e}").run(ir)
    x_cal, c_cal = (next(c.name for c in ir.calibrations() if c.input == v) for v in ("x", "c"))
    ir.set_calibration(x_cal, threshold=np.float32(0.65 * 127))
    ir.set_calibration(c_cal, threshold=np.float32(6.0))
    ir.set_calibration(next(c.name for c in ir.calibrations("weight")), threshold=np.float32(1.0))
    feed = {"x": np.linspace(-5, 20, 64, dtype=np.float32).reshape(1, 1, 1, 64)}
    out = ir.calibration(c_cal).output
    got = IntegerRuntime("nash-e").run(ir, feed, capture=[out])[out]
    want = qir.run(ir, feed, level="fakequant", capture=[out])[out]
    assert float(got.max()) == pytest.approx(6.0)
    assert np.abs(got - want).max() <= 6.0 / 127 + 1e-6  # one output step at most


def test_a_bias_past_31_bits_follows_the_accumulator_rule(digits_calibrated):
    """Dual int16 makes ``s_x·s_w`` tiny, so a bias can take more than 31 bits in accumulator units:
    where the profile keeps the exact sum (nash-e: ``warn``), the bias is exact too and the integer
    level tracks fake quantization; where it saturates, the bias saturates with the sum."""
    ir = digits_calibrated.clone()
    for c in ir.calibrations():
        ir.set_calibration(c.name, mode="int16")
    conv = ir.op("conv2")
    bias_name = conv.inputs[2]
    ir.set_weight(bias_name, ir.weight_array(bias_name) * 8)  # a larger bias: 8x, past 2^31 in accumulator units
    x_scale = float(np.max(params_of(ir.producer(conv.inputs[0])).scale))
    w_scale = np.asarray(params_of(ir.producer(conv.inputs[1])).scale, np.float64).reshape(-1)
    assert float(np.max(np.abs(ir.weight_array(bias_name)) / (x_scale * w_scale))) > 2 ** 31
    profile = get_profile("nash-e")
    assert profile.acc_overflow == "warn"
    feeds = [{"input": im} for im in _images(5)]
    out = ir.outputs[0]
    fq = [qir.run(ir, f)[out] for f in feeds]
    exact = [IntegerRuntime(profile).run(ir, f)[out] for f in feeds]
    assert _cos(fq, exact) > 0.99999
    saturating = IntegerRuntime(profile.with_overrides(acc_overflow="saturate"))
    assert _cos(fq, [saturating.run(ir, f)[out] for f in feeds]) < _cos(fq, exact) - 1e-6


def test_overflows_in_nodes_already_reported_are_not_reported_again(caplog, monkeypatch):
    """Runs of one model on many samples overflow in about the same nodes, each sample a few of
    its own: a run warns only when a node overflows that no run reported before."""
    from collections import Counter

    from qir.runtimes.integer import interpreter
    from qir.runtimes.integer.arithmetic import Arithmetic

    once.forget(interpreter.REPORTED)
    warned = []
    for nodes in (["conv1", "conv2"], ["conv1"], ["conv2", "fc"], ["fc", "conv1"]):  # a sample's overflowing nodes
        arith = Arithmetic(get_profile("nash-e"))
        arith.stats.overflows = Counter(nodes)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            interpreter.IntegerRuntime.warn_once(arith)
        warned.append([r.getMessage() for r in caplog.records if "accumulator overflow" in r.getMessage()])
    assert [len(w) for w in warned] == [1, 0, 1, 0] and "fc" in warned[2][0]
