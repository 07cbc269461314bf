"""Timing sanity check: the numpy Conv kernel vs onnxruntime's single Conv node.

Not a test. Prints, per representative CNN convolution, the median wall time of
``qir.runtimes.numpy_ref`` Conv and of an onnxruntime session holding just that Conv node
(CPU provider, graph optimisations disabled, weights as initializers as in a real model),
and their ratio. Run: ``python benchmarks/conv_kernels.py [--threads N] [--repeat R]``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from qir.runtimes.numpy_ref.registry import lookup

CASES = [
    # name, X shape, W shape, attributes
    ("3x3 conv 64->64, 1x64x80x80", (1, 64, 80, 80), (64, 64, 3, 3), {"pads": [1, 1, 1, 1]}),
    ("depthwise 3x3, 1x96x160x160", (1, 96, 160, 160), (96, 1, 3, 3), {"pads": [1, 1, 1, 1], "group": 96}),
    ("1x1 conv 128->256, 1x128x40x40", (1, 128, 40, 40), (256, 128, 1, 1), {}),
    ("3x3/2 conv 3->16, 1x3x640x640", (1, 3, 640, 640), (16, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    # extra (informative): the strided depthwise path
    ("depthwise 5x5/2, 1x96x160x160", (1, 96, 160, 160), (96, 1, 5, 5), {"pads": [2, 2, 2, 2], "strides": [2, 2],
                                                                          "group": 96}),
]


def ort_session(x_shape, w, b, attrs, threads):
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def median_time(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default 2)")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    conv = lookup("Conv").fn
    print(f"{'case':36s} {'numpy ms':>9s} {'ort ms':>8s} {'ratio':>6s} {'max rel err':>11s}")
    for name, xs, ws, attrs in CASES:
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) * 0.1).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        sess = ort_session(xs, w, b, attrs, args.threads)
        ref = sess.run(None, {"x": x})[0]
        got = conv(x, w, b, **attrs)
        err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
        t_np = median_time(lambda: conv(x, w, b, **attrs), args.repeat)
        t_ort = median_time(lambda: sess.run(None, {"x": x}), args.repeat)
        print(f"{name:36s} {t_np * 1e3:9.2f} {t_ort * 1e3:8.2f} {t_np / t_ort:6.2f} {err:11.2e}")


if __name__ == "__main__":
    main()
