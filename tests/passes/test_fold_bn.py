"""fold-bn: the folded model computes what the original computes (onnxruntime as the oracle)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import qir
from qir.passes.fold_bn import FoldBatchNormPass

from ..conftest import REPO, model_from_text

CONV_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8,8] x) => (float[2,4,8,8] y, float[2,4,8,8] z) {
    c = Conv <pads=[1,1,1,1]> (x, w, b)
    y = BatchNormalization <epsilon=0.001> (c, s, beta, mean, var)
    c2 = Conv <pads=[1,1,1,1]> (x, w)
    z = BatchNormalization (c2, s, beta, mean, var)
}
"""
GEMM_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[5,6] x) => (float[5,4] y) {
    h = Gemm <transB=1, alpha=0.5, beta=2.0> (x, wg, bg)
    y = BatchNormalization (h, s, beta, mean, var)
}
"""
CONVT_BN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,5,5] x) => (float[1,4,10,10] y) {
    c = ConvTranspose <strides=[2,2]> (x, wt)
    y = BatchNormalization (c, s, beta, mean, var)
}
"""
BN = {"s": (4,), "beta": (4,), "mean": (4,), "var": (4,)}


def load(text, weights):
    return model_from_text(text, weights, positive=("var",))


@pytest.mark.parametrize("text, weights, shape", [
    (CONV_BN, {"w": (4, 3, 3, 3), "b": (4,), **BN}, (2, 3, 8, 8)),
    (GEMM_BN, {"wg": (4, 6), "bg": (4,), **BN}, (5, 6)),
    (CONVT_BN, {"wt": (3, 4, 2, 2), **BN}, (1, 3, 5, 5)),
], ids=["conv", "gemm-alpha-beta", "convtranspose"])
def test_folded_model_matches_onnxruntime_on_the_original(text, weights, shape):
    model = load(text, weights)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    ir = qir.load(model)
    result = FoldBatchNormPass()(ir)
    assert result.modified and not ir.ops("BatchNormalization")
    assert qir.verify(ir) == []
    got = qir.run(ir, {"x": x}, runtime="ort")
    for name, exp in zip(ir.outputs, expected):
        np.testing.assert_allclose(got[name], exp, rtol=1e-5, atol=1e-5 * np.abs(exp).max())


def test_shared_weight_is_copied_and_unfoldable_pairs_are_left_alone():
    model = load(CONV_BN, {"w": (4, 3, 3, 3), "b": (4,), **BN})
    ir = qir.load(model)
    clone = ir.clone()
    w = ir.weight_array("w")
    w_before = w.copy()
    FoldBatchNormPass()(ir)
    # the first fold copies the shared w; the second conv is then its only reader and gets a
    # new array under the same name (copy-on-write); the original array is never written
    assert sorted(c.inputs[1] for c in ir.ops("Conv")) == ["Conv_0.weight", "w"]
    assert ir.weight_array("w") is not w
    np.testing.assert_array_equal(w, w_before)
    assert clone.ops("BatchNormalization") and clone.weight_array("w") is w
    # a conv output that is also a graph output cannot fold
    ir2 = qir.load(model)
    ir2.set_outputs([*ir2.outputs, "c"])
    result = FoldBatchNormPass()(ir2)
    assert [f["into"] for f in result.report["folded"]] == ["Conv_1"]


def test_bundled_example_folds_every_batchnorm_and_keeps_accuracy():
    root = REPO / "qir" / "examples" / "digits"
    ir = qir.load(root / "model.onnx")
    before = ir.clone()
    result = FoldBatchNormPass()(ir)
    assert len(result.report["folded"]) == 5 and not ir.ops("BatchNormalization")
    assert [o.name for o in ir.ops()][:3] == ["conv1", "relu1", "conv2"]  # op names survive
    x = np.load(root / "eval_images.npy")[:10]
    for sample in x:
        a = qir.run(before, {"input": sample}, runtime="ort")["logits"]
        b = qir.run(ir, {"input": sample}, runtime="ort")["logits"]
        assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


def test_aliases_name_the_batchnorm_output_and_clones_keep_their_own():
    import qir
    from qir.passes import get_pass

    from ..conftest import DIGITS

    original = qir.load(DIGITS / "model.onnx")
    bn_outputs = {op.outputs[0]: op.inputs[0] for op in original.ops("BatchNormalization")}
    original.meta["value_aliases"] = {"earlier": "alias"}
    ir = original.clone()  # shares the meta dict's contents with the original
    get_pass("fold-bn")(ir)
    aliases = ir.meta["value_aliases"]
    assert {k: v for k, v in aliases.items() if k != "earlier"} == {conv: bn for bn, conv in bn_outputs.items()}
    assert original.meta["value_aliases"] == {"earlier": "alias"}


# A batch norm spelled out as Mul and Add by constants (PPLCNetV3's learnable affine block; a
# ViT's layer scale after a MatMul and its bias Add). A Relu writes each graph output: a Mul or Add
# that writes one does not fold (its output would be renamed).
CONV_AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8,8] x) => (float[2,4,8,8] y, float[2,4,8,8] z) {
    c = Conv <pads=[1,1,1,1]> (x, w, b)
    m = Mul (s1, c)
    a = Add (m, t1)
    y = Relu (a)
    c2 = Conv <pads=[1,1,1,1]> (x, w)
    a2 = Add (c2, tc)
    z = Relu (a2)
}
"""
GEMM_AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[5,6] x) => (float[5,4] y) {
    h = Gemm <transB=1, alpha=0.5, beta=2.0> (x, wg, bg)
    m = Mul (h, g4)
    y = Relu (m)
}
"""
MATMUL_SCALE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,5,6] x) => (float[2,5,4] y) {
    h = MatMul (x, wm)
    hb = Add (bm, h)
    ls = Mul (hb, gamma)
    a = Add (ls, beta2)
    y = Relu (a)
}
"""
CONVT_AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,3,5,5] x) => (float[1,4,10,10] y) {
    c = ConvTranspose <strides=[2,2]> (x, wt, bt)
    a = Add (c, tc)
    y = Relu (a)
}
"""
# None of these folds: a constant along the width (not the channels), one spanning the whole map,
# a conv output read twice, a Mul that writes a graph output, a MatMul's own bias Add, an Add of
# two activations.
NOT_AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8,8] x) => (float[2,4,8,8] y, float[2,4,8,8] z, float[2,4,8,8] u, float[2,4,8,8] v,
                         float[2,4,8,8] o, float[2,24,4] q) {
    c = Conv <pads=[1,1,1,1]> (x, w, b)
    y0 = Mul (c, width)
    y = Relu (y0)
    c2 = Conv <pads=[1,1,1,1]> (x, w, b)
    z0 = Mul (c2, whole)
    z = Relu (z0)
    c3 = Conv <pads=[1,1,1,1]> (x, w, b)
    u0 = Mul (c3, s1)
    u = Relu (u0)
    uu = Relu (c3)
    v = Add (uu, y)
    c4 = Conv <pads=[1,1,1,1]> (x, w, b)
    o = Mul (c4, s1)
    shape = Constant <value = int64[3] {2, 24, 8}> ()
    xm = Reshape (x, shape)
    h = MatMul (xm, wm)
    q0 = Add (h, bm)
    q = Relu (q0)
}
"""


@pytest.mark.parametrize("text, weights, shape, folds", [
    (CONV_AFFINE, {"w": (4, 3, 3, 3), "b": (4,), "s1": (1,), "t1": (1,), "tc": (1, 4, 1, 1)}, (2, 3, 8, 8), 3),
    (GEMM_AFFINE, {"wg": (4, 6), "bg": (4,), "g4": (4,)}, (5, 6), 1),
    (MATMUL_SCALE, {"wm": (6, 4), "bm": (4,), "gamma": (4,), "beta2": (1, 1, 4)}, (2, 5, 6), 2),
    (CONVT_AFFINE, {"wt": (3, 4, 2, 2), "bt": (4,), "tc": (4, 1, 1)}, (1, 3, 5, 5), 1),
], ids=["conv-mul-add", "gemm-alpha-beta", "matmul-bias-layer-scale", "convtranspose"])
def test_a_per_channel_mul_and_add_fold_and_match_onnxruntime(text, weights, shape, folds):
    model = load(text, weights)
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    ir = qir.load(model)
    adds_and_muls = len([op for op in ir.ops() if op.op_type in ("Mul", "Add")])
    result = FoldBatchNormPass()(ir)
    assert result.modified and len(result.report["affine"]) == folds
    assert len([op for op in ir.ops() if op.op_type in ("Mul", "Add")]) == adds_and_muls - folds
    assert qir.verify(ir) == []
    assert ir.outputs == tuple(o.name for o in model.graph.output)
    for runtime in ("ort", "numpy"):
        got = qir.run(ir, {"x": x}, runtime=runtime, level="float")
        for name, exp in zip(ir.outputs, expected):
            np.testing.assert_allclose(got[name], exp, rtol=1e-5, atol=1e-5 * np.abs(exp).max())


def test_the_layer_scale_folds_into_the_matmul_weight_and_bias_and_the_alias_names_the_last_step():
    ir = qir.load(load(MATMUL_SCALE, {"wm": (6, 4), "bm": (4,), "gamma": (4,), "beta2": (1, 1, 4)}))
    wm, bm, gamma, beta2 = (ir.weight_array(v).copy() for v in ("wm", "bm", "gamma", "beta2"))
    FoldBatchNormPass()(ir)
    assert [op.op_type for op in ir.ops()] == ["MatMul", "Add", "Relu"]
    matmul, add, _ = ir.ops()
    np.testing.assert_allclose(ir.weight_array(matmul.inputs[1]), wm * gamma, rtol=1e-6)
    np.testing.assert_allclose(ir.weight_array(add.inputs[0]).reshape(-1), bm * gamma + beta2.reshape(-1), rtol=1e-6)
    assert add.outputs[0] == "hb" and ir.meta["value_aliases"]["hb"] == "a"


def test_a_shared_conv_weight_is_copied_before_a_mul_folds_into_it():
    text = CONV_AFFINE.replace("c2 = Conv <pads=[1,1,1,1]> (x, w)", "c2 = Conv <pads=[1,1,1,1]> (x, w, b)")
    ir = qir.load(load(text, {"w": (4, 3, 3, 3), "b": (4,), "s1": (1,), "t1": (1,), "tc": (1, 4, 1, 1)}))
    w, s1 = ir.weight_array("w"), ir.weight_array("s1").copy()
    w_before = w.copy()
    FoldBatchNormPass()(ir)
    first, second = ir.ops("Conv")
    np.testing.assert_array_equal(w, w_before)  # (the array the model was loaded with is never written)
    np.testing.assert_allclose(ir.weight_array(first.inputs[1]), w_before * s1, rtol=1e-6)
    np.testing.assert_array_equal(ir.weight_array(second.inputs[1]), w_before)  # (an Add leaves W alone)


def test_a_mul_or_add_that_is_not_a_per_channel_affine_is_left_alone():
    weights = {"w": (4, 3, 3, 3), "b": (4,), "width": (8,), "whole": (1, 4, 8, 8), "s1": (1,),
               "wm": (8, 4), "bm": (4,)}
    model = load(NOT_AFFINE, weights)
    ir = qir.load(model)
    before = str(ir)
    result = FoldBatchNormPass()(ir)
    assert not result.modified and result.report["affine"] == []
    assert str(ir) == before
