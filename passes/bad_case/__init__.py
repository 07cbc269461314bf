"""Bad-case search: the input on which an analysis model strays furthest from a baseline
(horizon QuantAnalysis ``auto_find_bad_case``).

Both models run on the first ``num_steps`` samples (an optional ``post_process`` maps each
model's ``{output: array}`` first). For every output and every metric — Cosine, MSE, L1, KL,
SQNR (dB), ATOL, from :mod:`qir.metrics` — the bad case is the sample with the worst value
(lowest Cosine/SQNR, highest otherwise). The report holds the seed's three tables:

1. the bad-case sample index of each output, per metric;
2. the metric values of each output on its bad case (for the chosen ``metric``);
3. per metric, the sample index of the worst output over all outputs.

A sample whose baseline outputs hold NaN or Inf is left out with a warning (its values are NaN,
it is never a bad case; the report's ``left_out``: ``{sample: why}``): every metric would score
only its finite positions, or none. When every sample is left out, the search is an InputError.
A sample on which an output's baseline is near zero or constant
(:func:`qir.metrics.ill_conditioned`) is never that output's Cosine or SQNR bad case (those
metrics are noise there; a warning names it and points to L1 or MSE), unless every sample is;
the report's ``ill_conditioned`` lists them: ``{output: {sample: why}}``.

The pass returns the report (the ``data`` key holds the samples searched); it writes nothing.
:mod:`qir.tools.reports.bad_case` writes ``badcase.txt`` (those tables), ``badcase.json`` (every
per-sample value) and ``badcase.npz`` (the chosen bad case's inputs, no pickle).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from qir.data import model_samples
from qir.errors import InputError
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.bad_case.search import RankShares, SampleSearch, Score, search_on_cluster
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.lib.model_pair import BAD_CASE_METRICS
from qir.runtimes.engine.cluster import Cluster, current_cluster, executor_for, parse_cluster
from qir.runtimes.progress import task, track

__all__ = ["BadCasePass", "BadCaseReport", "find_bad_cases", "PostProcess"]

# maps a model's outputs (``{name: array}``) to the values compared (a detector's class scores, ...)
PostProcess = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

logger = logging.getLogger(__name__)

_RELATIVE = ("Cosine", "SQNR")  # relative to the baseline: noise where it is near zero or constant


@dataclass
class BadCaseReport(Report):
    """The bad-case search (see the module docstring): the ``metric`` that picks the case, how many
    ``samples``, ``values`` (``{output: {metric: [value per sample]}}``), ``bad_case`` (``{output:
    {metric: worst sample}}``), ``worst_output`` (``{metric: {"output", "index"}}``), the ``chosen``
    sample and the samples' inputs (``data``; not written as JSON); when some sample needed it,
    ``left_out``, ``ill_conditioned`` and ``collapsed`` (``{output: {sample: why}}``)."""

    metric: str
    samples: int
    values: dict[str, dict[str, list[float]]]
    bad_case: dict[str, dict[str, int]]
    worst_output: dict[str, dict[str, str | int]]
    chosen: int
    data: Any
    left_out: dict[str, str] | None = None
    ill_conditioned: dict[str, dict[str, str]] | None = None
    collapsed: dict[str, dict[str, str]] | None = None

    optional = ("left_out", "ill_conditioned", "collapsed")

    def to_json(self) -> dict[str, Any]:
        """``badcase.json``'s document: the report less the samples' inputs."""
        return {k: v for k, v in super().to_json().items() if k != "data"}


def find_bad_cases(baseline: QIR | str | Path, analysis: QIR | str | Path | None, data: Any, *,
                   num_steps: int | None = None, metric: str = "L1",
                   post_process: PostProcess | None = None, runtime: str = Runtime.ORT,
                   replay_discrete: bool = True, level: str = Level.FAKEQUANT, march: str | None = None,
                   cluster: str | Cluster | None = None, values: Sequence[str] = ()) -> BadCaseReport:
    """The report (see the module docstring). ``analysis=None`` compares ``baseline`` run in
    float with the same model fake-quantized (the usual float vs calibrated question).
    ``replay_discrete``: the analysis model takes the indices of its sort/top-k/arg-max ops from
    the baseline's run (:mod:`.discrete`). ``level="integer"`` (numpy runtime, ``march``): the
    analysis model computes what that NPU does (:func:`.model_pair.model_pair`). ``cluster``: the
    samples are dealt to its workers (:mod:`.search`; default: the one set by
    :func:`qir.runtimes.engine.cluster.use_cluster`, else here); the report is the same. Ranks of
    a torchrun job (or of a program's own process group) that each hold their own share of the
    data (a ``DataLoader`` over a ``DistributedSampler``) search all the shares as one
    (:class:`.search.RankShares`: ``num_steps`` samples per rank, in the sampler's
    order); the report's ``data`` then holds the bad cases only. ``values``: activations both
    models compute, scored as outputs are (:class:`.search.SampleSearch`)."""
    if metric not in BAD_CASE_METRICS:
        raise InputError(f"unknown bad-case metric {metric!r}; choose one of {', '.join(BAD_CASE_METRICS)}")
    search = SampleSearch(baseline, analysis, runtime=runtime, replay_discrete=replay_discrete, level=level, values=values,
                          march=march, post_process=post_process)
    base_ir = search.base_ir
    samples = model_samples(base_ir, data, num_steps)
    cluster = current_cluster() if cluster is None else parse_cluster(cluster)
    if cluster is None:
        scores = [search.score(sample) for sample in track(samples, "bad-case search", unit="samples")]
    else:
        with task("bad-case search", len(samples), unit="samples", enabled=executor_for(cluster).driver) as bar:
            scores, samples = search_on_cluster(cluster, search, data, samples, bar.update)
    values: dict[str, dict[str, list[float]]] = {}
    left_out: dict[int, str] = {}
    ill: dict[str, dict[int, str]] = {}  # output -> sample -> why Cosine/SQNR are noise there
    collapse: dict[str, dict[int, str]] = {}  # output -> sample -> how the analysis output collapsed
    for i, score in enumerate(scores):
        _record(i, score, values, left_out, ill, collapse)
    _warn(ill, collapse, len(samples))
    if len(left_out) == len(samples):
        raise InputError(f"every sample's baseline outputs hold NaN or Inf ({left_out[0]} on sample 0): no bad case "
                         "to find; check the data for NaN or infinite values")
    worst = {name: {m: _worst(m, vals, _skipped(m, name, left_out, ill, len(samples))) for m, vals in per.items()}
             for name, per in values.items()}
    overall = {}
    for m in BAD_CASE_METRICS:
        name, index = max(((n, worst[n][m]) for n in worst), key=lambda kv: _badness(m, values[kv[0]][m][kv[1]]))
        overall[m] = {"output": name, "index": index}
    if isinstance(samples, RankShares):  # every rank gets the bad cases from the ranks that hold them
        samples.fetch({e["index"] for e in overall.values()} | {i for per in worst.values() for i in per.values()})
    report = BadCaseReport(metric, len(samples), values, worst, overall, _chosen(metric, overall, values, collapse),
                           samples)
    if left_out:
        report.left_out = {str(i): why for i, why in left_out.items()}
    if ill:
        report.ill_conditioned = {name: {str(i): why for i, why in per.items()} for name, per in ill.items()}
    if collapse:
        report.collapsed = {name: {str(i): how for i, how in per.items()} for name, per in collapse.items()}
    return report


def _chosen(metric: str, overall: dict, values: dict, collapse: dict[str, dict[int, str]]) -> int:
    """The sample to analyse: the metric's worst, unless an output collapsed on some sample (a
    destroyed output is the bad case whatever a metric says); then the collapsed sample that
    metric scores worst."""
    if not collapse:
        return overall[metric]["index"]
    return max(((name, i) for name, per in collapse.items() for i in per),
               key=lambda kv: _badness(metric, values[kv[0]][metric][kv[1]]))[1]


def _record(i: int, score: Score, values: dict, left_out: dict[int, str], ill: dict[str, dict[int, str]],
            collapse: dict[str, dict[int, str]]) -> None:
    """Sample ``i``'s :data:`.search.Score` into ``values`` (its metrics per output, NaN when it is
    left out), ``left_out``, ``ill`` and ``collapse`` (:func:`_warn` says it once per output)."""
    note, metrics, ill_here, collapse_here = score
    if note is not None:
        left_out[i] = note
        logger.warning("sample %d is left out of the bad-case search: the baseline's outputs hold NaN or Inf (%s)",
                       i, note)
    for name, per in metrics.items():
        slot = values.setdefault(name, {m: [] for m in BAD_CASE_METRICS})
        for seed_name in BAD_CASE_METRICS:
            slot[seed_name].append(per[seed_name])
        if ill_here.get(name):
            ill.setdefault(name, {})[i] = ill_here[name]
        if collapse_here.get(name):
            collapse.setdefault(name, {})[i] = collapse_here[name]


def _warn(ill: dict[str, dict[int, str]], collapse: dict[str, dict[int, str]], count: int) -> None:
    """One warning per output for the samples whose baseline makes Cosine and SQNR noise, and one
    for the samples on which the analysis model's output collapsed (with a count, not a line each)."""
    for name, per in collapse.items():
        first = min(per)
        logger.warning("output %r of the analysis model collapses on %d of %d sample(s) (%s): on sample %d it is %s",
                       name, len(per), count, _listed(per), first, per[first])
    for name, per in ill.items():
        first = min(per)
        logger.warning("%d sample(s) (%s) are not candidates for the Cosine and SQNR bad case of %r: its baseline "
                       "output is near zero or constant there (sample %d: %s), so those metrics measure noise; L1 or "
                       "MSE pick a meaningful bad case on such data", len(per), _listed(per), name, first, per[first])


def _listed(indices) -> str:
    shown = sorted(indices)
    return ", ".join(map(str, shown[:8])) + (f", ... {len(shown) - 8} more" if len(shown) > 8 else "")


def _skipped(metric: str, name: str, left_out: dict[int, str], ill: dict[str, dict[int, str]], count: int) -> set[int]:
    """The samples that cannot be ``metric``'s bad case of output ``name``: those left out, and
    for Cosine and SQNR those where the output is ill-conditioned, unless that is every sample
    (then they are all there is, and a warning says so)."""
    skip = set(left_out)
    if metric in _RELATIVE and ill.get(name):
        if len(skip | set(ill[name])) < count:
            return skip | set(ill[name])
        logger.warning("output %r is near zero or constant on every sample: its %s bad case is noise; "
                       "use L1 or MSE", name, metric)
    return skip


def _badness(metric: str, value: float) -> float:
    """Larger is worse (NaN counts as the worst)."""
    if value != value:
        return math.inf
    return -value if metric in ("Cosine", "SQNR") else value


def _worst(metric: str, values: list[float], skip) -> int:
    """The index of the worst value, among the samples not in ``skip``."""
    return int(max((i for i in range(len(values)) if i not in skip), key=lambda i: _badness(metric, values[i])))


@register_pass
class BadCasePass(AnalysisPass):
    """``bad-case``: the worst sample per output and metric (:func:`find_bad_cases`), with the
    IR as the analysis model against ``baseline`` (None: the IR run in float)."""

    name = "bad-case"

    def __init__(self, data: Any, baseline: QIR | str | Path | None = None, *, num_steps: int | None = None,
                 metric: str = "L1", runtime: str = Runtime.ORT, replay_discrete: bool = True) -> None:
        self.data, self.baseline = data, baseline
        self.options = {"num_steps": num_steps, "metric": metric, "runtime": runtime,
                        "replay_discrete": replay_discrete}

    def run(self, ir: QIR) -> PassResult:
        pair = (ir, None) if self.baseline is None else (self.baseline, ir)
        return PassResult(ir, False, find_bad_cases(*pair, self.data, **self.options))
