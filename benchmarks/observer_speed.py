"""Cost of calibration statistics per activation tensor vs the work that produced the tensor.

    python benchmarks/observer_speed.py [--threads 2] [--repeat 20] [--bins 2048]

For each shape (default: a YOLOv8n-320 stem activation 1x64x160x160 and a neck one 1x256x20x20),
prints the best-of-N time (min: least disturbed by other load on the machine) of
  - AbsHistogram.update      (what percentile / kl / mse / mix calibration pay per tensor, per sample)
  - AbsMaxObserver.update    (what max calibration pays)
  - np.abs(x).max()          (the naive max, for scale)
  - conv 1x1 / conv 3x3      (the float matmul of a Conv producing that tensor with Cin = C,
                              i.e. [C, C*k*k] @ [C*k*k, H*W]: the forward work per tensor)
on Gaussian and ReLU-like (half exact zeros) data, then the one-off cost of each threshold method.
"""
from __future__ import annotations

import argparse
import os

SHAPES = [(1, 64, 160, 160), (1, 256, 20, 20)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--bins", type=int, default=2048)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)  # must happen before numpy is imported

    import time

    import numpy as np

    from qir.passes.calibrate.observers import AbsHistogram, AbsMaxObserver
    from qir.passes.calibrate.thresholds import METHODS, compute_threshold

    def timed(fn, repeat=args.repeat) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) * 1e3

    rng = np.random.default_rng(0)
    print(f"threads={args.threads} bins={args.bins} (best of {args.repeat} runs, ms)")
    header = (f"{'shape':<18} {'data':<6} {'hist.update':>11} {'absmax.upd':>10} {'abs().max':>9} "
              f"{'conv1x1':>8} {'conv3x3':>8} {'hist/1x1':>8} {'hist/3x3':>8} {'ns/elem':>7}")
    print(header)
    print("-" * len(header))
    last_hist = None
    for shape in SHAPES:
        _, c, hh, ww = shape
        w1 = rng.standard_normal((c, c)).astype(np.float32)
        a1 = rng.standard_normal((c, hh * ww)).astype(np.float32)
        w3 = rng.standard_normal((c, c * 9)).astype(np.float32)
        a3 = rng.standard_normal((c * 9, hh * ww)).astype(np.float32)
        t1 = timed(lambda: w1 @ a1)
        t3 = timed(lambda: w3 @ a3, repeat=max(3, args.repeat // 4))
        gauss = rng.standard_normal(shape).astype(np.float32)
        for name, x in (("gauss", gauss), ("relu", np.maximum(gauss, 0))):
            h = AbsHistogram(args.bins).update(x)
            m = AbsMaxObserver().update(x)
            th = timed(lambda: h.update(x))
            tm = timed(lambda: m.update(x))
            ta = timed(lambda: np.abs(x).max())
            print(f"{'x'.join(map(str, shape)):<18} {name:<6} {th:>11.3f} {tm:>10.3f} {ta:>9.3f} "
                  f"{t1:>8.3f} {t3:>8.3f} {th / t1:>8.2f} {th / t3:>8.2f} {th * 1e6 / x.size:>7.2f}")
            last_hist = h
    print()
    print("threshold computation, once per tensor at the end of calibration (int8, ms):")
    for name in METHODS:
        print(f"  {name:<11} {timed(lambda: compute_threshold(last_hist, name, 127), repeat=5):8.3f}")


if __name__ == "__main__":
    main()
