"""What ``qir tune``'s sensitivity stage must cost at least on this machine (issue 35): its
units, each lowered alone from the reference, re-executed on every evaluation sample.

    python benchmarks/sensitivity_floor.py [--data DIR] [--model ppocrv4_det] [--march nash-e]
        [--repeats 3] [--out FILE.json]

The data and the ``mse``-calibrated model are ``benchmarks/tune_stages.py``'s (built under
``--data`` when missing); calibration nodes are split per consumer group first, as tune does by
default. On the reference tune searches down from (the upper bound), for each unit the stage ranks
(every searchable unit that is not cheap, as tune picks them): the share of the model's FLOPs in
its cone (what the engine re-executes: everything downstream of the unit's calibration nodes) and
the share it runs in fact (the engine runs a segment that holds no change whole, cone or not).
Then the time of one whole fake-quant run of the reference on one thread (onnxruntime, as the
evaluator writes it: the fastest of ``--repeats`` per sample, the mean over samples). The floor is
units x samples x the mean cone share x that time: what re-executing each cone once per sample
costs with nothing else (no session builds, no reference passes). It prints the figures and,
with ``--out``, writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")


def cone_shares(ir, space, reference, units, sample) -> tuple[list[float], list[float], int]:
    """Per unit, the share of the model's FLOPs in its cone and the share the engine runs (the
    segments of the cone that hold no change run whole); and the number of segments."""
    import numpy as np

    from qir.runtimes.engine import EngineOptions
    from qir.runtimes.engine.cost import step_flops
    from qir.runtimes.engine.engine import Engine

    ref = space.changes(reference)
    engine = Engine(ir, [sample], EngineOptions(reference="quantized", reference_changes=ref, progress=False, threads=1))
    plan = engine.plan
    flops = step_flops(ir, plan)
    total = float(flops.sum())
    cones, runs = [], []
    for i in units:
        lowered = space.changes(space.move(reference, {i: 0}))
        changed = [n for n in set(ref) | set(lowered) if ref.get(n) != lowered.get(n)]
        start = plan.start_steps(changed)
        cone = plan.cone(start)
        run = 0.0
        for lo, hi in plan.segments:
            inside = np.flatnonzero(cone[lo:hi]) + lo
            if inside.size:
                run += float(flops[inside].sum() if any(lo <= s < hi for s in start) else flops[lo:hi].sum())
        cones.append(float(flops[cone].sum()) / total)
        runs.append(run / total)
    engine.close()
    return cones, runs, len(plan.segments)


def whole_seconds(ir, space, reference, samples, repeats: int) -> float:
    """One whole fake-quant run of ``reference`` on one thread: the fastest of ``repeats`` per
    sample, the mean over samples (the evaluator's runtime and lowering)."""
    from qir.execution import Level, Runtime
    from qir.runtimes.base import get_runtime
    from qir.runtimes.engine import configured_clone
    from qir.runtimes.engine.variants import run_whole

    model = configured_clone(ir, "quantized", space.changes(reference))
    rt = get_runtime(Runtime.ORT, level=Level.FAKEQUANT, threads=1, optimization="all", layout_stable=True)
    outputs = list(ir.outputs)
    run_whole(model, samples[0], outputs, rt)  # (the session is built here, not timed)
    times = []
    for sample in samples:
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            run_whole(model, sample, outputs, rt)
            best = min(best, time.perf_counter() - began)
        times.append(best)
    return sum(times) / len(times)


def main() -> None:
    import tune_peers
    from tune_stages import prepared

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=None, help="folder of the data and models (default: a temp dir)")
    p.add_argument("--model", default="ppocrv4_det", choices=sorted(tune_peers.MODELS))
    p.add_argument("--march", default="nash-e")
    p.add_argument("--repeats", type=int, default=3, help="runs per sample; the fastest counts")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    args = p.parse_args()

    data, ir = prepared(args.data, args.model, args.march, "sensitivity_floor_")
    from qir.passes.tune import CHEAP_SHARE, checked_samples
    from qir.passes.tune.space import Space, constrained_splits
    from qir.runtimes.march import get_profile
    from qir.split import split_calibration

    for name, groups in constrained_splits(ir, get_profile(args.march)).items():  # (as tune splits by default)
        split_calibration(ir, name, groups)
    space = Space(ir, get_profile(args.march))
    base = space.apply(ir.clone(), space.start())
    reference = space.upper()
    cheap = set(space.cheap(space.start(), reference, CHEAP_SHARE))
    units = [i for i in space.searchable() if reference.levels[i] > 0 and i not in cheap]
    samples = checked_samples(base, str(data["eval"]))
    cones, runs, segments = cone_shares(base, space, reference, units, samples[0])
    whole = whole_seconds(base, space, reference, samples, args.repeats)
    cone = sum(cones) / len(cones)
    out = {"model": args.model, "units": len(units), "cheap_units": len(cheap), "samples": len(samples),
           "segments": segments, "mean_cone_share": round(cone, 4), "mean_run_share": round(sum(runs) / len(runs), 4),
           "whole_run_s": round(whole, 4), "floor_s": round(len(units) * len(samples) * cone * whole, 1)}
    print(f"{args.model}: {out['units']} units ranked ({out['cheap_units']} cheap ones left out), "
          f"{out['samples']} samples, {segments} segments")
    print(f"  a cone holds {100 * cone:.1f}% of the model's FLOPs on average; the engine runs "
          f"{100 * out['mean_run_share']:.1f}% (segments without a change run whole)")
    print(f"  one whole fake-quant run of the reference, one thread: {whole:.4f} s")
    print(f"  floor of the sensitivity stage: {out['units']} x {out['samples']} x {cone:.3f} x {whole:.4f} s = "
          f"{out['floor_s']} s")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
