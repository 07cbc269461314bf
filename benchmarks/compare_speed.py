"""Time and memory of the QuantAnalysis workflow (``qir compare``) on the real models.

    python benchmarks/compare_speed.py [--models yolov8n_320 ...] [--images 16]

Per model, calibrated (nash-e, max) on 2 calibration images: the bad-case search over N real
images (float vs fake-quantized), ``run`` (both models on the bad case, every layer kept and
saved), ``compare_per_layer`` (the table, the error split with its shadow re-runs on the numpy
kernels, the advisor) and ``sensitivity`` (one engine variant per op activation / weight).
Each step's seconds, plus one plain fake-quantized forward for scale, and the process's peak
RSS at the end.
"""
from __future__ import annotations

import argparse
import resource
import tempfile
import time

from real_cases import CASES, realmodels, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=sorted(CASES))
    parser.add_argument("--images", type=int, default=16)
    args = parser.parse_args()

    import qir
    from qir.passes import PassManager, get_pass
    from qir.tools.compat.quant_analysis import QuantAnalysis

    rm = realmodels()

    print(f"{'model':<13}{'forward':>8}{'bad case':>9}{'run':>7}{'layers':>8}{'compare':>8}{'ops':>6}"
          f"{'sensitivity':>12}{'findings':>9}")
    for name in args.models:
        shape = CASES[name][1]
        input_name = rm.MODELS[name][1]
        images = samples(rm, name, rm.CALIB + rm.EVAL)[: args.images]
        ir = qir.load(rm.model(name), input_shapes={input_name: shape})
        PassManager("fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e}").run(ir)
        get_pass("calibrate", data=images[:2], method="max", progress=False)(ir)
        qir.run(ir, images[0])
        start = time.perf_counter()
        qir.run(ir, images[0])
        forward = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as tmp:
            qa = QuantAnalysis(ir, out_dir=tmp)
            took, got = {}, {}
            for step, fn in (("bad case", lambda: qa.auto_find_bad_case(images)), ("run", qa.run),
                             ("compare", qa.compare_per_layer), ("sensitivity", qa.sensitivity)):
                start = time.perf_counter()
                got[step] = fn()
                took[step] = time.perf_counter() - start
            rows = len(got["compare"])
            sens = next(iter(got["sensitivity"]["outputs"].values()))
        print(f"{name:<13}{forward:>8.3f}{took['bad case']:>9.2f}{took['run']:>7.2f}{rows:>8}{took['compare']:>8.2f}"
              f"{len(sens):>6}{took['sensitivity']:>12.2f}{len(qa.report['advisor']):>9}", flush=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
