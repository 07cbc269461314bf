"""How far one photo's score moves under int8 noise on the ViT-S: fake quantization and nash-e's
integer level against float, value by value, and what a small change of precision does to each
photo (issue 34: "what decides the worst photo at the integer level").

    python benchmarks/vit_noise.py --data DIR [--model CALIBRATED.onnx]

``DIR`` is ``benchmarks/tune_peers.py``'s ViT-S data folder (``float_static.onnx`` and the
``eval`` / ``held`` photos as ``.npy``); the calibrated model defaults to
``DIR/calibrated_mse.onnx`` (what ``benchmarks/tune_stages.py --model vit_s_focus`` writes). It
prints, for the evaluation and the held photos, each photo's cosine with the float outputs at
fake quantization (onnxruntime) and at the integer level (numpy); then on the evaluation photo the
integer level scores worst, the relative error against float of every activation quantizer's
value at both levels and between them, every `--every`-th row; and the same scores with the
twelve Softmax outputs at int16 (a change that lowers the noise everywhere); and per held photo
the range of its score over twelve configurations that each raise one Softmax input alone to
int16, in onnxruntime and in the numpy runtime (the same arithmetic, another float rounding order);
last, the residual stream at int16 (the outputs of the embeddings' Add and of each layer's two
residual Adds: one role across the layers, not units picked on the evaluation photos), with its
estimated time on nash-e.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")


def _feeds(ir, folder: Path) -> list[dict]:
    return [{ir.inputs[0]: np.load(f).astype(np.float32)} for f in sorted(folder.glob("*.npy"))]


def _float_outputs(qir, base, feeds) -> list[np.ndarray]:
    return [qir.run(base, f, runtime="ort", level="float")[base.outputs[0]] for f in feeds]


def _scores(qir, ref, ir, feeds) -> tuple[list[float], list[float]]:
    from qir.metrics import cosine_similarity

    fq = [cosine_similarity(r, qir.run(ir, f, runtime="ort", level="fakequant")[ir.outputs[0]]) for r, f in zip(ref, feeds)]
    it = [cosine_similarity(r, qir.run(ir, f, runtime="numpy", level="integer")[ir.outputs[0]]) for r, f in zip(ref, feeds)]
    return fq, it


def _line(name: str, values: list[float]) -> str:
    return f"  {name:<10} mean {np.mean(values):.4f} worst {np.min(values):.4f}  " + " ".join(f"{v:.4f}" for v in values)


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / (np.linalg.norm(a) + 1e-12))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tune_peers.py's vit_s_focus data folder")
    p.add_argument("--model", default=None, help="the calibrated model (default DATA/calibrated_mse.onnx)")
    p.add_argument("--every", type=int, default=12, help="print every N-th quantizer's row (default 12)")
    args = p.parse_args()
    import qir
    from qir.records import CalibRecord

    data = Path(args.data)
    base, ir = qir.load(data / "float_static.onnx"), qir.load(args.model or data / "calibrated_mse.onnx")
    sets = {name: _feeds(ir, data / name) for name in ("eval", "held")}
    refs = {name: _float_outputs(qir, base, feeds) for name, feeds in sets.items()}  # (once: every config compares with them)
    scores = {name: _scores(qir, refs[name], ir, feeds) for name, feeds in sets.items()}
    print("cosine with float, per photo (all-int8 as calibrated):")
    for name, (fq, it) in scores.items():
        print(_line(f"{name} fq", fq))
        print(_line(f"{name} int", it))
    worst = int(np.argmin(scores["eval"][1]))
    values = [c.output for c in ir.calibrations("activation")]
    feed = sets["eval"][worst]
    runs = {level: qir.run(ir, feed, runtime="numpy", level=level, capture=values)
            for level in ("float", "fakequant", "integer")}
    print(f"\nevaluation photo {worst}, relative error of each quantized value (every {args.every}th):")
    print(f"  {'value':<70} {'fq':>7} {'int':>7} {'fq-int':>7}")
    for k, c in enumerate(ir.calibrations("activation")):
        if k % args.every and k != len(values) - 1:
            continue
        fl, fq, it = (runs[level][c.output] for level in ("float", "fakequant", "integer"))
        print(f"  {c.name[-70:]:<70} {_relative(fl, fq):7.4f} {_relative(fl, it):7.4f} {_relative(fq, it):7.4f}")
    softmax = ir.clone()
    outs = [c.name for op in ir.ops("Softmax") for c in ir.consumers(op.outputs[0]) if isinstance(c, CalibRecord)]
    for name in outs:
        softmax.set_calibration(name, mode="int16")
    print(f"\nwith the {len(outs)} Softmax outputs at int16:")
    for name, feeds in sets.items():
        fq, it = _scores(qir, refs[name], softmax, feeds)
        print(_line(f"{name} fq", fq))
        print(_line(f"{name} int", it))
    _single_raises(qir, refs["held"], ir, sets["held"])
    _residual_stream(qir, refs, ir, sets)


def _residual_stream(qir, refs, ir, sets) -> None:
    import re

    from qir.passes.tune.space import Space
    from qir.runtimes.march import get_profile

    pattern = re.compile(r"(layer\.\d+/Add(_1)?|embeddings/Add)_output_0_calib$")
    names = [c.name for c in ir.calibrations("activation") if pattern.search(c.name)]
    raised = ir.clone()
    for name in names:
        raised.set_calibration(name, mode="int16")
    profile = get_profile("nash-e")
    print(f"\nthe residual stream at int16 ({len(names)} quantizers): est. {Space(raised, profile).cost_of_ir() / 1000:.3f} "
          f"ms (all-int8 {Space(ir, profile).cost_of_ir() / 1000:.3f} ms)")
    for name, feeds in sets.items():
        fq, it = _scores(qir, refs[name], raised, feeds)
        print(_line(f"{name} fq", fq))
        print(_line(f"{name} int", it))


def _single_raises(qir, ref, ir, feeds) -> None:
    """Per photo, the lowest and highest fake-quant score over the configurations that raise one
    Softmax input alone to int16, in onnxruntime and numpy."""
    from qir.metrics import cosine_similarity
    from qir.records import CalibRecord

    inputs = [ir.producer(op.inputs[0]).name for op in ir.ops("Softmax")
              if isinstance(ir.producer(op.inputs[0]), CalibRecord)]
    got = {rt: np.zeros((len(inputs), len(feeds))) for rt in ("ort", "numpy")}
    for k, name in enumerate(inputs):
        one = ir.clone()
        one.set_calibration(name, mode="int16")
        for rt, table in got.items():
            table[k] = [cosine_similarity(r, qir.run(one, f, runtime=rt, level="fakequant")[one.outputs[0]])
                        for r, f in zip(ref, feeds)]
    print(f"\none of the {len(inputs)} Softmax inputs at int16 (each alone), held photos, lowest / highest score:")
    for rt, table in got.items():
        print(f"  {rt:<6} " + "  ".join(f"{lo:.4f}/{hi:.4f}" for lo, hi in zip(table.min(0), table.max(0))))
    print(f"  largest onnxruntime-numpy difference on one configuration and photo: {np.abs(got['ort'] - got['numpy']).max():.4f}")


if __name__ == "__main__":
    main()
