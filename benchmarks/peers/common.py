"""What the peer scripts share (they run under the peers' own virtualenv, not qir's Python, and
import nothing from qir): one thread everywhere, the data folders, the metric, and the result
files.

**One thread.** :func:`one_thread` makes every onnxruntime session of the process (the peer's
own ones included: NNCF's statistics and validation engines, AIMET's sim sessions) use one
intra-op and one inter-op thread, and sets torch to one thread when torch is there; the
benchmark also sets ``OMP_NUM_THREADS=1`` and the BLAS thread variables in the environment.

**Metric.** The mean over samples of the cosine similarity between a model's first output and
the float model's, per sample on the flattened output in float64 (what ``qir tune`` measures
for ``cosine>=0.99``). Sessions run with ``session.disable_quant_qdq`` so that a QDQ model
computes its fake quantization as written, the way qir verifies and the benchmark scores.

**Result files** (:func:`write_result`): ``OUT/model.onnx`` (the quantized QDQ model) and
``OUT/result.json`` (tool, version, settings, ``wall_s``: from the loaded model to the quantized
model in memory, the peer's calibration included, imports and writing excluded; ``cpu_s``: the
process's CPU time over the same span).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def one_thread() -> None:
    """Every onnxruntime session created after this call runs on one thread; torch too."""
    import onnxruntime as ort

    base = ort.InferenceSession
    if getattr(base, "_one_thread", False):
        return

    class OneThreadSession(base):
        _one_thread = True

        def __init__(self, path_or_bytes, sess_options=None, *args, **kwargs):
            sess_options = sess_options if sess_options is not None else ort.SessionOptions()
            sess_options.intra_op_num_threads = 1
            sess_options.inter_op_num_threads = 1
            super().__init__(path_or_bytes, sess_options, *args, **kwargs)

    ort.InferenceSession = OneThreadSession
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def samples(folder: str | Path, limit: int | None = None) -> list[np.ndarray]:
    """The ``*.npy`` arrays of ``folder`` in name order (each one model input, batch 1)."""
    files = sorted(Path(folder).glob("*.npy"))[:limit]
    if not files:
        raise SystemExit(f"no .npy samples in {folder}")
    return [np.load(f).astype(np.float32) for f in files]


def session(model, *, qdq_as_written: bool = True):
    """A one-thread CPU session of ``model`` (path, bytes or ModelProto); ``qdq_as_written``:
    ``session.disable_quant_qdq`` (fake quantization as the graph says, no integer kernels)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3  # no warnings about unused initializers
    if qdq_as_written:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if not isinstance(model, (str, Path, bytes)):
        model = model.SerializeToString()
    return ort.InferenceSession(str(model) if isinstance(model, Path) else model, options,
                                providers=["CPUExecutionProvider"])


def outputs(sess, xs: list[np.ndarray]) -> list[np.ndarray]:
    """The first output of ``sess`` on each sample, flattened, in float64."""
    name = sess.get_inputs()[0].name
    return [np.asarray(sess.run(None, {name: x})[0], np.float64).ravel() for x in xs]


def cosines(refs: list[np.ndarray], outs: list[np.ndarray]) -> list[float]:
    """Per-sample cosine similarity of ``outs`` to ``refs`` (both zero: 1, one zero: 0)."""
    values = []
    for a, b in zip(refs, outs):
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        values.append(1.0 if na == nb == 0 else 0.0 if na == 0 or nb == 0 else float(a @ b / (na * nb)))
    return values


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every peer script takes."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="float ONNX model (opset >= 13, static input shape)")
    p.add_argument("--calib", required=True, help="folder of calibration samples (*.npy)")
    p.add_argument("--eval", required=True, help="folder of tuning samples (*.npy): the target is met there")
    p.add_argument("--out", required=True, help="output folder: model.onnx, result.json")
    p.add_argument("--max-drop", type=float, default=0.01, help="allowed absolute drop of mean cosine from float (1.0)")
    p.add_argument("--eval-num", type=int, default=None, help="use only the first N tuning samples (cheap runs)")
    return p


class Timer:
    """Wall time and this process's CPU time from construction to :meth:`stop` (on a shared
    machine the CPU time of a one-thread run is the steadier number)."""

    def __init__(self) -> None:
        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        self.wall_s = self.cpu_s = 0.0

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self.start
        self.cpu_s = time.process_time() - self.cpu_start


def write_result(out: str | Path, model, timer: Timer, **info) -> None:
    """``OUT/model.onnx`` and ``OUT/result.json`` (see the module docstring)."""
    import onnx

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / "model.onnx"))
    info = {"wall_s": round(timer.wall_s, 2), "cpu_s": round(timer.cpu_s, 2), "threads": 1,
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), **info}
    (out / "result.json").write_text(json.dumps(info, indent=2) + "\n")
