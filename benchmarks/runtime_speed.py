"""Median forward time of the numpy reference interpreter vs onnxruntime on the real models.

    python benchmarks/runtime_speed.py [--threads 2] [--repeat 5] [--models yolov8n_320 ...]

Both runtimes use the same number of threads (BLAS threads for numpy, intra-op threads for
onnxruntime). Inputs are real photos preprocessed the way each model's own package does.
Prints one row per model: median ms per forward for each runtime and their ratio.
"""
from __future__ import annotations

import argparse
import os

from real_cases import CASES, median_ms, realmodels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--models", nargs="*", default=sorted(CASES))
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # must happen before numpy is imported

    import qir
    from qir.runtimes.numpy_ref.interpreter import NumpyRuntime
    from qir.runtimes.ort.backend import OrtRuntime

    rm = realmodels()

    runtimes = {"numpy": NumpyRuntime(), "ort": OrtRuntime(threads=args.threads)}
    print(f"threads={args.threads} repeat={args.repeat} (median ms per forward, 1 image)")
    print(f"{'model':<14}{'numpy ms':>10}{'ort ms':>10}{'ratio':>8}")
    for name in args.models:
        prep, shape = CASES[name]
        input_name = rm.MODELS[name][1]
        ir = qir.load(rm.model(name), input_shapes={input_name: shape})
        feed = {input_name: getattr(rm, prep)(rm.images(rm.EVAL[:1])[0])}
        times = {rt_name: median_ms(lambda rt=rt: rt.run(ir, feed), args.repeat) for rt_name, rt in runtimes.items()}
        print(f"{name:<14}{times['numpy']:>10.1f}{times['ort']:>10.1f}{times['numpy'] / times['ort']:>7.2f}x")


if __name__ == "__main__":
    main()
