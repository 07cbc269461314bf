"""``qir tune`` on PP-OCRv4 det stage by stage: where its time goes, and what it ends with on the
unseen images (issue 35).

    python benchmarks/tune_stages.py [--data DIR] [--model ppocrv4_det] [--target "cosine>=0.99,worst>=0.98"]
        [--transforms none] [--sensitivity-samples all] [--price latency] [--out FILE.json] [--profile FILE.prof]

The data and model are ``benchmarks/tune_peers.py``'s (8 calibration, 8 evaluation and 16 unseen
text images, the model's input fixed at 1x3x640x640; ``--model vit_s_focus``: the ViT-S on its 8 + 8
+ 8 photos), built under ``--data`` when missing. The
float model is calibrated once for nash-e with ``mse`` (``DATA/calibrated_mse.onnx``, kept); the
timed part is ``TunePass`` on that calibrated model, one thread, as ``qir tune --threads 1`` runs
it, with the calibration data for the clipping stage and the unseen images as check data. Each
stage's wall and CPU time (the process's: on a shared machine the steadier of the two, one
thread) are measured by wrapping the pass's stage methods (nested calls counted once, in the
outer stage, except the clipping statistics: also inside ``bounds``), the transforms stage
(tune's default candidates, or ``--transforms``) included; ``--profile`` also writes a cProfile
of the timed part (it slows the run by about a tenth); the JSON holds the times,
the result's cost against all-int16, its estimated time (ms) and FLOP cost against all-int8, its
calibration nodes per mode and GEMMs per precision, its score on the evaluation and on the unseen images, and
the sensitivity order's stable top-k and the samples it ranked on, and the transforms kept.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

STAGES = {  # stage -> (module, attribute) wrapped
    "transforms": ("qir.passes.tune", "choose_transforms"),
    "clipping statistics": ("qir.passes.tune", "clipping_fixes"),
    "bounds": ("qir.passes.tune.TunePass", "_bounds"),
    "sensitivity": ("qir.passes.tune.TunePass", "_sensitivity"),
    "ratio search": ("qir.passes.tune", "ratio_search"),
    "greedy": ("qir.passes.tune", "greedy"),
    "pruning": ("qir.passes.tune", "prune"),
    "verification": ("qir.passes.tune.TunePass", "_verified"),
    "backtracking": ("qir.passes.tune.TunePass", "_backtrack"),
    "integer repair": ("qir.passes.tune", "integer_repair"),
    "trim thresholds": ("qir.passes.tune.TunePass", "_trim_thresholds"),
    "attribution": ("qir.passes.tune.TunePass", "_attribute"),
}


ALWAYS = {"clipping statistics"}  # timed inside the bounds stage too (which includes it)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _timed(times: dict[str, list[float]], name: str, fn, active: list[str]):
    def run(*args, **kwargs):
        wall, cpu = _clocks()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = times.setdefault(name, [0.0, 0.0])
            spent[0] += time.perf_counter() - wall
            spent[1] += time.process_time() - cpu

    def wrapper(*args, **kwargs):
        if name in ALWAYS:
            return run(*args, **kwargs)
        if active:  # (inside another stage: counted there)
            return fn(*args, **kwargs)
        active.append(name)
        try:
            return run(*args, **kwargs)
        finally:
            active.pop()
    return wrapper


def instrument() -> tuple[dict[str, list[float]], dict[str, int]]:
    """The stages' times, and per stage the samples the search ran whole (a configuration on one
    sample, one onnxruntime run: a count the machine's load does not move)."""
    import importlib

    times: dict[str, list[float]] = {}
    runs: dict[str, int] = {}
    active: list[str] = []
    for name, (where, attr) in STAGES.items():
        module, _, cls = where.partition(".TunePass")
        owner = importlib.import_module(module)
        owner = getattr(owner, "TunePass") if where.endswith("TunePass") else owner
        setattr(owner, attr, _timed(times, name, getattr(owner, attr), active))
    evaluator = importlib.import_module("qir.passes.tune.evaluator")
    whole = evaluator.run_whole

    def counted(*args, **kwargs):
        stage = active[-1] if active else "other"
        runs[stage] = runs.get(stage, 0) + 1
        return whole(*args, **kwargs)
    evaluator.run_whole = counted
    return times, runs


def prepared(folder: str | None, model: str, march: str, prefix: str):
    """``tune_peers.py``'s data for ``model`` under ``folder`` (a temp dir named ``prefix`` when
    None; built when missing) and its float model calibrated for ``march`` with ``mse``
    (``FOLDER/calibrated_mse.onnx``, built once and kept): ``(data folders, the calibrated IR)``."""
    import tune_peers

    import qir
    from qir.tools.tune import _calibrate

    root = Path(folder or tempfile.mkdtemp(prefix=prefix))
    data, models = tune_peers.build_data(root, model), tune_peers.build_models(root, model)
    calibrated = root / "calibrated_mse.onnx"
    if not calibrated.exists():
        ir = qir.load(models["static"])
        _calibrate(ir, str(data["calib"]), march, "mse", 99.99)
        qir.save(ir, calibrated)
    return data, qir.load(calibrated)


def _samples(text: str) -> int | str | None:
    return None if text == "all" else text if text == "auto" else int(text)


def main() -> None:
    import tune_peers

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder of the data and models (default: a temp dir)")
    p.add_argument("--model", default="ppocrv4_det", choices=sorted(tune_peers.MODELS),
                   help="which of tune_peers.py's models (default ppocrv4_det)")
    p.add_argument("--target", default="cosine>=0.99,worst>=0.98")
    p.add_argument("--march", default="nash-e")
    p.add_argument("--transforms", default="default", help="'none', or the transforms stage's candidates, "
                   "comma-separated (default: tune's default)")
    p.add_argument("--sensitivity-samples", default="all", help="qir tune's --sensitivity-samples: 'all' (its "
                   "default), 'auto', or a count of the worst evaluation samples")
    p.add_argument("--price", default="latency", choices=["latency", "flops"], help="qir tune's --price")
    p.add_argument("--out", default=None, help="also write the numbers to this JSON file")
    p.add_argument("--report", default=None, help="also write tune's report (JSON, without its "
                   "verification section, which holds the emitted model) to this file")
    p.add_argument("--profile", default=None, help="also write a cProfile of the timed part to this file")
    args = p.parse_args()

    data, ir = prepared(args.data, args.model, args.march, "tune_stages_")
    from qir.passes import get_pass

    times, runs = instrument()
    transforms = {} if args.transforms == "default" else {
        "transforms": None if args.transforms == "none" else args.transforms.split(",")}
    tune = get_pass("tune", target=args.target, eval_data=str(data["eval"]), calib_data=str(data["calib"]),
                    march=args.march, threads=1, check_data=str(data["held"]), progress=False,
                    sensitivity_samples=_samples(args.sensitivity_samples), price=args.price, **transforms)
    profiler = cProfile.Profile() if args.profile else None
    start, cpu = _clocks()
    if profiler:
        profiler.enable()
    result = tune(ir)
    total, total_cpu = time.perf_counter() - start, time.process_time() - cpu
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    r = result.report
    unseen = r.get("unseen") or {}
    out = {"target": args.target, "seconds": round(total, 1), "cpu_seconds": round(total_cpu, 1),
           "stages (wall s, cpu s)": {k: [round(v[0], 2), round(v[1], 2)] for k, v in times.items()},
           "whole runs (samples)": runs,
           "reached": r["reached"], "cost_vs_int16": r["final"]["cost_vs_int16"], "eval_mean": r["final"]["mean"],
           "est_ms": round(r["final"]["time_us"] / 1000, 3), "flop_cost_vs_start": r["final"]["flop_cost_vs_start"],
           "eval_worst": r["final"]["worst"], "unseen_mean": unseen.get("mean"), "unseen_worst": unseen.get("worst"),
           "raised": r["raised"], "calibration_modes": r["calibration_modes"], "gemm_ops": r["gemm_ops"],
           "configurations": r["configurations"], "engine_calls": r["engine_calls"],
           "stable_top_k": (r.get("sensitivity") or {}).get("stable_top_k"),
           "sensitivity_units": len((r.get("sensitivity") or {}).get("rows", [])),
           "sensitivity_samples": (r.get("ratio_search") or {}).get("sensitivity_samples"),
           "transforms_chosen": (r.get("transforms") or {}).get("chosen")}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.report:
        from qir.json_dump import json_text

        kept = {k: r[k] for k in r.keys() if k != "verification"}  # (that holds the emitted model)
        Path(args.report).write_text(json_text("qir.tune", kept))


if __name__ == "__main__":
    main()
