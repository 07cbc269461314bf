"""All-int8 with a spelled-out LayerNorm and GELU quantized op by op, and run as one unit each (nash-e's
``composites``), on two transformer families: prints a Markdown table (issue 34).

* ``vit_s_focus``: the DINOv2-style ViT-S of ``../shared/models`` (opset 14: LayerNorm spelled out),
  8 CALIB photos to calibrate, 8 EVAL photos to score;
* ``torch_block``: a pre-norm transformer encoder built here with torch (four blocks of attention,
  LayerNorm, GELU and residual Adds, then a final LayerNorm; seeded random weights), exported at opset 14, on seeded random token
  sequences whose residual stream has two channels ``--outlier-scale`` (40) times the rest, as
  trained transformers' have (8 to calibrate, 8 others to score).

Each row runs ``fold-bn,fuse,insert-calibration,calibrate{method=max}`` for nash-e as it is, and for
nash-e with ``composites=()`` (every op quantized on its own), and scores the per-sample output
cosine of the all-int8 fake-quant model (onnxruntime) against the float model.

    python benchmarks/composites_int8.py [--models vit_s_focus torch_block] [--outlier-scale 40]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


def vit_case():
    from real_cases import realmodels

    rm = realmodels()
    key = rm.MODELS["vit_s_focus"][1]
    calib = [{key: rm.vit_input(i)} for i in rm.images(rm.CALIB)[:8]]
    evaluation = [{key: rm.vit_input(i)} for i in rm.images(rm.EVAL)[:8]]
    return rm.model("vit_s_focus"), {key: [1, 3, 224, 224]}, calib, evaluation


def torch_block_case(folder: Path, outlier_scale: float = 40.0):
    import torch
    from torch import nn

    torch.manual_seed(0)
    d, heads, hidden, tokens = 64, 4, 256, 32

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.fc1, self.fc2, self.act = nn.Linear(d, hidden), nn.Linear(hidden, d), nn.GELU()

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.fc2(self.act(self.fc1(self.ln2(x))))

    class Encoder(nn.Module):  # four blocks and a final LayerNorm, as an encoder ends
        def __init__(self):
            super().__init__()
            self.blocks, self.norm = nn.Sequential(*[Block() for _ in range(4)]), nn.LayerNorm(d)

        def forward(self, x):
            return self.norm(self.blocks(x))

    path = folder / "torch_block.onnx"
    torch.onnx.export(Encoder().eval(), (torch.zeros(1, tokens, d),), str(path), input_names=["x"], output_names=["y"],
                      opset_version=14, dynamo=False)
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal((1, tokens, d)).astype(np.float32) for _ in range(16)]
    for x in samples:  # two residual channels 40x the rest: the outlier channels trained transformers carry
        x[..., [3, 17]] *= outlier_scale
    samples = [{"x": x} for x in samples]
    return path, None, samples[:8], samples[8:]


def all_int8(model, shapes, calib, evaluation, profile) -> tuple[float, float, int, float]:
    import qir
    from qir.kinds import CalibRole
    from qir.metrics import cosine_similarity
    from qir.passes import PassManager, get_pass

    base = qir.load(model, input_shapes=shapes)
    ir = base.clone()
    start = time.perf_counter()
    steps = [get_pass("fold-bn"), get_pass("fuse", march=profile), get_pass("insert-calibration", march=profile),
             get_pass("calibrate", data=calib, method="max", progress=False)]
    PassManager(steps).run(ir)
    seconds = time.perf_counter() - start
    cosines = [min(cosine_similarity(qir.run(base, s, runtime="ort", level="float")[o], qir.run(ir, s, runtime="ort")[o])
                   for o in ir.outputs) for s in evaluation]
    return float(np.mean(cosines)), float(np.min(cosines)), len(ir.calibrations(CalibRole.ACTIVATION)), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vit_s_focus", "torch_block"], choices=["vit_s_focus", "torch_block"])
    parser.add_argument("--outlier-scale", type=float, default=40.0, help="torch_block: the two outlier channels' scale")
    args = parser.parse_args()
    from qir.runtimes.march import get_profile

    nash_e = get_profile("nash-e")
    print("| model | LayerNorm / GELU | activation quantizers | all-int8 mean cosine | worst sample | pipeline s |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            case = vit_case() if name == "vit_s_focus" else torch_block_case(Path(tmp), args.outlier_scale)
            for label, profile in (("op by op", nash_e.with_overrides(composites=())), ("one unit each", nash_e)):
                mean, worst, count, seconds = all_int8(*case, profile)
                print(f"| {name} | {label} | {count} | {mean:.4f} | {worst:.4f} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
