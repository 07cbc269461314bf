"""Forward time of the numpy runtime's integer level vs its float and fake-quant levels.

    python benchmarks/integer_speed.py [--threads 2] [--repeat 3] [--march nash-e] [--models ...]

Each real model is calibrated for nash-e (fold-bn, fuse, insert-calibration, max calibration on
two real photos), then one photo runs at each level on the numpy runtime. Prints the median ms
per forward and the ratios integer / float and integer / fakequant (the aim: integer <= 2x float).
"""
from __future__ import annotations

import argparse
import os

from real_cases import CASES, median_ms, realmodels, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--march", default="nash-e")
    parser.add_argument("--models", nargs="*", default=["yolov8n_320", "ppocrv4_det"])
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # must happen before numpy is imported

    import qir
    from qir.passes import PassManager, get_pass
    from qir.runtimes.base import get_runtime

    rm = realmodels()
    runtimes = {"float": get_runtime("numpy", level="float"), "fakequant": get_runtime("numpy", level="fakequant"),
                "integer": get_runtime("numpy", level="integer", march=args.march)}
    print(f"threads={args.threads} repeat={args.repeat} march={args.march} (median ms per forward, 1 image)")
    print(f"{'model':<14}{'float':>9}{'fakequant':>11}{'integer':>9}{'int/float':>11}{'int/fq':>8}")
    for name in args.models:
        input_name = rm.MODELS[name][1]
        ir = qir.load(rm.model(name), input_shapes={input_name: CASES[name][1]})
        calib = samples(rm, name, rm.CALIB[:2])
        PassManager(f"fold-bn,fuse{{march={args.march}}},insert-calibration{{march={args.march}}}").run(ir)
        get_pass("calibrate", data=calib, method="max", progress=False)(ir)
        feed = samples(rm, name, rm.EVAL[:1])[0]
        times = {level: median_ms(lambda rt=rt: rt.run(ir, feed), args.repeat) for level, rt in runtimes.items()}
        print(f"{name:<14}{times['float']:>9.1f}{times['fakequant']:>11.1f}{times['integer']:>9.1f}"
              f"{times['integer'] / times['float']:>10.2f}x{times['integer'] / times['fakequant']:>7.2f}x")


if __name__ == "__main__":
    main()
