"""Real third-party models (../shared/models): import, verify, dump, export, both runtimes.

Slow: they run a YOLOv8n detector, a PP-OCRv4 text detector and a text-direction classifier
on real photos. CI fetches the models first (.ci/run) so these always run there.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import qir
from qir.io.onnx_export import export_onnx

from ..conftest import NEEDS_TORCH, real_models

pytestmark = pytest.mark.slow

# name -> (preprocessing function name, static input shape, images, inner values compared too,
#          images on which only the inner values are compared)
# The text models get images that contain text: on a photo without text the detector's
# probability map peaks near 1e-7, where onnxruntime's own sigmoid approximation error (~1e-7
# absolute) is most of the signal, so "relative to the max" says nothing there. The detector's
# pre-sigmoid logits are compared too; they are well conditioned on any image.
CASES = {
    "yolov8n_320": ("yolov8n_input", [1, 3, 320, 320],
                    ["camera.png", "motorcycle_right.png", "astronaut.png"], [], []),
    "ppocrv4_det": ("ppocr_det_input", [1, 3, 640, 640],
                    ["page.png", "text.png", "coffee.png", "camera.png"], ["p2o.Add.281"],
                    ["camera.png"]),
    "ppocr_cls": ("ppocr_cls_input", [1, 3, 48, 192], ["page.png", "text.png", "coins.png"], [], []),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    rm = real_models()
    name = request.param
    prep, shape, image_names, _, _ = CASES[name]
    input_name = rm.MODELS[name][1]
    ir = qir.load(rm.model(name), input_shapes={input_name: shape})
    feeds = [{input_name: getattr(rm, prep)(img)} for img in rm.images(image_names)]
    assert len(feeds) == len(image_names)
    return name, rm.model(name), ir, list(zip(image_names, feeds))


def test_imports_verifies_and_dumps_deterministically(case):
    name, path, ir, _ = case
    assert qir.verify(ir) == []
    text = str(ir)
    assert str(qir.load(path, input_shapes={i: list(ir.value(i).shape) for i in ir.inputs})) == text
    assert "Shape(" not in text  # static shapes fold every shape-computation chain
    assert len(text.splitlines()) > 100 and all(len(line) < 2000 for line in text.splitlines())


def test_export_runs_in_onnxruntime_like_the_original(case):
    name, path, ir, feeds = case
    exported = export_onnx(ir)
    onnx.checker.check_model(exported, full_check=True)
    ours = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for _, feed in feeds[:1]:
        for a, b in zip(ours.run(None, feed), theirs.run(None, feed)):
            assert np.abs(a - b).max() <= 1e-4 * max(float(np.abs(b).max()), 1e-12)


def test_numpy_interpreter_agrees_with_onnxruntime_on_real_images(case):
    name, _, ir, feeds = case
    _, _, _, inner, inner_only = CASES[name]
    for image, feed in feeds:
        a = qir.run(ir, feed, runtime="numpy", capture=inner)
        b = qir.run(ir, feed, runtime="ort", capture=inner)
        compared = inner if image in inner_only else [*ir.outputs, *inner]
        for value in compared:
            err = np.abs(a[value] - b[value]).max() / max(float(np.abs(b[value]).max()), 1e-12)
            assert err <= 1e-4, f"{name} on {image}, {value}: relative error {err:.2e}"


@pytest.mark.torch
@pytest.mark.parametrize("net_index, size", [(0, 12), (1, 24), (2, 48)], ids=["pnet", "rnet", "onet"])
def test_mtcnn_torch_nets_export_import_and_agree_with_torch(net_index, size, tmp_path):
    """facenet-pytorch's MTCNN stages with their released weights (PReLU, MaxPool ceil_mode,
    Linear, Softmax), exported by torch, imported by qir, run on real face crops."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    from PIL import Image

    rm = real_models()
    net = rm.mtcnn_nets()[net_index]
    faces = rm.faces(4)  # 25x25 gray in [0, 1]
    crops = np.stack([np.asarray(Image.fromarray((f * 255).astype(np.uint8)).resize((size, size)),
                                 np.float32) for f in faces])
    x = ((np.repeat(crops[:, None], 3, axis=1) - 127.5) / 128.0).astype(np.float32)
    path = tmp_path / "net.onnx"
    with torch.no_grad():
        torch.onnx.export(net, (torch.from_numpy(x[:1]),), str(path), input_names=["input"], dynamo=False)
        expected = [tuple(t.numpy() for t in net(torch.from_numpy(x[i:i + 1]))) for i in range(len(x))]
    ir = qir.load(path)
    assert qir.verify(ir) == []
    for i in range(len(x)):
        for runtime in ("numpy", "ort"):
            got = qir.run(ir, {"input": x[i:i + 1]}, runtime=runtime)
            for out, ref in zip(ir.outputs, expected[i]):
                err = np.abs(got[out] - ref).max() / max(float(np.abs(ref).max()), 1e-12)
                assert err <= 1e-4, f"{runtime} {out}: {err:.2e}"
