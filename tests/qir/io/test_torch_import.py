"""from_torch: torch-built models of every kind the issue lists, a torch.ao fake-quant model,
module paths, input/output names, call counts, and the error without torch."""
from __future__ import annotations

import builtins

import numpy as np
import pytest

import qir
from qir.errors import ImportError_

from ...conftest import NEEDS_TORCH

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
nn = torch.nn
F = torch.nn.functional

from qir.io.torch_import import from_torch, torch_outputs  # noqa: E402
from qir.runtimes.torch_check import check_against_torch  # noqa: E402


class ConvNet(nn.Module):
    """conv/bn/relu, a residual add, a depthwise conv, interpolation, linear, a shared module."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 16, 1)
        self.act = nn.ReLU()  # called twice
        self.fc = nn.Linear(16, 10)

    def forward(self, image):
        x = self.stem(image)
        x = self.act(self.pw(self.dw(x))) + x
        x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
        x = F.interpolate(x, size=(8, 8), mode="nearest")
        return self.fc(self.act(x).mean((2, 3)))


class Encoder(nn.Module):
    """layernorm, MultiheadAttention, scaled_dot_product_attention; keyword inputs; dict output."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)

    def forward(self, tokens, bias):
        x = self.norm(tokens)
        a, _ = self.mha(x, x, x, need_weights=False)
        q, k, v = self.qkv(x + a).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)
        return {"hidden": self.out(y) + bias, "pooled": y.mean(1)}


def _agree(ir, module, example):
    for rt in ("numpy", "ort"):
        diffs = check_against_torch(ir, module, example, runtime=rt)
        assert max(diffs.values()) <= 1e-4, (rt, diffs)


def test_conv_model_imports_with_module_paths_and_call_counts(tmp_path):
    torch.manual_seed(0)
    model = ConvNet().eval()
    example = torch.randn(1, 3, 8, 8)
    ir = from_torch(model, example)
    assert ir.inputs == ("image",) and ir.outputs == ("output",)
    _agree(ir, model, example)
    modules = {op.module for op in ir.ops()}
    assert {"stem.0", "dw", "pw", "act", "fc"} <= modules
    assert ir.meta["torch_call_warnings"] == {"act": 2}
    assert "[stem.0]" in str(ir)
    qir.save(ir, tmp_path / "m.onnx")  # module paths survive a save/load round trip
    assert {op.module for op in qir.load(tmp_path / "m.onnx").ops()} == modules


def test_attention_layernorm_keyword_inputs_and_dict_outputs():
    torch.manual_seed(0)
    model = Encoder().eval()
    example = {"tokens": torch.randn(2, 6, 32), "bias": torch.randn(32)}
    ir = from_torch(model, example)
    assert ir.inputs == ("tokens", "bias") and set(ir.outputs) == {"hidden", "pooled"}
    _agree(ir, model, example)
    assert {"norm", "mha", "qkv", "out"} <= {op.module for op in ir.ops()}


def _qat_model(qconfig):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = torch.ao.quantization.QuantStub(), torch.ao.quantization.DeQuantStub()
            self.conv, self.relu, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Linear(8, 4)

        def forward(self, x):
            return self.dequant(self.fc(self.relu(self.conv(self.quant(x))).mean((2, 3))))

    torch.manual_seed(0)
    model = Net()
    model.qconfig = qconfig
    model.train()
    torch.ao.quantization.prepare_qat(model, inplace=True)
    for _ in range(4):
        model(torch.randn(2, 3, 8, 8))
    model.apply(torch.ao.quantization.disable_observer)
    return model.eval()


def test_torch_ao_fake_quant_imports_with_stored_scales():
    from torch.ao.quantization import (
        FakeQuantize,
        MovingAverageMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
        QConfig,
        get_default_qat_qconfig,
    )

    per_channel = QConfig(
        activation=FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                                          dtype=torch.quint8),
        weight=FakeQuantize.with_args(observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
                                      dtype=torch.qint8, qscheme=torch.per_channel_symmetric, ch_axis=0))
    for qconfig in (get_default_qat_qconfig("qnnpack"), per_channel):
        model = _qat_model(qconfig)
        example = torch.randn(1, 3, 8, 8)
        ir = from_torch(model, example)
        conv_w = ir.calibration("conv.weight_calib")
        fq = model.conv.weight_fake_quant
        np.testing.assert_array_equal(np.ravel(conv_w.scale), np.ravel(fq.scale.numpy()))  # as stored
        act_scale = float(model.quant.activation_post_process.scale)
        want = torch_outputs(model, example)["output"]
        for rt in ("numpy", "ort"):
            got = qir.run(ir, {"x": example.numpy()}, runtime=rt)["output"]
            step = float(model.fc.activation_post_process.scale)
            assert np.abs(got - want).max() <= step + 1e-7 and act_scale > 0  # within one quantization step


def test_unsupported_qconfig_and_missing_torch_are_clear_errors(monkeypatch):
    from torch.ao.quantization import get_default_qat_qconfig

    model = _qat_model(get_default_qat_qconfig("x86"))  # reduce_range: 7-bit activations
    with pytest.raises(ImportError_, match=r"integer range \[0, 127\].*qnnpack"):
        from_torch(model, torch.randn(1, 3, 8, 8))
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ImportError_, match=r"pip install 'qir\[torch\]'"):
        qir.from_torch(object(), None)


def _fills_use_cache(forward):
    """What Hugging Face's forward decorators do: the model fills a keyword parameter itself."""
    import functools

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs["use_cache"] = False
        return forward(self, *args, **kwargs)

    return wrapper


class HFLike(nn.Module):
    """A forward shaped like BertModel's: tensors, then keyword parameters with defaults."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 4)

    @_fills_use_cache
    def forward(self, input_ids, attention_mask=None, token_type_ids=None, use_cache=None):
        return self.proj(self.embed(input_ids) * attention_mask.unsqueeze(-1))


def test_positional_tensors_are_bound_to_forward_parameter_names():
    # the TorchScript exporter pads positional inputs with forward()'s defaults, then the decorator's
    # use_cache collides with the padded one: "got multiple values for argument 'use_cache'"
    torch.manual_seed(0)
    model = HFLike().eval()
    ids, mask = torch.randint(0, 16, (1, 5)), torch.ones(1, 5)
    ir = from_torch(model, (ids, mask))
    assert ir.inputs == ("input_ids", "attention_mask")
    assert str(ir) == str(from_torch(model, {"input_ids": ids, "attention_mask": mask}))  # the keyword path
    assert {op.module for op in ir.ops()} >= {"embed", "proj"} and "embed.weight" in {w.name for w in ir.weights()}
    _agree(ir, model, (ids, mask))


def test_a_small_bert_built_from_its_config_imports_with_positional_inputs():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 64, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    ir = qir.from_torch(bert, (ids, mask))
    assert ir.inputs == ("input_ids", "attention_mask") and ir.outputs == ("last_hidden_state", "pooler_output")
    assert "encoder.layer.0.attention.self.query" in {op.module for op in ir.ops()}
    diffs = check_against_torch(ir, bert, (ids, mask), runtime="ort")
    assert max(diffs.values()) <= 1e-4, diffs


def test_the_newer_exporter_keeps_module_paths_and_needs_onnxscript(monkeypatch):
    import importlib.util

    torch.manual_seed(0)
    model = ConvNet().eval()
    example = torch.randn(1, 3, 8, 8)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript"
                        else real_find_spec(name, *a))
    with pytest.raises(ImportError_, match="pip install onnxscript"):
        from_torch(model, example, dynamo=True)
    monkeypatch.undo()
    pytest.importorskip("onnxscript")
    ir = from_torch(model, example, dynamo=True)
    script = from_torch(model, example)
    assert ir.inputs == script.inputs == ("image",) and (ir.opset, script.opset) == (18, 17)
    # (its graph optimizer folds the stem's BatchNorm into the Conv, which then names stem.1)
    assert {"stem", "dw", "pw", "fc"} <= {op.module.split(".")[0] for op in ir.ops() if op.module}
    assert [op.module for op in ir.ops() if op.op_type == "Conv"][1:] == ["dw", "pw"]
    _agree(ir, model, example)


def test_import_torch_command(tmp_path, capsys):
    from qir.tools.cli import main

    (tmp_path / "net.py").write_text(
        "import torch\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
        "    def forward(self, picture):\n"
        "        return self.body(picture)\n"
        "def build():\n"
        "    return Net()\n")
    out = tmp_path / "net.onnx"
    assert main(["import-torch", f"{tmp_path / 'net.py'}:build", "--example-shape", "1,3,8,8", "-o", str(out),
                 "--check"]) == 0
    printed = capsys.readouterr().out
    assert "agreement with torch" in printed and out.exists()
    ir = qir.load(out)
    assert ir.inputs == ("picture",) and ir.ops()[0].module == "body.0"
    assert main(["import-torch", f"{tmp_path / 'net.py'}:nope", "--example-shape", "1,3,8,8", "-o",
                 str(tmp_path / "x.onnx")]) == 2


@pytest.mark.slow
def test_real_mtcnn_nets_with_released_weights():
    from ...conftest import real_models

    rm = real_models()
    faces = rm.faces(4)  # real face crops, gray 25x25 in [0, 1]
    for net, size in zip(rm.mtcnn_nets(), (12, 24, 48)):
        crops = np.stack([np.repeat(np.asarray(
            torch.nn.functional.interpolate(torch.from_numpy(f)[None, None], size=(size, size), mode="bilinear",
                                            align_corners=False)[0], np.float32), 3, axis=0) for f in faces])
        example = torch.from_numpy((crops - 0.5) / 0.5)
        ir = from_torch(net, example)
        _agree(ir, net, example)
        assert sum(1 for op in ir.ops() if op.module) >= len(ir.ops()) - 3  # nearly every op names its module


def test_reports_name_the_torch_modules():
    from qir.passes import PassManager, get_pass

    torch.manual_seed(0)
    model = ConvNet().eval()
    ir = from_torch(model, torch.randn(1, 3, 8, 8))
    data = [{"image": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)} for i in range(3)]
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=data, progress=False)(ir)
    rows = get_pass("node-sensitivity", data=data, node_type="activation", progress=False)(ir).report["rows"]
    assert {"dw", "pw", "fc"} <= {m for r in rows for m in r.get("module", "").split(";")}
