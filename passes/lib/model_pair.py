"""The two models a comparison runs (baseline and analysis, each at its level), the seed's bad-case
metrics, and the discrete-op replay setup shared by the comparison analyses."""
from __future__ import annotations

import logging
from pathlib import Path

from qir.api import as_ir
from qir.graph import QIR

logger = logging.getLogger(__name__)

BAD_CASE_METRICS = {"Cosine": "cosine-similarity", "MSE": "mse", "L1": "l1", "KL": "kl", "SQNR": "sqnr-db",
                    "ATOL": "atol"}


def model_pair(baseline: QIR | str | Path, analysis: QIR | str | Path | None) -> list[tuple[QIR, str]]:
    """``[(baseline IR, level), (analysis IR, level)]``: both run as they are (fake-quantized;
    a model without calibration nodes is float), or, with ``analysis=None``, the baseline run in
    float against itself fake-quantized."""
    base_ir = as_ir(baseline)
    if analysis is None:
        return [(base_ir, "float"), (base_ir, "fakequant")]
    return [(base_ir, "fakequant"), (as_ir(analysis), "fakequant")]


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
