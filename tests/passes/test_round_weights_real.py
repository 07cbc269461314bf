"""round-weights on a real model (slow): PP-OCR cls. The threshold search leaves every float
weight as it was and each layer it changes gets a smaller output error on unseen images; AdaRound's
codes are what the emitted QDQ model holds, and onnxruntime runs that model as qir's fake-quant
level computes it. (Its output, two class scores, is no measure: on one image their cosine
moves by chance with any change upstream.)"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qir
from qir.calibration import along_axis, calib_scale
from qir.io.qdq_export import export_qdq
from qir.passes import PassManager, get_pass

from ..conftest import HAS_TORCH, NEEDS_TORCH, real_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cls():
    rm = real_models()
    key = rm.MODELS["ppocr_cls"][1]
    images = rm.images(rm.CALIB)[:2] + rm.images(rm.EVAL)[:1]
    samples = [{key: rm.ppocr_cls_input(i)} for i in images]
    ir = qir.load(rm.model("ppocr_cls"), input_shapes={key: [1, 3, 48, 192]})
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=samples[:2], progress=False)(ir)
    return ir, samples[:2], samples[2]


def _errors_at(model, reference, ops, sample):
    """Per op, the all-int8 model's output MSE there against the float model's (onnxruntime)."""
    outs = [op.outputs[0] for op in ops]
    want = qir.run(reference, sample, runtime="ort", level="float", capture=outs)
    got = qir.run(model, sample, runtime="ort", capture=outs)
    return np.array([float(np.mean((got[o] - want[o]) ** 2)) for o in outs])


def test_the_threshold_search_keeps_the_float_weights_and_cuts_layer_errors_on_an_unseen_image(cls):
    """Each changed layer with only its own weights' new thresholds: its all-int8 error on the
    unseen image falls at 24 of the 35 layers (0.882 -> 0.870 summed; the others within 7%). With
    every layer changed at once the later layers' errors grow (0.88 -> 1.02 summed, measured since
    nash runs cls's HardSwish as one unit; before, 29 of 35 fell, 1.10 -> 0.96): what each layer
    gains does not add up on this model, which is why tune measures a transform before keeping it."""
    base, calib, unseen = cls
    ir = base.clone()
    result = get_pass("round-weights", data=calib, method="threshold", measure=False)(ir)
    changed = [ir.op(s["name"]) for s in result.report["changed"]]
    assert result.modified and len(changed) > 20
    assert result.report["inputs"] == "quantized"
    assert any("only 2 input rows" in s["reason"] for s in result.report["skipped"])  # 1x1 convs after pooling
    for c in base.calibrations("weight"):
        np.testing.assert_array_equal(ir.weight_array(c.input), base.weight_array(c.input))
    before = _errors_at(base, base, changed, unseen)
    alone = []  # (each layer's error with only its own weights' new thresholds: what the search decides)
    for op in changed:
        one = base.clone()
        for c in ir.calibrations("weight"):
            if c.output in op.inputs:
                one.set_calibration(c.name, threshold=c.threshold, axis=c.axis, fixed=c.fixed)
        alone.append(_errors_at(one, base, [op], unseen)[0])
    alone = np.array(alone)
    assert np.sum(alone < before) >= 2 * len(changed) // 3 and alone.sum() < before.sum(), (before, alone)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)
def test_adaround_codes_are_the_emitted_models_and_onnxruntime_runs_them_as_qir_does(cls):
    base, calib, unseen = cls
    ir = base.clone()
    result = get_pass("round-weights", data=calib, iterations=60, rows=512, measure=False)(ir)
    assert result.modified
    model = export_qdq(ir)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    flipped = 0
    for site in result.report["changed"]:
        cal = ir.producer(ir.op(site["name"]).inputs[1])
        w = ir.weight_array(cal.input)
        codes = np.rint(w / along_axis(calib_scale(cal), cal.axis, w.ndim))
        emitted = [a for a in inits.values() if a.dtype == np.int8 and a.shape == w.shape and np.array_equal(a, codes)]
        assert emitted, site["name"]
        flipped += site["detail"]["flipped"]
    assert flipped > 0
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = session.run(None, unseen)[0]
    want = qir.run(ir, unseen, runtime="numpy")[ir.outputs[0]]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
