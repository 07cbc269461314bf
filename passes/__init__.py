"""Transformation and analysis passes over the QIR, one pass per module (docs/architecture.md, "Passes").

    from qir.passes import PassManager, PipelineContext
    result = PassManager("fold-bn,fuse,insert-calibration,calibrate{method=kl}",
                         context=PipelineContext(data=samples), dump_dir="dumps").run(ir)
"""
from __future__ import annotations

import importlib
import pkgutil

from qir.passes.base import PASSES, AnalysisPass, Pass, PassError, PassResult, get_pass, register_pass
from qir.passes.manager import PassManager, PipelineContext, build_pipeline, parse_pipeline

__all__ = ["Pass", "AnalysisPass", "PassResult", "PassError", "PassManager", "PipelineContext", "PASSES", "get_pass",
           "register_pass", "parse_pipeline", "build_pipeline"]

_NOT_PASSES = frozenset({"base", "manager", "lib"})  # the contract, the manager, shared helpers


def pass_modules() -> list[str]:
    """The pass modules: every module of this package but the contract, the manager and ``lib``
    (each defines and registers exactly one pass, checked by the tests)."""
    return [m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_PASSES]


def _load_passes() -> None:
    """Import every pass module so each registers itself."""
    for module in pass_modules():
        importlib.import_module(f"{__name__}.{module}")
