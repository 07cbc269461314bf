"""All-int8 with and without each repair transform (``smooth``, ``equalize``, ``bias-correct``, ``round-weights``) on
the ViT-S and PP-OCRv4 det: prints a Markdown table (issue 34).

Every configuration runs what ``qir calibrate`` runs (march nash-e: fold-bn, fuse,
insert-calibration, calibrate{method=max}), with the transforms where the natural pipeline puts
them: ``fold-bn,fuse,smooth,equalize,insert-calibration,calibrate,bias-correct``. It calibrates on 8
calibration images and scores on 8 others the per-image output cosine of the all-int8 fake-quant
model (onnxruntime) against the *original* float model: mean and worst image. PP-OCRv4 det reads
text images (``text_images``, seed 0 to calibrate, seed 1 to evaluate); the ViT-S the CALIB / EVAL
photos.

    python benchmarks/repair_int8.py [--models vit_s_focus ppocrv4_det] [--count 8]
"""
from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from real_cases import CASES as REAL_CASES
from real_cases import VIT_CASE, calib_and_eval, realmodels

CASES = {"vit_s_focus": VIT_CASE, "ppocrv4_det": REAL_CASES["ppocrv4_det"]}
CONFIGS = {  # label -> (transforms before calibration, after calibration)
    "all-int8 (none)": ("", ""),
    "smooth": ("smooth", ""),
    "equalize": ("equalize", ""),
    "equalize{activations}": ("equalize{activations=True}", ""),
    "bias-correct": ("", "bias-correct"),
    "bias-correct{empirical}": ("", "bias-correct{mode=empirical}"),
    "smooth,equalize,bias-correct": ("smooth,equalize", "bias-correct"),
    "smooth,bias-correct{empirical}": ("smooth", "bias-correct{mode=empirical}"),
    "round-weights{threshold}": ("", "round-weights{method='threshold'}"),
    "round-weights{adaround,200 it}": ("", "round-weights{method='adaround',iterations=200,batch=128}"),
    "round-weights{adaround,200 it,15 min}": ("", "round-weights{method='adaround',iterations=200,batch=64,"
                                                   "time_budget_s=900}"),
    "round-weights{adaround,200 it,10 min}": ("", "round-weights{method='adaround',iterations=200,batch=64,"
                                                   "time_budget_s=600}"),
    "round-weights{adaround,200 it,20 min}": ("", "round-weights{method='adaround',iterations=200,batch=64,"
                                                   "time_budget_s=1200}"),
    "smooth,round-weights{threshold}": ("smooth", "round-weights{method='threshold'}"),
}


def run_config(base, before: str, after: str, calib, evaluation, float_outputs) -> dict:
    from qir.metrics import cosine_similarity
    from qir.passes import PassManager, PipelineContext

    ir = base.clone()
    start = time.perf_counter()
    pipeline = ",".join(p for p in ("fold-bn,fuse{march=nash-e}", before, "insert-calibration{march=nash-e}",
                                    "calibrate{method='max',progress=False}", after) if p)
    result = PassManager(pipeline, context=PipelineContext(data=calib, measure=False)).run(ir)
    seconds = time.perf_counter() - start
    sites = {k: len(v.get("changed", [])) for k, v in result.report["passes"].items() if "changed" in v}
    for k, v in result.report["passes"].items():  # a time-bounded round-weights: how far it got
        if v.get("stopped_by_time_budget"):
            sites[k] = f"{sites[k]} (time budget: {sum('time budget' in s['reason'] for s in v['skipped'])} left)"
    import qir
    cosines = []
    for sample, ref in zip(evaluation, float_outputs):
        got = qir.run(ir, sample, runtime="ort")
        cosines.append(min(cosine_similarity(ref[o], got[o]) for o in ir.outputs))
    return {"mean": float(np.mean(cosines)), "worst": float(np.min(cosines)), "sites": sites, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--count", type=int, default=8, help="calibration and evaluation images each (default 8)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--log", action="store_true", help="log the passes' progress (round-weights: one line a layer)")
    args = parser.parse_args()
    import qir

    if args.log:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    rm = realmodels()
    print("| model | transforms | sites changed | all-int8 mean cosine | worst image | pipeline s |")
    print("|---|---|---|---|---|---|")
    for name in args.models:
        calib, evaluation = calib_and_eval(rm, name, CASES[name][0], args.count)
        key = rm.MODELS[name][1]
        base = qir.load(rm.model(name), input_shapes={key: CASES[name][1]})
        float_outputs = [qir.run(base, s, runtime="ort", level="float") for s in evaluation]
        for label in args.configs:
            r = run_config(base, *CONFIGS[label], calib, evaluation, float_outputs)
            sites = ", ".join(f"{k} {v}" for k, v in r["sites"].items()) or "-"
            print(f"| {name} | {label} | {sites} | {r['mean']:.4f} | {r['worst']:.4f} | {r['seconds']:.1f} |",
                  flush=True)


if __name__ == "__main__":
    main()
