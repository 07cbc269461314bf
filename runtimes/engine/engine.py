"""The analysis engine: evaluate many variants of one calibrated IR on some samples.

A *variant* changes the mode of a few calibration nodes relative to a *reference
configuration*: ``float`` (every calibration node passes through; "only this node quantized"
analyses) or ``quantized`` (the IR's own modes; "only this node back to float"). For every
sample and variant the engine compares chosen values (the model outputs by default) with a
*baseline* (the float model by default) under chosen metrics (:mod:`qir.metrics`).

How it is fast (``../shared/DESIGN.md`` §5):

1. **Reference cache.** The reference configuration runs once per sample, step by step
   (:mod:`.plan`); every value crossing a step boundary is kept in a :class:`.cache.ValueCache`
   (``memory_budget`` bytes, spilled to disk past it). Fake-quantized values are kept as their
   integer codes; the float input of an integer quantizer is not kept at all but recomputed
   from its producer by the one variant that needs it. Samples are processed one at a time,
   so the cache holds one sample.
2. **Cone re-execution.** A variant re-executes only its cone, reading everything else from
   the cache. Values leave memory after their last reader in the cone.
3. **Segments and switches (onnxruntime).** Consecutive steps form segments of about equal
   FLOPs, each one cached session. A variant that changes only activation calibration nodes
   runs as a row of a batch: the segment holding its first change runs as one session in which
   the changed nodes are *switches* (:mod:`.switches`) that each row turns on for itself, later
   segments as sessions in the reference configuration (switches again where a row changes
   more nodes), segments outside the cone not at all. Variants whose first change lies in the
   same segment share calls, up to ``batch`` rows per call. With only such variants, the
   reference itself runs segment by segment and keeps just the values crossing segments.
   Each switch session is checked once against the reference (no row switched: equal within
   1e-6 of each value's magnitude; onnxruntime may fold an Add into a Conv across a
   pass-through calibration node of the reference, which a switch keeps apart), and batched
   calls against single ones (equal bit for bit); what fails runs step by step, one per call.
4. **Steps (both runtimes).** Other variants (a weight calibration node changed, the numpy
   runtime) re-execute their cone step by step, on a reference kept step by step; on
   onnxruntime a segment of the cone that holds no change runs as one call when that was
   measured to be cheaper. They run after all the batched ones, once the segment sessions are
   let go, so the two sets of sessions never fill memory together.
5. **Variants in parallel.** ``threads`` calls run at once, each on one core: the many
   small calls of a cone parallelize better across variants than inside an operator.
6. **Resume.** With ``out_dir``, results are appended to ``engine_results.jsonl`` as they are
   produced, one line per (variant, sample); ``resume=True`` keeps the lines of the same analysis
   and computes only what is missing.

Results equal a plain evaluation (clone the IR, set the modes, run the whole model:
:func:`evaluate_plainly`) on the same runtime; the tests check it on real models. On
onnxruntime both write GlobalAveragePool as ReduceMean (``layout_stable``): onnxruntime picks
that op's kernel by the layout of its input, so a whole-model run and the engine's parts would
otherwise average differently.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import resource
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.calibration import QRANGE, along_axis, calib_scale, set_mode
from qir.data import model_samples
from qir.errors import ExecutionError, InputError
from qir.graph import QIR
from qir.json_dump import finite
from qir.kinds import CalibMode
from qir.records import CalibRecord, copy_record
from qir.runtimes.base import check_feeds, get_runtime
from qir.runtimes.engine.cache import ValueCache, release_free_memory, resident_bytes
from qir.runtimes.engine.cost import elements, step_flops
from qir.runtimes.engine.plan import Plan, build_plan, split_segments, weight_calibrations
from qir.runtimes.engine.runners import NumpySteps, OrtSteps, part_key
from qir.runtimes.numerics import apply_calibration
from qir.runtimes.ort.switches import is_rows_input, rows_input

__all__ = ["Engine", "EngineResult", "Variant", "evaluate_plainly", "configured_clone", "one_at_a_time",
           "load_variants", "RESULTS_FILE"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "engine_results.jsonl"
_TRIM_GROWTH = 256 << 20  # freed C memory goes back to the system once the process grew this much
_BATCH_BYTES = 2 << 20  # default batch: its largest activation about this size (stays in cache)
_MAX_BATCH = 32
REFERENCES = ("float", "quantized")
BASELINES = ("float", "reference")


@dataclass(frozen=True)
class Variant:
    """A named set of calibration-node mode changes, e.g. ``Variant("conv1", {"x_calib": "int8"})``."""

    name: str
    changes: Mapping[str, str]

    def items(self) -> list[tuple[str, str]]:
        return sorted((n, CalibMode(m).value) for n, m in self.changes.items())


def one_at_a_time(ir: QIR, mode: str, role: str = "activation") -> list[Variant]:
    """One variant per calibration node of ``role`` (``activation``, ``weight`` or ``all``),
    named after the node, setting just that node to ``mode``."""
    if role not in ("activation", "weight", "all"):
        raise InputError(f"unknown role {role!r}; choose activation, weight or all")
    return [Variant(c.name, {c.name: mode}) for c in ir.calibrations(None if role == "all" else role)]


def load_variants(path: str | Path) -> list[Variant]:
    """Variants from a JSON file: ``{"name": {"calibration node": "mode", ...}, ...}`` or a list
    of ``{"name": ..., "changes": {...}}`` objects."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(f"variants file not found: {path}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict):
        data = [{"name": k, "changes": v} for k, v in data.items()]
    if not isinstance(data, list) or not all(
            isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("changes"), dict)
            for d in data):
        raise InputError(f"{path}: expected {{name: {{node: mode}}}} or a list of "
                         "{\"name\": ..., \"changes\": {node: mode}} objects")
    return [Variant(d["name"], dict(d["changes"])) for d in data]


def effective(rec: CalibRecord, mode: CalibMode | str) -> CalibRecord:
    """A copy of ``rec`` in ``mode`` (imported int8/int16 scales converted, see ``set_mode``)."""
    out = copy_record(rec)
    set_mode(out, mode)
    return out


def configured(ir: QIR, reference: str, changes: Mapping[str, str]) -> dict[str, CalibRecord]:
    """Every calibration node as it runs in ``reference`` with ``changes`` applied."""
    out = {}
    for c in ir.calibrations():
        mode = changes.get(c.name, CalibMode.FLOAT if reference == "float" else None)
        out[c.name] = c if mode is None or CalibMode(mode) is c.mode else effective(c, mode)
    return out


def configured_clone(ir: QIR, reference: str, changes: Mapping[str, str]) -> QIR:
    """A clone of ``ir`` whose calibration nodes run as in ``reference`` with ``changes``."""
    clone = ir.clone()
    for name, rec in configured(ir, reference, changes).items():
        clone.set_calibration(name, mode=rec.mode)
    return clone


def evaluate_plainly(ir: QIR, feeds: Mapping[str, np.ndarray], changes: Mapping[str, str], *,
                     reference: str = "float", compare: Sequence[str] | None = None,
                     runtime: str = "ort", **runtime_options: Any) -> dict[str, np.ndarray]:
    """The slow, obvious way: clone ``ir``, set every calibration node's mode, run the whole
    model (a new session on onnxruntime, with the engine's ``layout_stable`` lowering). What
    every engine result must equal, and what the peers do per node."""
    if runtime == "ort":
        runtime_options.setdefault("layout_stable", True)
    return _run_whole(configured_clone(ir, reference, changes), feeds, list(compare or ir.outputs),
                      get_runtime(runtime, level="fakequant", **runtime_options))


def _run_whole(model: QIR, feeds: Mapping[str, np.ndarray], compare: Sequence[str], rt) -> dict[str, np.ndarray]:
    """``compare`` values of one whole-model run (graph outputs, the rest captured)."""
    got = rt.run(model, feeds, capture=[v for v in compare if v not in model.outputs])
    return {v: got[v] for v in compare}


# ops onnxruntime's NCHWc layout pass (level ``all`` only) folds into a preceding Conv: an Add
# as its sum input (another order of additions); Sigmoid and Tanh as its activation (not
# checked to give the same values, so treated the same way). Relu, Clip and HardSigmoid fused
# into a Conv give the same values as on their own (PP-OCRv4 det's guard covers HardSigmoid).
_NCHWC_FUSED = frozenset({"Add", "Sum", "Sigmoid", "Tanh"})


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


def _scale_of(rec: CalibRecord, ir: QIR) -> np.ndarray:
    """The scale of an integer-mode calibration node, shaped to broadcast over its value."""
    shape = ir.value(rec.input).shape
    return along_axis(calib_scale(rec), rec.axis, len(shape) if shape is not None else 0)


def _decode(x: float | str) -> float:
    return float(x)


def _equal(got: Mapping[str, np.ndarray], expect: Mapping[str, np.ndarray]) -> bool:
    return all(np.array_equal(got[v], expect[v], equal_nan=True) for v in expect)


def _close(got: Mapping[str, np.ndarray], expect: Mapping[str, np.ndarray], rtol: float = 1e-6) -> bool:
    """Same shapes and NaN/Inf places, finite values within ``rtol`` of the largest |expected|
    (the engine's promise against a plain run: a fused op rounds differently, nothing more)."""
    for v, want in expect.items():
        have = got[v]
        if have.shape != want.shape:
            return False
        if want.dtype.kind != "f":
            if not np.array_equal(have, want):
                return False
            continue
        finite = np.isfinite(want)
        if not np.array_equal(finite, np.isfinite(have)) or not np.array_equal(have[~finite], want[~finite],
                                                                              equal_nan=True):
            return False
        if finite.any():
            scale = float(np.abs(want[finite]).max())
            if float(np.abs(have[finite].astype(np.float64) - want[finite]).max()) > rtol * scale:
                return False
    return True


@dataclass
class EngineResult:
    """Metrics per (variant, sample, compared value), and how the work went.

    ``rows``: ``{"variant": name, "sample": i, "values": {value: {metric: number}}}``.
    ``stats``: seconds, steps and segments executed, sessions built, peak bytes held by the
    reference cache, bytes spilled to disk and the process's peak RSS.
    """

    rows: list[dict]
    metrics: tuple[str, ...]
    compare: tuple[str, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    def per_variant(self) -> dict[str, dict[str, float]]:
        """Each variant's metrics: mean over compared values per sample, then over samples
        (NaN entries skipped), in the order variants were given."""
        acc: dict[str, dict[str, list[float]]] = {}
        for row in self.rows:
            slot = acc.setdefault(row["variant"], {m: [] for m in self.metrics})
            for m in self.metrics:
                vals = [v[m] for v in row["values"].values() if v[m] == v[m]]
                if vals:
                    slot[m].append(float(np.mean(vals)))
        return {name: {m: (float(np.mean(v)) if v else math.nan) for m, v in ms.items()}
                for name, ms in acc.items()}

    def ranked(self, metric: str | None = None) -> list[tuple[str, dict[str, float]]]:
        """``per_variant`` sorted worst first by ``metric`` (default: the first metric)."""
        metric = metric or self.metrics[0]
        table = self.per_variant()
        return sorted(table.items(), key=lambda kv: qmetrics.worst_first(metric, kv[1][metric]))


class Engine:
    """Evaluate variants of ``ir`` on ``data`` (see the module docstring).

    Args:
        ir: a calibrated IR (not modified).
        data: samples (folder, .npz, .npy, or an iterable of ``{input: array}``).
        runtime: ``ort`` (default) or ``numpy``.
        reference: ``float`` or ``quantized`` (the configuration variants change).
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
        threads: cores to use (default: all). Calls run ``threads`` at a time, each on one
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
        progress: show a progress bar with ETA (on a terminal).
    """

    def __init__(self, ir: QIR, data: Any, *, runtime: str = "ort", reference: str = "float",
                 baseline: str = "float", compare: Sequence[str] | None = None,
                 metrics: Sequence[str] | str = ("cosine-similarity",), memory_budget: int = 2 << 30,
                 segments: int | None = None, batch: int | None = None, data_num: int | None = None,
                 threads: int | None = None,
                 optimization: str = "auto", rounding: str = "half_to_even", spill_dir: str | Path | None = None,
                 progress: bool = True) -> None:
        if runtime not in ("ort", "numpy"):
            raise InputError(f"unknown runtime {runtime!r}; the engine runs 'ort' or 'numpy'")
        if reference not in REFERENCES:
            raise InputError(f"unknown reference {reference!r}; choose one of {', '.join(REFERENCES)}")
        if baseline not in BASELINES:
            raise InputError(f"unknown baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
        if memory_budget < 0:
            raise InputError(f"memory_budget must be >= 0 bytes, got {memory_budget}")
        self.ir, self.runtime, self.reference, self.baseline = ir, runtime, reference, baseline
        self.compare = tuple(dict.fromkeys(compare or ir.outputs))
        for v in self.compare:
            ir.value(v)  # NotFoundError with suggestions
        self.metrics = qmetrics.check_metrics(metrics)
        self.samples = model_samples(ir, data, data_num)
        if optimization == "auto":
            optimization = "extended" if fusable_across_calibration(ir) else "all"
        self.rounding, self.threads, self.optimization = rounding, threads, optimization
        self.workers = max(1, int(threads or os.cpu_count() or 1))
        self.progress = progress
        self.plan: Plan = build_plan(ir, self.compare)
        self.records = configured(ir, reference, {})
        self.constants = {c.output: apply_calibration(self.records[c.name], ir.weight_array(c.input), rounding)
                          for c in weight_calibrations(ir)}
        self._variant_records: dict[tuple[str, str], CalibRecord] = {}
        self.batch = self._batch_size(batch) if runtime == "ort" else 1
        if runtime == "numpy":
            self.runner = NumpySteps(ir, self.plan)
        else:
            self.runner = OrtSteps(ir, self.plan, self.records, self.constants, 1, optimization, rounding,
                                   batch=self.batch > 1)
        self._cut_segments(segments)
        self._switches: dict[int, dict[str, CalibRecord]] = {}  # segment -> switch node -> its target
        self._checked: set[tuple] = set()  # switch parts checked against the reference
        self.step_cost: np.ndarray | None = None
        self.segment_cost: dict[int, float] = {}
        self.cache = ValueCache(memory_budget, spill_dir)
        self._code_scale = {s.index: _scale_of(self.records[s.calib.name], ir) for s in self.plan.steps
                            if s.calib is not None and self.records[s.calib.name].mode in QRANGE}
        self._recomputable = self._values_to_recompute()
        self._baselines: dict[int, dict[str, np.ndarray]] = {}
        self._level, self._sample = "", None  # how the reference of which sample is cached
        self._lock = threading.Lock()
        self.stats = {"steps_run": 0, "segments_run": 0, "reference_seconds": 0.0}

    # ------------------------------------------------------------------ public
    def evaluate(self, variants: Iterable[Variant], out_dir: str | Path | None = None, *,
                 resume: bool = False, force: bool = False) -> EngineResult:
        """Metrics of every variant on every sample (see :class:`EngineResult`)."""
        from tqdm import tqdm

        variants = list(variants)
        self._check_variants(variants)
        start = time.perf_counter()
        rows, path = self._open_results(variants, out_dir, resume, force)
        done = {(r["variant"], r["sample"]) for r in rows}
        total = len(variants) * len(self.samples)
        bar = tqdm(total=total, initial=len(done), desc="variants", unit="run", leave=False,
                   disable=None if self.progress else True)
        pool = ThreadPoolExecutor(self.workers) if self.workers > 1 else None

        def run(jobs: list[list[tuple]], s: int, base: dict[str, np.ndarray]) -> None:
            def measure(job) -> list[dict]:
                return [{"variant": v.name, "sample": s,
                         "values": finite({n: qmetrics.compute(self.metrics, base[n], got[n]) for n in self.compare})}
                        for (v, _), got in zip(job, self._run_job(job))]

            release_free_memory()
            floor = resident_bytes()
            for job_rows in pool.map(measure, jobs) if pool else map(measure, jobs):
                if resident_bytes() - floor > _TRIM_GROWTH:  # (a trim walks the whole heap: not every call)
                    release_free_memory()
                    floor = resident_bytes()
                rows.extend(job_rows)
                if path is not None:
                    with open(path, "a") as f:
                        f.write("".join(json.dumps(row) + "\n" for row in job_rows))
                bar.update(len(job_rows))

        try:
            pending = {s: sample for s, sample in enumerate(self.samples)
                       if any((v.name, s) not in done for v in variants)}
            batched, single = self._route(variants)
            baselines = pool.submit(self._float_baselines, pending) if pool else None
            if baselines is None:
                self._float_baselines(pending)
            if batched and pending:
                self._build_parts(pool)
            if baselines is not None:
                baselines.result()
            if batched:  # first every sample's rows of batched calls, on a segment-level reference
                for s, sample in pending.items():
                    base = self._reference(s, sample, pool, steps=False)
                    if self._check_parts(pool):  # a switch failed its check: its variants go step by step
                        batched, single = self._route(variants)
                    run(self._jobs([(v, ch) for v, ch in batched if (v.name, s) not in done], []), s, base)
                if single:  # then the step-by-step variants: the segment sessions make way for theirs
                    self.runner.release_parts()
            for s, sample in pending.items() if single else ():
                base = self._reference(s, sample, pool, steps=True)
                run(self._jobs([], [v for v in single if (v.name, s) not in done]), s, base)
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
            bar.close()
            self.cache.clear()
            self._baselines.clear()
        for row in rows:
            for v in row["values"].values():
                for m in v:
                    v[m] = _decode(v[m])
        order = {v.name: i for i, v in enumerate(variants)}
        rows.sort(key=lambda r: (order.get(r["variant"], len(order)), r["sample"]))
        stats = dict(self.stats, seconds=round(time.perf_counter() - start, 3),
                     sessions=getattr(self.runner, "sessions", 0), steps=len(self.plan.steps),
                     segments=len(self.plan.segments), batch=self.batch, peak_cache_bytes=self.cache.peak,
                     spilled_bytes=self.cache.spilled,
                     peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return EngineResult(rows, self.metrics, self.compare, stats)

    def run_variant(self, variant: Variant) -> dict[str, np.ndarray]:
        """The compared values of ``variant`` on the current sample (after ``_reference``)."""
        changes = self._changes(variant)
        if self._switchable(changes):
            return self._run_rows([changes])[0]
        return self._run_steps(changes)

    def close(self) -> None:
        self.cache.close()

    # ------------------------------------------------------------------ routing
    def _batch_size(self, batch: int | None) -> int:
        if batch is not None:
            if int(batch) < 1:
                raise InputError(f"batch must be at least 1, got {batch}")
            return int(batch)
        largest = max((elements(self.ir, v.name) * np.dtype(v.dtype).itemsize
                       for v in self.ir.activations() if v.dtype is not None), default=0)
        return int(max(1, min(_MAX_BATCH, _BATCH_BYTES // max(largest, 1))))

    def _cut_segments(self, count: int | None) -> None:
        """Segments of about equal FLOPs (every step also counts a tenth of the mean, so that
        FLOP-free steps spread), and which segment reads each value last."""
        plan, n = self.plan, len(self.plan.steps)
        flops = step_flops(self.ir, plan)
        count = count or max(1, int(round(math.sqrt(n))))
        plan.segments = split_segments(list(flops + max(float(flops.sum()), 1.0) / (10 * n)), count) if n else []
        self._segment_of = np.zeros(n, np.int64)
        for k, (lo, hi) in enumerate(plan.segments):
            self._segment_of[lo:hi] = k
        self._producer = {o: step.index for step in plan.steps for o in step.outputs}
        self._last_segment = {v: int(self._segment_of[i]) for v, i in plan.last_reader.items()}
        self._distrusted: set[int] = set()  # segments whose switches failed their check

    def _changes(self, variant: Variant) -> dict[str, CalibRecord]:
        """``variant``'s calibration nodes whose record differs from the reference's."""
        changes = {n: self._variant_record(n, m) for n, m in variant.items()}
        return {n: r for n, r in changes.items() if r is not self.records[n]}

    def _route(self, variants: list[Variant]) -> tuple[list[tuple[Variant, dict[str, CalibRecord]]], list[Variant]]:
        """Split ``variants`` into rows of batched calls and step-by-step ones, after choosing the
        switches: each activation calibration node that variants change is a switch to the mode
        most of them give it (none in a segment whose switches failed their check). A variant
        runs as a row when each of its changes is a switch to its mode."""
        if not isinstance(self.runner, OrtSteps):
            return [], list(variants)
        parsed = [(v, self._changes(v)) for v in variants]
        wanted: dict[str, Counter] = {}
        for _, changes in parsed:
            if all(n in self.plan.step_of for n in changes):
                for n, rec in changes.items():
                    wanted.setdefault(n, Counter())[rec.mode.value] += 1
        switches: dict[int, dict[str, CalibRecord]] = {}
        for n, modes in wanted.items():
            k = int(self._segment_of[self.plan.step_of[n]])
            if k not in self._distrusted:
                switches.setdefault(k, {})[n] = self._variant_record(n, modes.most_common(1)[0][0])
        self._switches = switches
        batched = [(v, ch) for v, ch in parsed if self._switchable(ch)]
        rows = {v.name for v, _ in batched}
        return batched, [v for v in variants if v.name not in rows]

    def _switchable(self, changes: Mapping[str, CalibRecord]) -> bool:
        """True when every change is a switch to that mode (the variant can run as a row)."""
        if not isinstance(self.runner, OrtSteps):
            return False
        for n, rec in changes.items():
            i = self.plan.step_of.get(n)
            if i is None or self._switches.get(int(self._segment_of[i]), {}).get(n) is not rec:
                return False
        return True

    def _first_segment(self, changes: Mapping[str, CalibRecord]) -> int:
        return min((int(self._segment_of[self.plan.step_of[n]]) for n in changes), default=len(self.plan.segments))

    def _jobs(self, batched: list[tuple[Variant, dict]], single: list[Variant]) -> list[list[tuple]]:
        """The calls to make: batched variants grouped by the segment of their first change (the
        largest cones first), at most ``batch`` per call; then the step-by-step ones, one each."""
        groups: dict[int, list] = {}
        for v, changes in batched:
            groups.setdefault(self._first_segment(changes), []).append((v, changes))
        jobs = [g[i:i + self.batch] for _, g in sorted(groups.items()) for i in range(0, len(g), self.batch)]
        return jobs + [[(v, None)] for v in single]

    def _run_job(self, job: list[tuple[Variant, dict | None]]) -> list[dict[str, np.ndarray]]:
        if job[0][1] is None:
            return [self._run_steps(self._changes(job[0][0]))]
        return self._run_rows([changes for _, changes in job])

    # ------------------------------------------------------------------ execution
    def _run_rows(self, rows: list[Mapping[str, CalibRecord]]) -> list[dict[str, np.ndarray]]:
        """Compared values of variants given by their ``changes`` (each change a switch), run as
        the rows of one batch: from the segment of the first change on, each segment the cone
        reaches runs once for all rows, as a switch part where a row changes one of its nodes."""
        plan, batch = self.plan, len(rows)
        read = self._reader({}, {}, self.constants)
        overlay: dict[str, np.ndarray] = {}
        tiled: dict[str, np.ndarray] = {}  # reference values repeated for every row

        def feed(v: str) -> np.ndarray:
            if v in overlay:
                return overlay[v]
            if batch == 1:
                return read(v)
            if v not in tiled:
                tiled[v] = np.repeat(read(v), batch, axis=0)
            return tiled[v]

        runs = 0
        for k in range(min(map(self._first_segment, rows)), len(plan.segments)):
            switched: dict[str, list[int]] = {}
            for r, changes in enumerate(rows):
                for n in changes:
                    if self._segment_of[plan.step_of[n]] == k:
                        switched.setdefault(n, []).append(r)
            part = self.runner.part(k, self._switches[k] if switched else None)
            if not switched and not any(v in overlay for v in part.inputs):
                continue  # outside every row's cone: the reference values stand
            feeds = {v: feed(v) for v in part.inputs}
            for n in part.switches:
                feeds[rows_input(n)] = np.array(switched.get(n, ()), np.int64).reshape(-1, 1)
            overlay.update(self.runner.run(part.session, part.outputs, feeds))
            runs += 1
            for held in (overlay, tiled):  # free what no later segment reads
                for v in [v for v in held if self._last_segment.get(v, -1) <= k and v not in self.compare]:
                    del held[v]
        with self._lock:
            self.stats["segments_run"] += runs
        return [{v: (overlay[v][r:r + 1] if batch > 1 else overlay[v]) if v in overlay else read(v)
                 for v in self.compare} for r in range(batch)]

    def _run_steps(self, changes: Mapping[str, CalibRecord]) -> dict[str, np.ndarray]:
        """Compared values of a variant given by its ``changes``, its cone re-executed step by
        step (segments of the cone that hold no change as one call where that is cheaper)."""
        if self._level != "steps":  # a direct run_variant after a segment-level reference
            with self._lock:
                if self._level != "steps":
                    self._reference(*self._sample, steps=True)
        plan = self.plan
        start = plan.start_steps(changes)
        cone = plan.cone(start)
        constants = dict(self.constants)
        for name, rec in changes.items():
            if rec.output in constants:
                constants[rec.output] = apply_calibration(rec, self.ir.weight_array(rec.input), self.rounding)
        overlay: dict[str, np.ndarray] = {}
        steps_run = segments_run = 0
        read = self._reader(overlay, changes, constants)

        for k, (lo, hi) in enumerate(plan.segments):
            idx = np.flatnonzero(cone[lo:hi]) + lo
            if not idx.size:
                continue
            whole = self.segment_cost.get(k)
            if (whole is not None and not any(lo <= i < hi for i in start)
                    and whole < float(self.step_cost[idx].sum())):
                overlay.update(self.runner.run_segment(k, read))
                segments_run += 1
            else:
                for i in idx:
                    overlay.update(self._step(int(i), read, changes, constants))
                    for v in plan.steps[i].inputs:  # free what no later step reads
                        if plan.last_reader.get(v) == i and v not in self.compare:
                            overlay.pop(v, None)
                steps_run += int(idx.size)
            for v in [v for v in overlay if plan.last_reader.get(v, -1) < hi and v not in self.compare]:
                del overlay[v]
        with self._lock:
            self.stats["steps_run"] += steps_run
            self.stats["segments_run"] += segments_run
        return {v: read(v) for v in self.compare}

    def _part_keys(self) -> list[tuple[int, dict[str, CalibRecord] | None]]:
        """``(segment, switches)`` of every part the batched variants use: each segment in the
        reference configuration, and each segment holding switches with them."""
        return [(k, None) for k in range(len(self.plan.segments))] + sorted(self._switches.items())

    def _build_parts(self, pool) -> None:
        """Build every segment session the batched variants use (each segment in the reference
        configuration, and with its switches), ``threads`` at a time. When a segment cannot
        take a batch, ``batch`` falls to 1."""
        if not isinstance(self.runner, OrtSteps):
            return
        keys = self._part_keys()
        parts = list(pool.map(lambda key: self.runner.part(*key), keys) if pool
                     else (self.runner.part(*key) for key in keys))
        if self.batch > 1 and not all(p.batched for p in parts):
            logger.info("a segment cannot take a batch (a value crossing it has no leading 1): "
                        "one variant per call")
            self.batch = 1

    def _check_parts(self, pool) -> bool:
        """Check each part once, on the current sample's segment-level reference: a switch part
        with no row switched must compute the reference (:func:`_close`), and with batches every
        row of a run on two copies of the inputs must equal the single run bit for bit. A switch
        part that fails is not used (its segment's variants run step by step; returns True); a
        failed batch check sets ``batch`` to 1."""
        if not isinstance(self.runner, OrtSteps):
            return False
        todo = [key for key in self._part_keys() if part_key(*key) not in self._checked]
        if not todo:
            return False
        read = self._reader({}, {}, self.constants)
        batch = self.batch

        def check(key) -> tuple[bool, bool]:
            k, switches = key
            part = self.runner.part(k, switches)
            feeds = {v: read(v) for v in part.inputs}
            feeds |= {rows_input(n): np.zeros((0, 1), np.int64) for n in part.switches}
            if switches is None and batch == 1:
                return True, True  # the reference part: what the reference ran
            single = self.runner.run(part.session, part.outputs, feeds)
            same = switches is None or _close(single, {v: read(v) for v in part.outputs})
            if batch == 1:
                return same, True
            try:
                got = self.runner.run(part.session, part.outputs, {
                    v: a if is_rows_input(v) else np.repeat(a, 2, axis=0) for v, a in feeds.items()})
            except ExecutionError:
                return same, False
            return same, all(_equal({v: a[r:r + 1] for v, a in got.items()}, single) for r in (0, 1))

        failed = False
        for (k, switches), (same, batch_ok) in zip(todo, pool.map(check, todo) if pool else map(check, todo)):
            self._checked.add(part_key(k, switches))
            if not same:
                logger.info("segment %d computes other values as one part; its variants run step by step", k)
                self._distrusted.add(k)
                failed = True
            if not batch_ok and self.batch > 1:
                logger.info("segment %d computes other values in a batch: one variant per call", k)
                self.batch = 1
        return failed

    # ------------------------------------------------------------------ pieces
    def _variant_record(self, name: str, mode: str) -> CalibRecord:
        key = (name, mode)
        if key not in self._variant_records:
            rec = self.ir.calibration(name)
            ref = self.records[name]
            self._variant_records[key] = ref if CalibMode(mode) is ref.mode else effective(rec, mode)
        return self._variant_records[key]

    def _check_variants(self, variants: list[Variant]) -> None:
        names: set[str] = set()
        for v in variants:
            if not isinstance(v, Variant):
                raise InputError(f"variants must be qir.runtimes.engine.Variant objects, got {type(v).__name__}")
            if v.name in names:
                raise InputError(f"two variants are named {v.name!r}; variant names must be unique")
            names.add(v.name)
            for node, mode in v.changes.items():
                self.ir.calibration(node)  # NotFoundError with suggestions
                try:
                    CalibMode(mode)
                except ValueError:
                    raise InputError(f"variant {v.name!r}: unknown mode {mode!r} for {node!r}; choose one of "
                                     f"{', '.join(m.value for m in CalibMode)}") from None

    def _values_to_recompute(self) -> dict[str, int]:
        """``{value: producing step}`` for values that only integer-mode calibration nodes read
        (in the reference): the cache keeps their quantized codes instead, and a variant that
        needs the float value (it changes that node) recomputes it from its producer."""
        readers: dict[str, list[int]] = {}
        for step in self.plan.steps:
            for v in step.inputs:
                readers.setdefault(v, []).append(step.index)
        out = {}
        for step in self.plan.steps:
            if step.calib is not None:
                continue
            for v in step.outputs:
                rs = readers.get(v, [])
                if rs and v not in self.plan.kept and all(i in self._code_scale for i in rs):
                    out[v] = step.index
        return out

    def _reader(self, overlay: dict[str, np.ndarray], changes: Mapping[str, CalibRecord], constants):
        """``read(value)``: the variant's value, else the cached reference, else (a value the
        cache does not keep) recomputed from its producer step."""
        cache = self.cache

        def read(v: str) -> np.ndarray:
            if v in overlay:
                return overlay[v]
            producer = self._recomputable.get(v)
            if producer is None or v in cache:
                return cache.get(v)
            return self._step(producer, read, changes, constants)[v]

        return read

    def _step(self, i: int, read, changes: Mapping[str, CalibRecord], constants) -> dict[str, np.ndarray]:
        step = self.plan.steps[i]
        calib = step.calib
        if calib is not None:
            rec = changes.get(calib.name) or self.records[calib.name]
            return {calib.output: apply_calibration(rec, read(calib.input), self.rounding)}
        key = tuple((w, changes[w].mode.value) for w in step.weight_calibs if w in changes)
        return self.runner.run_step(i, read, constants, key)

    def _reference(self, s: int, sample: Mapping[str, np.ndarray], pool=None, steps: bool = True) -> dict[str, np.ndarray]:
        """Run the reference on sample ``s`` into the cache, step by step (every value crossing a
        step kept; what step-by-step variants read) or, with ``steps=False``, segment by segment
        (only values crossing segments; what batched variants read). Returns the baseline values."""
        start = time.perf_counter()
        cache, plan = self.cache, self.plan
        cache.clear()
        for name, array in check_feeds(self.ir, sample).items():
            cache.put(name, array)
        self._level, self._sample = ("steps" if steps else "segments"), (s, sample)
        if steps:
            self._reference_steps(pool)
        else:
            read = self._reader({}, {}, self.constants)
            for k in range(len(plan.segments)):
                for name, array in self.runner.run_segment(k, read).items():
                    cache.put(name, array, self._code_scale.get(self._producer.get(name)))
        base = self._baselines.get(s) or {v: cache.get(v) for v in self.compare}
        self.stats["reference_seconds"] += time.perf_counter() - start
        return base

    def _reference_steps(self, pool=None) -> None:
        """The reference, step by step, into the cache (the sample's inputs are there); the first
        time, step costs are timed and segments checked (:meth:`_calibrate_costs`)."""
        cache, plan = self.cache, self.plan
        timing = self.step_cost is None
        if timing and pool is not None and hasattr(self.runner, "prepare"):  # build sessions in parallel
            list(pool.map(self.runner.prepare, range(len(plan.steps))))
        transient: dict[str, np.ndarray] = {}  # recomputable values, until their last reader ran
        read = self._reader(transient, {}, self.constants)
        costs = np.zeros(len(plan.steps))
        for step in plan.steps:
            t0 = time.perf_counter()
            outs = self._step(step.index, read, {}, self.constants)
            costs[step.index] = time.perf_counter() - t0
            scale = self._code_scale.get(step.index)
            for name, array in outs.items():
                if name in self._recomputable:
                    transient[name] = array
                else:
                    cache.put(name, array, scale)
            for name in step.inputs:
                if name in transient and plan.last_reader.get(name) == step.index:
                    del transient[name]
        if timing:
            self._calibrate_costs(costs, pool)

    def _float_baselines(self, samples: dict[int, Mapping[str, np.ndarray]]) -> None:
        """Compared values of the float model for ``samples`` (when the reference is not float),
        computed up front with one plain whole-model run each, on one core (it runs beside the
        engine's own sessions being built); the session is released before the reference
        cache fills."""
        if self.baseline != "float" or self.reference == "float" or not samples:
            return
        float_ir = configured_clone(self.ir, "float", {})
        options = {"threads": 1, "optimization": self.optimization,
                   "layout_stable": True} if self.runtime == "ort" else {}
        rt = get_runtime(self.runtime, level="fakequant", rounding=self.rounding, **options)
        for s, sample in samples.items():
            self._baselines[s] = _run_whole(float_ir, check_feeds(self.ir, sample), self.compare, rt)

    def _calibrate_costs(self, costs: np.ndarray, pool=None) -> None:
        """Step costs as timed in the first reference pass (sessions were built beforehand; a
        session's first run is slower, which only biases the choice toward whole segments);
        each segment run once to warm it up and check it against the cached step outputs,
        then timed."""
        plan = self.plan
        read = self._reader({}, {}, self.constants)
        self.step_cost = costs
        if not getattr(self.runner, "segments", False):
            return

        def same(k: int) -> bool:  # warm-up run, checked against the steps and let go
            outs = self.runner.run_segment(k, read)
            bad = [v for v, a in outs.items() if not np.array_equal(a, read(v), equal_nan=True)]
            if bad:
                logger.info("segment %d differs from its steps at %s; running its steps one by one", k, bad[0])
            return not bad

        ks = range(len(plan.segments))
        for k, ok in list(zip(ks, pool.map(same, ks) if pool else map(same, ks))):
            if ok:  # timed alone, like the steps
                t0 = time.perf_counter()
                self.runner.run_segment(k, read)
                self.segment_cost[k] = time.perf_counter() - t0

    def _open_results(self, variants: list[Variant], out_dir, resume: bool, force: bool):
        if out_dir is None:
            if resume:
                raise InputError("resume needs the output directory of the interrupted analysis")
            return [], None
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / RESULTS_FILE
        header = {"qir_engine_results": 1, "fingerprint": self._fingerprint(variants)}
        rows: list[dict] = []
        if path.exists() and resume:
            lines = path.read_text().splitlines()
            try:
                head = json.loads(lines[0]) if lines else {}
            except json.JSONDecodeError:
                head = {}
            if head.get("fingerprint") != header["fingerprint"]:
                raise InputError(f"{path} holds results of a different analysis (other model, data, "
                                 "variants or options); use another output directory, or --force to start over")
            for line in lines[1:]:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    logger.info("ignoring an incomplete line in %s (the run was interrupted)", path)
            known = {v.name for v in variants}
            rows = [r for r in rows if r.get("variant") in known and 0 <= r.get("sample", -1) < len(self.samples)]
        elif path.exists() and not force:
            raise InputError(f"{path} already exists; pass --resume to continue that analysis or --force "
                             "to overwrite it")
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
        tmp.replace(path)
        return rows, path

    def _fingerprint(self, variants: list[Variant]) -> str:
        h = hashlib.sha1()
        calib = [(c.name, c.mode.value, np.asarray(c.threshold if c.threshold is not None else c.scale,
                                                    np.float64).round(9).tolist())
                 for c in self.ir.calibrations()]
        parts = [self.ir.name, repr(self.ir.counts()), calib, [(v.name, v.items()) for v in variants],
                 len(self.samples), list(self.compare), list(self.metrics), self.reference,
                 self.baseline, self.runtime, self.rounding]
        h.update(json.dumps(parts, default=str).encode())
        return h.hexdigest()
