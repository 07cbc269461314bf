"""The analysis engine: many variants of one calibrated IR, evaluated fast (see :mod:`.engine`)."""
from __future__ import annotations

from qir.runtimes.engine.engine import (
                     RESULTS_FILE,
                     Engine,
                     EngineResult,
                     Variant,
                     configured_clone,
                     evaluate_plainly,
                     load_variants,
                     one_at_a_time,
)

__all__ = ["Engine", "EngineResult", "Variant", "evaluate_plainly", "configured_clone", "one_at_a_time",
           "load_variants", "RESULTS_FILE"]
