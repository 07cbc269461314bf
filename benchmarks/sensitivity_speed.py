"""Per-node sensitivity: the naive way vs qir's analysis engine, on real models.

    python benchmarks/sensitivity_speed.py [--models yolov8n_320 ppocrv4_det ppocr_cls]
                                           [--repeats 3] [--naive-nodes 24] [--threads 2]

For each model (calibrated with ``max`` on 4 real images, the nash-e default pipeline) and one
real sample, over its N activation calibration nodes:

- (b) "only this node quantized" (float reference, one node int8) and
- (c) "only this node back to float" (int8 reference, one node float; compared with float),

each computed two ways:

- naive: per node, clone the IR, set the modes, export it, open a new onnxruntime session and
  run the whole model (what hmct-debugger and plain onnxruntime scripts do). Timed on
  ``--naive-nodes`` nodes spread over the graph and scaled to N (every node costs about the
  same: one session build plus one forward);
- qir: ``qir.runtimes.engine.Engine`` over all N nodes, from scratch (plan, sessions, reference run
  included), median of ``--repeats`` runs.

Also printed: F, one float forward of the whole model (onnxruntime, same threads; measured
right before each qir run as the median of 10 runs, and the fastest of those measurements kept:
on a noisy machine a slow period only ever adds time, so the fastest is the best estimate of the
compute limit, and the floor it gives is the strictest), and the quantized forward (likewise),
which sets the speed at which (c) re-runs its cones;
N×F; the cone floor Σ_i (FLOPs downstream of node i / all FLOPs)·F (FLOPs as in
``qir.runtimes.engine.cost``); qir's ratio to each; the peak RSS of the process during the qir runs
(the kernel's counter is reset before them, so model loading and calibration do not count).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from pathlib import Path

from real_cases import CASES, calibrated_case


def _reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) so it measures what follows (Linux), after
    handing memory freed by earlier work (model loading, calibration, F) back to the system."""
    from qir.runtimes.engine.cache import release_free_memory

    gc.collect()
    release_free_memory()
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss_mb(field: str = "VmHWM") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _forward_time(model, sample, threads: int, runs: int = 10) -> float:
    """One whole-model onnxruntime forward (median of ``runs``, after 3 warm-ups)."""
    from qir.runtimes.base import get_runtime

    rt = get_runtime("ort", threads=threads)
    for _ in range(3):
        rt.run(model, sample)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        rt.run(model, sample)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)  # (rt and its session's memory arena go with it: not qir's)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--naive-nodes", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from qir.runtimes.engine import Engine, Variant, configured_clone, evaluate_plainly
    from qir.runtimes.engine.cost import cone_fraction, step_flops
    from qir.runtimes.engine.plan import build_plan

    head = (f"{'model':<12}{'job':<13}{'N':>4}{'naive s':>9}{'qir s':>8}{'speedup':>8}{'F ms':>7}"
            f"{'N*F s':>7}{'floor s':>8}{'qir/NF':>7}{'qir/floor':>10}{'RSS MB':>8}")
    print(head)
    for name in args.models:
        ir, sample, images = calibrated_case(name)
        del images
        nodes = [c.name for c in ir.calibrations("activation")]
        n = len(nodes)

        float_ir = configured_clone(ir, "float", {})
        forwards, quantized_forwards = [], []

        def measure_forwards() -> None:
            forwards.append(_forward_time(float_ir, sample, args.threads))
            quantized_forwards.append(_forward_time(ir, sample, args.threads))
            for model in (float_ir, ir):
                model.touch()  # drop the whole-model session (and its memory arena) cached in the IR
            gc.collect()

        plan = build_plan(ir)
        flops = step_flops(ir, plan)
        cone = sum(cone_fraction(plan, flops, [c]) for c in nodes)

        picked = nodes[:: max(1, n // args.naive_nodes)][: args.naive_nodes]
        for job, reference, mode in (("(b) quantize", "float", "int8"), ("(c) to float", "quantized", "float")):
            variants = [Variant(c, {c: mode}) for c in nodes]
            runs = []
            _reset_peak_rss()
            base_rss = _peak_rss_mb("VmRSS")
            for _ in range(args.repeats):
                measure_forwards()
                _reset_peak_rss()
                t0 = time.perf_counter()
                engine = Engine(ir, [sample], reference=reference, threads=args.threads, progress=False)
                result = engine.evaluate(variants)
                runs.append(time.perf_counter() - t0)
                level = engine.optimization
                engine.close()
            took = statistics.median(runs)
            rss = _peak_rss_mb()
            forward, quantized_forward = min(forwards), min(quantized_forwards)
            floor = cone * forward
            t0 = time.perf_counter()
            for c in picked:
                evaluate_plainly(ir, sample, {c: mode}, reference=reference, runtime="ort", threads=args.threads)
            naive = (time.perf_counter() - t0) / len(picked) * n
            print(f"{name:<12}{job:<13}{n:>4}{naive:>9.2f}{took:>8.2f}{naive / took:>7.1f}x"
                  f"{forward * 1e3:>7.1f}{n * forward:>7.2f}{floor:>8.2f}{took / (n * forward):>7.2f}"
                  f"{took / floor:>10.2f}{rss:>8.0f}", flush=True)
            del result
        print(f"{'':<12}cone floor / N*F = {floor / (n * forward):.2f}; naive timed on {len(picked)} "
              f"of {n} nodes; qir median of {args.repeats} (onnxruntime level {level}); F the fastest of "
              f"{len(forwards)} measurements (median of 10 runs each) taken between the qir runs; "
              f"RSS: peak of the whole process, which held {base_rss:.0f} MB before qir started", flush=True)
        print(f"{'':<12}the quantized forward takes {quantized_forward * 1e3:.1f} ms = "
              f"{quantized_forward / forward:.2f} F: (c) re-runs its cones quantized, so its floor at that speed "
              f"is {floor * quantized_forward / forward:.2f} s and qir (c) / that = "
              f"{took / (floor * quantized_forward / forward):.2f}", flush=True)


if __name__ == "__main__":
    main()
