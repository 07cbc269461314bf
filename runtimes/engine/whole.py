"""Variants at the integer level ("node sensitivity as the NPU computes it").

The integer level (:class:`qir.runtimes.integer.IntegerRuntime`) carries integer codes between
ops and requantizes a GEMM's output straight into the parameters of the calibration node that
reads it, so a changed node also changes how the ops before it round: the fake-quant reference
cache does not apply. Each variant is the IR cloned with the variant's modes (built once per
variant; it serves every sample, the integer runtime caching its plan, with the quantized
weights, on it), run by *integer cone re-execution* (:mod:`qir.runtimes.integer.cone`): the
reference configuration is traced once per sample (every value kept), and a variant re-runs only
the steps whose computation it changes (requantization targets included) and those downstream,
reading the rest from the trace; results equal the plain evaluation
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
from typing import Iterator, Mapping, Sequence

import numpy as np

from qir.errors import QirError
from qir.execution import Execution, Level, Runtime
from qir.graph import QIR
from qir.runtimes.base import get_runtime
from qir.runtimes.engine.variants import Variant, configured_clone, run_whole
from qir.runtimes.integer.cone import IntegerTrace, run_cone, trace

__all__ = ["WholeRuns", "WHOLE_LEVELS"]

logger = logging.getLogger(__name__)

WHOLE_LEVELS = (Level.INTEGER,)  # levels whose variants run whole
_RUN_REPORTS = "qir.runtimes.integer.arithmetic"  # the logger of the integer runtime's per-run reports


class _HoldBack(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


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

    def runtime(self):
        """A runtime of the level (one per thread: a run records its statistics on it)."""
        return get_runtime(Runtime.NUMPY, level=self.level, march=self.march)

    def model(self, variant: Variant) -> QIR:
        """The IR as ``variant`` runs it (clone it once per variant; it serves every sample)."""
        return configured_clone(self.ir, self.reference, {**self.reference_changes, **variant.changes})

    def run(self, model: QIR, feeds: Mapping[str, np.ndarray], rt=None, variant: str | None = None,
            sample: int | None = None) -> dict[str, np.ndarray]:
        """The compared values of ``model`` on ``feeds`` (sample number ``sample``: its cone re-run
        over the reference's trace of that sample; a whole run without it); an error names the
        ``variant``, whose run's fallbacks and overflows are noted."""
        rt = rt or self.runtime()
        try:
            if sample is None:
                got = run_whole(model, feeds, self.compare, rt)
            else:
                capture = [v for v in self.compare if v not in model.outputs]
                got = run_cone(rt, model, feeds, self.trace(sample, feeds), capture)
                got = {v: got[v] for v in self.compare}
        except QirError as exc:
            if variant is None:
                raise
            raise type(exc)(f"variant {variant!r}: {exc}") from exc
        if variant is not None:
            self.note(variant, rt.last_stats)
        return got

    def trace(self, sample: int, feeds: Mapping[str, np.ndarray]) -> IntegerTrace:
        """The reference configuration's trace on sample ``sample`` (built once, kept until
        :meth:`forget`)."""
        with self._lock:
            if sample not in self._traces:
                model = configured_clone(self.ir, self.reference, self.reference_changes)
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
        return self.run(self._baseline_models[configuration], feeds)
