"""Scoring configurations for ``qir tune`` on the evaluation data, and the record of every one tried.

:class:`Evaluator` scores a batch of :class:`~.tune_space.Config` at once. With a metric target
it is one :meth:`qir.runtimes.engine.Engine.evaluate` call: the engine's reference is the start
configuration (``reference="quantized"``), each configuration a variant of it, compared with the
float model's outputs (cached reference, cone re-execution, batched rows). With a task-metric
target (a callable) each configuration is a clone run whole on onnxruntime (slower: the engine
only computes :mod:`qir.metrics`). A configuration is scored once (memo); ``store`` (a mapping,
e.g. the facade's journal file) keeps the scores across runs so an interrupted tune resumes.

Every configuration scored is recorded in :attr:`Evaluator.history` with its stage, cost, mean,
worst sample and whether it meets the target: the cost-vs-accuracy picture of the report.
"""
from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Callable, MutableMapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.tune.space import Config, Space
from qir.passes.tune.target import Score, Target
from qir.passes.tune.verify import sample_values
from qir.runtimes.base import get_runtime
from qir.runtimes.engine import Engine, EngineOptions, Variant, configured_clone
from qir.runtimes.engine.options import optimization_level
from qir.runtimes.engine.variants import run_whole

__all__ = ["Score", "Evaluator", "config_key"]

logger = logging.getLogger(__name__)

KEEP = 2  # engines kept for other reference configurations (each holds its sessions)
#: A configuration that differs from the one it is scored around in more units than this runs
#: whole (one onnxruntime session of the configured model): re-executing the cones of many units
#: step by step costs more than that (on PP-OCRv4 det, 0.78 s a sample against 0.25 s).
WHOLE_FROM = 2
#: An engine around a configuration it has not met yet first runs that configuration on every
#: sample, step by step, and builds its sessions; each near configuration then costs about half a
#: whole run. Fewer near configurations than this run whole instead (on PP-OCRv4 det, 8 samples:
#: eight on a new engine 12.8 s, whole 14.8 s; four whole 7.2 s).
ENGINE_FROM = 6


def config_key(config: Config) -> str:
    """A stable text key of a configuration (for the memo and the journal)."""
    return json.dumps([list(config.levels), [list(t) for t in config.thresholds]])


class Evaluator:
    """Scores configurations of ``space`` on ``samples`` against ``target`` (module docstring).

    ``base``: the start configuration as an IR (the engine's reference). ``engine_options`` go to
    :class:`~qir.runtimes.engine.Engine` (runtime, threads, ...)."""

    def __init__(self, base: QIR, space: Space, target: Target, samples: Sequence[dict], *,
                 store: MutableMapping[str, Any] | None = None, prefix: str = "", progress: bool = True,
                 floats: Sequence[dict] | None = None, costs: dict | None = None, reference: QIR | None = None,
                 **engine_options: Any) -> None:
        self.base, self.space, self.target, self.samples = base, space, target, samples
        #: The model whose float outputs every score is against (None: ``base``'s own; tune's
        #: transforms give the model as it was before them, whose float function bias correction moves).
        self.reference = reference
        self.store = store if store is not None else {}
        self.prefix = prefix  # of the store's keys: evaluators on other samples share a store
        self.engine_options = engine_options
        self.memo: dict[Config, Score] = {}
        self.history: list[dict] = []
        self.progress = progress
        self.calls = 0
        self.engine = None
        self._floats = None if floats is None else list(floats)  # (:meth:`floats`)
        #: The step and segment costs the first engine timed, adopted by the next ones (shared
        #: with the evaluators of the bad cases: :meth:`.Engine.adopt_costs`).
        self.costs = costs if costs is not None else {}
        if isinstance(target.metric, str):
            self.engine = self._new_engine({})
        self._engines: dict[Config, Engine] = {}  # around -> the engine whose reference it is
        self._start_ran = False  # whether the start's engine has run (built its sessions)
        #: Configurations :meth:`meets` found to miss before running every sample: how many it ran.
        self.missed: dict[Config, int] = {}

    def _new_engine(self, reference_changes: dict[str, str]) -> Engine:
        """An engine whose reference is the start with ``reference_changes``: compared with
        :meth:`floats` when configurations also run whole, sharing :attr:`costs`, and (the search's
        neighbours mostly change weights) running a call's batched variants step by step when
        some run so anyway (in this process only: :class:`~qir.runtimes.engine.EngineOptions`)."""
        options = EngineOptions(reference="quantized", metrics=[self.target.metric], progress=self.progress,
                                compare=self.target.compared(self.base),
                                reference_changes=reference_changes, steps_when_mixed=True,
                                **self.engine_options).checked()
        given = self._floats is not None  # (an evaluator at another level compares with the search's floats)
        floats = self.floats if options.runtime == Runtime.ORT or self.reference is not None or given else None
        return Engine(self.base, self.samples, options, float_baselines=floats, costs=self.costs)

    def close(self) -> None:
        for engine in [self.engine, *self._engines.values()]:
            if engine is not None:
                engine.close()
        self._engines.clear()

    # ------------------------------------------------------------------ scoring
    def score(self, configs: Sequence[Config], stage: str | Sequence[str], around: Config | None = None) -> list[Score]:
        """Scores of ``configs`` (in order), computing those not scored before in one call;
        ``stage`` names the search step that tried them (one name, or one per configuration).
        ``around``: a configuration they are all near (the engine's reference is then that one,
        so each re-executes only where it differs from it; default: the start)."""
        stages = [stage] * len(configs) if isinstance(stage, str) else list(stage)
        todo = dict(zip(configs, stages))
        for c in configs:
            if c in self.memo:
                todo.pop(c, None)
        fresh = [c for c in todo if self.prefix + config_key(c) not in self.store]
        for c in todo:
            if c not in fresh:
                saved = self.store[self.prefix + config_key(c)]
                self._record(c, Score(saved["mean"], tuple(saved["samples"])), todo[c])
        if fresh:
            self.calls += 1
            started = time.perf_counter()
            if self.engine:
                whole = self.whole_runs
                near = [c for c in fresh if not whole or self._units_changed(c, around) <= WHOLE_FROM]
                if whole and len(near) < ENGINE_FROM and not self._has_engine(around):
                    near = []
                engine_side = set(near)
                far = [c for c in fresh if c not in engine_side]
                scored = dict(zip(near, self._engine_scores(near, todo[near[0]], around) if near else []))
                scored.update(zip(far, self._whole_scores(far) if far else []))
            else:
                near, scored = [], dict(zip(fresh, self._plain_scores(fresh)))
            logger.debug("tune: %s%s: %d configuration(s) (%d whole) on %d sample(s) in %.1f s", self.prefix,
                         todo[fresh[0]], len(fresh), len(fresh) - len(near), len(self.samples), time.perf_counter() - started)
            for c, s in scored.items():
                self.store[self.prefix + config_key(c)] = {"mean": s.mean, "samples": list(s.samples)}
                self._record(c, s, todo[c])
        return [self.memo[c] for c in configs]

    def on_samples(self, picked: Sequence[int] | None, configs: Sequence[Config], stage: str,
                   around: Config | None = None) -> list[Score]:
        """Scores of ``configs`` (near ``around``) on the samples ``picked`` (None: all, as
        :meth:`score`), by an evaluator of those samples sharing :attr:`store` (its keys prefixed
        by them). A configuration already scored on every sample is not run again: its score there
        is those samples' values (the engine's mean over samples is their mean)."""
        if picked is None or len(picked) == len(self.samples):
            return self.score(configs, stage, around)
        picked = list(picked)
        known = {c: on_samples(self.memo[c], picked) for c in configs if c in self.memo}
        todo = [c for c in configs if c not in known]
        if not todo:
            return [known[c] for c in configs]
        sub = Evaluator(self.base, self.space, self.target, [self.samples[i] for i in picked], store=self.store,
                        prefix=f"samples {picked}: ", progress=self.progress, costs=self.costs,
                        floats=[self.floats()[i] for i in picked] if self.whole_runs or self.reference else None,
                        reference=self.reference, **self.engine_options)
        try:
            scored = dict(zip(todo, sub.score(todo, stage, around)))
        finally:
            sub.close()
            self.calls += sub.calls
        return [known[c] if c in known else scored[c] for c in configs]

    def adopt(self, config: Config, score: Score, stage: str) -> None:
        """Record ``score``, on every sample, measured elsewhere (pieces on other evaluators'
        samples), unless ``config`` is scored already."""
        if config not in self.memo:
            self.store[self.prefix + config_key(config)] = {"mean": score.mean, "samples": list(score.samples)}
            self._record(config, score, stage)

    def met(self, config: Config) -> bool:
        return self.target.met(self.memo[config])

    def meets(self, config: Config, stage: str, around: Config | None, counted: Callable[[Score], Score],
              parent: Score) -> bool:
        """Whether ``config`` meets the target as ``counted`` (a score -> what it counts at, no
        better where a sample scores as in ``parent``, the best it can: each sample's change from
        ``parent`` counted as a loss, :func:`.search.changes_as_losses`). A configuration that runs
        whole runs one sample at a time, those ``parent`` scores worst first, and stops at the first
        that decides a miss: with every sample not run yet taken as ``parent`` has it, it already
        misses. A miss decided early is not scored (:attr:`missed`); anything else is, as by
        :meth:`score`."""
        if config in self.missed:
            return False
        single = config in self.memo or self.prefix + config_key(config) in self.store or not self.whole_runs or \
            (self._units_changed(config, around) <= WHOLE_FROM and self._has_engine(around))
        if single:
            return self.target.met(counted(self.score([config], stage, around)[0]))
        model = configured_clone(self.base, "quantized", self.space.changes(config))
        rt, compared, floats = self._whole_runtime(), self.target.compared(model), self.floats()
        outs: dict[int, dict] = {}
        for i in self.target.worst_first(parent.samples):
            outs[i] = run_whole(model, self.samples[i], compared, rt)
            if len(outs) == len(self.samples):
                break
            known = sorted(outs)
            _, values = sample_values(self.base, self.target, [floats[k] for k in known], [outs[k] for k in known])
            hopeful = dict(enumerate(parent.samples)) | dict(zip(known, values))
            if not self.target.met(counted(_mean_score(tuple(hopeful[k] for k in range(len(self.samples)))))):
                self.missed[config] = len(outs)
                logger.debug("tune: %s%s: a miss decided on %d of %d samples", self.prefix, stage, len(outs), len(self.samples))
                return False
        self.calls += 1
        score = Score(*sample_values(self.base, self.target, floats, [outs[k] for k in range(len(self.samples))]))
        self.store[self.prefix + config_key(config)] = {"mean": score.mean, "samples": list(score.samples)}
        self._record(config, score, stage)
        return self.target.met(counted(score))

    def _record(self, config: Config, score: Score, stage: str) -> None:
        self.memo[config] = score
        worst_sample, worst = self.target.worst(score.samples)
        self.history.append({"stage": stage, "cost": self.space.cost(config),
                             "flop_cost": self.space.flop_cost(config), "mean": score.mean, "worst": worst,
                             "worst_sample": worst_sample, "meets": self.target.met(score),
                             "levels": self.space.describe(config), "thresholds": len(config.thresholds),
                             "config": config})

    def _has_engine(self, around: Config | None) -> bool:
        """Whether an engine whose reference is ``around`` has run (and holds its sessions)."""
        if around is None or not self.space.changes(around):
            return self._start_ran
        return around in self._engines

    def _engine_around(self, around: Config | None) -> tuple[Engine, dict[str, str]]:
        """The engine whose reference is ``around`` (built once, the last :data:`KEEP` kept) and
        that configuration's changes."""
        if around is None or not (changes := self.space.changes(around)):
            return self.engine, {}
        if around not in self._engines:
            while len(self._engines) >= KEEP:
                self._engines.pop(next(iter(self._engines))).close()
            self._engines[around] = self._new_engine(changes)
        return self._engines[around], changes

    @property
    def whole_runs(self) -> bool:
        """Whether configurations far from the engine's reference run whole (a metric target on
        onnxruntime), compared with :meth:`floats`, as the engines are."""
        return self.engine is not None and self.engine.runtime == Runtime.ORT

    def floats(self) -> list[dict]:
        """The float model's outputs on each sample, computed once (given by the evaluator a
        sub-evaluator's samples come from) and compared with by every whole run and engine:
        whole runs, on one core, at the engines' optimization level, as an engine computes its
        float baselines."""
        if self._floats is None:
            rt = get_runtime(Runtime.ORT, level=Level.FLOAT, threads=1, optimization=self._optimization(),
                             layout_stable=True)
            model = self.reference or self.base
            self._floats = [run_whole(model, s, self.target.compared(model), rt) for s in self.samples]
        return self._floats

    def _optimization(self) -> str:
        """The onnxruntime optimization level the engines run at (:func:`.optimization_level`)."""
        return optimization_level(self.base, self.engine_options.get("optimization", "auto"))

    def _engine_scores(self, configs: list[Config], stage: str, around: Config | None = None) -> list[Score]:
        engine, near = self._engine_around(around)
        self._start_ran |= engine is self.engine
        start = self.space.start_modes
        variants = []
        for k, c in enumerate(configs):
            changes = self.space.changes(c)
            variants.append(Variant(f"config {k}", {**{n: start[n] for n in near if n not in changes}, **changes}))
        result = engine.evaluate(variants, progress=f"tune: {stage}" if self.progress else False)
        metric = self.target.metric
        by_variant: dict[str, dict[int, float]] = {}
        for row in result.rows:
            by_variant.setdefault(row["variant"], {})[row["sample"]] = _row_value(row, metric)
        means = result.per_variant()
        out = []
        for v in variants:
            per = by_variant.get(v.name, {})
            out.append(Score(float(means[v.name][metric]),
                             tuple(per.get(s, math.nan) for s in range(len(self.samples)))))
        return out

    def _units_changed(self, config: Config, around: Config | None) -> int:
        """How many units (and fixed thresholds) ``config`` sets otherwise than ``around`` (None:
        the engine's reference, the plain start)."""
        around = around if around is not None else self.space.plain_start()
        moved = sum(a != b for a, b in zip(config.levels, around.levels))
        return moved + len(set(config.thresholds) ^ set(around.thresholds))

    def _whole_scores(self, configs: list[Config]) -> list[Score]:
        """Each configuration a clone of the base run whole in onnxruntime (fake quantization,
        written as the engine writes it: ``layout_stable``), against the float model's outputs,
        averaged as the engine averages (:func:`.tune_verify.sample_values`)."""
        rt = self._whole_runtime()
        out = []
        for c in configs:
            model = configured_clone(self.base, "quantized", self.space.changes(c))
            outs = [run_whole(model, s, self.target.compared(model), rt) for s in self.samples]
            out.append(Score(*sample_values(self.base, self.target, self.floats(), outs)))
        return out

    def _whole_runtime(self):
        return get_runtime(Runtime.ORT, level=Level.FAKEQUANT, threads=self.engine_options.get("threads"),
                           optimization=self.engine.optimization, layout_stable=True)

    def _plain_scores(self, configs: list[Config]) -> list[Score]:
        """A task metric: each configuration a clone of the base run whole on onnxruntime."""
        rt = get_runtime(Runtime.ORT, level=Level.FAKEQUANT)
        out = []
        for c in configs:
            model = configured_clone(self.base, "quantized", self.space.changes(c))
            values = [float(self.target.metric(rt.run(model, sample), i)) for i, sample in enumerate(self.samples)]
            out.append(Score(float(np.nanmean(values)) if any(v == v for v in values) else math.nan, tuple(values)))
        return out


def on_samples(score: Score, picked: Sequence[int]) -> Score:
    """``score`` on the samples ``picked`` only (NaN ones left out of its mean, as the engine's)."""
    return _mean_score(tuple(score.samples[i] for i in picked))


def _mean_score(values: tuple[float, ...]) -> Score:
    """The score of per-sample ``values``: their mean, NaN ones left out (as the engine's)."""
    kept = [v for v in values if v == v]
    return Score(float(np.mean(kept)) if kept else math.nan, values)


def _row_value(row: dict, metric: str) -> float:
    """One sample's value: the mean over compared values, the ill-conditioned ones left out of a
    relative metric (as :class:`~qir.runtimes.engine.EngineResult` means do); NaN when none is left."""
    ill = (row.get("ill_conditioned") or {}) if metric in qmetrics.RELATIVE else {}
    numbers = [v[metric] for n, v in row["values"].items() if n not in ill and v[metric] == v[metric]]
    return float(np.mean(numbers)) if numbers else math.nan
