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
