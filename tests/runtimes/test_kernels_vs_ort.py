"""Every numpy reference kernel against onnxruntime, one single-node ONNX model per case.

Each case builds a one-node model with ``onnx.helper`` (all inputs are graph inputs, so
onnxruntime runs its general dynamic-shape path), runs it with onnxruntime (CPU, graph
optimisations disabled) as the oracle, runs the kernel directly through the registry, and
compares shapes, dtypes and values: float outputs by max|a - b| / max(max|b|, tiny) <= tol
(tol = 0 means bit-exact), integer and bool outputs exactly. Kernel inputs are passed as
read-only copies, and the caller's arrays are checked unchanged afterwards.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qir.runtimes.numpy_ref import registry
from qir.runtimes.numpy_ref.kernels import conv as conv_mod
from qir.runtimes.numpy_ref.registry import lookup, registered_op_types

RNG = np.random.default_rng(20240607)
F32 = np.float32
I64 = np.int64


def r(*shape, lo=None, hi=None, dtype=F32):
    """Seeded random normal (or uniform in [lo, hi)) array."""
    if lo is not None:
        return RNG.uniform(lo, hi, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def ri(*shape, lo=-5, hi=5, dtype=I64):
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def i64(*v):
    return np.array(v, dtype=I64)


def f32(*v):
    return np.array(v, dtype=F32)


@dataclass
class Case:
    op: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    opset: int = 17
    n_out: int = 1
    tol: float = 1e-4
    id: str = ""

    def __str__(self):
        return self.id or self.op


def C(op, inputs, attrs=None, opset=17, n_out=1, tol=1e-4, id=""):
    return pytest.param(Case(op, inputs, attrs or {}, opset, n_out, tol, id), id=f"{op}-{id}" if id else op)


# ----------------------------------------------------------------------------------------
# the harness
# ----------------------------------------------------------------------------------------


def _onnx_attr_value(v):
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    return v


def run_ort(case: Case):
    names = [f"in{k}" if x is not None else "" for k, x in enumerate(case.inputs)]
    while names and names[-1] == "":
        names.pop()
    outs = [f"out{k}" for k in range(case.n_out)]
    attrs = {k: _onnx_attr_value(v) for k, v in case.attrs.items()}
    node = helper.make_node(case.op, names, outs, **attrs)
    g_inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, case.inputs)
        if n
    ]
    g_outputs = [onnx.ValueInfoProto(name=o) for o in outs]
    graph = helper.make_graph([node], "single_node", g_inputs, g_outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", case.opset)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {n: x for n, x in zip(names, case.inputs) if n})


def run_kernel(case: Case):
    spec = lookup(case.op)
    assert spec is not None, f"no numpy kernel for {case.op}"
    inputs = []
    for x in case.inputs:
        if x is None:
            inputs.append(None)
        else:
            c = np.array(x, copy=True)
            c.setflags(write=False)
            inputs.append(c)
    ctx = {}
    if "_opset" in spec.context:
        ctx["_opset"] = case.opset
    if "_num_outputs" in spec.context:
        ctx["_num_outputs"] = case.n_out
    out = spec.fn(*inputs, **case.attrs, **ctx)
    return list(out) if isinstance(out, tuple) else [out]


def assert_close(got, want, tol, what=""):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "fc" and tol > 0:
        nan_g, nan_w = np.isnan(got), np.isnan(want)
        assert np.array_equal(nan_g, nan_w), f"{what}: NaN positions differ"
        ok = ~nan_w
        if not ok.any():
            return
        g, w = got[ok].astype(np.float64), want[ok].astype(np.float64)
        inf = np.isinf(w)
        assert np.array_equal(g[inf], w[inf]), f"{what}: infinities differ"
        g, w = g[~inf], w[~inf]
        if w.size == 0:
            return
        err = np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30)
        assert err <= tol, f"{what}: relative error {err:.3g} > {tol:g}"
    else:
        assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), f"{what}: values differ\n{got}\n!=\n{want}"


def _spec_differs_from_ort(case: Case) -> bool:
    """Resize with align_corners and a scales input whose s L is not whole on some axis:
    onnxruntime divides by the rounded output length, ONNX (and the kernel) by s L."""
    if case.op != "Resize" or case.opset < 11 or case.attrs.get("coordinate_transformation_mode") != "align_corners":
        return False
    scales = case.inputs[2] if len(case.inputs) > 2 else None
    if scales is None or scales.size == 0:
        return False
    resized = scales.astype(np.float64) * np.array(case.inputs[0].shape)
    return bool(np.any(resized != np.floor(resized)))


def run_reference(case: Case):
    """ONNX's reference implementation of the case's node."""
    from onnx.reference import ReferenceEvaluator

    names = [f"in{k}" if x is not None else "" for k, x in enumerate(case.inputs)]
    node = helper.make_node(case.op, names, [f"out{k}" for k in range(case.n_out)],
                            **{k: _onnx_attr_value(v) for k, v in case.attrs.items()})
    return ReferenceEvaluator(node).run(None, {n: x for n, x in zip(names, case.inputs) if n})


def check(case: Case):
    originals = [None if x is None else np.array(x, copy=True) for x in case.inputs]
    want = run_reference(case) if _spec_differs_from_ort(case) else run_ort(case)
    got = run_kernel(case)
    assert len(got) == len(want), f"{len(got)} outputs, onnxruntime gave {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, case.tol, f"{case} output {k}")
    for x, o in zip(case.inputs, originals):
        if x is not None:
            assert np.array_equal(x, o, equal_nan=True), "kernel modified an input"


# ----------------------------------------------------------------------------------------
# registration
# ----------------------------------------------------------------------------------------

REQUIRED_OPS = """
Conv ConvTranspose Gemm MatMul Add Sub Mul Div Pow Sqrt Exp Log Neg Abs Reciprocal Relu LeakyRelu
PRelu Sigmoid Tanh HardSigmoid HardSwish Clip Erf Gelu Softmax LogSoftmax MaxPool AveragePool
GlobalAveragePool GlobalMaxPool BatchNormalization LayerNormalization InstanceNormalization Resize
Concat Split Slice Reshape Transpose Flatten Squeeze Unsqueeze Gather Expand Tile Pad Shape Cast Where
Equal Greater Less ReduceMean ReduceSum ReduceMax ArgMax TopK Identity Constant ConstantOfShape Range
DepthToSpace
""".split()

EXTRA_OPS = """
Min Max Sum Mean Floor Ceil Round Not And Or GreaterOrEqual LessOrEqual Softplus Elu Selu Mish
SpaceToDepth GroupNormalization ReduceMin ReduceProd ReduceL2 ArgMin Sign Sin Cos Einsum GatherElements ScatterND NonZero
Hardmax Dropout Size
""".split()


def test_required_ops_registered():
    missing = sorted(set(REQUIRED_OPS) - set(registered_op_types()))
    assert not missing, f"missing kernels: {missing}"


def test_extra_ops_registered():
    missing = sorted(set(EXTRA_OPS) - set(registered_op_types()))
    assert not missing, f"missing kernels: {missing}"


def test_lookup_ai_onnx_domain_alias():
    assert lookup("Conv", "ai.onnx") is lookup("Conv")
    assert lookup("NoSuchOp") is None
    assert registry.lookup("Conv").fn is conv_mod.conv


# ----------------------------------------------------------------------------------------
# elementwise
# ----------------------------------------------------------------------------------------

ELEMENTWISE = [
    C("Add", [r(3, 4, 5), r(4, 1)], tol=0, id="broadcast"),
    C("Add", [r(2, 3), np.array(1.5, F32)], tol=0, id="scalar"),
    C("Add", [ri(4, 5), ri(5)], id="int64"),
    C("Sub", [r(2, 1, 4), r(3, 1)], tol=0, id="broadcast-both"),
    C("Mul", [r(2, 3, 4), r(1, 3, 1)], tol=0),
    C("Div", [r(3, 4), r(4, lo=0.5, hi=2)], tol=0),
    C("Div", [i64(7, -7, 7, -7, 0, 9, -9, 1), i64(2, 2, -2, -2, 3, 4, 4, -3)], id="int64-trunc"),
    C("Div", [ri(5, 6, lo=-100, hi=100, dtype=np.int32), ri(6, lo=1, hi=9, dtype=np.int32)], id="int32"),
    C("Div", [ri(4, 4, lo=0, hi=200, dtype=np.uint8), ri(4, lo=1, hi=9, dtype=np.uint8)], id="uint8"),
    C("Mod", [i64(7, -7, 7, -7, 0, 13), i64(3, 3, -3, -3, 5, 4)], id="int-sign-of-divisor"),
    C("Mod", [i64(7, -7, 7, -7), i64(3, 3, -3, -3)], {"fmod": 1}, id="int-fmod"),
    C("Mod", [r(10), r(10, lo=0.5, hi=2)], {"fmod": 1}, id="float-fmod"),
    C("Pow", [r(3, 4, lo=0.1, hi=3), r(3, 4, lo=-2, hi=2)]),
    C("Pow", [r(3, 4), np.array(2.0, F32)], id="square"),
    C("Pow", [r(3, 4), np.array(3, I64)], opset=15, id="int-exponent"),
    C("Pow", [r(5, lo=0.5, hi=2), np.array(0.5, F32)], id="sqrt"),
    C("Min", [r(2, 3), r(3), r(1, 1)], tol=0, id="variadic"),
    C("Max", [r(2, 3), r(3), r(1, 1)], tol=0, id="variadic"),
    C("Max", [r(4)], tol=0, id="single"),
    C("Sum", [r(2, 3), r(3), r(2, 1)], tol=1e-6, id="variadic"),
    C("Mean", [r(2, 3), r(3), r(2, 1)], tol=1e-6, id="variadic"),
    C("Sqrt", [r(4, 5, lo=0, hi=10)], tol=0),
    C("Exp", [r(4, 5, lo=-20, hi=20)], tol=1e-6),
    C("Log", [r(4, 5, lo=1e-3, hi=100)], tol=1e-6),
    C("Neg", [r(4, 5)], tol=0),
    C("Neg", [ri(4, 5, dtype=np.int32)], id="int32"),
    C("Abs", [r(4, 5)], tol=0),
    C("Abs", [ri(4, 5)], id="int64"),
    C("Reciprocal", [r(4, 5, lo=0.1, hi=3)], tol=0),
    C("Floor", [f32(-1.5, -0.5, 0.0, 0.5, 1.5, 2.7, -2.7)], tol=0),
    C("Ceil", [f32(-1.5, -0.5, 0.0, 0.5, 1.5, 2.7, -2.7)], tol=0),
    C("Round", [f32(-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, 2.51, -2.51)], tol=0, id="ties-to-even"),
    C("Sign", [f32(-2.0, 0.0, 3.0, -0.0)], tol=0),
    C("Sin", [r(20, lo=-10, hi=10)], tol=1e-6),
    C("Cos", [r(20, lo=-10, hi=10)], tol=1e-6),
    C("Tan", [r(20, lo=-1.5, hi=1.5)], tol=1e-6),
    C("Asin", [r(20, lo=-1, hi=1)], tol=1e-6),
    C("Acos", [r(20, lo=-1, hi=1)], tol=1e-6),
    C("Atan", [r(20, lo=-10, hi=10)], tol=1e-6),
    C("Sinh", [r(20, lo=-5, hi=5)], tol=1e-6),
    C("Cosh", [r(20, lo=-5, hi=5)], tol=1e-6),
    C("Asinh", [r(20, lo=-10, hi=10)], tol=1e-6),
    C("Acosh", [r(20, lo=1, hi=10)], tol=1e-6),
    C("Atanh", [r(20, lo=-0.99, hi=0.99)], tol=1e-6),
    C("CastLike", [r(2, 3) * 10, np.zeros(1, np.int32)], opset=15, id="to-int32"),
    C("CastLike", [ri(2, 3), np.zeros(1, F32)], opset=15, id="to-float"),
    C("Erf", [r(2000, lo=-6, hi=6)], tol=1e-6, id="wide"),
    C("Erf", [np.concatenate([f32(0.0, -0.0, 1e-30, -1e-8, 0.46875, 4.0, 10.0, -10.0), r(500, lo=-0.5, hi=0.5)])],
      tol=1e-6, id="small-and-tails"),
    C("Equal", [ri(3, 4, lo=0, hi=3), ri(4, lo=0, hi=3)]),
    C("Equal", [f32(1.0, 2.0, np.nan, 0.0), f32(1.0, 3.0, np.nan, -0.0)], id="float-nan"),
    C("Greater", [r(3, 4), r(1, 4)]),
    C("Less", [r(3, 4), r(3, 1)]),
    C("GreaterOrEqual", [ri(3, 4, lo=0, hi=3), ri(4, lo=0, hi=3)], opset=16),
    C("LessOrEqual", [ri(3, 4, lo=0, hi=3), ri(4, lo=0, hi=3)], opset=16),
    C("Not", [r(3, 4) > 0]),
    C("And", [r(3, 4) > 0, r(4) > 0]),
    C("Or", [r(3, 4) > 0, r(4) > 0]),
    C("Xor", [r(3, 4) > 0, r(4) > 0]),
    C("Where", [r(3, 1, 4) > 0, r(2, 4), r(3, 2, 1)], tol=0),
    C("Where", [r(5) > 0, ri(5), np.array(-1, I64)], id="int-scalar"),
    C("IsNaN", [f32(1.0, np.nan, np.inf)]),
    C("IsInf", [f32(1.0, np.nan, np.inf, -np.inf)], {"detect_negative": 0}),
    C("Identity", [r(2, 3)], tol=0),
    C("Dropout", [r(3, 4)], tol=0, opset=13),
    C("Dropout", [r(3, 4)], tol=0, opset=13, n_out=2, id="mask"),
    C("Cast", [f32(-2.7, -0.5, 0.0, 0.5, 2.7, 100.9)], {"to": onnx.TensorProto.INT64}, id="float-to-int64"),
    C("Cast", [f32(-2.7, 0.0, 0.5, 2.7, 100.9)], {"to": onnx.TensorProto.INT32}, id="float-to-int32"),
    C("Cast", [f32(-2.0, 0.0, 0.5, np.nan)], {"to": onnx.TensorProto.BOOL}, id="float-to-bool"),
    C("Cast", [ri(3, 4)], {"to": onnx.TensorProto.FLOAT}, id="int-to-float"),
    C("Cast", [r(3, 4) * 100], {"to": onnx.TensorProto.FLOAT16}, tol=0, id="float-to-half"),
    C("Cast", [r(3, 4)], {"to": onnx.TensorProto.DOUBLE}, tol=0, id="float-to-double"),
    C("Cast", [np.array([True, False])], {"to": onnx.TensorProto.FLOAT}, id="bool-to-float"),
    C("Cast", [f32(0.0, 1.0, 200.0, 255.0)], {"to": onnx.TensorProto.UINT8}, id="float-to-uint8"),
    C("Cast", [ri(6, lo=-3, hi=3)], {"to": onnx.TensorProto.FLOAT}, opset=21, id="opset21"),
    C("Einsum", [r(2, 3, 4), r(2, 4, 5)], {"equation": "bij,bjk->bik"}),
    C("Einsum", [r(3, 3)], {"equation": "ii->i"}, tol=0, id="diag"),
    C("Einsum", [r(2, 3), r(3, 4)], {"equation": "ij, jk"}, id="implicit"),
]


@pytest.mark.parametrize("case", ELEMENTWISE)
def test_elementwise(case):
    check(case)


# ----------------------------------------------------------------------------------------
# activations
# ----------------------------------------------------------------------------------------

EXTREME = np.concatenate([r(200) * 4, f32(-100.0, -30.0, -1e-7, 0.0, 1e-7, 30.0, 100.0)])

ACTIVATION = [
    C("Relu", [r(3, 4, 5)], tol=0),
    C("Relu", [ri(10, dtype=np.int32)], opset=14, id="int32"),
    C("LeakyRelu", [r(3, 4)], tol=0),
    C("LeakyRelu", [r(3, 4)], {"alpha": 0.3}, tol=1e-6, id="alpha"),
    C("PRelu", [r(2, 3, 4, 5), r(3, 1, 1)], tol=0, id="per-channel"),
    C("PRelu", [r(2, 3, 4, 5), r(1)], tol=0, id="scalar-slope"),
    C("PRelu", [r(2, 3, 4, 5), r(5)], tol=0, id="last-axis"),
    C("PRelu", [EXTREME, np.array([-2.5], F32)], tol=0, id="negative-slope"),
    C("PRelu", [ri(3, 4, dtype=np.int32), ri(4, lo=-3, hi=3, dtype=np.int32)], opset=16, id="int32"),
    C("LeakyRelu", [EXTREME], {"alpha": 3.0}, tol=1e-6, id="alpha-gt-1"),
    C("LeakyRelu", [EXTREME], {"alpha": -0.5}, tol=1e-6, id="negative-alpha"),
    C("Relu", [ri(10, lo=-100, hi=100, dtype=np.int8)], opset=14, id="int8"),
    C("Relu", [f32(np.nan, -np.inf, np.inf, -0.0, 0.0)], tol=0, id="nan-inf"),
    C("Clip", [ri(4, 5, lo=-100, hi=100, dtype=np.int8), np.array(-3, np.int8)], opset=13, id="int8-min-only"),
    C("Clip", [ri(4, 5, dtype=np.int32), None, np.array(2, np.int32)], opset=13, id="int32-max-only"),
    C("Clip", [f32(np.nan, -np.inf, np.inf, 0.3), np.array(-1, F32), np.array(1, F32)], opset=13, tol=0, id="nan-inf"),
    C("Sigmoid", [EXTREME], tol=1e-6),
    C("Tanh", [EXTREME], tol=1e-6),
    C("HardSigmoid", [EXTREME], tol=1e-6),
    C("HardSigmoid", [EXTREME], {"alpha": 0.5, "beta": 0.1}, tol=1e-6, id="attrs"),
    C("HardSwish", [EXTREME], opset=14, tol=1e-6),
    C("Clip", [r(4, 5), np.array(-0.5, F32), np.array(0.5, F32)], opset=11, tol=0, id="inputs"),
    C("Clip", [r(4, 5), np.array(-0.5, F32)], opset=13, tol=0, id="min-only"),
    C("Clip", [r(4, 5), None, np.array(0.25, F32)], opset=13, tol=0, id="max-only"),
    C("Clip", [r(4, 5)], opset=13, tol=0, id="unbounded"),
    C("Clip", [r(4, 5), np.array(0.5, F32), np.array(-0.5, F32)], opset=13, tol=0, id="min-gt-max"),
    C("Clip", [r(4, 5)], {"min": -0.3, "max": 0.2}, opset=6, tol=0, id="opset6-attrs"),
    C("Clip", [ri(4, 5), np.array(-2, I64), np.array(3, I64)], opset=13, id="int64"),
    C("Elu", [EXTREME], tol=1e-6),
    C("Elu", [EXTREME], {"alpha": 0.5}, tol=1e-6, id="alpha"),
    C("Celu", [EXTREME], {"alpha": 2.0}, tol=1e-6, opset=12),
    C("Selu", [EXTREME], tol=1e-6),
    C("ThresholdedRelu", [EXTREME], {"alpha": 0.5}, tol=0, opset=10),
    C("Softplus", [EXTREME], tol=1e-6),
    C("Softsign", [EXTREME], tol=1e-6),
    C("Mish", [EXTREME], tol=1e-5, opset=18),
    C("Gelu", [EXTREME], opset=20, tol=1e-6, id="exact"),
    C("Gelu", [EXTREME], {"approximate": "tanh"}, opset=20, tol=1e-6, id="tanh"),
    C("Softmax", [r(2, 3, 4) * 5], opset=11, tol=1e-6, id="opset11-default-axis1-flattens"),
    C("Softmax", [r(2, 3, 4) * 5], {"axis": 2}, opset=11, tol=1e-6, id="opset11-axis2"),
    C("Softmax", [r(2, 3, 4) * 5], {"axis": -2}, opset=11, tol=1e-6, id="opset11-neg-axis"),
    C("Softmax", [r(2, 3, 4) * 5], opset=13, tol=1e-6, id="opset13-default"),
    C("Softmax", [r(2, 3, 4) * 5], {"axis": 1}, opset=13, tol=1e-6, id="opset13-axis1"),
    C("Softmax", [f32(1000.0, 1000.0, -1000.0)], opset=13, tol=1e-6, id="large"),
    C("LogSoftmax", [r(2, 3, 4) * 5], opset=11, tol=1e-5, id="opset11"),
    C("LogSoftmax", [r(2, 3, 4) * 5], {"axis": 0}, opset=13, tol=1e-5, id="opset13-axis0"),
    C("LogSoftmax", [r(2, 3, 4) * 5], opset=13, tol=1e-5, id="opset13-default"),
    C("Hardmax", [ri(2, 3, 4, lo=0, hi=3).astype(F32)], opset=11, tol=0, id="opset11-ties"),
    C("Hardmax", [ri(2, 3, 4, lo=0, hi=3).astype(F32)], {"axis": 1}, opset=13, tol=0, id="opset13-ties"),
]


@pytest.mark.parametrize("case", ACTIVATION)
def test_activation(case):
    check(case)


# ----------------------------------------------------------------------------------------
# convolution and matrix products
# ----------------------------------------------------------------------------------------

CONV = [
    C("Conv", [r(1, 3, 9, 11), r(4, 3, 3, 3), r(4)], {"pads": [1, 1, 1, 1]}, id="3x3-pad1"),
    C("Conv", [r(2, 4, 10, 9), r(6, 4, 3, 3), r(6)], {"strides": [2, 2]}, id="stride2-batch2"),
    C("Conv", [r(1, 3, 12, 12), r(5, 3, 3, 3)], {"dilations": [2, 3], "pads": [2, 1, 0, 3]}, id="dilated-asym-pads"),
    C("Conv", [r(1, 6, 8, 8), r(4, 3, 3, 3), r(4)], {"group": 2, "pads": [1, 1, 1, 1]}, id="group2"),
    C("Conv", [r(1, 8, 7, 7), r(8, 2, 3, 3), r(8)], {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="group4"),
    C("Conv", [r(1, 8, 9, 9), r(8, 1, 3, 3), r(8)], {"group": 8, "pads": [1, 1, 1, 1]}, id="depthwise"),
    C("Conv", [r(2, 5, 10, 8), r(5, 1, 5, 5), r(5)], {"group": 5, "strides": [2, 2], "pads": [2, 2, 2, 2]},
      id="depthwise-5x5-s2"),
    C("Conv", [r(1, 4, 9, 9), r(8, 1, 3, 3), r(8)], {"group": 4, "pads": [1, 0, 1, 2], "dilations": [2, 1]},
      id="depthwise-multiplier2"),
    C("Conv", [r(1, 4, 9, 9), r(4, 1, 3, 3)], {"group": 4, "auto_pad": "SAME_UPPER", "strides": [2, 2]},
      id="depthwise-same-upper"),
    C("Conv", [r(2, 3, 13, 12), r(6, 1, 5, 4), r(6)], {"group": 3, "strides": [3, 2], "dilations": [2, 1],
      "pads": [4, 3, 2, 0]}, id="depthwise-stride3-pads-gt-stride"),
    C("Conv", [r(1, 3, 7, 8, 9), r(3, 1, 3, 3, 3), r(3)], {"group": 3, "strides": [2, 2, 3], "pads": [1, 0, 1, 1, 1, 0]},
      id="depthwise-3d-strided"),
    C("Conv", [r(1, 5, 10, 10), r(5, 1, 1, 3)], {"group": 5, "strides": [1, 2], "pads": [0, 1, 0, 1]},
      id="depthwise-mixed-stride"),
    C("Conv", [r(1, 16, 7, 9), r(8, 16, 1, 1), r(8)], id="1x1"),
    C("Conv", [r(2, 16, 7, 9), r(8, 16, 1, 1)], {"strides": [2, 2]}, id="1x1-stride2"),
    C("Conv", [r(1, 16, 7, 9), r(8, 4, 1, 1), r(8)], {"group": 4}, id="1x1-grouped"),
    C("Conv", [r(1, 4, 5, 5), r(8, 4, 1, 1), r(8)], {"pads": [1, 0, 0, 1]}, id="1x1-padded"),
    C("Conv", [r(1, 3, 10, 11), r(4, 3, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, id="same-upper"),
    C("Conv", [r(1, 3, 10, 11), r(4, 3, 4, 4)], {"auto_pad": "SAME_LOWER", "strides": [2, 3]}, id="same-lower"),
    C("Conv", [r(1, 3, 10, 11), r(4, 3, 3, 2)], {"auto_pad": "VALID", "strides": [2, 2]}, id="valid"),
    C("Conv", [r(2, 3, 17), r(5, 3, 4), r(5)], {"pads": [2, 1], "strides": [2]}, id="1d"),
    C("Conv", [r(1, 4, 11), r(4, 1, 3)], {"group": 4, "pads": [1, 1]}, id="1d-depthwise"),
    C("Conv", [r(1, 2, 5, 6, 7), r(3, 2, 3, 3, 3), r(3)], {"pads": [1, 1, 1, 1, 1, 1], "strides": [1, 2, 2]}, id="3d"),
    C("Conv", [r(1, 4, 5, 6, 7), r(4, 1, 3, 3, 3)], {"group": 4, "pads": [1, 0, 1, 1, 0, 1]}, id="3d-depthwise"),
    C("Conv", [r(1, 3, 16, 16), r(8, 3, 3, 3)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, id="kernel_shape-attr"),
    C("ConvTranspose", [r(1, 4, 5, 6), r(4, 3, 3, 3), r(3)], {"strides": [2, 2], "pads": [1, 1, 1, 1],
      "output_padding": [1, 1]}, id="s2-k3-p1-outpad"),
    C("ConvTranspose", [r(2, 4, 5, 6), r(4, 2, 4, 4), r(2)], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, id="s2-k4-p1"),
    C("ConvTranspose", [r(1, 4, 5, 5), r(4, 3, 3, 3)], {}, id="s1-no-pad"),
    # 1x1 stride 1 with C_in == C_out: W is (C_in, C_out), so y = W^T x, not W x
    C("ConvTranspose", [r(1, 4, 5, 5), r(4, 4, 1, 1), r(4)], {}, id="pointwise-square"),
    C("ConvTranspose", [r(2, 4, 3, 5), r(4, 6, 1, 1)], {"output_padding": [0, 0]}, id="pointwise"),
    C("ConvTranspose", [r(1, 6, 4, 5), r(6, 2, 3, 3), r(4)], {"group": 2, "strides": [2, 1], "pads": [0, 1, 1, 0]},
      id="group2"),
    C("ConvTranspose", [r(1, 4, 4, 5), r(4, 1, 3, 3)], {"group": 4, "strides": [2, 2]}, id="depthwise"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"dilations": [2, 2], "strides": [2, 2], "pads": [1, 2, 0, 1]},
      id="dilated"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"strides": [2, 2], "output_shape": [10, 11]},
      id="output_shape"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"strides": [3, 2], "output_shape": [11, 9]},
      id="output_shape-odd"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
      id="same-upper"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"strides": [2, 2], "auto_pad": "SAME_LOWER"},
      id="same-lower"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 4, 4)], {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
      id="same-upper-k4"),
    C("ConvTranspose", [r(1, 3, 4, 5), r(3, 2, 3, 3)], {"strides": [2, 2], "auto_pad": "VALID"}, id="valid"),
    C("ConvTranspose", [r(2, 3, 7), r(3, 2, 5), r(2)], {"strides": [3], "pads": [1, 2], "output_padding": [2]},
      id="1d"),
    C("ConvTranspose", [r(1, 2, 3, 4, 3), r(2, 3, 2, 3, 2), r(3)], {"strides": [2, 1, 2], "pads": [0, 1, 0, 1, 0, 1]},
      id="3d"),
    C("ConvTranspose", [r(1, 4, 6, 6), r(4, 8, 1, 1), r(8)], {}, id="1x1"),
    C("Gemm", [r(3, 4), r(4, 5), r(5)], id="bias-row"),
    C("Gemm", [r(4, 3), r(5, 4), r(3, 5)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, id="trans-alpha-beta"),
    C("Gemm", [r(3, 4), r(5, 4), r(3, 1)], {"transB": 1}, id="bias-col"),
    C("Gemm", [r(3, 4), r(4, 5), np.array(1.5, F32)], {"beta": 0.0}, id="beta0"),
    C("Gemm", [r(3, 4), r(4, 5)], {"alpha": 2.0}, opset=11, id="no-C"),
    C("Gemm", [r(3, 4), r(4, 5), r(1, 1)], id="bias-1x1"),
    C("MatMul", [r(3, 4), r(4, 5)], id="2d"),
    C("MatMul", [r(2, 1, 3, 4), r(5, 4, 6)], id="batched-broadcast"),
    C("MatMul", [r(4), r(4, 5)], id="1d-left"),
    C("MatMul", [r(2, 3, 4), r(4)], id="1d-right"),
    C("MatMul", [ri(3, 4, dtype=np.int32), ri(4, 2, dtype=np.int32)], id="int32"),
]


@pytest.mark.parametrize("case", CONV)
def test_conv_and_matmul(case):
    check(case)


def _random_conv_cases(n=40, seed=7):
    """Seeded random Conv / ConvTranspose configurations (1-D to 3-D, groups, depthwise,
    strides, dilations, asymmetric pads, auto_pad)."""
    g = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        nd = int(g.choice([1, 2, 2, 2, 3]))
        kind = g.choice(["dense", "grouped", "depthwise"])
        groups = 1 if kind == "dense" else int(g.choice([2, 3]))
        cg = int(g.integers(1, 4))
        if kind == "depthwise":
            cg, groups = 1, int(g.integers(2, 7))
        c_in = cg * groups
        mg = int(g.integers(1, 4))
        ks = [int(v) for v in g.integers(1, 5, size=nd)]
        st = [int(v) for v in g.integers(1, 4, size=nd)]
        dil = [int(v) for v in g.integers(1, 3, size=nd)]
        sp = [int(v) for v in g.integers(6, 14 if nd < 3 else 8, size=nd)]
        pads = [int(g.integers(0, k)) for k in ks] + [int(g.integers(0, k)) for k in ks]
        attrs = {"group": groups, "strides": st, "dilations": dil, "pads": pads}
        if g.random() < 0.2:
            attrs = {"group": groups, "strides": st, "auto_pad": str(g.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))}
        x = r(int(g.integers(1, 3)), c_in, *sp)
        bias = [r(mg * groups)] if g.random() < 0.7 else []
        cases.append(C("Conv", [x, r(mg * groups, cg, *ks)] + bias, attrs, id=f"random{i}-{nd}d-{kind}"))
        t_attrs = {"group": groups, "strides": st, "dilations": dil,
                   "pads": [int(g.integers(0, (k - 1) * d // 2 + 1)) for k, d in zip(ks * 2, dil * 2)]}
        if g.random() < 0.3:  # onnxruntime requires output_padding < stride
            t_attrs["output_padding"] = [int(g.integers(0, s)) for s in st]
        xt = r(int(g.integers(1, 3)), c_in, *[v // 2 for v in sp])
        cases.append(C("ConvTranspose", [xt, r(c_in, mg, *ks)] + bias, t_attrs, id=f"random{i}-{nd}d-{kind}"))
    return cases


@pytest.mark.parametrize("case", _random_conv_cases())
def test_conv_random_configs(case):
    check(case)


@pytest.mark.parametrize(
    "w_shape,attrs",
    [
        ((6, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((6, 4, 1, 1), {}),
        ((4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}),
        ((8, 1, 3, 3), {"group": 4, "strides": [2, 2]}),
    ],
)
def test_conv_non_contiguous_input(w_shape, attrs):
    """Interpreter inputs may be views (Slice/Transpose outputs): same result as contiguous."""
    base = r(1, 9, 4, 10)
    x = base.transpose(0, 2, 3, 1)[:, :, ::2, 1:5].transpose(0, 3, 1, 2)  # (1, 4, 9, 5), strided
    assert not x.flags.c_contiguous
    w, b = r(*w_shape), r(w_shape[0])
    got = lookup("Conv").fn(x, w, b, **attrs)
    want = run_ort(Case("Conv", [np.ascontiguousarray(x), w, b], attrs))[0]
    assert_close(got, want, 1e-4, "non-contiguous Conv")


@pytest.mark.parametrize(
    "shape,w_shape,attrs",
    [
        ((2, 5, 23, 19), (7, 5, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 1]}),
        ((1, 6, 21, 20), (4, 3, 3, 3), {"group": 2, "pads": [1, 2, 0, 1]}),
        ((1, 3, 9, 8, 7), (2, 3, 3, 3, 3), {"pads": [1, 1, 1, 1, 1, 1]}),
    ],
)
def test_conv_im2col_row_bands(monkeypatch, shape, w_shape, attrs):
    """Force tiny im2col buffers so the banded path (several row bands) is exercised."""
    monkeypatch.setattr(conv_mod, "_IM2COL_BYTES", 2048)
    check(Case("Conv", [r(*shape), r(*w_shape), r(w_shape[0])], attrs))


@pytest.mark.parametrize("mult", [1, 3])
def test_conv_depthwise_channel_blocks(monkeypatch, mult):
    """Force one-channel accumulator blocks in the depthwise path."""
    monkeypatch.setattr(conv_mod, "_DW_BLOCK_BYTES", 16)
    check(Case("Conv", [r(2, 5, 11, 10), r(5 * mult, 1, 3, 3), r(5 * mult)], {"group": 5, "pads": [1, 1, 1, 1]}))


@pytest.mark.parametrize(
    "op,inputs,attrs",
    [
        ("Sigmoid", [r(3, 50, 700) * 10], {}),
        ("Tanh", [r(3, 50, 700) * 3], {}),
        ("Exp", [r(3, 50, 700) * 3], {}),
        ("Conv", [r(1, 16, 70, 80), r(16, 1, 3, 3), r(16)], {"group": 16, "pads": [1, 1, 1, 1]}),
        ("Conv", [r(2, 8, 70, 80), r(16, 1, 3, 3), r(16)], {"group": 8, "strides": [2, 2]}),
    ],
)
def test_threaded_kernels_are_deterministic(monkeypatch, op, inputs, attrs):
    """The thread-pool split gives bit-identical results to the single-threaded run."""
    fn = lookup(op).fn
    monkeypatch.setenv("QIR_NUMPY_THREADS", "1")
    single = fn(*inputs, **attrs)
    monkeypatch.setenv("QIR_NUMPY_THREADS", "3")
    multi = fn(*inputs, **attrs)
    assert np.array_equal(single, multi)
    check(Case(op, inputs, attrs, tol=1e-5))


def test_conv_float32_stays_float32():
    y = lookup("Conv").fn(r(1, 3, 8, 8), r(4, 3, 3, 3), r(4), pads=[1, 1, 1, 1])
    assert y.dtype == np.float32


# ----------------------------------------------------------------------------------------
# pooling and normalization
# ----------------------------------------------------------------------------------------

POOL = [
    C("MaxPool", [r(1, 3, 8, 8)], {"kernel_shape": [2, 2], "strides": [2, 2]}, tol=0, id="2x2-s2"),
    C("MaxPool", [r(2, 3, 9, 10) - 5], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, tol=0,
      id="3x3-s2-p1-negative-values"),
    C("MaxPool", [r(1, 2, 5, 5)], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, tol=0, id="ceil"),
    C("MaxPool", [r(1, 2, 5, 5)], {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1},
      tol=0, id="ceil-drop-window-in-pad"),
    C("MaxPool", [r(1, 2, 6, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
      tol=0, id="ceil-overhang"),
    C("MaxPool", [r(1, 2, 10, 11)], {"kernel_shape": [3, 2], "dilations": [2, 3], "pads": [1, 1, 2, 1]}, tol=0,
      id="dilated"),
    C("MaxPool", [r(1, 2, 7, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, tol=0,
      id="same-upper"),
    C("MaxPool", [r(1, 2, 7, 8)], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, tol=0,
      id="same-lower"),
    C("MaxPool", [r(1, 2, 7, 8)], {"kernel_shape": [3, 3], "auto_pad": "VALID"}, tol=0, id="valid"),
    C("MaxPool", [r(1, 4, 10, 10)], {"kernel_shape": [5, 5], "pads": [2, 2, 2, 2]}, tol=0, id="sppf-5x5"),
    C("MaxPool", [r(2, 3, 11)], {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}, tol=0, id="1d"),
    C("MaxPool", [r(1, 2, 5, 6, 7)], {"kernel_shape": [2, 3, 2], "strides": [2, 2, 1]}, tol=0, id="3d"),
    C("MaxPool", [ri(1, 2, 6, 6, lo=-128, hi=127, dtype=np.int8)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},
      opset=12, id="int8"),
    C("MaxPool", [ri(1, 2, 6, 6, lo=0, hi=3).astype(F32)], {"kernel_shape": [3, 3], "strides": [2, 2],
      "pads": [1, 1, 1, 1]}, n_out=2, tol=0, id="indices-ties"),
    C("MaxPool", [r(2, 3, 7, 6)], {"kernel_shape": [2, 3], "strides": [2, 1], "storage_order": 1}, n_out=2, tol=0,
      id="indices-column-major"),
    C("AveragePool", [r(1, 3, 8, 8)], {"kernel_shape": [2, 2], "strides": [2, 2]}, tol=1e-6, id="2x2-s2"),
    C("AveragePool", [r(1, 3, 7, 9)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, tol=1e-6,
      id="pads-exclude"),
    C("AveragePool", [r(1, 3, 7, 9)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
      "count_include_pad": 1}, tol=1e-6, id="pads-include"),
    C("AveragePool", [r(1, 2, 5, 5)], {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, tol=1e-6,
      id="ceil"),
    C("AveragePool", [r(1, 2, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
      "ceil_mode": 1, "count_include_pad": 1}, tol=1e-6, id="ceil-include-pad-overhang-not-counted"),
    C("AveragePool", [r(1, 2, 5, 5)], {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [1, 1, 1, 1],
      "ceil_mode": 1, "count_include_pad": 1}, tol=1e-6, id="ceil-drop-window"),
    C("AveragePool", [r(1, 2, 7, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
      tol=1e-6, id="same-upper"),
    C("AveragePool", [r(1, 2, 7, 8)], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER",
      "count_include_pad": 1}, tol=1e-6, id="same-lower-include"),
    C("AveragePool", [r(2, 3, 11)], {"kernel_shape": [4], "strides": [3], "pads": [2, 1]}, tol=1e-6, id="1d"),
    C("AveragePool", [r(1, 2, 5, 6, 7)], {"kernel_shape": [2, 3, 3], "pads": [0, 1, 1, 1, 1, 0]}, tol=1e-6,
      id="3d"),
    C("AveragePool", [r(1, 2, 9, 9)], {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
      opset=19, tol=1e-6, id="opset19-dilations"),
    C("LpPool", [r(1, 2, 6, 6)], {"kernel_shape": [2, 2], "strides": [2, 2]}, opset=18, tol=1e-5),
    C("GlobalAveragePool", [r(2, 3, 7, 9)], tol=1e-6),
    C("GlobalAveragePool", [r(2, 3, 7)], tol=1e-6, id="3d"),
    C("GlobalMaxPool", [r(2, 3, 7, 9)], tol=0),
    C("GlobalLpPool", [r(2, 3, 4, 5)], tol=1e-5),
    C("BatchNormalization", [r(2, 3, 4, 5), r(3), r(3), r(3), r(3, lo=0.1, hi=2)], opset=15, id="opset15"),
    C("BatchNormalization", [r(2, 3, 4, 5) + 100, r(3), r(3), r(3) + 100, r(3, lo=0.1, hi=2)], {"epsilon": 1e-3},
      opset=9, id="opset9-large-mean"),
    C("BatchNormalization", [r(4, 3), r(3), r(3), r(3), r(3, lo=0.1, hi=2)], opset=14, id="2d"),
    C("BatchNormalization", [r(2, 3, 7), r(3), r(3), r(3), r(3, lo=0.1, hi=2)], opset=15, id="3d"),
    C("LayerNormalization", [r(2, 3, 8), r(8), r(8)], opset=17, tol=1e-5, id="last-axis"),
    C("LayerNormalization", [r(2, 3, 4, 5) * 3 + 2, r(3, 4, 5), r(3, 4, 5)], {"axis": 1, "epsilon": 1e-3}, opset=17,
      tol=1e-5, id="axis1"),
    C("LayerNormalization", [r(2, 3, 8), r(8)], opset=17, tol=1e-5, id="no-bias"),
    C("LayerNormalization", [r(2, 3, 8), r(8), r(8)], {"axis": -2}, opset=17, n_out=3, tol=1e-5,
      id="mean-invstd-outputs"),
    C("InstanceNormalization", [r(2, 3, 4, 5) * 2 + 1, r(3), r(3)], tol=1e-5),
    C("InstanceNormalization", [r(2, 3, 7), r(3), r(3)], {"epsilon": 1e-2}, tol=1e-5, id="3d"),
    C("GroupNormalization", [r(2, 6, 4, 5) * 2 + 1, r(6), r(6)], {"num_groups": 3}, opset=21, tol=1e-5),
    C("GroupNormalization", [r(2, 4, 7), r(4), r(4)], {"num_groups": 4, "epsilon": 1e-2}, opset=21, tol=1e-5,
      id="3d-one-channel-per-group"),
    C("LpNormalization", [r(3, 4)], tol=1e-6, id="p2"),
    C("LpNormalization", [r(3, 4)], {"p": 1, "axis": 0}, tol=1e-6, id="p1-axis0"),
]


@pytest.mark.parametrize("case", POOL)
def test_pool_and_norm(case):
    check(case)


def _random_pool_cases(n=30, seed=11):
    """Seeded random MaxPool / AveragePool configurations (pads < kernel, as onnxruntime
    requires; ceil_mode; count_include_pad; dilations for MaxPool and AveragePool-19)."""
    g = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        nd = int(g.choice([1, 2, 2, 3]))
        ks = [int(v) for v in g.integers(1, 5, size=nd)]
        st = [int(v) for v in g.integers(1, 4, size=nd)]
        dil = [int(v) for v in g.integers(1, 3, size=nd)]
        pads = [int(g.integers(0, k)) for k in ks] * 2
        pads = pads[:nd] + [int(g.integers(0, k)) for k in ks]
        sp = [int(v) for v in g.integers(5, 12 if nd < 3 else 8, size=nd)]
        x = r(int(g.integers(1, 3)), int(g.integers(1, 4)), *sp)
        ceil = int(g.integers(0, 2))
        cases.append(C("MaxPool", [x], {"kernel_shape": ks, "strides": st, "dilations": dil, "pads": pads,
                                       "ceil_mode": ceil}, opset=12, tol=0, id=f"random{i}-{nd}d"))
        cases.append(C("AveragePool", [x], {"kernel_shape": ks, "strides": st, "dilations": dil, "pads": pads,
                                           "ceil_mode": ceil, "count_include_pad": int(g.integers(0, 2))},
                       opset=19, tol=1e-5, id=f"random{i}-{nd}d"))
    return cases


@pytest.mark.parametrize("case", _random_pool_cases())
def test_pool_random_configs(case):
    check(case)


# ----------------------------------------------------------------------------------------
# Resize
# ----------------------------------------------------------------------------------------

EMPTY_F = np.zeros(0, F32)
EMPTY_I = np.zeros(0, I64)
X45 = r(1, 2, 4, 5)
CTMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


def _resize_cases():
    cases = []
    for ctm in CTMS:
        for nm in NEAREST_MODES:
            for sc in ([1, 1, 2, 2], [1, 1, 3, 2], [1, 1, 0.5, 0.6], [1, 1, 1.5, 2.5]):
                cases.append(C("Resize", [X45, EMPTY_F, f32(*sc)], {"mode": "nearest",
                               "coordinate_transformation_mode": ctm, "nearest_mode": nm}, opset=13, tol=0,
                               id=f"nearest-{ctm}-{nm}-{sc[2]}x{sc[3]}"))
        for sc in ([1, 1, 2, 2], [1, 1, 0.5, 0.6], [1, 1, 1.7, 3.0], [1, 1, 0.3, 0.25]):
            cases.append(C("Resize", [X45, EMPTY_F, f32(*sc)], {"mode": "linear",
                           "coordinate_transformation_mode": ctm}, opset=13, tol=1e-5,
                           id=f"linear-{ctm}-{sc[2]}x{sc[3]}"))
        cases.append(C("Resize", [r(1, 2, 6, 7), EMPTY_F, f32(1, 1, 1.5, 2.0)], {"mode": "cubic",
                       "coordinate_transformation_mode": ctm}, opset=13, tol=1e-5, id=f"cubic-{ctm}"))
    for nm in NEAREST_MODES:
        cases.append(C("Resize", [X45, EMPTY_F, None, i64(1, 2, 9, 7)], {"mode": "nearest", "nearest_mode": nm},
                       opset=13, tol=0, id=f"nearest-sizes-{nm}"))
        cases.append(C("Resize", [r(1, 2, 8, 10), EMPTY_F, None, i64(1, 2, 3, 4)], {"mode": "nearest",
                       "nearest_mode": nm}, opset=13, tol=0, id=f"nearest-sizes-down-{nm}"))
    cases += [
        C("Resize", [X45, EMPTY_F, None, i64(1, 2, 7, 1)], {"mode": "linear"}, opset=13, tol=1e-5,
          id="linear-sizes-to-1"),
        C("Resize", [X45, EMPTY_F, None, i64(1, 2, 1, 9)], {"mode": "linear",
          "coordinate_transformation_mode": "align_corners"}, opset=13, tol=1e-5, id="linear-align-to-1"),
        C("Resize", [X45, EMPTY_F, EMPTY_F, i64(1, 2, 8, 10)], {"mode": "linear"}, opset=11, tol=1e-5,
          id="opset11-linear-sizes"),
        C("Resize", [X45, EMPTY_F, f32(1, 1, 2, 2)], {"mode": "nearest"}, opset=11, tol=0, id="opset11-nearest"),
        C("Resize", [X45, None, f32(1, 1, 2, 2)], {"mode": "nearest"}, opset=13, tol=0, id="roi-absent"),
        C("Resize", [X45, EMPTY_F, f32(1, 1, 1, 1)], {"mode": "linear"}, opset=13, tol=0, id="identity"),
        C("Resize", [X45, f32(0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7), f32(1, 1, 2, 1.5)], {"mode": "linear",
          "coordinate_transformation_mode": "tf_crop_and_resize"}, opset=13, tol=1e-5, id="linear-tf-crop"),
        C("Resize", [X45, f32(0, 0, -0.2, 0.1, 1, 1, 1.3, 0.7), None, i64(1, 2, 6, 6)], {"mode": "linear",
          "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.0}, opset=13,
          tol=1e-5, id="linear-tf-crop-extrapolate"),
        C("Resize", [X45, f32(0, 0, -0.2, 0.1, 1, 1, 1.3, 0.7), None, i64(1, 2, 6, 6)], {"mode": "nearest",
          "coordinate_transformation_mode": "tf_crop_and_resize", "extrapolation_value": -7.0}, opset=13,
          tol=0, id="nearest-tf-crop-extrapolate"),
        C("Resize", [X45, f32(0, 0, 0.2, 0.1, 1, 1, 0.8, 0.7), None, i64(1, 2, 1, 3)], {"mode": "linear",
          "coordinate_transformation_mode": "tf_crop_and_resize"}, opset=13, tol=1e-5, id="tf-crop-length1"),
        C("Resize", [r(1, 2, 6, 7), EMPTY_F, f32(1, 1, 2, 1.5)], {"mode": "cubic", "exclude_outside": 1,
          "cubic_coeff_a": -0.5}, opset=13, tol=1e-5, id="cubic-exclude-outside"),
        C("Resize", [r(1, 2, 6, 7), EMPTY_F, f32(1, 1, 0.5, 0.75)], {"mode": "cubic"}, opset=13, tol=1e-5,
          id="cubic-down"),
        C("Resize", [r(5, 6), EMPTY_F, f32(2, 1.5)], {"mode": "linear"}, opset=13, tol=1e-5, id="linear-2d"),
        C("Resize", [r(1, 2, 3, 4, 5), EMPTY_F, f32(1, 1, 2, 1.5, 0.6)], {"mode": "linear"}, opset=13, tol=1e-5,
          id="trilinear-5d"),
        C("Resize", [r(1, 2, 3, 4, 5), EMPTY_F, f32(1, 1, 2, 1.5, 0.6)], {"mode": "nearest"}, opset=13, tol=0,
          id="nearest-5d"),
        C("Resize", [r(7), EMPTY_F, f32(2.5)], {"mode": "nearest"}, opset=13, tol=0, id="nearest-1d"),
        C("Resize", [r(1, 4, 5, 3), EMPTY_F, f32(1, 2, 1.5, 1)], {"mode": "linear"}, opset=13, tol=1e-5,
          id="linear-nhwc"),
        C("Resize", [r(2, 3, 4, 5), EMPTY_F, f32(1, 2, 1, 1)], {"mode": "nearest"}, opset=13, tol=0,
          id="nearest-channel-axis"),
        C("Resize", [X45, EMPTY_F, f32(2, 2)], {"mode": "linear", "axes": [2, 3]}, opset=18, tol=1e-5,
          id="opset18-axes-scales"),
        C("Resize", [X45, EMPTY_F, None, i64(8, 9)], {"mode": "nearest", "axes": [-2, -1]}, opset=18, tol=0,
          id="opset18-axes-sizes"),
        C("Resize", [X45, EMPTY_F, None, i64(1, 2, 10, 9)], {"mode": "linear",
          "keep_aspect_ratio_policy": "not_larger"}, opset=18, tol=1e-5, id="opset18-not-larger"),
        C("Resize", [X45, EMPTY_F, None, i64(10, 9)], {"mode": "nearest", "axes": [2, 3],
          "keep_aspect_ratio_policy": "not_smaller"}, opset=18, tol=0, id="opset18-not-smaller"),
        C("Resize", [X45, EMPTY_F, f32(1, 1, 1.5, 0.6)], {"mode": "linear",
          "coordinate_transformation_mode": "half_pixel_symmetric"}, opset=19, tol=1e-5,
          id="opset19-half-pixel-symmetric"),
        C("Resize", [X45, EMPTY_F, f32(1, 1, 2.5, 1.4)], {"mode": "nearest",
          "coordinate_transformation_mode": "half_pixel_symmetric"}, opset=19, tol=0,
          id="opset19-half-pixel-symmetric-nearest"),
        C("Resize", [r(1, 2, 9, 11), EMPTY_F, f32(1, 1, 0.4, 0.7)], {"mode": "linear", "antialias": 1}, opset=18,
          tol=1e-5, id="antialias-linear"),
        C("Resize", [r(1, 2, 9, 11), EMPTY_F, None, i64(1, 2, 4, 5)], {"mode": "cubic", "antialias": 1}, opset=18,
          tol=1e-5, id="antialias-cubic-sizes"),
        C("Resize", [r(1, 2, 9, 11), EMPTY_F, f32(1, 1, 0.5, 0.3)], {"mode": "cubic", "antialias": 1,
          "exclude_outside": 1}, opset=18, tol=1e-5, id="antialias-cubic-exclude-outside"),
        C("Resize", [X45, EMPTY_F, f32(1, 1, 0.6, 0.7)], {"mode": "linear",
          "coordinate_transformation_mode": "align_corners"}, opset=13, tol=1e-5, id="align-corners-unwhole-down"),
        C("Resize", [X45, f32(1, 1, 2, 2)], {"mode": "nearest"}, opset=10, tol=0, id="opset10-nearest"),
        C("Resize", [X45, f32(1, 1, 0.5, 0.6)], {"mode": "nearest"}, opset=10, tol=0, id="opset10-nearest-down"),
        C("Resize", [X45, f32(1, 1, 1.5, 2.5)], {"mode": "linear"}, opset=10, tol=1e-5, id="opset10-linear"),
        C("Resize", [ri(1, 2, 4, 5, lo=0, hi=255, dtype=np.uint8), EMPTY_F, f32(1, 1, 2, 3)], {"mode": "nearest"},
          opset=13, id="nearest-uint8"),
        C("Upsample", [X45, f32(1, 1, 2, 3)], {"mode": "nearest"}, opset=9, tol=0, id="opset9"),
        C("Upsample", [X45, f32(1, 1, 2, 1.5)], {"mode": "linear"}, opset=9, tol=1e-5, id="opset9-linear"),
    ]
    return cases


@pytest.mark.parametrize("case", _resize_cases())
def test_resize(case):
    check(case)


def _random_resize_cases(n=60, seed=5):
    """Seeded random Resize: random in/out sizes (given as sizes or as float scales), every
    coordinate mode and nearest mode, nearest / linear / cubic."""
    g = np.random.default_rng(seed)
    cases = []
    for i in range(n):
        mode = str(g.choice(["nearest", "nearest", "linear", "cubic"]))
        ctm = str(g.choice(CTMS + ["half_pixel_symmetric"]))
        attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
        if mode == "nearest":
            attrs["nearest_mode"] = str(g.choice(NEAREST_MODES))
        hw = [int(v) for v in g.integers(1, 9, size=2)]
        x = r(1, 2, *hw)
        if g.random() < 0.5:
            out = [int(v) for v in g.integers(1, 17, size=2)]
            if mode == "cubic":
                out = [max(o, v) for o, v in zip(out, hw)]
            inputs = [x, EMPTY_F, None, i64(1, 2, *out)]
        else:
            lo = 1.0 if mode == "cubic" else 0.3
            sc = [float(np.round(v, 2)) for v in g.uniform(lo, 3.5, size=2)]
            inputs = [x, EMPTY_F, f32(1, 1, *sc)]
        cases.append(C("Resize", inputs, attrs, opset=19, tol=0 if mode == "nearest" else 1e-5,
                       id=f"random{i}-{mode}-{ctm}"))
    return cases


@pytest.mark.parametrize("case", _random_resize_cases())
def test_resize_random(case):
    check(case)


def test_resize_nearest_integer_upsample_is_repeat():
    """The fast path (broadcast copy) gives exactly np.repeat for 2x nearest upsampling."""
    x = r(1, 3, 4, 5)
    y = lookup("Resize").fn(x, None, f32(1, 1, 2, 2), mode="nearest", _opset=13)
    assert np.array_equal(y, np.repeat(np.repeat(x, 2, axis=2), 2, axis=3))
    assert y.flags.c_contiguous


# ----------------------------------------------------------------------------------------
# shape, indexing, constants
# ----------------------------------------------------------------------------------------

INT_MAX = np.iinfo(np.int64).max
INT_MIN = np.iinfo(np.int64).min

SHAPE = [
    C("Concat", [r(2, 3), r(2, 1), r(2, 4)], {"axis": 1}, tol=0),
    C("Concat", [r(2, 3, 1), r(1, 3, 1)], {"axis": -3}, tol=0, id="neg-axis"),
    C("Concat", [ri(0, 3), ri(2, 3)], {"axis": 0}, id="empty-part"),
    C("Split", [r(6, 4)], {"axis": 0}, opset=11, n_out=3, tol=0, id="even-by-outputs"),
    C("Split", [r(6, 5)], {"axis": 1, "split": [2, 3]}, opset=11, n_out=2, tol=0, id="opset11-attr"),
    C("Split", [r(6, 5), i64(1, 1, 3)], {"axis": -1}, opset=13, n_out=3, tol=0, id="opset13-input"),
    C("Split", [r(7, 2)], {"axis": 0, "num_outputs": 3}, opset=18, n_out=3, tol=0, id="opset18-uneven"),
    C("Split", [r(4, 6)], {"axis": 1, "num_outputs": 2}, opset=18, n_out=2, tol=0, id="opset18-even"),
    C("Split", [r(4, 6), i64(0, 6)], {"axis": 1}, opset=13, n_out=2, tol=0, id="zero-size-piece"),
    C("Slice", [r(5, 6), i64(1, 0), i64(4, 6)], opset=13, tol=0, id="basic"),
    C("Slice", [r(5, 6), i64(-1), i64(INT_MIN), i64(1), i64(-1)], opset=13, tol=0, id="reverse-all"),
    C("Slice", [r(5, 6), i64(4, 10), i64(0, -INT_MAX), i64(0, 1), i64(-2, -3)], opset=13, tol=0,
      id="neg-steps-clamp"),
    C("Slice", [r(5, 6), i64(-3), i64(INT_MAX), i64(-1)], opset=13, tol=0, id="neg-axis-int-max"),
    C("Slice", [r(5, 6), i64(3), i64(1), i64(0)], opset=13, tol=0, id="empty"),
    C("Slice", [r(5, 6), i64(-100), i64(100), i64(1), i64(2)], opset=13, tol=0, id="clamp-step2"),
    C("Slice", [r(5, 6, 7), i64(1, 2), i64(4, -1)], opset=13, tol=0, id="axes-omitted"),
    C("Slice", [r(5, 6)], {"starts": [1], "ends": [3], "axes": [1]}, opset=9, tol=0, id="opset9-attrs"),
    C("Reshape", [r(2, 3, 4), i64(0, -1)], tol=0, id="zero-copies"),
    C("Reshape", [r(2, 3, 4), i64(4, 0, 2, -1)], tol=0, id="zero-minus1"),
    C("Reshape", [r(0, 3), i64(3, 0)], {"allowzero": 1}, opset=14, tol=0, id="allowzero"),
    C("Reshape", [r(2, 3), i64(-1)], tol=0, id="flat"),
    C("Transpose", [r(2, 3, 4)], tol=0, id="default-reverse"),
    C("Transpose", [r(2, 3, 4, 5)], {"perm": [0, 2, 3, 1]}, tol=0, id="perm"),
    C("Flatten", [r(2, 3, 4)], tol=0, id="default"),
    C("Flatten", [r(2, 3, 4)], {"axis": 0}, tol=0, id="axis0"),
    C("Flatten", [r(2, 3, 4)], {"axis": -1}, tol=0, id="axis-1"),
    C("Flatten", [r(2, 3, 4)], {"axis": 3}, tol=0, id="axis-rank"),
    C("Squeeze", [r(1, 3, 1, 4)], {"axes": [0, -2]}, opset=11, tol=0, id="opset11-attr"),
    C("Squeeze", [r(1, 3, 1, 4), i64(2)], opset=13, tol=0, id="opset13-input"),
    C("Squeeze", [r(1, 3, 1, 4)], opset=13, tol=0, id="all"),
    C("Unsqueeze", [r(3, 4)], {"axes": [0, 3]}, opset=11, tol=0, id="opset11-attr"),
    C("Unsqueeze", [r(3, 4), i64(-1, 1)], opset=13, tol=0, id="opset13-neg"),
    C("Unsqueeze", [np.array(2.0, F32), i64(0)], opset=13, tol=0, id="scalar"),
    C("Gather", [r(5, 4), i64(0, -1, 2, -5)], tol=0, id="neg-indices"),
    C("Gather", [r(5, 4, 3), np.array(-2, I64)], {"axis": 1}, tol=0, id="scalar-index"),
    C("Gather", [r(5, 4), ri(2, 3, lo=-4, hi=4, dtype=np.int32)], {"axis": -1}, tol=0, id="2d-int32-indices"),
    C("Gather", [i64(3, 1, 4, 1, 5), i64(0, 2)], id="shape-like"),
    C("GatherElements", [r(3, 4), ri(3, 2, lo=-4, hi=4)], {"axis": 1}, tol=0),
    C("GatherElements", [r(3, 4), ri(2, 4, lo=-3, hi=3)], {"axis": 0}, tol=0, id="axis0"),
    C("GatherND", [r(3, 4, 5), ri(2, 2, lo=0, hi=3)], tol=0),
    C("GatherND", [r(2, 4, 5), ri(2, 3, 1, lo=-4, hi=4)], {"batch_dims": 1}, tol=0, id="batch-dims"),
    C("ScatterND", [r(4, 5), i64(0, 2, 3).reshape(3, 1), r(3, 5)], tol=0),
    C("ScatterND", [r(4, 5), i64(0, 1, 2, 3, 0, 1).reshape(3, 2), r(3)], {"reduction": "add"}, opset=16, tol=1e-6,
      id="add-duplicates"),
    C("ScatterElements", [r(3, 4), i64(0, 2, 1, 0).reshape(1, 4), r(1, 4)], {"axis": 0}, tol=0, opset=13),
    C("ScatterElements", [r(3, 4), i64(1, -1, 0).reshape(3, 1), r(3, 1)], {"axis": 1}, tol=0, opset=13,
      id="neg-index"),
    C("Expand", [r(3, 1), i64(2, 1, 4)], tol=0),
    C("Expand", [r(2, 3), i64(1, 1)], tol=0, id="shape-smaller"),
    C("Tile", [r(2, 3), i64(2, 3)], tol=0),
    C("Tile", [ri(1, 2, 2), i64(3, 1, 2)], id="int"),
    C("Pad", [r(2, 3), i64(1, 2, 0, 1)], opset=11, tol=0, id="constant-default-0"),
    C("Pad", [r(2, 3), i64(1, 2, 2, 1), np.array(1.5, F32)], opset=13, tol=0, id="constant-value"),
    C("Pad", [r(3, 4), i64(2, 3, 1, 2)], {"mode": "reflect"}, opset=13, tol=0, id="reflect"),
    C("Pad", [r(3, 4), i64(2, 3, 1, 2)], {"mode": "edge"}, opset=13, tol=0, id="edge"),
    C("Pad", [r(3, 4), i64(-1, 1, 0, -2)], opset=13, tol=0, id="negative-crop"),
    C("Pad", [r(1, 2, 3, 4), i64(0, 0, 1, 2, 0, 0, 1, 2)], {"mode": "reflect"}, opset=13, tol=0, id="4d-reflect"),
    C("Pad", [r(2, 3, 4), i64(1, 2, 1, 2), np.array(-1.0, F32), i64(0, -1)], opset=18, tol=0, id="opset18-axes"),
    C("Pad", [r(3, 4), i64(1, 2, 2, 1)], {"mode": "wrap"}, opset=19, tol=0, id="opset19-wrap"),
    C("Pad", [r(2, 3)], {"pads": [1, 0, 0, 2], "value": 2.5}, opset=2, tol=0, id="opset2-attrs"),
    C("Pad", [ri(2, 3), i64(1, 1, 1, 1), np.array(7, I64)], opset=13, id="int64"),
    C("Shape", [r(2, 3, 4)], id="full"),
    C("Shape", [r(2, 3, 4, 5)], {"start": 1, "end": -1}, opset=15, id="start-end"),
    C("Shape", [r(2, 3, 4, 5)], {"start": -10, "end": 10}, opset=15, id="clamped"),
    C("Shape", [r(2, 3, 4, 5)], {"start": 3, "end": 1}, opset=15, id="empty"),
    C("Size", [r(2, 3, 4)]),
    C("ConstantOfShape", [i64(2, 3)], id="default-f32-zero"),
    C("ConstantOfShape", [i64(3, 1)], {"value": np.array([7], I64)}, id="int64-value"),
    C("ConstantOfShape", [i64(2)], {"value": np.array([1.5], F32)}, id="float-value"),
    C("ConstantOfShape", [i64(0, 3)], {"value": np.array([1.5], F32)}, id="empty"),
    C("Constant", [], {"value": r(2, 3)}, tol=0, id="tensor"),
    C("Constant", [], {"value_float": 2.5}, tol=0, opset=13, id="value_float"),
    C("Constant", [], {"value_floats": [1.0, 2.5]}, tol=0, opset=13, id="value_floats"),
    C("Constant", [], {"value_int": 7}, opset=13, id="value_int"),
    C("Constant", [], {"value_ints": [1, -2, 3]}, opset=13, id="value_ints"),
    C("Range", [np.array(0.1, F32), np.array(100.0, F32), np.array(0.1, F32)], tol=0, id="float-drift"),
    C("Range", [np.array(5.0, F32), np.array(-3.0, F32), np.array(-1.5, F32)], tol=0, id="float-neg-delta"),
    C("Range", [np.array(1, I64), np.array(10, I64), np.array(3, I64)], id="int"),
    C("Range", [np.array(10, np.int32), np.array(1, np.int32), np.array(-4, np.int32)], id="int32-neg"),
    C("Range", [np.array(5, I64), np.array(1, I64), np.array(1, I64)], id="empty"),
    C("DepthToSpace", [r(2, 8, 3, 4)], {"blocksize": 2}, tol=0, id="DCR"),
    C("DepthToSpace", [r(2, 18, 3, 4)], {"blocksize": 3, "mode": "CRD"}, tol=0, id="CRD"),
    C("SpaceToDepth", [r(2, 3, 4, 6)], {"blocksize": 2}, tol=0),
    C("SpaceToDepth", [r(2, 3, 4, 6)], {"blocksize": 2, "mode": "CRD"}, opset=28, tol=0, id="crd"),
    C("SpaceToDepth", [r(1, 2, 6, 3)], {"blocksize": 3, "mode": "DCR"}, opset=28, tol=0, id="dcr"),
    C("NonZero", [ri(3, 4, lo=0, hi=2)]),
    C("NonZero", [r(2, 3, 2) > 0], id="bool-3d"),
    C("Trilu", [r(4, 5), np.array(1, I64)], opset=14, tol=0, id="upper-k1"),
    C("Trilu", [r(2, 4, 5), np.array(-1, I64)], {"upper": 0}, opset=14, tol=0, id="lower-k-1"),
]


@pytest.mark.parametrize("case", SHAPE)
def test_shape_ops(case):
    check(case)


# ----------------------------------------------------------------------------------------
# reductions, arg*, TopK
# ----------------------------------------------------------------------------------------

X345 = r(3, 4, 5)
TIES = ri(3, 6, lo=0, hi=3).astype(F32)

REDUCE = [
    C("ReduceSum", [X345], {"axes": [1]}, opset=11, tol=1e-6, id="opset11-attr"),
    C("ReduceSum", [X345, i64(0, -1)], opset=13, tol=1e-6, id="opset13-input"),
    C("ReduceSum", [X345], {"keepdims": 0}, opset=13, tol=1e-6, id="all-axes"),
    C("ReduceSum", [X345, EMPTY_I], {"noop_with_empty_axes": 1}, opset=13, tol=0, id="noop"),
    C("ReduceSum", [X345, EMPTY_I], {"keepdims": 0}, opset=13, tol=1e-6, id="empty-axes-reduce-all"),
    C("ReduceSum", [ri(3, 4), i64(1)], {"keepdims": 0}, opset=13, id="int64"),
    C("ReduceMean", [X345], {"axes": [2, 1]}, opset=13, tol=1e-6, id="opset13-attr"),
    C("ReduceMean", [X345, i64(-1)], {"keepdims": 0}, opset=18, tol=1e-6, id="opset18-input"),
    C("ReduceMean", [X345], opset=18, tol=1e-6, id="opset18-all"),
    C("ReduceMax", [X345], {"axes": [-1], "keepdims": 0}, opset=13, tol=0, id="opset13-attr"),
    C("ReduceMax", [X345, i64(0, 2)], opset=18, tol=0, id="opset18-input"),
    C("ReduceMax", [X345, EMPTY_I], {"noop_with_empty_axes": 1}, opset=18, tol=0, id="opset18-noop"),
    C("ReduceMin", [X345], {"axes": [1]}, opset=13, tol=0),
    C("ReduceMin", [X345, i64(1)], opset=18, tol=0, id="opset18"),
    C("ReduceMax", [r(2, 0, 4), i64(1)], opset=18, tol=0, id="empty-set"),
    C("ReduceMin", [r(2, 0, 4), i64(1)], {"keepdims": 0}, opset=18, tol=0, id="empty-set"),
    C("ReduceMax", [ri(2, 0, 4, dtype=np.int32), i64(1)], opset=18, tol=0, id="empty-set-int32"),
    C("ReduceLogSumExp", [r(2, 0, 4), i64(1)], opset=18, tol=0, id="empty-set"),
    C("ReduceProd", [X345], {"axes": [2]}, opset=13, tol=1e-5),
    C("ReduceL2", [X345], {"axes": [0, 2], "keepdims": 0}, opset=13, tol=1e-6),
    C("ReduceL1", [X345], {"axes": [1]}, opset=13, tol=1e-6),
    C("ReduceSumSquare", [X345], {"axes": [1]}, opset=13, tol=1e-6),
    C("ReduceLogSumExp", [X345 * 30], {"axes": [2]}, opset=13, tol=1e-6),
    C("ReduceLogSum", [np.abs(X345) + 0.1], {"axes": [2]}, opset=13, tol=1e-6),
    C("ArgMax", [TIES], {"axis": 1}, id="ties-first"),
    C("ArgMax", [TIES], {"axis": 1, "select_last_index": 1}, id="ties-last"),
    C("ArgMax", [X345], {"axis": -1, "keepdims": 0}, id="no-keepdims"),
    C("ArgMax", [ri(4, 5)], {"axis": 0}, id="int64"),
    C("ArgMin", [TIES], {"axis": 0, "keepdims": 0}, id="ties-first"),
    C("ArgMin", [TIES], {"axis": 1, "select_last_index": 1}, id="ties-last"),
    C("TopK", [TIES, i64(4)], n_out=2, tol=0, id="largest-ties"),
    C("TopK", [TIES, i64(4)], {"largest": 0}, n_out=2, tol=0, id="smallest-ties"),
    C("TopK", [X345, i64(2)], {"axis": 0}, n_out=2, tol=0, id="axis0"),
    C("TopK", [X345, i64(5)], {"axis": -1}, n_out=2, tol=0, id="k-eq-n"),
    C("TopK", [ri(3, 8, lo=0, hi=4), i64(3)], n_out=2, id="int64-ties"),
    C("TopK", [TIES, i64(0)], n_out=2, tol=0, id="k0"),
    C("TopK", [TIES], {"k": 3}, opset=9, n_out=2, tol=0, id="opset9-k-attr"),
    C("TopK", [r(4, 300), i64(17)], {"axis": 1}, n_out=2, tol=0, id="large-n"),
    C("CumSum", [X345, np.array(1, I64)], opset=14, tol=1e-6),
    C("CumSum", [X345, np.array(-1, I64)], {"exclusive": 1, "reverse": 1}, opset=14, tol=1e-6, id="excl-rev"),
]


@pytest.mark.parametrize("case", REDUCE)
def test_reduce(case):
    check(case)


# ----------------------------------------------------------------------------------------
# harness self-checks: the comparison must be able to fail
# ----------------------------------------------------------------------------------------


def test_assert_close_detects_errors():
    with pytest.raises(AssertionError):
        assert_close(f32(1.0, 2.0), f32(1.0, 2.001), 1e-4)
    with pytest.raises(AssertionError):
        assert_close(f32(1.0, 2.0), np.array([1.0, 2.0]), 1e-4)
    with pytest.raises(AssertionError):
        assert_close(i64(1, 2), i64(1, 3), 1e-4)
    with pytest.raises(AssertionError):
        assert_close(f32(1.0, 2.0), f32(1.0, 2.0).reshape(2, 1), 1e-4)
    with pytest.raises(AssertionError):
        assert_close(f32(1.0, np.nan), f32(1.0, 2.0), 1e-4)
    assert_close(f32(1.0, 2.0), f32(1.0, 2.0001), 1e-4)


def test_wrong_kernel_would_fail():
    """A deliberately wrong semantic (floor instead of truncating int Div) is caught."""
    case = Case("Div", [i64(-7, 7), i64(2, 2)])
    want = run_ort(case)[0]
    assert not np.array_equal(np.floor_divide(case.inputs[0], case.inputs[1]), want)
