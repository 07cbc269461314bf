"""All-int8 as qir calibrates it for nash-e on four real models: how many activation quantizers,
the per-sample output cosine against the float model (mean and worst sample), and the latency
model's estimated time all-int8 and all-int16 (issues 33, 34).

Each model runs ``fold-bn,fuse{march=nash-e},insert-calibration{march=nash-e},calibrate`` (``--method``,
default mse) on 8 calibration samples and is scored in onnxruntime on 8 others: PP-OCRv4 det on text
images (``text_images``, seed 0 to calibrate, 1 to score), the others on the CALIB / EVAL photos.
What the model's ops become (folded into a GEMM, one unit of a fusion or composite) is what the
pipeline decides, so running this before and after a change to those rules measures the change.

    python benchmarks/int8_units.py [--models ppocrv4_det ppocr_cls yolov8n_320 vit_s_focus] [--method mse]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from real_cases import CASES as REAL_CASES
from real_cases import VIT_CASE, calib_and_eval, realmodels

CASES = {**{name: REAL_CASES[name] for name in ("ppocrv4_det", "ppocr_cls", "yolov8n_320")}, "vit_s_focus": VIT_CASE}


def measure(rm, name: str, method: str, count: int) -> dict:
    import qir
    from qir.kinds import CalibRole
    from qir.metrics import cosine_similarity
    from qir.passes import PassManager, PipelineContext
    from qir.passes.tune.space import Space
    from qir.runtimes.march import get_profile

    calib, evaluation = calib_and_eval(rm, name, CASES[name][0], count)
    key = rm.MODELS[name][1]
    base = qir.load(rm.model(name), input_shapes={key: CASES[name][1]})
    floats = [qir.run(base, s, runtime="ort", level="float") for s in evaluation]
    ir = base.clone()
    start = time.perf_counter()
    PassManager(f"fold-bn,fuse{{march=nash-e}},insert-calibration{{march=nash-e}},calibrate{{method='{method}',progress=False}}",
                context=PipelineContext(data=calib, measure=False)).run(ir)
    seconds = time.perf_counter() - start
    cosines = [min(cosine_similarity(f[o], qir.run(ir, s, runtime="ort")[o]) for o in ir.outputs)
               for s, f in zip(evaluation, floats)]
    space = Space(ir, get_profile("nash-e"))
    start8 = space.plain_start()
    return {"quantizers": len(ir.calibrations(CalibRole.ACTIVATION)), "mean": float(np.mean(cosines)),
            "worst": float(np.min(cosines)), "int8_ms": space.time_us(start8) / 1000,
            "int16_ms": space.time_us(space.level_named(start8, "int16")) / 1000, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--method", default="mse", help="calibration method (default: mse)")
    parser.add_argument("--count", type=int, default=8, help="calibration and evaluation samples each (default 8)")
    args = parser.parse_args()
    rm = realmodels()
    print("| model | activation quantizers | all-int8 mean cosine | worst sample | est. ms int8 | est. ms int16 | pipeline s |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        r = measure(rm, name, args.method, args.count)
        print(f"| {name} | {r['quantizers']} | {r['mean']:.4f} | {r['worst']:.4f} | {r['int8_ms']:.3f} | "
              f"{r['int16_ms']:.3f} | {r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
