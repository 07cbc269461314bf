"""The integer level at onnxruntime's semantics on attention models, against onnxruntime's
default CPU session (the oracle): the ViT-S saliency model and a transformer encoder block built
with torch (attention with a mask, LayerNormalization, erf GELU, residuals), each quantized by
onnxruntime's ``quantize_static`` (QDQ; QUInt8/QUInt8 and QInt8/QInt8; per tensor and per
channel). onnxruntime runs them partly as fused integer kernels (QLinearMatMul, QLinearAdd,
QLinearSoftmax, ...) and partly as ``DQ -> float op -> Q`` (which groups depends on the types:
with int8 activations its s8->u8 conversion leaves Add, Mul and the q/k/v MatMuls unfused).
The per-op comparison names no departing op: every quantized value onnxruntime exposes is
computed by qir from onnxruntime's own inputs to the same code."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import qir
from qir.runtimes.integer.against_ort import compare_with_ort

from ...conftest import HAS_TORCH, NEEDS_TORCH, real_models

pytest.importorskip("onnxruntime.quantization")

CONFIGS = [("QUInt8", False), ("QUInt8", True), ("QInt8", False), ("QInt8", True)]


def quantize(src, dst, samples, activation: str, per_channel: bool):
    """onnxruntime's static QDQ quantization, weights in the activations' type."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=getattr(QuantType, activation), weight_type=getattr(QuantType, activation),
                    per_channel=per_channel)
    return dst


def check(report, name):
    assert report.output_codes_agree >= 0.999, (name, report.output_codes_agree)
    assert report.output_cosine >= 0.9999, (name, report.output_cosine)
    compared = [v for v in report.values if v.count]
    assert len(compared) > 20 and not report.rerun_differs
    assert not any("output codes not compared" in note for note in report.notes)
    assert report.departing == [], [(v.op, v.ort_kernel, v.own_differ) for v in report.departing]


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    rm = real_models()
    root = tmp_path_factory.mktemp("vit")
    ir = qir.load(rm.model("vit_s_focus"), input_shapes={"input_image": [1, 3, 224, 224]})
    path = root / "vit_float.onnx"
    onnx.save(qir.export_onnx(ir), str(path))
    calib = [{"input_image": rm.vit_input(img)} for img in rm.images(rm.CALIB)[:4]]
    feeds = [{"input_image": rm.vit_input(img)} for img in rm.images(["camera.png"])]
    return path, calib, feeds


@pytest.mark.slow
@pytest.mark.parametrize("activation,per_channel", CONFIGS)
def test_vit_matches_onnxruntime(vit, activation, per_channel, tmp_path):
    path, calib, feeds = vit
    qdq = quantize(path, tmp_path / "vit_qdq.onnx", calib, activation, per_channel)
    report = compare_with_ort(qdq, qir.load(qdq), feeds)
    assert report.kernels.get("QLinearMatMul", 0) >= 60 and report.kernels.get("QLinearSoftmax", 0) == 12
    check(report, f"vit {activation} per_channel={per_channel}")


def encoder_block(path):
    """A pre-norm transformer encoder block (random weights) exported to ONNX by torch: attention
    with a key mask (Where), LayerNormalization, erf GELU, residual Adds."""
    import math

    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self, d: int = 64, heads: int = 4, hidden: int = 128) -> None:
            super().__init__()
            self.heads, self.dk = heads, d // heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.fc1, self.fc2, self.act = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.GELU()

        def forward(self, x, mask):
            b, t, d = x.shape
            y = self.ln1(x)
            q, k, v = (f(y).reshape(b, t, self.heads, self.dk).transpose(1, 2) for f in (self.q, self.k, self.v))
            a = (q @ k.transpose(-1, -2)) / math.sqrt(self.dk)
            a = a.masked_fill(mask[:, None, None, :] == 0, -1e4).softmax(-1)
            x = x + self.o((a @ v).transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    torch.manual_seed(0)
    x, mask = torch.randn(1, 32, 64), torch.ones(1, 32, dtype=torch.int64)
    torch.onnx.export(Block().eval(), (x, mask), str(path), input_names=["x", "mask"], output_names=["y"],
                      opset_version=17, dynamo=False)
    return path


def block_samples(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = np.ones((1, 32), np.int64)
        mask[:, rng.integers(16, 32):] = 0
        out.append({"x": rng.standard_normal((1, 32, 64)).astype(np.float32), "mask": mask})
    return out


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason=NEEDS_TORCH)
@pytest.mark.parametrize("activation,per_channel", CONFIGS)
def test_torch_encoder_block_matches_onnxruntime(activation, per_channel, tmp_path):
    path = encoder_block(tmp_path / "block.onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert {"LayerNormalization", "Softmax", "Where", "Erf", "MatMul"} <= ops
    qdq = quantize(path, tmp_path / "block_qdq.onnx", block_samples(8, 0), activation, per_channel)
    report = compare_with_ort(qdq, qir.load(qdq), block_samples(3, 1))
    assert report.kernels.get("QLinearSoftmax", 0) == 1 and report.kernels.get("QLinearMatMul", 0) >= 5
    check(report, f"block {activation} per_channel={per_channel}")
