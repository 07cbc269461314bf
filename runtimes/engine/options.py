"""The engine's options: which are valid, and the defaults it derives from the model (the batch
size, the onnxruntime optimization level)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from qir.errors import InputError
from qir.execution import Execution, Level
from qir.graph import QIR
from qir.runtimes.engine.cost import elements

__all__ = ["EngineOptions", "REFERENCES", "BASELINES", "ENGINE_LEVELS", "check_options", "batch_size",
           "optimization_level", "fusable_across_calibration"]

REFERENCES = ("float", "quantized")
BASELINES = ("float", "reference")
ENGINE_LEVELS = (Level.FAKEQUANT, Level.INTEGER)  # variants change quantization: the float level has none


@dataclass(frozen=True)
class EngineOptions:
    """Everything an :class:`~qir.runtimes.engine.Engine` is configured with, fixed at construction
    (the engine's docstring says what each means). :meth:`checked` resolves the execution (runtime,
    level, march: :meth:`qir.execution.Execution.resolve`) and checks the rest, with one clear error.
    A worker of a cluster builds the same engine from the same options."""

    runtime: str | None = None
    level: str = Level.FAKEQUANT
    march: str | None = None
    reference: str = "float"
    baseline: str = "float"
    compare: Sequence[str] | None = None
    metrics: Sequence[str] | str = ("cosine-similarity",)
    memory_budget: int = 2 << 30
    segments: int | None = None
    batch: int | None = None
    data_num: int | None = None
    threads: int | None = None
    optimization: str = "auto"
    rounding: str = "half_to_even"
    spill_dir: str | Path | None = None
    progress: bool | str = True
    cluster: Any = None  # a cluster name or :class:`.cluster.Cluster`; None: the current one
    reference_changes: Mapping[str, str] = field(default_factory=dict)
    #: When some variants of a call run step by step anyway (a weight change, a mode no switch
    #: takes), run the batched ones step by step too: one reference pass a sample instead of two.
    #: Off by default, and ignored on a cluster: which way a variant runs then depends on the
    #: variants evaluated with it, and a sharded analysis must compute the same whatever each shard's mix.
    steps_when_mixed: bool = False

    def checked(self) -> EngineOptions:
        """These options with the execution resolved (the runtime a level runs on, the march's
        default) and every choice checked (one clear error)."""
        execution = Execution.resolve(self.runtime, self.level, self.march, levels=ENGINE_LEVELS)
        check_options(self.reference, self.baseline, self.memory_budget)
        return replace(self, runtime=execution.runtime, level=execution.level, march=execution.march,
                        reference_changes=dict(self.reference_changes or {}))

    def for_worker(self, threads: int) -> EngineOptions:
        """The options a cluster's worker builds the same engine with: its own cores, no progress,
        run locally."""
        return replace(self, threads=threads, progress=False, cluster="local", spill_dir=None, steps_when_mixed=False)

_BATCH_BYTES = 2 << 20  # default batch: its largest activation about this size (stays in cache)
_MAX_BATCH = 32

# ops onnxruntime's NCHWc layout pass (level ``all`` only) folds into a preceding Conv: an Add
# as its sum input (another order of additions); Sigmoid and Tanh as its activation (not
# checked to give the same values, so treated the same way). Relu, Clip and HardSigmoid fused
# into a Conv give the same values as on their own (PP-OCRv4 det's guard covers HardSigmoid).
_NCHWC_FUSED = frozenset({"Add", "Sum", "Sigmoid", "Tanh"})


def check_options(reference: str, baseline: str, memory_budget: int) -> None:
    """One clear error for a reference, baseline or memory budget the engine does not take (the
    runtime and level: :meth:`qir.execution.Execution.resolve`)."""
    if reference not in REFERENCES:
        raise InputError(f"unknown reference {reference!r}; choose one of {', '.join(REFERENCES)}")
    if baseline not in BASELINES:
        raise InputError(f"unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
    if memory_budget < 0:
        raise InputError(f"memory_budget must be >= 0 bytes, got {memory_budget}")


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
