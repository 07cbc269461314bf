"""Capturing activations over samples for the distribution-style analyses (one model run per
sample, every requested value at once), and the clipped share of a captured tensor."""
from __future__ import annotations

from typing import Any

import numpy as np

from qir.graph import QIR
from qir.runtimes.base import get_runtime
from qir.runtimes.engine import configured_clone


def collect(ir: QIR, data: Any, values: list[str], *, quantized: bool, data_num: int | None,
            runtime: str = "ort") -> dict[str, list[np.ndarray]]:
    """``values`` on each of the first ``data_num`` samples (one model run per sample), in the
    calibrated model (``quantized``) or the float one."""
    from qir.data import model_samples

    model = ir if quantized else configured_clone(ir, "float", {})
    rt = get_runtime(runtime, level="fakequant")
    parts: dict[str, list[np.ndarray]] = {v: [] for v in values}
    for sample in model_samples(ir, data, data_num):
        got = rt.run(model, sample, capture=values)
        for v in values:
            parts[v].append(np.asarray(got[v]))
    return parts


def clipped_fraction(x: np.ndarray, threshold: float | None) -> float | None:
    """Share of the values beyond ±threshold (what the quantizer clips)."""
    if threshold is None or not x.size:
        return None
    return float(np.mean(np.abs(x) > threshold))
