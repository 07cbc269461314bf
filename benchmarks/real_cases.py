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
