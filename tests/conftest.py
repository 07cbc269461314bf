"""Shared fixtures: tiny models written in ONNX text, and the real third-party models."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_MODELS = REPO.parent / "shared" / "models"

# A test that needs an optional extra carries its marker (``torch``, ``ray``: registered in
# pyproject.toml) and skips without it with one of these reasons. The README's test command runs
# on the dev extra alone, so these skip there; .ci/run checks that no other skip names torch or Ray
# and runs ``-m "torch or ray"`` again with both installed.
NEEDS_TORCH = "needs the torch extra: pip install -e '.[torch]'"
NEEDS_RAY = "needs the ray extra: pip install -e '.[ray]'"
HAS_TORCH = importlib.util.find_spec("torch") is not None


def model_from_text(text: str, weights: dict[str, tuple] | None = None, seed: int = 0,
                    positive: tuple[str, ...] = ()) -> onnx.ModelProto:
    """Parse ONNX text; ``weights`` {name: shape} become seeded-random float32 initializers
    (those named in ``positive`` are made > 0, e.g. BatchNorm variances)."""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    for name, shape in (weights or {}).items():
        arr = rng.standard_normal(shape).astype(np.float32)
        if name in positive:
            arr = np.abs(arr) + np.float32(0.1)
        model.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    onnx.checker.check_model(model)
    return model


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def session_threads(monkeypatch) -> list[int]:
    """The intra-op thread count of every onnxruntime session built from here on in the test, in
    order (0: none set, onnxruntime's choice); clear it to count from a later point."""
    import onnxruntime as ort

    built: list[int] = []
    session = ort.InferenceSession

    def recorded(model, options=None, *args, **kwargs):
        built.append(options.intra_op_num_threads if options is not None else 0)
        return session(model, options, *args, **kwargs)
    monkeypatch.setattr(ort, "InferenceSession", recorded)
    return built


def real_models():
    """The shared ``realmodels`` helper module, or skip when ../shared/models is absent."""
    if not (SHARED_MODELS / "realmodels.py").exists():
        pytest.skip(f"real models need {SHARED_MODELS} (the shared folder beside the repo)")
    if str(SHARED_MODELS) not in sys.path:
        sys.path.insert(0, str(SHARED_MODELS))
    import realmodels

    return realmodels


DIGITS = REPO / "qir" / "examples" / "digits"
DIGITS_DATA = DIGITS / "calibration_data"


def calibrate_for_nash_e(ir, data, method: str = "max"):
    """``ir`` through the nash-e default pipeline (fold-bn, fuse, insert-calibration, calibrate)."""
    from qir.passes import PassManager, get_pass

    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=data, method=method, progress=False)(ir)
    return ir


def near_zero_sigmoid_case(rng, count: int):
    """A detector-like head, ``Sigmoid(Conv(x))`` on 8 channels, calibrated for nash-e on
    ``count`` samples, of which sample 1 drives the Conv to about -12: its output is ~6e-6
    everywhere (nothing to detect), the others respond. Returns ``(ir, samples)``."""
    import onnx

    import qir

    model = model_from_text("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 8, 6, 6] x) => (float[1, 1, 6, 6] y) {
            h = Conv(x, w)
            y = Sigmoid(h)
        }""", {"w": (1, 8, 1, 1)})
    w = onnx.numpy_helper.to_array(model.graph.initializer[0]).reshape(8)
    x = rng.standard_normal((count, 1, 8, 6, 6)).astype(np.float32)
    x[1] = 0.1 * x[1] - (12 / np.abs(w).sum() * np.sign(w))[None, :, None, None]
    samples = [{"x": s} for s in x]
    return calibrate_for_nash_e(qir.load(model), samples), samples


@pytest.fixture(scope="session")
def digits_calibrated():
    """The bundled digits model calibrated for nash-e with max (shared: clone it to change it)."""
    import qir

    return calibrate_for_nash_e(qir.load(DIGITS / "model.onnx"), DIGITS_DATA)


@pytest.fixture(scope="module")
def digits_calibrated_file(tmp_path_factory, digits_calibrated) -> str:
    """``digits_calibrated`` saved as an ONNX file (its path; one file per test module, so that a
    module's commands cannot change another's), for tests of the command line."""
    import qir

    path = tmp_path_factory.mktemp("model") / "cal.onnx"
    qir.save(digits_calibrated, path)
    return str(path)


@pytest.fixture(scope="session")
def digits_samples():
    """Three evaluation images of the digits model, as samples."""
    images = np.load(DIGITS / "eval_images.npy")[:3].astype(np.float32)
    return [{"input": image} for image in images]


def calibrated_real(name: str, shape: list[int], images: list[str] | None = None, count: int = 2):
    """A real model from ../shared/models calibrated for nash-e on ``count`` real images (``images``
    by file name, default the calibration set), and those samples."""
    import qir

    rm = real_models()
    input_name = rm.MODELS[name][1]
    prep = {"yolov8n_320": rm.yolov8n_input, "ppocrv4_det": rm.ppocr_det_input, "ppocr_cls": rm.ppocr_cls_input}[name]
    samples = [{input_name: prep(img)} for img in rm.images(images or rm.CALIB)][:count]
    ir = qir.load(rm.model(name), input_shapes={input_name: shape})
    return calibrate_for_nash_e(ir, samples), samples
