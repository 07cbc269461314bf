"""The real models the benchmarks run (``../shared/models``), each with its preprocessing and a
static input shape."""
from __future__ import annotations

import sys
from pathlib import Path

CASES = {  # name -> (preprocessing function in realmodels, static input shape)
    "yolov8n_320": ("yolov8n_input", [1, 3, 320, 320]),
    "ppocrv4_det": ("ppocr_det_input", [1, 3, 640, 640]),
    "ppocr_cls": ("ppocr_cls_input", [1, 3, 48, 192]),
}


#: The ViT-S (``vit_s_focus``) the same way; not in :data:`CASES`, which the speed benchmarks run whole.
VIT_CASE = ("vit_input", [1, 3, 224, 224])


def calib_and_eval(rm, name: str, prep: str, count: int) -> tuple[list[dict], list[dict]]:
    """``count`` calibration and ``count`` evaluation samples of model ``name`` (``prep``: its
    preprocessing function in ``realmodels``): PP-OCRv4 det on text images (``text_images``, seed 0
    to calibrate, 1 to evaluate; a text detector needs text), the others on the CALIB / EVAL photos."""
    if name == "ppocrv4_det":
        calib, evaluation = rm.text_images(count, seed=0), rm.text_images(count, seed=1)
    else:
        calib, evaluation = rm.images(rm.CALIB)[:count], rm.images(rm.EVAL)[:count]
    key, fn = rm.MODELS[name][1], getattr(rm, prep)
    return [{key: fn(i)} for i in calib], [{key: fn(i)} for i in evaluation]


#: The one real image each model is timed on: a text page for the text models.
SAMPLE_IMAGE = {"yolov8n_320": "motorcycle_right.png", "ppocrv4_det": "page.png", "ppocr_cls": "page.png"}


def calibrated_case(name: str, calib: int = 4):
    """Model ``name`` loaded at its static shape, through the nash-e pipeline (fold-bn, fuse,
    insert-calibration) and max-calibrated on the first ``calib`` calibration photos. Returns
    ``(ir, sample, calibration samples)``, the sample from :data:`SAMPLE_IMAGE`."""
    import qir
    from qir.passes import PassManager, get_pass

    rm = realmodels()
    input_name = rm.MODELS[name][1]
    images = samples(rm, name, rm.CALIB[:calib])
    sample = samples(rm, name, [SAMPLE_IMAGE[name]])[0]
    ir = qir.load(rm.model(name), input_shapes={input_name: CASES[name][1]})
    PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
    get_pass("calibrate", data=images, method="max", progress=False)(ir)
    return ir, sample, images


def realmodels():
    """The ``realmodels`` helper module of ``../shared/models``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "shared" / "models"))
    import realmodels

    return realmodels


def samples(rm, name: str, names: list[str]) -> list[dict]:
    """``{input: array}`` samples of model ``name`` from the images ``names``."""
    prep = getattr(rm, CASES[name][0])
    return [{rm.MODELS[name][1]: prep(img)} for img in rm.images(names)]


def median_ms(run, repeat: int) -> float:
    """Median wall time of ``run()`` in ms over ``repeat`` calls, after one warm-up call (plans,
    sessions, caches)."""
    import statistics
    import time

    run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
