"""Executing the engine's steps (and, on onnxruntime, whole segments) on a runtime.

A runner computes the outputs of one step from a ``read(value)`` lookup (the variant's changed
values over the reference cache) and ``constants`` (weight calibration outputs in the variant's
modes). Calibration steps are computed by the engine itself with
:func:`qir.runtimes.numerics.apply_calibration`, which both runtimes match bit for bit.

- :class:`NumpySteps` calls the numpy interpreter's kernels for the ops of a step, with the same
  execution plan (BatchNorm folding included) as :class:`~qir.runtimes.numpy_ref.interpreter.NumpyRuntime`.
- :class:`OrtSteps` builds one onnxruntime session per step (weights and weight-calibration
  outputs as initializers, so onnxruntime pre-packs them) and one per segment and *switch
  assignment*: the segment in the reference configuration, with the calibration nodes of the
  assignment lowered as switches (:mod:`.switches`) that the variants of a batch turn on row by
  row. The empty assignment is the segment as the reference runs it. Sessions are built on
  first use (or ahead, from several threads) and reused by every variant and sample.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from qir.errors import ExecutionError, QirError
from qir.graph import QIR
from qir.io.onnx_export import ExportMemo, export_subgraph
from qir.records import CalibRecord
from qir.runtimes.engine.plan import Plan
from qir.runtimes.engine.variants import change_key
from qir.runtimes.numpy_ref.interpreter import execution_plan
from qir.runtimes.ort.backend import new_session
from qir.runtimes.ort.lowering import lower_fake_quant, lower_layout_stable
from qir.runtimes.ort.switches import make_batch_capable, rows_value_info, switch_nodes

__all__ = ["NumpySteps", "OrtSteps", "Part", "Read", "part_key"]

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


def part_key(k: int, switches: Mapping[str, CalibRecord] | None) -> tuple:
    """What tells two parts apart: the segment and what each switch turns on (:func:`change_key`)."""
    return k, tuple(sorted((n, change_key(r)) for n, r in (switches or {}).items()))


@dataclass(frozen=True)
class Part:
    """A segment as one session: its value inputs and outputs, the switches it takes a
    ``rows`` input for, and whether it runs on a batch of rows."""

    session: object
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    switches: tuple[str, ...] = ()
    batched: bool = False


class OrtSteps:
    """Steps and segments as cached onnxruntime sessions (see the module docstring).

    ``batch``: export segments batch-capable (:func:`.switches.make_batch_capable`), so a
    segment session also runs many variants in one call."""

    segments = True

    def __init__(self, ir: QIR, plan: Plan, reference: Mapping[str, CalibRecord],
                 constants: Mapping[str, np.ndarray], threads: int | None = None,
                 optimization: str = "all", rounding: str = "half_to_even", batch: bool = False) -> None:
        self.ir, self.plan, self.reference = ir, plan, reference
        self.constants = constants
        self.threads, self.optimization, self.rounding = threads, optimization, rounding
        self.batch = batch
        self._steps: dict[tuple, object] = {}
        self._parts: dict[tuple, Part] = {}
        self._memo = ExportMemo()  # nodes and initializers exported once for all parts (the IR does not change)
        self.sessions = 0  # sessions built
        self._lock = threading.Lock()  # sessions built by several threads: the first one stored wins

    def _lower(self, ir: QIR, rec: CalibRecord):
        return lower_fake_quant(ir, rec, self.rounding)

    def _session(self, records, inputs, outputs, constants, lower=None, switches=(), batch=False):
        """A session for ``records``; with ``batch``, batch-capable when the part allows it.
        Returns ``(session, batched)``."""
        model = export_subgraph(self.ir, records, list(inputs), list(outputs), constants=constants,
                                lower_calibration=lower or self._lower, lower_op=lower_layout_stable,
                                memo=self._memo)
        model.graph.input.extend(rows_value_info(n, k) for k, n in enumerate(switches))
        batched = batch and make_batch_capable(model, self.ir)
        session = new_session(model, self.threads, self.optimization, shared=True,
                              what=f"the part of {self.ir.name!r} ending at {records[-1].name!r}")
        with self._lock:
            self.sessions += 1
        return session, batched

    def prepare(self, i: int) -> None:
        """Build step ``i``'s reference session now (callable from several threads)."""
        if self.plan.steps[i].calib is None:
            self._step_session(i, self.constants, ())

    def _step_session(self, i: int, constants: Mapping[str, np.ndarray], key: tuple):
        entry = self._steps.get((i, key))
        if entry is None:
            step = self.plan.steps[i]
            wanted = {self.reference[w].output for w in step.weight_calibs}
            entry, _ = self._session(step.records, step.inputs, step.outputs,
                                     {n: a for n, a in constants.items() if n in wanted})
            with self._lock:
                entry = self._steps.setdefault((i, key), entry)
        return entry

    def run_step(self, i: int, read: Read, constants: Mapping[str, np.ndarray],
                 key: tuple = ()) -> dict[str, np.ndarray]:
        """Step ``i``; ``key`` names the weight-calibration modes in ``constants`` (sessions are
        cached per step and key)."""
        step = self.plan.steps[i]
        return self.run(self._step_session(i, constants, key), step.outputs, {v: read(v) for v in step.inputs})

    def part(self, k: int, switches: Mapping[str, CalibRecord] | None = None) -> Part:
        """Segment ``k`` in the reference configuration, with the calibration nodes of
        ``switches`` (node -> its record in the variants' mode) as switches."""
        switches = dict(switches or {})
        key = part_key(k, switches)
        entry = self._parts.get(key)
        if entry is None:
            inputs, outputs = self.plan.segment_io(k)
            lo, hi = self.plan.segments[k]
            records = [self.reference.get(r.name, r) if isinstance(r, CalibRecord) else r
                       for s in self.plan.steps[lo:hi] for r in s.records]
            names = tuple(r.name for r in records if r.name in switches)

            def lower(ir: QIR, rec: CalibRecord):
                if rec.name in switches:
                    return switch_nodes(ir, rec, switches[rec.name], self.rounding)
                return self._lower(ir, rec)

            session, batched = self._session(records, inputs, outputs, dict(self.constants), lower,
                                             names, self.batch)
            entry = Part(session, tuple(inputs), tuple(outputs), names, batched)
            with self._lock:
                entry = self._parts.setdefault(key, entry)
        return entry

    def release_parts(self) -> None:
        """Let every segment session go (and the nodes and weights exported for them)."""
        with self._lock:
            self._parts.clear()
            self._memo.clear()

    def run_segment(self, k: int, read: Read) -> dict[str, np.ndarray]:
        """Segment ``k`` as one session in the reference configuration."""
        part = self.part(k)
        return self.run(part.session, part.outputs, {v: read(v) for v in part.inputs})

    @staticmethod
    def run(session, outputs, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``outputs`` of ``session`` on ``feeds`` (onnxruntime errors as ExecutionError)."""
        try:
            got = session.run(list(outputs), dict(feeds))
        except QirError:
            raise
        except Exception as exc:
            raise ExecutionError(f"onnxruntime failed on the part ending at {outputs[-1]!r}: "
                                 f"{str(exc).strip().splitlines()[0]}") from exc
        return dict(zip(outputs, got))
