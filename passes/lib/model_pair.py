"""The two models a comparison runs (baseline and analysis, each at its level), the seed's bad-case
metrics, and the discrete-op replay setup shared by the comparison analyses."""
from __future__ import annotations

import logging
from pathlib import Path

from qir.api import as_ir
from qir.execution import Execution, Level
from qir.graph import QIR
from qir.runtimes.base import get_runtime

logger = logging.getLogger(__name__)

BAD_CASE_METRICS = {"Cosine": "cosine-similarity", "MSE": "mse", "L1": "l1", "KL": "kl", "SQNR": "sqnr-db",
                    "ATOL": "atol"}


def model_pair(baseline: QIR | str | Path, analysis: QIR | str | Path | None,
               level: str = Level.FAKEQUANT) -> list[tuple[QIR, str]]:
    """``[(baseline IR, level), (analysis IR, level)]``: both run as they are (fake-quantized;
    a model without calibration nodes is float), or, with ``analysis=None``, the baseline run in
    float against itself fake-quantized, which needs calibration nodes (else an InputError naming
    the model: both runs would compute the same). ``level="integer"``: the analysis model computes
    what the NPU does instead (the baseline as before)."""
    base_ir = as_ir(baseline, calibrated=analysis is None)
    if analysis is None:
        return [(base_ir, "float"), (base_ir, level)]
    return [(base_ir, Level.FAKEQUANT), (as_ir(analysis), level)]


def level_runtime(runtime: str, level: str, march: str | None = None):
    """The runtime ``runtime`` at ``level`` (``march``: the integer level's profile, ignored at the
    other levels, where a model of the pair runs at another level than the analysis model)."""
    return get_runtime(Execution.resolve(runtime, level, march if level == Level.INTEGER else None))


def replay_setup(base_ir: QIR, analy_ir: QIR) -> tuple[QIR, list[str]]:
    """The analysis model with its discrete index outputs as inputs and the names of those
    values (fed from the baseline's run); the model unchanged and ``[]`` when it has none or the
    baseline lacks one of them."""
    from qir.passes.lib.discrete import index_values, replayed

    names = index_values(analy_ir)
    if not names:
        return analy_ir, []
    missing = [v for v in names if not base_ir.has_value(v)]
    if missing:
        logger.warning("not replaying discrete ops: the baseline has no values %s", missing[:3])
        return analy_ir, []
    return replayed(analy_ir), names
