"""Discrete ops replay the baseline's indices in bad-case search and sensitivity: a TopK whose
near-tied scores flip under quantization stops dominating the error."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import qir
from qir.passes import get_pass
from qir.passes.bad_case import find_bad_cases
from qir.passes.lib.discrete import index_values, replayed
from qir.passes.op_sensitivity import op_sensitivity
from qir.runtimes.engine import configured_clone

from ...conftest import DIGITS

TOPK = """
<ir_version: 8, opset_import: ["" : 17]>
topk_net (float[1, 16] x) => (float[1, 3] vals, float[1, 3, 4] rows) {
    scores = MatMul(x, w)
    k = Constant<value = int64[1] {3}>()
    vals, idx = TopK<axis = 1>(scores, k)
    rows = Gather<axis = 0>(table, idx)
}
"""


@pytest.fixture(scope="module")
def topk_model():
    model = onnx.parser.parse_model(TOPK)
    rng = np.random.default_rng(0)
    base = rng.standard_normal((16, 1)).astype(np.float32)
    w = base + 0.02 * rng.standard_normal((16, 8)).astype(np.float32)  # 8 nearly tied scores
    for name, arr in (("w", w), ("table", rng.standard_normal((8, 4)).astype(np.float32))):
        model.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    ir = qir.load(model)
    data = [{"x": rng.standard_normal((1, 16)).astype(np.float32)} for _ in range(12)]
    get_pass("insert-calibration")(ir)
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    return ir, data


def test_replayed_model_takes_indices_as_inputs(topk_model):
    ir, data = topk_model
    assert index_values(ir) == ["idx"]
    new = replayed(ir)
    assert "idx" in new.inputs and not new.ops("TopK") and new.outputs == ir.outputs
    assert replayed(qir.load(DIGITS / "model.onnx")) is None
    flt = configured_clone(ir, "float", {})
    got = qir.run(flt, data[0], capture=["scores", "idx"])
    replay = qir.run(new, {**data[0], "idx": got["idx"]})
    topk_input = ir.ops("TopK")[0].inputs[0]  # the scores as TopK reads them (quantized)
    ref = qir.run(ir, data[0], capture=[topk_input])
    want = np.take_along_axis(ref[topk_input], got["idx"], axis=1)  # in the float order
    np.testing.assert_allclose(replay["vals"], want, rtol=1e-6)
    np.testing.assert_array_equal(replay["rows"], qir.run(flt, data[0])["rows"])


def test_bad_case_and_sensitivity_replay_by_default(topk_model):
    ir, data = topk_model
    raw = find_bad_cases(ir, None, data, replay_discrete=False)
    replay = find_bad_cases(ir, None, data)
    assert max(raw["values"]["rows"]["L1"]) > 0.1  # some index flipped
    assert max(replay["values"]["rows"]["L1"]) == 0.0  # the same rows are gathered
    flipped = data[raw["bad_case"]["rows"]["L1"]]
    raw_sens = op_sensitivity(ir, flipped, replay_discrete=False, progress=False).outputs["rows"]
    sens = op_sensitivity(ir, flipped, progress=False).outputs["rows"]
    assert max(r["L1"] for r in raw_sens) > 0.1 and max(r["L1"] for r in sens) == 0.0


TWO_TOPK = """
<ir_version: 8, opset_import: ["" : 17]>
two_topk (float[1, 16] x) => (float[1, 3] v2, float[1, 3, 4] rows, int64[1] best) {
    scores = MatMul(x, w)
    k = Constant<value = int64[1] {3}>()
    v1, i1 = TopK<axis = 1>(scores, k)
    v2, i2 = TopK<axis = 1>(scores, k)
    rows = Gather<axis = 0>(table, i1)
    flat = Flatten<axis = 0>(x)
    best = ArgMax<axis = 1, keepdims = 0>(flat)
}
"""


def test_only_read_indices_are_replayed_and_pruned_quantizers_are_not_candidates():
    from ...conftest import model_from_text

    ir = qir.load(model_from_text(TWO_TOPK, {"w": (16, 8), "table": (8, 4)}))
    data = [{"x": np.random.default_rng(i).standard_normal((1, 16)).astype(np.float32)} for i in range(4)]
    get_pass("insert-calibration")(ir)
    get_pass("calibrate", data=data, method="max", progress=False)(ir)
    assert set(index_values(ir)) == {"i1", "best"}  # i2 is read by nothing
    new = replayed(ir)
    assert set(new.inputs) == {"x", "i1", "best"} and len(new.ops("TopK")) == 1
    report = find_bad_cases(ir, None, data)
    assert max(report["values"]["rows"]["L1"]) == 0.0 and max(report["values"]["best"]["ATOL"]) == 0.0
    sens = op_sensitivity(ir, data[0], progress=False)  # quantizers feeding only the ArgMax are gone
    assert set(sens.outputs) == {"v2", "rows", "best"}
