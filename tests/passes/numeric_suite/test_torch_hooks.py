"""qir.passes.numeric_suite.torch_hooks against torch's own Numeric Suite (torch.ao.ns._numeric_suite): same keys,
SQNR within 0.1 dB (torch's tensors scored with torch.ao.ns.fx.utils.compute_sqnr), accumulation
over several inputs, the user's models left untouched, and clear errors."""
from __future__ import annotations

import copy
import sys

import numpy as np
import pytest

from qir.errors import ImportError_, InputError

from ...conftest import NEEDS_TORCH

torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
nn = torch.nn

from torch.ao import quantization as tq  # noqa: E402
from torch.ao.ns import _numeric_suite as ns  # noqa: E402
from torch.ao.ns.fx.utils import compute_sqnr  # noqa: E402

from qir.passes.numeric_suite.torch_hooks import compare_model_outputs, compare_model_stub, compare_weights, sqnr_db  # noqa: E402

pytestmark = [
    pytest.mark.torch,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

TOL_DB = 0.1


class Net(nn.Module):
    """QuantStub -> Conv2d -> ReLU -> Conv2d -> flatten -> Linear -> DeQuantStub."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.conv1 = nn.Conv2d(3, 8, 3)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 4, 3)
        self.fc = nn.Linear(4 * 4 * 4, 10)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.conv1(self.quant(x)))
        x = torch.flatten(self.conv2(x), 1)
        return self.dequant(self.fc(x))


class AddNet(nn.Module):
    """Two convs joined by a FloatFunctional add (for the functional-op paths)."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(3, 4, 1)
        self.ff = nn.quantized.FloatFunctional()
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        return self.dequant(self.ff.add(self.a(x), self.b(x)))


def _engine() -> str:
    engines = torch.backends.quantized.supported_engines
    for name in ("fbgemm", "x86", "qnnpack"):
        if name in engines:
            return name
    pytest.skip(f"no usable quantized engine in {engines}")


@pytest.fixture(scope="module")
def engine():
    name, old = _engine(), torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    yield name
    torch.backends.quantized.engine = old


def _quantize(cls, engine, shape):
    torch.manual_seed(0)
    float_model = cls().eval()
    prepared = copy.deepcopy(float_model)
    prepared.qconfig = tq.get_default_qconfig(engine)
    tq.prepare(prepared, inplace=True)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(*shape))
    return float_model, tq.convert(prepared)


@pytest.fixture(scope="module")
def models(engine):
    return _quantize(Net, engine, (4, 3, 8, 8))


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(1, 3, 8, 8, generator=g) for _ in range(2)]


def _torch_db(reference, approx) -> float:
    approx = approx.dequantize() if approx.is_quantized else approx
    reference = reference.dequantize() if reference.is_quantized else reference
    return float(compute_sqnr(reference, approx))


def _strip_stats(d: dict) -> dict:
    return {k[: -len(".stats")]: v for k, v in d.items()}


def _assert_db(mine: float, theirs: float, where: str) -> float:
    if np.isinf(theirs) or np.isinf(mine):
        assert mine == theirs, where
        return 0.0
    diff = abs(mine - theirs)
    assert diff < TOL_DB, f"{where}: qir {mine:.4f} dB vs torch {theirs:.4f} dB"
    return diff


def _assert_lists(mine: dict, theirs: dict, calls: int) -> None:
    """mine {name: entry}, theirs {name: {"float": [...], "quantized": [...]}} (tensors)."""
    assert set(mine) == set(theirs)
    for name, entry in mine.items():
        assert len(entry["float"]) == len(entry["quantized"]) == len(entry["sqnr_db"]) == calls, name
        assert len(theirs[name]["float"]) == len(theirs[name]["quantized"]) == calls, name
        for i in range(calls):
            t_float, t_quant = theirs[name]["float"][i], theirs[name]["quantized"][i]
            _assert_db(entry["sqnr_db"][i], _torch_db(t_float, t_quant), f"{name}[{i}]")
            assert isinstance(entry["float"][i], np.ndarray) and isinstance(entry["quantized"][i], np.ndarray)
            np.testing.assert_allclose(entry["float"][i], t_float.detach().numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(entry["quantized"][i], t_quant.dequantize().numpy(), rtol=1e-5, atol=1e-6)


def _clone(value):
    # no deepcopy: qnnpack's unpacked linear bias is a non-leaf tensor, which deepcopy refuses
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_clone(v) for v in value)
    return value


def _snapshot(model):
    state = {k: _clone(v) for k, v in model.state_dict().items()}
    return [(name, type(m)) for name, m in model.named_modules()], state


def _same_value(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        if a.is_quantized != b.is_quantized:
            return False
        if a.is_quantized:
            return torch.equal(a.int_repr(), b.int_repr()) and torch.equal(a.dequantize(), b.dequantize())
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.ScriptObject):
        return _same_value(a.__getstate__(), b.__getstate__())
    return a == b


def _assert_untouched(model, snapshot) -> None:
    modules, state = snapshot
    assert [(name, type(m)) for name, m in model.named_modules()] == modules
    now = model.state_dict()
    assert list(now) == list(state)
    for key in state:
        assert _same_value(now[key], state[key]), key
    for name, m in model.named_modules():
        assert not m._forward_hooks and not m._forward_pre_hooks, name
        assert not hasattr(m, "activation_post_process") or isinstance(m, nn.quantized.FloatFunctional) \
            or isinstance(m, nn.quantized.QFunctional), name
        for method in ("add", "cat", "mul"):
            assert method not in vars(m), name


def test_sqnr_db_matches_compute_sqnr():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    y = x + 0.01 * rng.standard_normal((3, 5)).astype(np.float32)
    theirs = float(compute_sqnr(torch.from_numpy(x), torch.from_numpy(y)))
    assert abs(sqnr_db(x, y) - theirs) < 1e-3
    assert sqnr_db(x, x) == float("inf")
    assert np.isnan(sqnr_db(np.zeros(3), np.zeros(3)))
    assert abs(sqnr_db(torch.from_numpy(x), y) - theirs) < 1e-3
    with pytest.raises(InputError, match="same shape"):
        sqnr_db(x, y[:2])
    with pytest.raises(InputError, match="not numeric"):
        sqnr_db(x, "abc")


def test_compare_weights_matches_torch(models):
    float_model, q_model = models
    mine = compare_weights(float_model.state_dict(), q_model.state_dict())
    theirs = ns.compare_weights(float_model.state_dict(), q_model.state_dict())
    assert set(mine) == set(theirs) == {"conv1.weight", "conv2.weight", "fc._packed_params._packed_params"}
    for key, entry in mine.items():
        t_float, t_quant = theirs[key]["float"], theirs[key]["quantized"]
        assert entry["float"].dtype == np.float32 and entry["quantized"].dtype == np.float32
        np.testing.assert_array_equal(entry["float"], t_float.numpy())
        np.testing.assert_array_equal(entry["quantized"], t_quant.dequantize().numpy())
        _assert_db(entry["sqnr_db"], _torch_db(t_float, t_quant), key)
        assert 20 < entry["sqnr_db"] < 80, key


def test_compare_weights_dynamic_lstm_and_linear():
    torch.manual_seed(0)

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 5, num_layers=2)
            self.fc = nn.Linear(5, 3)

        def forward(self, x):
            return self.fc(self.lstm(x)[0])

    float_model = Rnn().eval()
    q_model = tq.quantize_dynamic(float_model, {nn.LSTM, nn.Linear}, dtype=torch.qint8)
    mine = compare_weights(float_model.state_dict(), q_model.state_dict())
    theirs = ns.compare_weights(float_model.state_dict(), q_model.state_dict())
    assert set(mine) == set(theirs) == {"lstm._all_weight_values.0.param", "lstm._all_weight_values.1.param",
                                        "fc._packed_params._packed_params"}
    for key, entry in mine.items():
        _assert_db(entry["sqnr_db"], _torch_db(theirs[key]["float"], theirs[key]["quantized"]), key)


def test_compare_model_outputs_matches_torch(models, inputs):
    float_model, q_model = models
    mine = compare_model_outputs(float_model, q_model, inputs[0])
    theirs = _strip_stats(ns.compare_model_outputs(copy.deepcopy(float_model), copy.deepcopy(q_model), inputs[0]))
    # ReLU is not in torch's default list; the float DeQuantStub gets no logger, so no "dequant"
    assert set(mine) == {"quant", "conv1", "conv2", "fc"}
    _assert_lists(mine, theirs, calls=1)


def test_compare_model_outputs_accumulates(models, inputs):
    float_model, q_model = models
    mine = compare_model_outputs(float_model, q_model, *inputs)
    f, q = copy.deepcopy(float_model), copy.deepcopy(q_model)
    ns.prepare_model_outputs(f, q)
    for x in inputs:
        f(x)
        q(x)
    theirs = _strip_stats(ns.get_matching_activations(f, q))
    _assert_lists(mine, theirs, calls=2)


def test_compare_model_outputs_allow_list(models, inputs):
    float_model, q_model = models
    allow = [nn.Conv2d, nn.quantized.Conv2d, nn.ReLU]
    mine = compare_model_outputs(float_model, q_model, inputs[0], allow_list=allow)
    theirs = _strip_stats(ns.compare_model_outputs(copy.deepcopy(float_model), copy.deepcopy(q_model),
                                                   inputs[0], allow_list=allow))
    assert set(mine) == {"conv1", "relu", "conv2"}
    _assert_lists(mine, theirs, calls=1)


def test_compare_model_stub_matches_torch(models, inputs):
    float_model, q_model = models
    swap = [nn.Conv2d, nn.Linear]
    mine = compare_model_stub(float_model, q_model, swap, inputs[0])
    theirs = _strip_stats(ns.compare_model_stub(copy.deepcopy(float_model), copy.deepcopy(q_model), swap, inputs[0]))
    assert set(mine) == {"conv1", "conv2", "fc"}
    _assert_lists(mine, theirs, calls=1)


def test_compare_model_stub_accumulates(models, inputs):
    float_model, q_model = models
    swap = {nn.Conv2d, nn.Linear}
    mine = compare_model_stub(float_model, q_model, swap, *inputs)
    f, q = copy.deepcopy(float_model), copy.deepcopy(q_model)
    ns.prepare_model_with_stubs(f, q, swap, ns.ShadowLogger)
    for x in inputs:
        q(x)
    theirs = _strip_stats(ns.get_logger_dict(q))
    _assert_lists(mine, theirs, calls=2)


def test_compare_model_stub_keeps_the_whole_batch(models):
    """torch's ShadowLogger keeps x[0] when len(x) > 1: only the first sample of a batch."""
    float_model, q_model = models
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    mine = compare_model_stub(float_model, q_model, [nn.Conv2d, nn.Linear], x)
    theirs = _strip_stats(ns.compare_model_stub(copy.deepcopy(float_model), copy.deepcopy(q_model),
                                                [nn.Conv2d, nn.Linear], x))
    for name, entry in mine.items():
        assert entry["quantized"][0].shape[0] == 3
        np.testing.assert_allclose(entry["quantized"][0][0], theirs[name]["quantized"][0].dequantize().numpy(),
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(entry["float"][0][0], theirs[name]["float"][0].numpy(), rtol=1e-5, atol=1e-6)


def test_functional_add(engine):
    float_model, q_model = _quantize(AddNet, engine, (4, 3, 5, 5))
    x = torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(3))
    mine = compare_model_outputs(float_model, q_model, x)
    theirs = _strip_stats(ns.compare_model_outputs(copy.deepcopy(float_model), copy.deepcopy(q_model), x))
    assert "ff" in mine
    _assert_lists(mine, theirs, calls=1)
    swap = [nn.quantized.FloatFunctional, nn.Conv2d]
    mine = compare_model_stub(float_model, q_model, swap, x)
    theirs = _strip_stats(ns.compare_model_stub(copy.deepcopy(float_model), copy.deepcopy(q_model), swap, x))
    assert set(mine) == {"a", "b", "ff"}
    _assert_lists(mine, theirs, calls=1)


def test_user_models_untouched(engine, inputs):
    for cls, x in ((Net, inputs[0]), (AddNet, torch.randn(1, 3, 5, 5))):
        float_model, q_model = _quantize(cls, engine, tuple(x.shape))
        f_snap, q_snap = _snapshot(float_model), _snapshot(q_model)
        f_out, q_out = float_model(x), q_model(x)
        compare_weights(float_model.state_dict(), q_model.state_dict())
        compare_model_outputs(float_model, q_model, x, x)
        compare_model_stub(float_model, q_model, [nn.Conv2d, nn.Linear, nn.quantized.FloatFunctional], x)
        _assert_untouched(float_model, f_snap)
        _assert_untouched(q_model, q_snap)
        assert torch.equal(float_model(x), f_out) and torch.equal(q_model(x), q_out)


def test_bad_input(models, inputs):
    float_model, q_model = models
    with pytest.raises(InputError, match="state_dict"):
        compare_weights(float_model, q_model)
    with pytest.raises(InputError, match="no weight"):
        compare_weights({"a.weight": torch.ones(2)}, {"b.weight": torch.ones(2)})
    other = nn.Sequential(nn.Conv2d(3, 8, 3))
    with pytest.raises(InputError, match="no module name is logged in both"):
        compare_model_outputs(other, q_model, inputs[0])
    with pytest.raises(InputError, match="not a torch.nn.Module"):
        compare_model_outputs(float_model.state_dict(), q_model, inputs[0])
    with pytest.raises(InputError, match="no inputs"):
        compare_model_outputs(float_model, q_model)
    with pytest.raises(InputError, match="allow_list"):
        compare_model_outputs(float_model, q_model, inputs[0], allow_list=["conv1"])
    with pytest.raises(InputError, match="module_swap_list"):
        compare_model_stub(float_model, q_model, [nn.ReLU], inputs[0])
    with pytest.raises(InputError, match="module_swap_list"):
        compare_model_stub(float_model, q_model, ["conv1"], inputs[0])


def test_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError_, match=r"pip install 'qir\[torch\]'"):
        compare_weights({}, {})


def test_numeric_suite_entry_points_take_torch_models(models, inputs):
    """qir.passes.numeric_suite hands PyTorch models to this module."""
    from qir.passes import numeric_suite

    f, q = models
    weights = numeric_suite.compare_weights(f, q)
    assert weights.keys() == compare_weights(f.state_dict(), q.state_dict()).keys()
    outputs = numeric_suite.compare_model_outputs(f, q, *inputs)
    assert outputs.keys() == compare_model_outputs(f, q, *inputs).keys()
    assert all(len(e["sqnr_db"]) == len(inputs) for e in outputs.values())
    stub = numeric_suite.compare_model_stub(f, q, [nn.Conv2d, nn.Linear], *inputs)
    assert stub.keys() == compare_model_stub(f, q, [nn.Conv2d, nn.Linear], *inputs).keys()
