"""Float ops on one quantized value computed once per code (:mod:`qir.runtimes.integer.coded`):
the gathered tensor is, bit for bit, what the op computes element by element."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qir.io.onnx_import import import_onnx
from qir.kinds import CalibMode
from qir.runtimes.integer import IntegerRuntime
from qir.runtimes.integer.coded import TABLE_OPS, coded_op
from qir.runtimes.integer.qtensor import Coded, QParams, QTensor, dequantize
from qir.runtimes.numpy_ref.registry import lookup

from ...conftest import calibrate_for_nash_e

#: The binary ops' second input (a constant of one element).
_SECOND = {"Pow": np.float32(2.0), "Div": np.float32(1.4142135), "Sub": np.float32(0.25), "Max": np.float32(-0.5),
          "Min": np.float32(0.5), "Add": np.float32(1.0), "Mul": np.float32(0.5)}


def _quantized(mode: CalibMode, shape, seed: int = 0, scale: float = 0.013) -> QTensor:
    low, high = {CalibMode.INT8: (-128, 127), CalibMode.INT16: (-32768, 32767)}[mode]
    codes = np.random.default_rng(seed).integers(low, high + 1, size=shape).astype(np.float32)
    return QTensor(codes, QParams(mode, np.asarray(np.float32(scale)), np.zeros((), np.int64)))


@pytest.mark.parametrize("op_type", sorted(TABLE_OPS))
@pytest.mark.parametrize("mode, shape", [(CalibMode.INT8, (3, 7, 61)), (CalibMode.INT16, (5, 211, 139))],
                         ids=["int8", "int16"])
def test_every_table_op_gives_the_tensor_it_computes_element_by_element(op_type, mode, shape):
    spec = lookup(op_type)
    assert spec is not None, op_type
    q = _quantized(mode, shape)
    args = [q, _SECOND[op_type]] if op_type in _SECOND else [q]
    kwargs = {"_opset": 17} if "_opset" in spec.context else {}
    with np.errstate(all="ignore"):
        expected = spec.fn(*[dequantize(a) if isinstance(a, QTensor) else np.asarray(a) for a in args], **kwargs)
        got = coded_op(spec.fn, [a if isinstance(a, QTensor) else np.asarray(a) for a in args], kwargs)
    assert isinstance(got, Coded) and got.codes is q.codes
    tensor = got.materialize()
    assert tensor.dtype == expected.dtype and np.array_equal(tensor, expected, equal_nan=True)


def test_two_values_of_one_code_array_combine_and_anything_else_declines():
    q = _quantized(CalibMode.INT8, (4, 300))
    half = coded_op(np.multiply, [q, np.asarray(np.float32(0.5))], {})
    both = coded_op(np.multiply, [q, half], {})  # (x * 0.5x: GELU's last Mul reads x and the chain)
    x = q.dequantize()
    assert np.array_equal(both.materialize(), x * (x * np.float32(0.5)))
    other = _quantized(CalibMode.INT8, (4, 300), seed=1)
    assert coded_op(np.add, [q, other], {}) is None  # two code arrays
    assert coded_op(np.add, [q, np.ones(300, np.float32)], {}) is None  # a constant of many elements
    per_channel = QTensor(q.codes, QParams(CalibMode.INT8, np.full(4, 0.01, np.float32), np.zeros(4, np.int64), axis=0))
    assert coded_op(np.negative, [per_channel], {}) is None
    small = _quantized(CalibMode.INT16, (10, 10))
    assert coded_op(np.negative, [small], {}) is None  # 65536 entries for 100 elements: not worth it


def _gelu_block(tokens: int = 197, width: int = 96):
    """MatMul -> GELU as torch exports it (Div, Erf, Add, Mul, Mul) -> MatMul."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((width, 2 * width)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((2 * width, width)) * 0.2).astype(np.float32), "w2")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Div", ["h", "sqrt2"], ["d"], name="gelu/Div"),
             helper.make_node("Erf", ["d"], ["e"], name="gelu/Erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="gelu/Add"),
             helper.make_node("Mul", ["h", "a"], ["m"], name="gelu/Mul"),
             helper.make_node("Mul", ["m", "half"], ["g"], name="gelu/Mul_1"),
             helper.make_node("MatMul", ["g", "w2"], ["y"], name="fc2")]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, tokens, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, tokens, width])],
                              initializer=[w1, w2, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = [{"x": rng.standard_normal((1, tokens, width)).astype(np.float32)} for _ in range(3)]
    return import_onnx(model), data


@pytest.mark.parametrize("mode", ["int8", "int16"])
def test_a_gelu_chain_runs_per_code_with_the_same_bits_and_the_same_report(monkeypatch, mode):
    from qir.runtimes.integer import interpreter

    ir, data = _gelu_block(tokens=720 if mode == "int16" else 197)  # (an int16 table: 65536 entries, for 138240)
    calibrate_for_nash_e(ir, data)
    for c in ir.calibrations("activation"):
        ir.set_calibration(c.name, mode=CalibMode(mode))
    capture = [c.output for c in ir.calibrations("activation")]
    runs = {}
    for name, ops in (("per code", TABLE_OPS), ("per element", frozenset())):
        monkeypatch.setattr(interpreter, "TABLE_OPS", ops)
        rt = IntegerRuntime("nash-e")
        runs[name] = [(rt.run(ir, s, capture=capture), rt.last_stats) for s in data]
    for (a, stats_a), (b, stats_b) in zip(runs["per code"], runs["per element"]):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        assert stats_a.float_fallback == stats_b.float_fallback and stats_a.float_composite == stats_b.float_composite


@pytest.mark.parametrize("mode", ["int8", "int16"])
def test_the_gelu_chain_takes_the_table_path(monkeypatch, mode):
    """(So that the comparison above compares two paths.)"""
    from qir.runtimes.integer import interpreter

    ir, data = _gelu_block(tokens=720 if mode == "int16" else 197)
    calibrate_for_nash_e(ir, data)
    for c in ir.calibrations("activation"):
        ir.set_calibration(c.name, mode=CalibMode(mode))
    made = []
    real = interpreter.coded_op
    monkeypatch.setattr(interpreter, "coded_op", lambda *a: made.append(real(*a)) or made[-1])
    IntegerRuntime("nash-e").run(ir, data[0])
    assert sum(isinstance(m, Coded) for m in made) >= 3  # Erf, Add and the Muls at least
