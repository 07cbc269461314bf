"""Capturing activations over samples for the distribution-style analyses (one model run per
sample, every requested value at once), the clipped share of a captured tensor, and
:class:`PlotResult`, how those analyses hand the arrays they captured to the plot writers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.base import PassResult
from qir.runtimes.base import get_runtime
from qir.runtimes.engine import configured_clone
from qir.runtimes.progress import track


def collect(ir: QIR, data: Any, values: list[str], *, quantized: bool, data_num: int | None,
            runtime: str = Runtime.ORT) -> dict[str, list[np.ndarray]]:
    """``values`` on each of the first ``data_num`` samples (one model run per sample), in the
    calibrated model (``quantized``) or the float one."""
    from qir.data import model_samples

    model = ir if quantized else configured_clone(ir, "float", {})
    rt = get_runtime(runtime, level=Level.FAKEQUANT)
    parts: dict[str, list[np.ndarray]] = {v: [] for v in values}
    for sample in track(model_samples(ir, data, data_num), "capture " + ("calibrated" if quantized else "float"),
                        unit="samples"):
        got = rt.run(model, sample, capture=values)
        for v in values:
            parts[v].append(np.asarray(got[v]))
    return parts


def clipped_fraction(x: np.ndarray, threshold: float | None) -> float | None:
    """Share of the values beyond ±threshold (what the quantizer clips)."""
    if threshold is None or not x.size:
        return None
    return float(np.mean(np.abs(x) > threshold))


@dataclass
class PlotResult(PassResult):
    """The result of an analysis whose report is drawn: ``report`` is the pass's typed report (its
    ``to_json()`` what its JSON file holds); ``arrays`` holds, per node of the report, the named
    arrays its plots draw (``{node: {name: ndarray}}``). Only the writers in ``qir.tools.reports``
    read them; they are never written as JSON."""

    arrays: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
