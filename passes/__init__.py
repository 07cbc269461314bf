"""Transformation and analysis passes over the QIR, one pass per module (DESIGN §3).

    from qir.passes import PassManager
    result = PassManager("fold-bn,fuse,insert-calibration,calibrate{method=kl}",
                         context={"data": samples}, dump_dir="dumps").run(ir)
"""
from __future__ import annotations

import importlib

from .base import PASSES, AnalysisPass, Pass, PassError, PassResult, get_pass, register_pass
from .manager import PassManager, build_pipeline, parse_pipeline

__all__ = ["Pass", "AnalysisPass", "PassResult", "PassError", "PassManager", "PASSES", "get_pass",
           "register_pass", "parse_pipeline", "build_pipeline"]

_PASS_MODULES = ("fold_bn", "fuse", "insert_calibration", "calibrate", "set_mode", "emit", "node_sensitivity",
                 "acc_error", "distribution", "channelwise", "sensitivity_analysis", "model_check", "profiler")


def _load_passes() -> None:
    """Import every pass module so each registers itself."""
    for module in _PASS_MODULES:
        importlib.import_module(f"{__name__}.{module}")
