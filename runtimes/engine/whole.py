"""Variants at the integer level ("node sensitivity as the NPU computes it").

The integer level (:class:`qir.runtimes.integer.IntegerRuntime`) carries integer codes between
ops and requantizes a GEMM's output straight into the parameters of the calibration node that
reads it, so a changed node also changes how the ops before it round: the fake-quant reference
cache does not apply. Each variant is a :class:`VariantModel`: the reference configuration's
calibration records with the variant's changed ones (built once per variant, no IR clone; it
serves every sample, keeping its integer plan, with the quantized weights of its changed nodes),
run by *integer cone re-execution* (:mod:`qir.runtimes.integer.cone`): the reference
configuration (one clone) is traced once per sample (every value kept), and a variant re-runs only
the steps whose computation it changes (requantization targets included) and those downstream,
reading the rest from the trace; a whole run of a variant (no sample) clones the IR with the
variant's modes. Results equal the plain evaluation
(:func:`.variants.evaluate_plainly` at level ``integer``) bit for bit. The baseline (the float
model, or the reference configuration at the integer level) runs once per sample.

While variants run, the integer runtime's per-run reports (ops that read quantized values but
ran in float, accumulator overflows) are held back: a variant that leaves an op's neighbours in
float makes that op fall back by design, and hundreds of variants would each say so. They are
gathered instead (:meth:`WholeRuns.note`) and logged once (:meth:`WholeRuns.report`):
overflows as a warning, fallbacks at INFO. The baseline runs report as any run does.
"""
from __future__ import annotations

import logging
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

import numpy as np

from qir.errors import QirError
from qir.execution import Execution, Level, Runtime
from qir.graph import QIR
from qir.records import CalibRecord
from qir.runtimes.base import get_runtime
from qir.runtimes.engine.variants import Variant, configured_clone, effective, is_no_change, run_whole
from qir.runtimes.integer.cone import ConeMemo, IntegerTrace, run_cone, trace

__all__ = ["WholeRuns", "WHOLE_LEVELS", "VariantModel"]

logger = logging.getLogger(__name__)

WHOLE_LEVELS = (Level.INTEGER,)  # levels whose variants run whole
_RUN_REPORTS = "qir.runtimes.integer.arithmetic"  # the logger of the integer runtime's per-run reports


class _HoldBack(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@dataclass
class VariantModel:
    """A variant as its integer runs read it: ``records``, every calibration node's record (the
    reference configuration's own objects where the variant leaves a node as it is), over the
    reference configuration's graph; ``memo`` keeps its cone plan per trace; the IR clone a whole
    run needs is made on first use (:meth:`WholeRuns.clone`)."""

    changes: dict[str, str]
    records: dict[str, CalibRecord]
    memo: ConeMemo = field(default_factory=ConeMemo)
    ir: QIR | None = None


class WholeRuns:
    """Variants of ``ir`` run whole at ``level`` (``march``: the integer level's profile)."""

    def __init__(self, ir: QIR, reference: str, compare: Sequence[str], level: str, march: str | None,
                 reference_changes: Mapping[str, str] | None = None) -> None:
        self.ir, self.reference, self.compare = ir, reference, list(compare)
        self.reference_changes = dict(reference_changes or {})
        self.level, self.march = level, Execution.resolve(None, level, march).march
        self.profile = self.runtime().profile  # (an unknown march fails here, before any run)
        self._baseline_models: dict[str, QIR] = {}
        self._lock = threading.Lock()
        self.overflows: dict[str, set[str]] = {}  # variant -> nodes whose accumulator overflowed
        self.fallbacks: dict[str, set[str]] = {}  # variant -> ops that read quantized values but ran in float
        self._traces: dict[int, IntegerTrace] = {}  # sample index -> the reference configuration's trace
        self._reference_ir: QIR | None = None  # the reference configuration's IR
        self._records: dict[str, CalibRecord] | None = None  # its calibration records

    def runtime(self):
        """A runtime of the level (one per thread: a run records its statistics on it)."""
        return get_runtime(Runtime.NUMPY, level=self.level, march=self.march)

    def model(self, variant: Variant) -> VariantModel:
        """``variant`` as its runs read it (built once per variant; it serves every sample)."""
        changes = {**self.reference_changes, **variant.changes}
        records = dict(self._reference_records())
        for name in variant.changes:
            rec = self.ir.calibration(name)
            records[name] = rec if is_no_change(rec, changes[name]) else effective(rec, changes[name])
        return VariantModel(changes, records)

    def clone(self, model: VariantModel) -> QIR:
        """The IR with ``model``'s modes (made once per model)."""
        if model.ir is None:
            model.ir = configured_clone(self.ir, self.reference, model.changes)
        return model.ir

    def run(self, model: VariantModel, feeds: Mapping[str, np.ndarray], rt=None, variant: str | None = None,
            sample: int | None = None) -> dict[str, np.ndarray]:
        """The compared values of ``model`` on ``feeds`` (sample number ``sample``: its cone re-run
        over the reference's trace of that sample; a whole run without it); an error names the
        ``variant``, whose run's fallbacks and overflows are noted."""
        rt = rt or self.runtime()
        try:
            if sample is None:
                got = run_whole(self.clone(model), feeds, self.compare, rt)
            else:
                ref_model = self._reference_model()
                capture = [v for v in self.compare if v not in ref_model.outputs]
                got = run_cone(rt, ref_model, feeds, self.trace(sample, feeds), capture, records=model.records,
                               memo=model.memo)
                got = {v: got[v] for v in self.compare}
        except QirError as exc:
            if variant is None:
                raise
            raise type(exc)(f"variant {variant!r}: {exc}") from exc
        if variant is not None:
            self.note(variant, rt.last_stats)
        return got

    def _reference_model(self) -> QIR:
        """The reference configuration's IR (one clone, traced on each sample)."""
        with self._lock:
            if self._reference_ir is None:
                self._reference_ir = configured_clone(self.ir, self.reference, self.reference_changes)
            return self._reference_ir

    def _reference_records(self) -> dict[str, CalibRecord]:
        """Every calibration node's record in the reference configuration (its IR's own objects)."""
        if self._records is None:
            self._records = {c.name: c for c in self._reference_model().calibrations()}
        return self._records

    def trace(self, sample: int, feeds: Mapping[str, np.ndarray]) -> IntegerTrace:
        """The reference configuration's trace on sample ``sample`` (built once, kept until
        :meth:`forget`)."""
        model = self._reference_model()
        with self._lock:
            if sample not in self._traces:
                self._traces[sample] = trace(self.runtime(), model, feeds,
                                             [v for v in self.compare if v not in model.outputs])
            return self._traces[sample]

    def forget(self) -> None:
        """Let the traces go (an evaluation is over)."""
        self._traces.clear()

    def note(self, variant: str, stats) -> None:
        """Gather one variant run's :class:`~qir.runtimes.integer.arithmetic.IntegerStats`."""
        with self._lock:
            self.overflows.setdefault(variant, set()).update(stats.overflows)
            self.fallbacks.setdefault(variant, set()).update(n for ns in stats.float_fallback.values() for n in ns)

    @contextmanager
    def held_back(self) -> Iterator[None]:
        """Hold back the integer runtime's per-run reports (see the module docstring)."""
        hold = _HoldBack()
        logging.getLogger(_RUN_REPORTS).addFilter(hold)
        try:
            yield
        finally:
            logging.getLogger(_RUN_REPORTS).removeFilter(hold)

    def report(self) -> None:
        """Log what the variants' runs gathered, once: overflows as a warning, fallbacks at INFO."""
        over = Counter(n for ns in self.overflows.values() for n in ns)
        if over and self.profile.acc_overflow != "ignore":  # (as a single run reports it)
            worst = ", ".join(f"{n} (in {c} variant(s))" for n, c in over.most_common(5))
            logger.warning("integer level (%s): accumulator overflow past the march's width in %d node(s): %s",
                           self.march, len(over), worst)
        fell = {v: ns for v, ns in self.fallbacks.items() if ns}
        if fell:
            ops = Counter(n for ns in fell.values() for n in ns)
            logger.info("integer level (%s): in %d of %d variant(s) some ops read quantized values but ran in float "
                        "(an op whose other inputs or output a variant leaves in float, or with no integer kernel): "
                        "%s", self.march, len(fell), len(self.fallbacks),
                        ", ".join(f"{n} ({c})" for n, c in ops.most_common(8)))
        self.overflows.clear()
        self.fallbacks.clear()

    def baseline(self, feeds: Mapping[str, np.ndarray], configuration: str) -> dict[str, np.ndarray]:
        """The compared values of ``configuration`` (``float``, or the reference's) on ``feeds``,
        at this level (the float configuration computes in float there too)."""
        if configuration not in self._baseline_models:
            self._baseline_models[configuration] = configured_clone(self.ir, configuration, {})
        return run_whole(self._baseline_models[configuration], feeds, self.compare, self.runtime())
