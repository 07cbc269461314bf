"""Calibration time per method vs plain float inference over the same real images.

    python benchmarks/calibration_speed.py [--models yolov8n_320 ...] [--images 8] [--methods max kl]
                                           [--repeats 5]

For each real model: plain float inference over N images with onnxruntime (the runtime
calibration uses), cold (building the session included, as a user's first run) and warm
(session already built); then the ``calibrate`` pass with each method on the same images, from
a fresh IR (after fold-bn, fuse and insert-calibration, which are not timed). Each repeat times
plain inference and then each method on fresh copies of the IR, one after the other, so a busy
moment of the machine hits both; the figures are medians over the repeats. Prints both ratios
(of the medians); the goal for ``max`` is at most 1.5x plain inference. For scale, the same images
through onnxruntime's own MinMaxCalibrater (graph augmented with ReduceMin/ReduceMax per
tensor, the technique qir's ``max`` uses too) are timed as ``ort-minmax``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from real_cases import CASES, realmodels
from real_cases import samples as real_samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=sorted(CASES))
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--methods", nargs="*", default=["max", "percentile", "kl", "mse", "mix"])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import qir
    from qir.passes import PassManager, get_pass

    rm = realmodels()

    print(f"{'model':<13}{'method':<12}{'seconds':>9}{'cold s':>8}{'warm s':>8}{'/cold':>7}{'/warm':>7}")
    for name in args.models:
        shape = CASES[name][1]
        input_name = rm.MODELS[name][1]
        samples = real_samples(rm, name, rm.CALIB)[: args.images]
        base = qir.load(rm.model(name), input_shapes={input_name: shape})
        PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(base)
        colds, warms, took = [], [], {m: [] for m in args.methods}
        for _ in range(args.repeats):
            plain = base.clone()
            start = time.perf_counter()
            for s in samples:
                qir.run(plain, s, runtime="ort", level="float")
            colds.append(time.perf_counter() - start)
            start = time.perf_counter()
            for s in samples:
                qir.run(plain, s, runtime="ort", level="float")
            warms.append(time.perf_counter() - start)
            del plain
            for method in args.methods:
                ir = base.clone()
                calibrate = get_pass("calibrate", data=samples, method=method, progress=False)
                start = time.perf_counter()
                calibrate(ir)
                took[method].append(time.perf_counter() - start)
        cold, warm = statistics.median(colds), statistics.median(warms)
        for method in args.methods:
            t = statistics.median(took[method])
            print(f"{name:<13}{method:<12}{t:>9.2f}{cold:>8.2f}{warm:>8.2f}{t / cold:>6.2f}x{t / warm:>6.2f}x")
        took = _onnxruntime_minmax(base, samples)
        print(f"{name:<13}{'ort-minmax':<12}{took:>9.2f}{cold:>8.2f}{warm:>8.2f}"
              f"{took / cold:>6.2f}x{took / warm:>6.2f}x")


def _onnxruntime_minmax(ir, samples) -> float:
    """Seconds for onnxruntime's MinMaxCalibrater over ``samples`` (float model of ``ir``)."""
    import tempfile

    import onnx
    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    from qir.io.qdq_export import export_qdq
    from qir.passes import get_pass

    float_ir = ir.clone()
    get_pass("set-mode", mode="float", all=True)(float_ir)  # every calibration node float: the plain model

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(samples)

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "float.onnx"
        onnx.save(export_qdq(float_ir), str(path))
        start = time.perf_counter()
        calibrator = create_calibrator(path, calibrate_method=CalibrationMethod.MinMax,
                                       augmented_model_path=str(Path(tmp) / "augmented.onnx"))
        calibrator.collect_data(Reader())
        calibrator.compute_data()
        return time.perf_counter() - start


if __name__ == "__main__":
    main()
