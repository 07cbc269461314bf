"""Forward time of the numpy runtime's integer level vs its float and fake-quant levels, and
node sensitivity at the integer level vs the fake-quant numpy engine.

    python benchmarks/integer_speed.py [--threads 2] [--repeat 3] [--march nash-e] [--models ...]
                                       [--sensitivity yolov8n_320 ...]

Each real model is calibrated for nash-e (fold-bn, fuse, insert-calibration, max calibration on
two real photos), then one photo runs at each level on the numpy runtime. Prints the median ms
per forward and the ratios integer / float and integer / fakequant (the aim: integer <= 2x float),
then the process CPU time of float and integer (the fastest of ``--repeat`` alternating runs:
on a machine shared with other jobs, wall time measures the neighbours as much as the code).

``--sensitivity``: for those models, "only this node back to float" over every activation
quantizer on one photo, with the engine on the numpy runtime at ``fakequant`` (reference cache,
cones) and at ``integer`` (cones over an integer trace), and the integer variants run whole as the
engine did before (the aim: integer <= 1.5x fakequant).
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
    parser.add_argument("--sensitivity", nargs="*", default=[], help="models to time node sensitivity on")
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
        cpu = cpu_ms({level: (lambda rt=runtimes[level]: rt.run(ir, feed)) for level in ("float", "integer")},
                     args.repeat)
        print(f"  process CPU time: float {cpu['float']:.1f} ms, integer {cpu['integer']:.1f} ms, "
              f"integer / float {cpu['integer'] / cpu['float']:.2f}x")
        if name in args.sensitivity:
            sensitivity(ir, feed, name, args)


def cpu_ms(runs: dict, repeat: int) -> dict[str, float]:
    """The fastest process CPU time (ms) of each run, the runs alternating ``repeat`` times."""
    import time

    best = {k: float("inf") for k in runs}
    for _ in range(max(repeat, 1)):
        for k, fn in runs.items():
            start = time.process_time()
            fn()
            best[k] = min(best[k], (time.process_time() - start) * 1000)
    return best


def sensitivity(ir, feed, name: str, args) -> None:
    """Node sensitivity ("only this node back to float") at each level, seconds (see above)."""
    import time

    from qir.kinds import CalibRole
    from qir.runtimes.engine import Engine
    from qir.runtimes.engine.variants import Variant
    from qir.runtimes.engine.whole import WholeRuns

    nodes = [c.name for c in ir.calibrations(CalibRole.ACTIVATION)]
    variants = [Variant(c, {c: "float"}) for c in nodes]
    seconds = {}  # process CPU time
    for level in ("fakequant", "integer"):
        start = time.process_time()
        Engine(ir, [feed], runtime="numpy", level=level, march=args.march if level == "integer" else None,
               reference="quantized",
               threads=args.threads, progress=False).evaluate(variants)
        seconds[level] = time.process_time() - start
    whole = WholeRuns(ir, "quantized", list(ir.outputs), "integer", args.march)
    start = time.process_time()
    for v in variants:
        whole.run(whole.model(v), feed)
    seconds["integer, whole runs"] = time.process_time() - start
    print(f"  node sensitivity over {len(nodes)} quantizers, 1 photo, process CPU time: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
          + f"; integer / fakequant {seconds['integer'] / seconds['fakequant']:.2f}x")


if __name__ == "__main__":
    main()
