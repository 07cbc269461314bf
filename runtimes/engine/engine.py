"""The analysis engine: evaluate many variants of one calibrated IR on some samples.

A *variant* (:mod:`.variants`) changes the mode of a few calibration nodes relative to a
*reference configuration*: ``float`` (every calibration node passes through; "only this node
quantized" analyses) or ``quantized`` (the IR's own modes; "only this node back to float"). For
every sample and variant the engine compares chosen values (the model outputs by default) with
a *baseline* (the float model by default) under chosen metrics (:mod:`qir.metrics`).

How it is fast (docs/architecture.md, "The analysis engine"):

1. **Reference cache** (:mod:`.reference`). The reference configuration runs once per sample;
   the values crossing step boundaries are kept, within a memory budget, spilled past it.
2. **Cone re-execution** (:mod:`.steps`). A variant re-executes only its cone, reading
   everything else from the cache.
3. **Segments and switches** (:mod:`.rows`, onnxruntime). A variant that changes only
   activation calibration nodes runs as a row of a batched call of segment sessions whose
   changed nodes are switches; each such session is checked once against the reference.
4. **Steps** (:mod:`.steps`, both runtimes). Other variants re-execute their cone step by step.
   They run after all the batched ones, once the segment sessions are let go, so the two sets
   of sessions never fill memory together.
5. **Variants in parallel.** ``threads`` calls run at once, each on one core: the many
   small calls of a cone parallelize better across variants than inside an operator.
6. **Resume** (:mod:`.results`). With ``out_dir``, results are appended to
   ``engine_results.jsonl`` as they are produced; ``resume=True`` computes only what is missing.

At ``level="integer"`` (node sensitivity as the NPU computes it, per a march profile) the
fake-quant reference cache does not apply: every variant re-runs its cone at the integer level
over a trace of the reference configuration (:mod:`.whole`, :mod:`qir.runtimes.integer.cone`),
its clone shared by the samples, ``threads`` variants at a time.

A sample whose baseline (the compared values the variants are measured against) holds NaN or
±Inf is left out with a warning naming it (``EngineResult.left_out``): the metrics drop
non-finite positions, so such a sample would score what little is left, or perfect when nothing
is. When every sample is left out, :meth:`Engine.evaluate` raises an InputError. A baseline value
that is near zero or constant on a sample (:func:`qir.metrics.ill_conditioned`) makes cosine
similarity and SQNR noise there: with such a metric, the sample's rows say so
(``ill_conditioned``), a warning names it and the metric to use instead, and the means leave
those entries out (:class:`.results.EngineResult`).

Results equal a plain evaluation (clone the IR, set the modes, run the whole model:
:func:`.variants.evaluate_plainly`) on the same runtime; the tests check it on real models.

With ``cluster`` (:mod:`.cluster`: a Ray cluster, or the ranks of a ``torchrun`` job) the variants
are cut into cost-balanced shards, one per worker, each evaluated on every sample by the worker's
own engine (own reference cache); rows stream back to this process, which writes
``engine_results.jsonl`` (:mod:`.distributed`). The results are the same as here.
"""
from __future__ import annotations

import logging
import math
import os
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir import once
from qir.data import model_samples
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.json_dump import finite
from qir.records import CalibRecord
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.engine.cache import MemoryTrim, ValueCache
from qir.runtimes.engine.cluster import Cluster, current_cluster, parse_cluster
from qir.runtimes.engine.cost import step_flops
from qir.runtimes.engine.distributed import evaluate_distributed
from qir.runtimes.engine.options import EngineOptions, batch_size, optimization_level
from qir.runtimes.engine.plan import Plan, build_plan, split_segments, weight_calibrations
from qir.runtimes.engine.reference import ReferenceCache, StepCosts
from qir.runtimes.engine.results import EngineResult, EngineStats, data_digest, fingerprint, open_results, ordered_rows
from qir.runtimes.engine.rows import Rows
from qir.runtimes.engine.runners import NumpySteps, OrtSteps
from qir.runtimes.engine.steps import run_steps
from qir.runtimes.engine.variants import Variant, VariantRecords, check_variants, configured, configured_clone, run_whole
from qir.runtimes.engine.whole import WHOLE_LEVELS, WholeRuns
from qir.runtimes.numerics import apply_calibration
from qir.runtimes.ort.backend import limited_threads
from qir.runtimes.progress import task

__all__ = ["Engine"]

logger = logging.getLogger(__name__)

_ILL_SAID = "engine: samples a relative metric cannot judge"  # :mod:`qir.once` topic
Job = list[tuple[Variant, "dict[str, CalibRecord] | None"]]  # one call: batched rows, or one variant step by step


class Engine:
    """Evaluate variants of ``ir`` on ``data`` (see the module docstring).

    Args:
        ir: a calibrated IR (not modified).
        data: samples (folder, .npz, .npy, or an iterable of ``{input: array}``).
        runtime: ``ort`` (default) or ``numpy`` (the default, and the only one, at the integer level).
        level: ``fakequant`` (default) or ``integer``: what the NPU computes, per ``march`` (a
            profile name, default ``nash-e``: :mod:`qir.execution`; see :mod:`.whole`).
        reference: ``float`` or ``quantized`` (the configuration variants change).
        reference_changes: changes (as a variant's: node -> ``"int16"``, ``"int8@2.5"``) that make
            the reference configuration itself: variants near a configuration far from the IR's
            own re-execute only where they differ from it (``qir tune`` measures many neighbours
            of one configuration). A variant's change that computes what the reference does is
            no change; a node the reference changes and a variant does not runs as the reference has it.
        baseline: what results are compared with: ``float`` (default) or ``reference``.
        compare: values to compare (default: the graph outputs); any activation may be named.
        metrics: metric names from :mod:`qir.metrics` (the first one ranks).
        memory_budget: bytes of reference values kept in memory (default 2 GiB).
        segments: number of onnxruntime segments (default: about the square root of the number
            of steps: more segments re-run less of a variant's first segment, each boundary
            costs a call and, at level ``all``, a layout reorder).
        batch: most variants per onnxruntime call (default: as many as keep the largest
            activation of a call near 2 MB, at most 32; 1 for models with large activations,
            where a batch runs no faster per row and evicts the cache).
        data_num: use at most this many samples.
        threads: cores to use (default: the :func:`~qir.runtimes.ort.backend.thread_limit` around
            it, else all). Calls run ``threads`` at a time, each on one
            core (onnxruntime sessions get one intra-op thread): many small calls parallelize
            better across variants than inside one operator.
        optimization: onnxruntime graph optimization level. ``auto`` (default) picks ``all``
            (layout/NCHWc kernels, the fastest) unless the model has a calibration node between
            a Conv and an Add, Sigmoid or Tanh: onnxruntime folds such an op into the Conv
            across a pass-through node in a whole-model run, which the engine's parts cannot,
            and results could drift by ~1e-5; then ``extended``, where they stay equal to a
            plain run at that level.
        rounding: fake-quant rounding.
        spill_dir: where cached values go past ``memory_budget`` (default: the system temp folder).
        progress: report progress (:mod:`qir.runtimes.progress`: log lines, or a tqdm bar with ETA
            on a terminal under ``qir.tools``); a string names the task (default ``variants``).
        cluster: where the variants run (:mod:`.cluster`): ``local``, ``auto`` / ``ray://HOST:PORT``
            / ``ray`` (Ray), ``torch`` (the ranks of a torchrun job); default: the one set by
            :func:`.cluster.use_cluster`, else local.
    """

    def __init__(self, ir: QIR, data: Any, options: EngineOptions | None = None, *,
                 float_baselines: Callable[[], Sequence[Mapping[str, np.ndarray]]] | None = None,
                 costs: dict[str, Any] | None = None, **option_values: Any) -> None:
        """``options`` (:class:`EngineOptions`), or its fields as keywords (``runtime=``, ``level=``,
        ...). ``float_baselines``: the float model's compared values of every sample, computed as
        :meth:`_float_baselines` computes them, when the caller has them (called once, when first
        needed; those runs are then saved). ``costs``: a dict shared by engines of the same model,
        which the first to time its steps fills (its :class:`StepCosts` under ``"measured"``) and
        the others adopt (:meth:`adopt_costs`)."""
        if options is not None and option_values:
            raise TypeError("give the engine's options as an EngineOptions or as keywords, not both")
        options = (options or EngineOptions(**option_values)).checked()
        self.options = options
        runtime, reference, baseline = options.runtime, options.reference, options.baseline
        level, march, compare, metrics = options.level, options.march, options.compare, options.metrics
        optimization, rounding, threads = options.optimization, options.rounding, options.threads or limited_threads()
        reference_changes = options.reference_changes
        self.cluster = current_cluster() if options.cluster is None else parse_cluster(options.cluster)
        self.data = data
        self.ir, self.runtime, self.reference, self.baseline = ir, runtime, reference, baseline
        self.level, self.march = level, march
        self.compare = tuple(dict.fromkeys(compare or ir.outputs))
        for v in self.compare:
            ir.value(v)  # NotFoundError with suggestions
        self.metrics = qmetrics.check_metrics(metrics)
        self.samples = model_samples(ir, data, options.data_num)
        optimization = optimization_level(ir, optimization)
        self.rounding, self.threads, self.optimization = rounding, threads, optimization
        self.workers = max(1, int(threads or (os.cpu_count() or 1) // _ranks_here(self.cluster)))
        self.progress = options.progress
        self._call_progress = options.progress  # (the current evaluate call's, :meth:`evaluate`)
        self.plan: Plan = build_plan(ir, self.compare)
        self.reference_changes = dict(reference_changes or {})
        check_variants(ir, [Variant("the reference", self.reference_changes)])
        self.records = configured(ir, reference, self.reference_changes)
        self.constants = {c.output: apply_calibration(self.records[c.name], ir.weight_array(c.input), rounding)
                          for c in weight_calibrations(ir)}
        self.variant_records = VariantRecords(ir, self.records)
        batch = batch_size(ir, options.batch) if runtime == Runtime.ORT else 1
        if runtime == Runtime.NUMPY:
            self.runner = NumpySteps(ir, self.plan)
        else:
            self.runner = OrtSteps(ir, self.plan, self.records, self.constants, 1, optimization, rounding,
                                   batch=batch > 1)
        self._cut_segments(options.segments)
        self.cache = ValueCache(options.memory_budget, options.spill_dir)
        self.ref_cache = ReferenceCache(ir, self.plan, self.runner, self.records, self.constants, rounding, self.cache)
        self.rows = Rows(self.plan, self.runner, self.ref_cache, self.variant_records, self.compare, batch)
        self._baselines: dict[int, dict[str, np.ndarray]] = {}
        self._given_floats = float_baselines
        self._floats_given: list | None = None  # (what it returned, once called)
        self._costs = costs
        self.steps_when_mixed = options.steps_when_mixed and self.cluster is None
        self._left_out: dict[int, str] = {}  # samples left out of the current evaluate, and why
        self._ill: dict[int, dict[str, str]] = {}  # sample -> compared value -> why relative metrics are noise
        self._bounds = ({v: qmetrics.output_bound(ir, v) for v in self.compare}
                        if any(m in qmetrics.RELATIVE for m in self.metrics) else None)
        self._lock = threading.Lock()
        self.stats = {"steps_run": 0, "segments_run": 0, "whole_runs": 0, "reference_seconds": 0.0}
        self.whole = (WholeRuns(ir, reference, self.compare, level, march, self.reference_changes)
                      if level in WHOLE_LEVELS else None)
        self._sample: tuple[int, Mapping[str, np.ndarray]] | None = None  # the current sample of a whole-run level

    @property
    def batch(self) -> int:
        """Most variants per onnxruntime call (1 on numpy; falls to 1 when a part cannot take a
        batch or computes other values in one)."""
        return self.rows.batch

    # ------------------------------------------------------------------ public
    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def evaluate(self, variants: Iterable[Variant], out_dir: str | Path | None = None, *,
                 resume: bool = False, force: bool = False, progress: bool | str | None = None) -> EngineResult:
        """Metrics of every variant on every sample (see :class:`EngineResult`). ``progress``: how
        this call reports progress (default: the engine's option)."""
        variants = list(variants)
        self._call_progress = self.progress if progress is None else progress
        if self._costs:
            self.adopt_costs(self._costs.get("measured"))
        check_variants(self.ir, variants)
        if self.cluster is not None:
            return evaluate_distributed(self, variants, out_dir, resume=resume, force=force)
        start = time.perf_counter()
        # (only a results file needs the digest; every sample fits the inputs before that file is written)
        data = self.data_digest() if out_dir is not None else None
        analysis = self.fingerprint(variants, data)
        rows, results = open_results(out_dir, analysis, variants, len(self.samples), resume=resume, force=force,
                                     data=data)
        done = {(r["variant"], r["sample"]) for r in rows}
        bar = self._bar(len(variants), len(done))

        def emit(job_rows: list[dict], skipped: int = 0) -> None:
            rows.extend(job_rows)
            results.append(job_rows)
            bar.update(len(job_rows) + skipped)

        try:
            self.evaluate_missing(variants, done, emit)
            self.check_left_out(self._left_out)
        finally:
            bar.close()
        if self._costs is not None and not self._costs and (measured := self.measured_costs()) is not None:
            self._costs["measured"] = measured
        return self.result(rows, variants, self._final_stats(start), self._left_out)

    def evaluate_missing(self, variants: list[Variant], done: set[tuple[str, int]], emit: Callable[..., None]) -> None:
        """Rows of every (variant, sample) not ``done``, passed to ``emit(rows, skipped)`` as they are
        produced (:meth:`_evaluate_missing`, ``threads`` calls at a time); the samples left out are
        in ``_left_out`` after. A worker of a cluster runs its shard with this."""
        pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None
        self._left_out, self._ill = {}, {}
        try:
            self._evaluate_missing(variants, done, pool, emit)
            self._warn_ill()
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
            self.cache.clear()
            self._baselines.clear()

    def data_digest(self) -> str:
        """The samples' :func:`.results.data_digest` (each sample checked against the inputs first)."""
        return data_digest(_fitting(self.ir, self.samples))

    def fingerprint(self, variants: Sequence[Variant], data: str | None) -> str:
        """The analysis of ``variants`` on these samples (digest ``data``), as the results file names it."""
        options = [list(self.compare), list(self.metrics), self.reference, self.baseline, self.runtime, self.rounding]
        if self.reference_changes:  # (analyses without keep the fingerprint of their files)
            options.append(sorted(self.reference_changes.items()))
        if self.whole is not None:  # (fake-quant analyses keep the fingerprint of their files)
            options += [self.level, self.whole.march]
        return fingerprint(self.ir, variants, len(self.samples), options, data)

    def check_left_out(self, left_out: Mapping[int, str]) -> None:
        """An InputError when every sample is ``left_out`` (its baseline holds NaN or Inf)."""
        if len(left_out) == len(self.samples):
            raise InputError(f"every sample's {self._baseline_name()} hold NaN or Inf "
                             f"({left_out[0]} on sample 0): nothing to compare; check the data "
                             f"({getattr(self.samples, 'source', 'the samples')}) for NaN or infinite values")

    def result(self, rows: list[dict], variants: list[Variant], stats: EngineStats,
               left_out: Mapping[int, str]) -> EngineResult:
        """The :class:`EngineResult` of ``rows`` (warning when every row is ill-conditioned)."""
        result = EngineResult(ordered_rows(rows, variants), self.metrics, self.compare, stats, left_out=dict(left_out))
        if self._bounds is not None and rows and all(len(r.get("ill_conditioned") or ()) == len(self.compare)
                                                     for r in rows):
            logger.warning("every sample's %s are near zero or constant: the %s numbers are kept (there are no "
                           "others) but measure noise; rank with mse or l1, or use data on which the model responds",
                           self._baseline_name(), "/".join(m for m in self.metrics if m in qmetrics.RELATIVE))
        return result

    def _bar(self, variant_count: int, done: int):
        progress = self._call_progress
        return task(progress if isinstance(progress, str) else "variants", variant_count * len(self.samples),
                    unit="runs", initial=done, enabled=bool(progress))

    def run_variant(self, variant: Variant) -> dict[str, np.ndarray]:
        """The compared values of ``variant`` on the current sample (after ``_reference``)."""
        if self.whole is not None:
            return self.whole.run(self.whole.model(variant), self._sample[1], variant=variant.name)
        changes = self.variant_records.changes(variant)
        if self.rows.switchable(changes):
            return self._run_rows([changes])[0]
        return self._run_steps(changes)

    def close(self) -> None:
        self.cache.close()

    def measured_costs(self) -> StepCosts | None:
        """The step and segment costs its first step-level reference pass timed (None before one,
        or on a runtime without segments), for :meth:`adopt_costs` of another engine."""
        ref = self.ref_cache
        if ref.step_cost is None or not getattr(self.runner, "segments", False):
            return None
        return StepCosts(ref.step_cost, dict(ref.segment_cost), list(self.plan.segments))

    def adopt_costs(self, costs: StepCosts | None) -> None:
        """Take ``costs`` (:meth:`measured_costs` of an engine of the same model and compared
        values, whatever its reference configuration) instead of timing its own: its first
        reference pass then neither times its steps nor runs each segment twice to check and time
        it. A segment that differed from its steps there is run step by step here too: whether
        one does is a matter of the ops onnxruntime fuses inside it, not of the modes of its
        calibration nodes (no QuantizeLinear/DequantizeLinear pair is fused, with
        ``session.disable_quant_qdq``). Costs of another plan are ignored."""
        ref = self.ref_cache
        if (costs is not None and ref.step_cost is None and getattr(self.runner, "segments", False)
                and costs.plan == self.plan.segments and len(costs.steps) == len(self.plan.steps)):
            ref.step_cost, ref.segment_cost = costs.steps, dict(costs.segments)

    # ------------------------------------------------------------------ orchestration
    def _evaluate_missing(self, variants: list[Variant], done: set[tuple[str, int]], pool,
                          emit: Callable[..., None]) -> None:
        """Rows of every (variant, sample) not ``done``, passed to ``emit`` as they are produced:
        first every sample's batched variants on a segment-level reference, then, once the
        segment sessions are let go, the step-by-step ones on a step-level reference (a sample
        left out is passed as ``emit([], n)``, its ``n`` runs). The float baselines are computed
        beside the building of the segment sessions. At a whole-run level: :meth:`_evaluate_whole`."""
        if self.whole is not None:
            self._evaluate_whole(variants, done, pool, emit)
            return
        pending = {s: sample for s, sample in enumerate(self.samples)
                   if any((v.name, s) not in done for v in variants)}
        batched, single = self.rows.route(variants)
        if self.steps_when_mixed and batched and single:
            batched, single = [], list(variants)
        baselines = pool.submit(self._float_baselines, pending) if pool else None
        if baselines is None:
            self._float_baselines(pending)
        if batched and pending:
            self.rows.build_parts(pool)
        if baselines is not None:
            baselines.result()
        if batched:
            for s, sample in pending.items():
                base = self._reference(s, sample, pool, steps=False)
                if not self._scored(s, base):
                    emit([], sum((v.name, s) not in done for v in variants))  # (its runs count as done)
                    continue
                if self.rows.check_parts(pool):  # a switch failed its check: its variants go step by step
                    batched, single = self.rows.route(variants)
                self._run_jobs(self.rows.jobs([(v, ch) for v, ch in batched if (v.name, s) not in done], []),
                               s, base, pool, emit)
            if single:  # the segment sessions make way for the steps'
                self.runner.release_parts()
        for s, sample in pending.items() if single else ():
            if s in self._left_out:
                continue
            base = self._reference(s, sample, pool, steps=True)
            if not self._scored(s, base):
                emit([], sum((v.name, s) not in done for v in variants))
                continue
            self._run_jobs(self.rows.jobs([], [v for v in single if (v.name, s) not in done]), s, base, pool, emit)

    def _scored(self, s: int, base: Mapping[str, np.ndarray]) -> bool:
        """Whether sample ``s`` is scored: not when its baseline values hold NaN or ±Inf (then it
        is left out, noted in ``_left_out`` and warned about; see the module docstring)."""
        if s in self._left_out:
            return False
        note = qmetrics.nonfinite_note({v: base[v] for v in self.compare})
        if note is None:
            self._note_conditioning(s, base)
            return True
        self._left_out[s] = note
        logger.warning("sample %d of %s is left out: its %s hold NaN or Inf (%s), so no metric on it "
                       "means anything", s, getattr(self.samples, "source", "the samples"), self._baseline_name(), note)
        return False

    def _note_conditioning(self, s: int, base: Mapping[str, np.ndarray]) -> None:
        """Flag the compared values whose baseline on sample ``s`` is near zero or constant
        (:func:`qir.metrics.ill_conditioned`), when a relative metric is asked for; warn once."""
        if self._bounds is None or s in self._ill:
            return
        ill = {v: why for v in self.compare if (why := qmetrics.ill_conditioned(base[v], self._bounds[v]))}
        self._ill[s] = ill

    def _warn_ill(self) -> None:
        """One warning for the samples of this call whose baseline makes a relative metric noise,
        each sample said once per process for this model and compared values (:mod:`qir.once`)."""
        new = sorted(s for s, ill in self._ill.items()
                     if ill and once.first_time(_ILL_SAID, (self.ir.name, self.compare, s)))
        if not new:
            return
        relative = "/".join(m for m in self.metrics if m in qmetrics.RELATIVE)
        ill = self._ill[new[0]]
        shown = "; ".join(f"{v!r} {why}" for v, why in list(ill.items())[:3]) + (" ..." if len(ill) > 3 else "")
        listed = ", ".join(map(str, new[:8])) + (f", ... {len(new) - 8} more" if len(new) > 8 else "")
        logger.warning("%d sample(s) (%s): %s is noise on them, their %s being near zero or constant (sample %d: %s); "
                       "they are left out of the %s means (use mse or l1 to rank on such data)", len(new), listed,
                       relative, self._baseline_name(), new[0], shown, relative)

    def _baseline_name(self) -> str:
        """What variants are compared with, for messages (``float outputs``)."""
        what = "outputs" if self.compare == tuple(self.ir.outputs) else "compared values"
        return f"float {what}" if self.baseline == "float" else f"{self.reference} reference {what}"

    def _run_jobs(self, jobs: list[Job], s: int, base: Mapping[str, np.ndarray], pool,
                  emit: Callable[[list[dict]], None]) -> None:
        """Run ``jobs`` on sample ``s`` (``threads`` at a time) and ``emit`` each job's rows: its
        variants' metrics against ``base``. Freed C memory is handed back as the process grows."""
        def measure(job: Job) -> list[dict]:
            return [self._row(v.name, s, base, got) for (v, _), got in zip(job, self._run_job(job))]

        trim = MemoryTrim()
        for job_rows in pool.map(measure, jobs) if pool else map(measure, jobs):
            trim()
            emit(job_rows)

    def _row(self, variant: str, s: int, base: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray]) -> dict:
        """The result row of ``variant`` on sample ``s``: its metrics against ``base``."""
        ill = self._ill.get(s)
        return {"variant": variant, "sample": s,
                "values": finite({n: qmetrics.compute(self.metrics, base[n], got[n]) for n in self.compare}),
                **({"ill_conditioned": ill} if ill else {})}

    def _evaluate_whole(self, variants: list[Variant], done: set[tuple[str, int]], pool,
                        emit: Callable[..., None]) -> None:
        """At a whole-run level (:mod:`.whole`): each pending sample's baseline first (a sample
        whose baseline holds NaN or Inf is left out, ``emit([], n)``), then each variant on every
        scored sample, one clone and runtime per variant, ``threads`` variants at a time."""
        pending = {s: sample for s, sample in enumerate(self.samples)
                   if any((v.name, s) not in done for v in variants)}
        bases = {}
        for s, sample in pending.items():
            base = self._reference(s, sample)
            if self._scored(s, base):
                bases[s] = base
            else:
                emit([], sum((v.name, s) not in done for v in variants))

        def measure(v: Variant) -> list[dict]:
            todo = [s for s in bases if (v.name, s) not in done]
            if not todo:
                return []
            model, rt = self.whole.model(v), self.whole.runtime()
            return [self._row(v.name, s, bases[s], self.whole.run(model, pending[s], rt, v.name, s)) for s in todo]

        trim = MemoryTrim()
        with self.whole.held_back():
            for rows in pool.map(measure, variants) if pool else map(measure, variants):
                trim()
                self.stats["whole_runs"] += len(rows)
                emit(rows)
        self.whole.report()
        self.whole.forget()

    def _run_job(self, job: Job) -> list[dict[str, np.ndarray]]:
        if job[0][1] is None:
            return [self._run_steps(self.variant_records.changes(job[0][0]))]
        return self._run_rows([changes for _, changes in job])

    def _run_rows(self, rows: list[Mapping[str, CalibRecord]]) -> list[dict[str, np.ndarray]]:
        """Compared values of variants given by their ``changes`` (each a switch), as the rows
        of one batched call (:meth:`.rows.Rows.run`)."""
        values, runs = self.rows.run(rows)
        with self._lock:
            self.stats["segments_run"] += runs
        return values

    def _run_steps(self, changes: Mapping[str, CalibRecord]) -> dict[str, np.ndarray]:
        """Compared values of a variant given by its ``changes``, its cone re-executed step by
        step (:func:`.steps.run_steps`) on a step-level reference of the current sample."""
        ref = self.ref_cache
        if ref.level != "steps":  # a direct run_variant after a segment-level reference
            with self._lock:
                if ref.level != "steps":
                    self._reference(*ref.sample, steps=True)
        values, steps_run, segments_run = run_steps(ref, changes, self.compare)
        with self._lock:
            self.stats["steps_run"] += steps_run
            self.stats["segments_run"] += segments_run
        return values

    def _reference(self, s: int, sample: Mapping[str, np.ndarray], pool=None, steps: bool = True) -> dict[str, np.ndarray]:
        """Run the reference on sample ``s`` into the cache, step by step or, with
        ``steps=False``, segment by segment (:meth:`.reference.ReferenceCache.load`). Returns the
        baseline values. At a whole-run level nothing is cached but the baseline, once per sample
        (the float model's values, or the reference configuration's at that level)."""
        start = time.perf_counter()
        if self.whole is not None:
            self._sample = (s, sample)
            if s not in self._baselines:
                given = self._given_baseline(s)
                self._baselines[s] = given if given is not None else \
                    self.whole.baseline(sample, "float" if self.baseline == "float" else self.reference)
            self.stats["reference_seconds"] += time.perf_counter() - start
            return self._baselines[s]
        self.ref_cache.load(s, sample, pool, steps)
        base = self._baselines.get(s) or {v: self.cache.get(v) for v in self.compare}
        self.stats["reference_seconds"] += time.perf_counter() - start
        return base

    def _float_baselines(self, samples: dict[int, Mapping[str, np.ndarray]]) -> None:
        """Compared values of the float model for ``samples`` (when the reference is not float),
        computed up front with one plain whole-model run each, on one core (it runs beside the
        engine's own sessions being built); the session is released before the reference
        cache fills."""
        if self.baseline != "float" or self.reference == "float" or not samples:
            return
        float_ir = configured_clone(self.ir, "float", {})
        options = {"threads": 1, "optimization": self.optimization,
                   "layout_stable": True} if self.runtime == Runtime.ORT else {}
        rt = get_runtime(self.runtime, level=Level.FAKEQUANT, rounding=self.rounding, **options)
        for s, sample in samples.items():
            given = self._given_baseline(s)
            self._baselines[s] = given if given is not None else run_whole(float_ir, check_feeds(self.ir, sample),
                                                                           self.compare, rt)

    def _given_baseline(self, s: int) -> dict[str, np.ndarray] | None:
        """Sample ``s``'s float baseline as the caller gave it (``float_baselines``), when the
        baseline is the float model's and the caller has every compared value; else None. The
        float model is the caller's to say: a transform that moved the float function (bias
        correction) leaves the model as given as the one to compare with."""
        if self._given_floats is None or self.baseline != "float" or self.reference == "float":
            return None
        if self._floats_given is None:
            self._floats_given = list(self._given_floats())
        given = self._floats_given[s] if s < len(self._floats_given) else {}
        return {v: given[v] for v in self.compare} if all(v in given for v in self.compare) else None

    def _cut_segments(self, count: int | None) -> None:
        """Segments of about equal FLOPs (every step also counts a tenth of the mean, so that
        FLOP-free steps spread); by default about the square root of the number of steps."""
        plan, n = self.plan, len(self.plan.steps)
        flops = step_flops(self.ir, plan)
        count = count or max(1, int(round(math.sqrt(n))))
        plan.segments = split_segments(list(flops + max(float(flops.sum()), 1.0) / (10 * n)), count) if n else []

    def _final_stats(self, start: float) -> EngineStats:
        return EngineStats(**self.stats, seconds=round(time.perf_counter() - start, 3),
                           sessions=getattr(self.runner, "sessions", 0), steps=len(self.plan.steps),
                           segments=len(self.plan.segments), batch=self.batch, peak_cache_bytes=self.cache.peak,
                           spilled_bytes=self.cache.spilled,
                           peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _ranks_here(cluster: Cluster | None) -> int:
    """How many ranks of a torchrun job share this machine's cores (1 elsewhere)."""
    if cluster is None or cluster.kind != "torch":
        return 1
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _fitting(ir: QIR, samples: Iterable[Mapping[str, np.ndarray]]) -> Iterator[Mapping[str, np.ndarray]]:
    """``samples`` as they are, each first checked against the model's inputs
    (:func:`~qir.runtimes.base.check_feeds`: a sample of another shape or dtype is an InputError)."""
    for sample in samples:
        check_feeds(ir, sample)
        yield sample
