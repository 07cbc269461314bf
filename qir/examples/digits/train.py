"""Train the bundled digits example and write it as ONNX with calibration and evaluation data.

The example behind ``qir demo`` and the README's first command: a tiny CNN trained on
scikit-learn's handwritten digits (``sklearn.datasets.load_digits``: 1797 grayscale 8x8
images, 10 classes; the data ships inside scikit-learn, so nothing is downloaded).

What the script does, deterministically (fixed seeds, one thread, deterministic torch kernels):

1. Loads the digits and scales pixels to [0, 1] (``x / 16``, float32, NCHW ``1x1x8x8``).
2. Splits them with stratified ``train_test_split``: an evaluation set of exactly 200 samples,
   then a calibration set of exactly 32 samples taken out of the remaining training part;
   the other 1565 samples are used for training.
3. Trains a small CNN (~16k parameters, a few seconds of CPU) that has what quantization
   debugging cares about: Conv+BatchNorm+ReLU blocks, a depthwise 3x3 conv, a residual Add
   followed by ReLU, MaxPool, GlobalAveragePool, Flatten and a final Gemm.
4. Writes the ONNX model by hand with ``onnx.helper`` from the trained weights (opset 17,
   IR version 8), keeping every BatchNormalization as its own node after its Conv so a
   fold-bn pass has something to fold. Nodes carry readable names (``conv1``, ``bn1``,
   ``relu1``, ``dw3``, ``add4``, ``fc``, ...); the graph input is ``input`` [1,1,8,8] float32
   and the output is ``logits`` [1,10] float32.
5. Checks the model (``onnx.checker.check_model(full_check=True)``) and verifies it against
   the torch model with onnxruntime on the whole evaluation set, one sample at a time
   (max abs logit difference < 1e-4 and identical argmax); it exits non-zero otherwise.
6. Writes, next to this file::

       model.onnx
       calibration_data/input/0.npy ... 31.npy   float32 (1,1,8,8)  (hmct layout <input_name>/<i>.npy)
       calibration_labels.npy                     int64 (32,)
       eval_images.npy                            float32 (200,1,1,8,8)
       eval_labels.npy                            int64 (200,)
       info.json                                  split, seeds, preprocessing, accuracy, versions

Regenerate with either of::

    python -m qir.examples.digits.train
    python qir/examples/digits/train.py

With the same library versions on the same machine the outputs are byte-identical from run
to run. Another CPU or another torch version may pick different float kernels and produce
slightly different weights (and so different bytes), but the same kind of model.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from pathlib import Path

# One thread everywhere, set before torch/numpy spin up their pools.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np
import onnx
import onnxruntime as ort
import sklearn
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional as F

OUT_DIR = Path(__file__).resolve().parent
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
OPSET = 17
IR_VERSION = 8

N_EVAL = 200
N_CALIB = 32
SPLIT_SEED = 0  # eval vs. rest
CALIB_SEED = 1  # calibration vs. train, inside the rest
TORCH_SEED = 0  # weight init and batch order
EPOCHS = 20
BATCH_SIZE = 32
LR = 3e-3
WEIGHT_DECAY = 1e-4
BN_EPS = 1e-5

ATOL = 1e-4
REGENERATE = "python -m qir.examples.digits.train"


class DigitsNet(nn.Module):
    """conv-bn-relu x2 -> [depthwise-bn-relu -> 1x1-bn] + skip -> relu -> maxpool -> conv-bn-relu -> GAP -> fc."""

    def __init__(self, c1: int = 16, c2: int = 32, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, c1, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c1, eps=BN_EPS)
        self.conv2 = nn.Conv2d(c1, c2, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c2, eps=BN_EPS)
        self.dw3 = nn.Conv2d(c2, c2, 3, padding=1, groups=c2, bias=False)
        self.bn3 = nn.BatchNorm2d(c2, eps=BN_EPS)
        self.pw4 = nn.Conv2d(c2, c2, 1, bias=False)
        self.bn4 = nn.BatchNorm2d(c2, eps=BN_EPS)
        self.conv5 = nn.Conv2d(c2, c2, 3, padding=1, bias=False)
        self.bn5 = nn.BatchNorm2d(c2, eps=BN_EPS)
        self.fc = nn.Linear(c2, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        y = F.relu(self.bn3(self.dw3(x)))
        y = self.bn4(self.pw4(y))
        x = F.relu(x + y)
        x = F.max_pool2d(x, 2)  # 8x8 -> 4x4
        x = F.relu(self.bn5(self.conv5(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set (e.g. when imported twice in one process)
        pass
    torch.use_deterministic_algorithms(True)


def load_split() -> dict[str, np.ndarray]:
    digits = load_digits()
    x = (digits.data.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    idx = np.arange(len(y))
    rest_idx, eval_idx = train_test_split(
        idx, test_size=N_EVAL, stratify=y, random_state=SPLIT_SEED, shuffle=True
    )
    train_idx, calib_idx = train_test_split(
        rest_idx, test_size=N_CALIB, stratify=y[rest_idx], random_state=CALIB_SEED, shuffle=True
    )
    assert len(eval_idx) == N_EVAL and len(calib_idx) == N_CALIB
    assert not (set(eval_idx) | set(calib_idx)) & set(train_idx)
    return {
        "x_train": x[train_idx], "y_train": y[train_idx],
        "x_calib": x[calib_idx], "y_calib": y[calib_idx],
        "x_eval": x[eval_idx], "y_eval": y[eval_idx],
        "n_total": np.int64(len(y)),
    }


def train(model: DigitsNet, x: np.ndarray, y: np.ndarray) -> None:
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(TORCH_SEED)
    opt = torch.optim.Adam(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    steps_per_epoch = (len(yt) + BATCH_SIZE - 1) // BATCH_SIZE
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=LR, epochs=EPOCHS, steps_per_epoch=steps_per_epoch
    )
    model.train()
    for _ in range(EPOCHS):
        perm = torch.randperm(len(yt), generator=gen)
        for s in range(steps_per_epoch):
            b = perm[s * BATCH_SIZE : (s + 1) * BATCH_SIZE]
            if len(b) < 2:  # BatchNorm needs more than one sample per batch in training mode
                continue
            loss = F.cross_entropy(model(xt[b]), yt[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    model.eval()


def _arr(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def to_onnx(model: DigitsNet) -> onnx.ModelProto:
    """Build the ONNX graph node by node from the trained (eval-mode) weights."""
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def init(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def conv(name: str, x: str, m: nn.Conv2d) -> str:
        w = init(f"{name}.weight", _arr(m.weight))
        ins = [x, w]
        if m.bias is not None:
            ins.append(init(f"{name}.bias", _arr(m.bias)))
        k = list(m.kernel_size)
        p = list(m.padding)
        nodes.append(helper.make_node(
            "Conv", ins, [f"{name}_out"], name=name,
            kernel_shape=k, pads=p + p, strides=list(m.stride),
            dilations=list(m.dilation), group=m.groups,
        ))
        return f"{name}_out"

    def bn(name: str, x: str, m: nn.BatchNorm2d) -> str:
        ins = [
            x,
            init(f"{name}.scale", _arr(m.weight)),
            init(f"{name}.bias", _arr(m.bias)),
            init(f"{name}.mean", _arr(m.running_mean)),
            init(f"{name}.var", _arr(m.running_var)),
        ]
        nodes.append(helper.make_node(
            "BatchNormalization", ins, [f"{name}_out"], name=name, epsilon=float(m.eps),
        ))
        return f"{name}_out"

    def op(op_type: str, name: str, ins: list[str], out: str | None = None, **attrs) -> str:
        out = out or f"{name}_out"
        nodes.append(helper.make_node(op_type, ins, [out], name=name, **attrs))
        return out

    x = INPUT_NAME
    x = op("Relu", "relu1", [bn("bn1", conv("conv1", x, model.conv1), model.bn1)])
    x = op("Relu", "relu2", [bn("bn2", conv("conv2", x, model.conv2), model.bn2)])
    y = op("Relu", "relu3", [bn("bn3", conv("dw3", x, model.dw3), model.bn3)])
    y = bn("bn4", conv("pw4", y, model.pw4), model.bn4)
    x = op("Relu", "relu4", [op("Add", "add4", [x, y])])
    x = op("MaxPool", "pool4", [x], kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 0, 0])
    x = op("Relu", "relu5", [bn("bn5", conv("conv5", x, model.conv5), model.bn5)])
    x = op("GlobalAveragePool", "gap", [x])
    x = op("Flatten", "flatten", [x], axis=1)
    op("Gemm", "fc", [x, init("fc.weight", _arr(model.fc.weight)), init("fc.bias", _arr(model.fc.bias))],
       out=OUTPUT_NAME, alpha=1.0, beta=1.0, transB=1)

    graph = helper.make_graph(
        nodes, "digits_cnn",
        inputs=[helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [1, 1, 8, 8])],
        outputs=[helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, [1, 10])],
        initializer=inits,
    )
    m = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="qir.examples.digits.train",
        producer_version="1",
        doc_string="Tiny CNN on sklearn load_digits (8x8, x/16, NCHW). Regenerate: " + REGENERATE,
    )
    onnx.checker.check_model(m, full_check=True)
    return m


def ort_logits(model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run([OUTPUT_NAME], {INPUT_NAME: x[i : i + 1]})[0] for i in range(len(x))])


def verify(model: DigitsNet, model_bytes: bytes, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    got = ort_logits(model_bytes, x)
    diff = float(np.max(np.abs(ref - got)))
    same = bool(np.array_equal(ref.argmax(1), got.argmax(1)))
    print(f"onnxruntime vs torch on {len(x)} eval samples: max |dlogit| = {diff:.2e}, same argmax: {same}")
    if not (diff < ATOL and same):
        raise SystemExit(f"ONNX model does not match torch (max abs diff {diff:.3e}, same argmax {same})")
    return got


def save_npy(path: Path, a: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, a, allow_pickle=False)


def main() -> int:
    t0 = time.perf_counter()
    seed_everything(TORCH_SEED)
    data = load_split()

    model = DigitsNet()
    n_params = sum(p.numel() for p in model.parameters())
    n_buffers = sum(b.numel() for n, b in model.named_buffers() if not n.endswith("num_batches_tracked"))
    train(model, data["x_train"], data["y_train"])
    t_train = time.perf_counter() - t0

    onnx_model = to_onnx(model)
    model_bytes = onnx_model.SerializeToString()

    x_eval = data["x_eval"].reshape(N_EVAL, 1, 1, 8, 8)
    logits = verify(model, model_bytes, data["x_eval"])
    correct = int((logits.argmax(1) == data["y_eval"]).sum())
    acc = correct / N_EVAL
    with torch.no_grad():
        train_acc = float((model(torch.from_numpy(data["x_train"])).argmax(1).numpy() == data["y_train"]).mean())

    # --- write everything ------------------------------------------------------------------
    (OUT_DIR / "model.onnx").write_bytes(model_bytes)
    calib_dir = OUT_DIR / "calibration_data" / INPUT_NAME
    calib_dir.mkdir(parents=True, exist_ok=True)
    for stale in calib_dir.glob("*.npy"):
        stale.unlink()
    for i in range(N_CALIB):
        save_npy(calib_dir / f"{i}.npy", np.ascontiguousarray(data["x_calib"][i : i + 1], dtype=np.float32))
    save_npy(OUT_DIR / "calibration_labels.npy", data["y_calib"].astype(np.int64))
    save_npy(OUT_DIR / "eval_images.npy", np.ascontiguousarray(x_eval, dtype=np.float32))
    save_npy(OUT_DIR / "eval_labels.npy", data["y_eval"].astype(np.int64))

    info = {
        "name": "digits_cnn",
        "description": "Tiny CNN on scikit-learn's handwritten digits, bundled as qir's offline example.",
        "dataset": {
            "source": "sklearn.datasets.load_digits (UCI ML optical recognition of handwritten digits, "
                      "bundled with scikit-learn; no download)",
            "image_shape": [8, 8],
            "n_classes": 10,
            "n_samples": int(data["n_total"]),
        },
        "preprocessing": "x/16, float32, NCHW",
        "split": {
            "method": f"stratified sklearn.model_selection.train_test_split: eval = test_size={N_EVAL} "
                      f"of all samples (random_state={SPLIT_SEED}); calibration = test_size={N_CALIB} "
                      f"of the remainder (random_state={CALIB_SEED}); train = the rest",
            "train": int(len(data["y_train"])),
            "calibration": N_CALIB,
            "eval": N_EVAL,
        },
        "seeds": {"split": SPLIT_SEED, "calibration": CALIB_SEED, "torch": TORCH_SEED},
        "training": {
            "optimizer": "Adam", "lr_schedule": "OneCycleLR", "max_lr": LR,
            "weight_decay": WEIGHT_DECAY, "epochs": EPOCHS, "batch_size": BATCH_SIZE,
            "threads": 1, "deterministic_algorithms": True,
        },
        "model": {
            "file": "model.onnx",
            "opset": OPSET,
            "ir_version": IR_VERSION,
            "input": {"name": INPUT_NAME, "shape": [1, 1, 8, 8], "dtype": "float32"},
            "output": {"name": OUTPUT_NAME, "shape": [1, 10], "dtype": "float32"},
            "nodes": [f"{n.name}:{n.op_type}" for n in onnx_model.graph.node],
            "param_count": int(n_params),
            "bn_running_stat_count": int(n_buffers),
        },
        "float_eval_accuracy": acc,
        "float_eval_correct": correct,
        "float_eval_accuracy_measured_with": "onnxruntime CPUExecutionProvider, batch 1",
        "float_train_accuracy_torch": round(train_acc, 4),
        "files": {
            "calibration": f"calibration_data/{INPUT_NAME}/<i>.npy, i=0..{N_CALIB - 1}, float32 (1,1,8,8)",
            "calibration_labels": "calibration_labels.npy, int64 (32,)",
            "eval_images": f"eval_images.npy, float32 ({N_EVAL},1,1,8,8)",
            "eval_labels": f"eval_labels.npy, int64 ({N_EVAL},)",
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": ort.__version__,
            "scikit-learn": sklearn.__version__,
            "numpy": np.__version__,
        },
        "regenerate": f"{REGENERATE}  (or: python qir/examples/digits/train.py)",
    }
    (OUT_DIR / "info.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")

    size = sum(p.stat().st_size for p in OUT_DIR.rglob("*") if p.is_file() and p.suffix in {".onnx", ".npy", ".json"})
    print(f"trained in {t_train:.1f}s: {n_params} params, train acc {train_acc:.4f}")
    print(f"float eval accuracy (onnxruntime): {acc:.4f} ({correct}/{N_EVAL})")
    print(f"model.onnx {len(model_bytes)} bytes; data files total {size} bytes in {OUT_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
