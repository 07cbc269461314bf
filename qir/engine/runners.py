"""Executing the engine's steps (and, on onnxruntime, whole segments) on a runtime.

A runner computes the outputs of one step from a ``read(value)`` lookup (the variant's changed
values over the reference cache) and ``constants`` (weight calibration outputs in the variant's
modes). Calibration steps are computed by the engine itself with
:func:`qir.runtimes.numerics.apply_calibration`, which both runtimes match bit for bit.

- :class:`NumpySteps` calls the numpy interpreter's kernels for the ops of a step, with the same
  execution plan (BatchNorm folding included) as :class:`~qir.runtimes.numpy_ref.interpreter.NumpyRuntime`.
- :class:`OrtSteps` builds one onnxruntime session per step (weights and weight-calibration
  outputs as initializers, so onnxruntime pre-packs them) and one per segment (the reference
  configuration baked in), each built on first use and reused by every variant and sample.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Mapping

import numpy as np

from qir.errors import ExecutionError, QirError
from qir.graph import QIR
from qir.onnx_export import export_subgraph
from qir.records import CalibRecord

from ..runtimes.numpy_ref.interpreter import execution_plan
from .plan import Plan

__all__ = ["NumpySteps", "OrtSteps", "Read"]

logger = logging.getLogger(__name__)

Read = Callable[[str], np.ndarray]


class NumpySteps:
    """Steps on the numpy reference kernels (no segments: every step runs on its own)."""

    segments = False

    def __init__(self, ir: QIR, plan: Plan, fold_batchnorm: bool = True) -> None:
        self.plan = plan
        eplan = execution_plan(ir, plan.kept, fold_batchnorm)
        self.weights = eplan.weights
        calls: dict[str, list] = {}
        for call in eplan.steps:
            if call.fn is not None:
                calls.setdefault(call.rec.name, []).append(call)
        self.calls = [[c for r in s.records for c in calls.get(r.name, ())] for s in plan.steps]

    def run_step(self, i: int, read: Read, constants: Mapping[str, np.ndarray],
                 key: tuple = ()) -> dict[str, np.ndarray]:
        env: dict[str, np.ndarray] = {}

        def get(v: str):
            if not v:
                return None
            for source in (env, constants, self.weights):
                if v in source:
                    return source[v]
            return read(v)

        for call in self.calls[i]:
            args = [get(v) for v in call.inputs]
            try:
                result = call.fn(*args, **call.kwargs)
            except QirError:
                raise
            except Exception as exc:
                raise ExecutionError(f"while executing node {call.rec.name!r} ({call.rec.op_type}): "
                                     f"{type(exc).__name__}: {exc}") from exc
            if type(result) is tuple:
                env.update((n, v) for n, v in zip(call.outputs, result) if n)
            else:
                env[call.outputs[0]] = result
        return {o: env[o] for o in self.plan.steps[i].outputs}


class OrtSteps:
    """Steps and segments as cached onnxruntime sessions (see the module docstring)."""

    segments = True

    def __init__(self, ir: QIR, plan: Plan, reference: Mapping[str, CalibRecord],
                 constants: Mapping[str, np.ndarray], threads: int | None = None,
                 optimization: str = "all", rounding: str = "half_to_even") -> None:
        self.ir, self.plan, self.reference = ir, plan, reference
        self.constants = constants
        self.threads, self.optimization, self.rounding = threads, optimization, rounding
        self._steps: dict[tuple, object] = {}
        self._segments: dict[int, tuple] = {}
        self._lock = threading.Lock()  # sessions built by several threads: the first one stored wins

    def _session(self, records, inputs, outputs, constants):
        from ..runtimes.ort_backend import lower_fake_quant, lower_layout_stable, new_session

        model = export_subgraph(self.ir, records, list(inputs), list(outputs), constants=constants,
                                lower_calibration=lambda ir, rec: lower_fake_quant(ir, rec, self.rounding),
                                lower_op=lower_layout_stable)
        return new_session(model, self.threads, self.optimization, shared=True,
                           what=f"the part of {self.ir.name!r} ending at {records[-1].name!r}")

    def prepare(self, i: int) -> None:
        """Build step ``i``'s reference session now (callable from several threads)."""
        if self.plan.steps[i].calib is None:
            self._step_session(i, self.constants, ())

    def _step_session(self, i: int, constants: Mapping[str, np.ndarray], key: tuple):
        entry = self._steps.get((i, key))
        if entry is None:
            step = self.plan.steps[i]
            wanted = {self.reference[w].output for w in step.weight_calibs}
            entry = self._session(step.records, step.inputs, step.outputs,
                                  {n: a for n, a in constants.items() if n in wanted})
            with self._lock:
                entry = self._steps.setdefault((i, key), entry)
        return entry

    def run_step(self, i: int, read: Read, constants: Mapping[str, np.ndarray],
                 key: tuple = ()) -> dict[str, np.ndarray]:
        """Step ``i``; ``key`` names the weight-calibration modes in ``constants`` (sessions are
        cached per step and key)."""
        step = self.plan.steps[i]
        return self._run(self._step_session(i, constants, key), step.inputs, step.outputs, read)

    def run_segment(self, k: int, read: Read) -> dict[str, np.ndarray]:
        """Segment ``k`` as one session in the reference configuration."""
        entry = self._segments.get(k)
        if entry is None:  # (session, inputs, outputs), worked out once per segment
            inputs, outputs = self.plan.segment_io(k)
            lo, hi = self.plan.segments[k]
            records = [self.reference.get(r.name, r) if isinstance(r, CalibRecord) else r
                       for s in self.plan.steps[lo:hi] for r in s.records]
            entry = (self._session(records, inputs, outputs, dict(self.constants)), inputs, outputs)
            with self._lock:
                entry = self._segments.setdefault(k, entry)
        return self._run(*entry, read)

    @staticmethod
    def _run(session, inputs, outputs, read: Read) -> dict[str, np.ndarray]:
        try:
            got = session.run(list(outputs), {v: read(v) for v in inputs})
        except QirError:
            raise
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed on the part ending at {outputs[-1]!r}: "
                                 f"{str(exc).strip().splitlines()[0]}") from exc
        return dict(zip(outputs, got))

    @property
    def sessions(self) -> int:
        return len(self._steps) + len(self._segments)
