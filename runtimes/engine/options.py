"""The engine's options: which are valid, and the defaults it derives from the model (the batch
size, the onnxruntime optimization level)."""
from __future__ import annotations

import numpy as np

from qir.errors import InputError
from qir.graph import QIR
from qir.runtimes.engine.cost import elements

__all__ = ["REFERENCES", "BASELINES", "ENGINE_LEVELS", "check_options", "engine_runtime", "batch_size",
           "optimization_level", "fusable_across_calibration"]

REFERENCES = ("float", "quantized")
BASELINES = ("float", "reference")
ENGINE_LEVELS = ("fakequant", "integer")  # variants change quantization: the float level has none
_BATCH_BYTES = 2 << 20  # default batch: its largest activation about this size (stays in cache)
_MAX_BATCH = 32

# ops onnxruntime's NCHWc layout pass (level ``all`` only) folds into a preceding Conv: an Add
# as its sum input (another order of additions); Sigmoid and Tanh as its activation (not
# checked to give the same values, so treated the same way). Relu, Clip and HardSigmoid fused
# into a Conv give the same values as on their own (PP-OCRv4 det's guard covers HardSigmoid).
_NCHWC_FUSED = frozenset({"Add", "Sum", "Sigmoid", "Tanh"})


def check_options(runtime: str, reference: str, baseline: str, memory_budget: int) -> None:
    """One clear error for a runtime, reference, baseline or memory budget the engine does not take."""
    if runtime not in ("ort", "numpy"):
        raise InputError(f"unknown runtime {runtime!r}; the engine runs 'ort' or 'numpy'")
    if reference not in REFERENCES:
        raise InputError(f"unknown reference {reference!r}; choose one of {', '.join(REFERENCES)}")
    if baseline not in BASELINES:
        raise InputError(f"unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
    if memory_budget < 0:
        raise InputError(f"memory_budget must be >= 0 bytes, got {memory_budget}")


def engine_runtime(runtime: str | None, level: str, march: str | None) -> str:
    """The runtime the engine runs ``level`` on: ``runtime``, or by default ``ort`` (``numpy`` at
    the integer level, which only the numpy runtime computes). One clear error for a level the
    engine does not take, the integer level asked of onnxruntime, or a march without it."""
    if level not in ENGINE_LEVELS:
        raise InputError(f"unknown level {level!r} for the engine; choose one of {', '.join(ENGINE_LEVELS)} "
                         "(its variants change quantization, which the float level leaves out)")
    if level == "integer":
        if runtime not in (None, "numpy"):
            raise InputError(f"the integer level runs on the numpy runtime only, not {runtime!r}; "
                             "leave the runtime out or choose numpy")
        return "numpy"
    if march is not None:
        raise InputError(f"a march applies to the integer level only (level {level!r}); add level='integer'")
    return runtime or "ort"


def batch_size(ir: QIR, batch: int | None) -> int:
    """``batch`` (at least 1), or by default as many rows as keep the largest activation of a
    call near 2 MB, at most 32 (1 for models with large activations: a batch runs no faster per
    row there and evicts the cache)."""
    if batch is not None:
        if int(batch) < 1:
            raise InputError(f"batch must be at least 1, got {batch}")
        return int(batch)
    largest = max((elements(ir, v.name) * np.dtype(v.dtype).itemsize
                   for v in ir.activations() if v.dtype is not None), default=0)
    return int(max(1, min(_MAX_BATCH, _BATCH_BYTES // max(largest, 1))))


def optimization_level(ir: QIR, optimization: str) -> str:
    """``optimization``, or for ``auto`` the fastest level whose results stay equal to a plain
    run: ``all`` unless :func:`fusable_across_calibration` finds a node, then ``extended``."""
    if optimization == "auto":
        return "extended" if fusable_across_calibration(ir) else "all"
    return optimization


def fusable_across_calibration(ir: QIR) -> list[str]:
    """Calibration nodes sitting between a Conv and the only op reading the Conv's output
    through them, when that op is one the ``all`` level fuses into the Conv once the node is a
    pass-through, and the fused result may differ from the two ops apart."""
    out = []
    for c in ir.calibrations("activation"):
        producer, readers = ir.producer(c.input), ir.consumers(c.output)
        if (getattr(producer, "op_type", None) == "Conv" and len(ir.consumers(c.input)) == 1
                and len(readers) == 1 and getattr(readers[0], "op_type", None) in _NCHWC_FUSED):
            out.append(c.name)
    return out
