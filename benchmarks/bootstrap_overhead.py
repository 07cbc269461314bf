"""What the rankings' bootstrap (:mod:`qir.passes.lib.confidence`) adds to a node sensitivity run,
on real models (issue 35: under 5%).

    python benchmarks/bootstrap_overhead.py [--models ppocr_cls yolov8n_320] [--samples 8] [--threads 1]

Each model is calibrated with ``max`` on 4 real images (the nash-e pipeline); the node sensitivity
of every activation quantizer (``node_type="activation"``) runs on ``--samples`` real images
(the calibration photos, repeated when there are fewer). The bootstrap's own time is measured
inside that run, by wrapping the call that computes it; printed: the run's CPU time (the
process's, one thread: steadier than wall time on a shared machine) and wall time, the
bootstrap's CPU time, their ratio, the table's rows and stable top-k.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["ppocr_cls", "yolov8n_320"])
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    from real_cases import calibrated_case, realmodels, samples

    from qir.passes import node_sensitivity
    from qir.passes.node_sensitivity import NodeSensitivityPass

    spent = []
    inner = node_sensitivity.rank_confidence

    def timed(*a, **kw):
        start = time.process_time()
        try:
            return inner(*a, **kw)
        finally:
            spent.append(time.process_time() - start)

    node_sensitivity.rank_confidence = timed
    rm = realmodels()
    for name in args.models:
        ir, _, _ = calibrated_case(name)
        data = samples(rm, name, (rm.CALIB * args.samples)[:args.samples])
        spent.clear()
        start, wall = time.process_time(), time.perf_counter()
        report = NodeSensitivityPass(data, node_type="activation", data_num=None, threads=args.threads,
                                     progress=False).analyse(ir)
        total = time.process_time() - start
        print(json.dumps({"model": name, "rows": len(report.rows), "samples": report.samples,
                          "run_cpu_s": round(total, 2), "run_wall_s": round(time.perf_counter() - wall, 2),
                          "bootstrap_cpu_s": round(sum(spent), 4),
                          "share": round(sum(spent) / total, 4), "stable_top_k": report.confidence.stable_top_k}),
              flush=True)


if __name__ == "__main__":
    main()
