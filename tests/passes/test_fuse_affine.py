"""fuse rule 2: a MatMul's bias Add (a per-channel constant after a linear op that fold-bn cannot
fold) runs in the MatMul's group on a march that fuses Gemm+Add, so no quantizer sits between them;
emitted as QDQ and QOperator, the model runs in onnxruntime as it runs fake-quantized."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import qir
from qir.passes import PassManager, PipelineContext
from qir.passes.lib.fusion import fusion_groups
from qir.tools.emit import emit_model

from ..conftest import model_from_text

LINEAR = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,6,8] x, float[1,6,4] r) => (float[1,6,4] y) {
    h = MatMul (x, w)
    hb = Add (h, b)
    s = Add (hb, r)
    y = Relu (s)
}
"""


def _calibrated(march: str):
    ir = qir.load(model_from_text(LINEAR, {"w": (8, 4), "b": (4,)}))
    rng = np.random.default_rng(0)
    data = [{"x": rng.standard_normal((1, 6, 8)).astype(np.float32),
             "r": rng.standard_normal((1, 6, 4)).astype(np.float32)} for _ in range(4)]
    PassManager(f"fold-bn,fuse{{march={march}}},insert-calibration{{march={march}}},calibrate",
                context=PipelineContext(data=data, measure=False)).run(ir)
    return ir, data


def test_a_matmul_and_its_bias_add_are_one_group_with_no_quantizer_between_on_nash():
    ir, _ = _calibrated("nash-e")
    matmul = ir.ops("MatMul")[0]
    assert [m for m in fusion_groups(ir).values() if matmul.name in m] == [[matmul.name, ir.producer("hb").name]]
    assert not [c for c in ir.calibrations() if c.input == "h"]   # the GEMM never writes h
    assert [c for c in ir.calibrations() if c.input == "hb"]     # its output is quantized once
    residual = ir.producer("s")
    assert residual.op_type == "Add" and "fusion" not in residual.meta  # an Add of two activations stays apart


def test_a_march_without_the_gemm_add_fusion_keeps_the_quantizer_between():
    ir, _ = _calibrated("ort")
    assert not fusion_groups(ir)
    assert [c for c in ir.calibrations() if c.input == "h"]


@pytest.mark.parametrize("fmt", ["qdq", "qoperator"])
def test_the_fused_linear_emits_and_runs_as_fake_quantized(tmp_path, fmt):
    ir, data = _calibrated("nash-e")
    path = tmp_path / f"{fmt}.onnx"
    emit_model(ir, path, format=fmt)
    session = ort.InferenceSession(str(path))
    for sample in data:
        want = qir.run(ir, sample, runtime="ort")["y"]
        got = session.run(["y"], sample)[0]
        scale = np.abs(want).max() / 127
        assert np.abs(got - want).max() <= 1.01 * scale, fmt
