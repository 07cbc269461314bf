"""All-int8 on the evaluation and on unseen samples for each calibration method and transform:
does the order on the evaluation samples carry to unseen ones? Prints a Markdown table (issue 34).

Reads a ``tune_peers.py`` data folder (``--data DIR``, built by ``tune_peers.py --data DIR``; the ViT-S's
is ``DIR/vit_s_focus``): ``float_static.onnx`` and ``calib/``, ``eval/``, ``held/`` of ``.npy``
samples. Each row runs ``fold-bn,fuse{march=nash-e},[TRANSFORMS,]insert-calibration{march=nash-e},
calibrate{method=M}`` on the calibration samples and scores the all-int8 model in onnxruntime: the
per-sample output cosine against the float model, mean and worst, on the evaluation and the unseen
(held) samples.

    python benchmarks/calibration_choice.py --data DIR/vit_s_focus [--methods max mse] [--transforms "" smooth]
"""
from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, type=Path, help="float_static.onnx with calib/ eval/ held/ beside it")
    parser.add_argument("--methods", nargs="+", default=["max", "mse", "percentile", "kl", "mix"])
    parser.add_argument("--transforms", nargs="+", default=["", "smooth"],
                        help="float transforms before calibration, one pipeline text a row ('' for none)")
    args = parser.parse_args()
    import qir
    from qir.metrics import cosine_similarity
    from qir.passes import PassManager, PipelineContext

    base = qir.load(args.data / "float_static.onnx")
    name = base.inputs[0]
    sets = {sub: [{name: np.load(f)} for f in sorted(glob.glob(str(args.data / sub / "*.npy")))]
            for sub in ("calib", "eval", "held")}
    refs = {k: [qir.run(base, s, runtime="ort", level="float") for s in sets[k]] for k in ("eval", "held")}
    print("| calibration | transforms | eval mean | eval worst | unseen mean | unseen worst | pipeline s |")
    print("|---|---|---|---|---|---|---|")
    for method in args.methods:
        for before in args.transforms:
            start = time.perf_counter()
            ir = base.clone()
            pipeline = ",".join(p for p in ("fold-bn,fuse{march=nash-e}", before, "insert-calibration{march=nash-e}",
                                            f"calibrate{{method='{method}',progress=False}}") if p)
            PassManager(pipeline, context=PipelineContext(data=sets["calib"], measure=False)).run(ir)
            seconds = time.perf_counter() - start
            cells = []
            for k in ("eval", "held"):
                cos = [min(cosine_similarity(r[o], qir.run(ir, s, runtime="ort")[o]) for o in ir.outputs)
                       for s, r in zip(sets[k], refs[k])]
                cells += [f"{np.mean(cos):.4f}", f"{np.min(cos):.4f}"]
            print(f"| {method} | {before or 'none'} | {' | '.join(cells)} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
