"""The bad-case search's work per sample, here or on a cluster (:mod:`qir.passes.bad_case` uses it).

:class:`SampleSearch` runs both models of a comparison on one sample and scores it: every
bad-case metric per output, or why the sample is left out (its baseline outputs hold NaN or
Inf), and the outputs whose baseline is ill-conditioned there. Samples do not depend on each
other, so on a cluster (:mod:`qir.runtimes.engine.cluster`) they are dealt in equal counts, one
shard per worker (:func:`qir.runtimes.engine.shards.even_split`, strided: neighbouring samples
are often alike); each worker's search scores its samples and the scores stream back. A Ray
worker gets the models (file paths, or the IRs pickled once), the data (its path, or the
arrays once) and the options; it checks that each of its samples has the driver's digest. A
torchrun rank uses its own search.

The ranks of a torchrun job (or of a program that made its own process group, as QuantAnalysis'
multi-machine example does) may instead each hold their own share of the samples: a
``DataLoader`` over a ``DistributedSampler``. The ranks compare their samples' digests first;
when they differ, each rank scores its own share and the scores of all are gathered on every
rank, in the order of :class:`RankShares`, so that every rank finds the same bad case, which
its owner then sends to every rank (:meth:`RankShares.fetch`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.data import model_samples
from qir.errors import InputError, NotFoundError, did_you_mean
from qir.execution import Level, Runtime
from qir.graph import QIR
from qir.passes.lib.model_pair import BAD_CASE_METRICS, level_runtime, model_pair, replay_setup
from qir.runtimes.engine.cluster import Cluster, executor_for
from qir.runtimes.engine.distributed import DataPayload, ModelPayload, data_payload, load_model, model_payload
from qir.runtimes.engine.executor import Executor, follow, raise_remote
from qir.runtimes.engine.results import data_digest
from qir.runtimes.engine.shards import even_split

__all__ = ["SampleSearch", "SearchCommon", "SearchShard", "Score", "sample_score", "scores_on_cluster", "bad_case_shard",
           "search_on_cluster", "RankShares"]

# (why the sample is left out or None, {output: {metric: value}}, {output: why Cosine/SQNR are noise},
#  {output: how the analysis output collapsed})
Score = tuple["str | None", dict[str, dict[str, float]], dict[str, str], dict[str, str]]


def sample_score(outs: Sequence[Mapping[str, np.ndarray]], base_ir: QIR) -> Score:
    """One sample's score from ``outs`` (the baseline's outputs, the analysis model's): NaN
    metrics and the reason when the baseline holds NaN or Inf, else every metric per output and
    the outputs whose baseline is ill-conditioned (:func:`qir.metrics.ill_conditioned`) and those
    the analysis model collapsed (:func:`qir.metrics.collapsed`)."""
    note = qmetrics.nonfinite_note(outs[0])
    metrics = {name: {seed: (math.nan if note else qmetrics.METRICS[q](outs[0][name], outs[1][name]))
                      for seed, q in BAD_CASE_METRICS.items()} for name in outs[0]}
    ill = {} if note else {name: why for name in outs[0]
                           if (why := qmetrics.ill_conditioned(outs[0][name], qmetrics.output_bound(base_ir, name)))}
    collapse = {} if note else {name: how for name in outs[0] if name in outs[1] and (
        how := qmetrics.collapsed(outs[0][name], outs[1][name], qmetrics.output_bound(base_ir, name)))}
    return note, metrics, ill, collapse


class SampleSearch:
    """Both models of a bad-case search, ready to run on samples (:func:`.model_pair.model_pair`;
    ``replay_discrete``: the analysis model takes the baseline's discrete indices). ``values``:
    activations both models compute, scored beside the outputs (a branch of a concatenated
    output, such as a detector's class scores; ``post_process`` sees the outputs only)."""

    def __init__(self, baseline: Any, analysis: Any, *, runtime: str = Runtime.ORT, replay_discrete: bool = True,
                 level: str = Level.FAKEQUANT, march: str | None = None,
                 post_process: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None,
                 values: Sequence[str] = ()) -> None:
        self.given = (baseline, analysis)
        self.values = tuple(values)
        self.options = {"runtime": runtime, "replay_discrete": replay_discrete, "level": level, "march": march,
                        "post_process": post_process, "values": self.values}
        (self.base_ir, base_level), (analy_ir, analy_level) = model_pair(baseline, analysis, level)
        self.analy_ir, self.replay = replay_setup(self.base_ir, analy_ir) if replay_discrete else (analy_ir, [])
        self.runtimes = level_runtime(runtime, base_level, march), level_runtime(runtime, analy_level, march)
        aliases = self.analy_ir.meta.get("value_aliases", {})  # an output fold-bn renamed: its name in the baseline
        self.rename = {o: aliases[o] for o in self.analy_ir.outputs if aliases.get(o) in self.base_ir.outputs}
        self.post_process = post_process
        self.pair = (self.base_ir, None if analysis is None else analy_ir)  # the IRs, before the replay
        for name in self.values:
            for ir, which in ((self.base_ir, "baseline"), (self.analy_ir, "analysis model")):
                if not ir.has_value(name):
                    raise NotFoundError(did_you_mean(name, [v.name for v in ir.activations()], f"value in the {which}")
                                        + " (values to score must be activations both models compute)")

    def score(self, sample: Mapping[str, np.ndarray]) -> Score:
        """Both models on ``sample``, scored (:func:`sample_score`)."""
        base = self.runtimes[0].run(self.base_ir, sample, capture=(*self.replay, *self.values))
        got = self.runtimes[1].run(self.analy_ir, {**sample, **{v: base[v] for v in self.replay}}, capture=self.values)
        outs = [{k: base[k] for k in self.base_ir.outputs}, {self.rename.get(k, k): got[k] for k in self.analy_ir.outputs}]
        if self.post_process:
            outs = [self.post_process(o) for o in outs]
        outs = [{**outs[0], **{v: base[v] for v in self.values}}, {**outs[1], **{v: got[v] for v in self.values}}]
        missing = sorted(set(outs[0]) ^ set(outs[1]))
        if missing:
            raise InputError(f"the two models' outputs differ ({missing[:3]}); compare models with the same outputs "
                             "or map them with post_process")
        return sample_score(outs, self.base_ir)

    def spec(self, data: Any, samples) -> SearchSpec:
        """What a Ray worker builds the same search from (see the module docstring)."""
        base, analysis = self.pair
        return SearchSpec(model_payload(base), None if analysis is None else model_payload(analysis),
                          data_payload(data, samples), len(samples), self.options)


@dataclass(frozen=True)
class SearchSpec:
    """What a worker builds the driver's :class:`SampleSearch` from: both models, the data, how
    many samples, and the search's options."""

    baseline: ModelPayload
    analysis: ModelPayload | None
    data: DataPayload
    count: int
    options: dict[str, Any]


def _from_spec(spec: SearchSpec) -> tuple[SampleSearch, Any]:
    base = load_model(spec.baseline)
    analysis = None if spec.analysis is None else load_model(spec.analysis)
    search = SampleSearch(base, analysis, **spec.options)
    return search, model_samples(search.base_ir, spec.data.data, spec.count)


@dataclass(frozen=True)
class SearchCommon:
    """What every shard of a search shares: the driver's own ``search`` and ``samples`` (a
    torchrun rank, a copy of the driver's program) or the ``spec`` a worker builds them from."""

    search: SampleSearch | None = None
    samples: Sequence[dict] | None = None
    spec: SearchSpec | None = None


@dataclass(frozen=True)
class SearchShard:
    """One worker's share of a search: the indices of its ``samples`` and their data digests."""

    samples: list[int]
    digests: list[str]


def bad_case_shard(common: SearchCommon, shard: SearchShard) -> Iterator[tuple]:
    """A worker's shard (a shard function of :mod:`qir.runtimes.engine.cluster`): ``("scores",
    [(sample, score)])`` per sample of ``shard.samples``, each checked against the driver's digest."""
    search, samples = (common.search, common.samples) if common.spec is None else _from_spec(common.spec)
    for i, digest in zip(shard.samples, shard.digests):
        sample = samples[i]
        if data_digest([sample]) != digest:
            raise InputError(f"sample {i} of the data differs from the driver's (check that every machine reads the "
                             "same files)")
        yield ("scores", [(i, search.score(sample))])


def scores_on_cluster(cluster: Cluster, search: SampleSearch, data: Any, samples,
                      digests: Sequence[str] | None = None) -> Iterator[tuple[int, Score]]:
    """Every sample's score, the samples dealt to the workers of ``cluster`` in equal counts, as
    they come (:func:`qir.runtimes.engine.executor.follow`: a worker's error is raised); every rank
    of a torchrun job gets every score. ``digests``: the samples' (computed here when None)."""
    executor = executor_for(cluster)
    executor.open()
    digests = [data_digest([sample]) for sample in samples] if digests is None else digests
    shards = [s for s in even_split(len(samples), min(executor.workers(), len(samples)), strided=True) if s]
    tasks = [SearchShard(s, [digests[i] for i in s]) for s in shards]
    common = (SearchCommon(search=search, samples=samples) if executor.shared_state
              else SearchCommon(spec=search.spec(data, samples)))
    scores: dict[int, Score] = {}
    for _, message in follow(executor, bad_case_shard, common, tasks):
        for i, score in message[1]:
            scores[i] = score
            yield i, score
    shared = executor.share(scores)
    if not executor.driver:
        yield from shared.items()


class RankShares(Sequence[dict]):
    """The samples of a search whose ranks each hold their own share, as one sequence: rank ``r``'s
    ``i``-th sample is at ``(i, r)`` in the order of ``(i, r)`` — while every rank still has
    samples, sample ``i * ranks + r``, which for a ``DistributedSampler`` without shuffling is the
    dataset's own order. This rank reads its own samples; another rank's only once
    :meth:`fetch` (every rank calling it with the same indices) has brought it here."""

    def __init__(self, executor: Executor, own: Sequence[dict], counts: Sequence[int]) -> None:
        self.executor, self.own, self.rank = executor, own, executor.rank
        self.order = [(r, i) for i in range(max(counts)) for r, n in enumerate(counts) if i < n]
        self.fetched: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k):  # type: ignore[override]
        r, i = self.order[k]
        if r == self.rank:
            return self.own[i]
        if k in self.fetched:
            return self.fetched[k]
        raise InputError(f"sample {k} is sample {i} of rank {r}'s share; this rank holds its own share and the bad "
                         "cases only")

    def fetch(self, indices) -> None:
        """Bring the samples ``indices`` from their ranks to every rank (collective: every rank calls it)."""
        mine = {k: self.own[self.order[k][1]] for k in sorted(set(indices)) if self.order[k][0] == self.rank}
        for part in self.executor.gather(mine):
            self.fetched.update(part)


def search_on_cluster(cluster: Cluster, search: SampleSearch, data: Any, samples,
                      tick: Callable[[], None]) -> tuple[list[Score], Sequence[dict]]:
    """Every sample's score on ``cluster`` (``tick()`` after each one this process gets), and the
    samples they score: those given, dealt to the workers (:func:`scores_on_cluster`), when every
    rank holds the same ones (a Ray cluster's driver always does); when the ranks' samples differ,
    each rank's own share scored there, and the scores of all, gathered on every rank, with the
    samples as :class:`RankShares`. An error on any rank is raised on every rank."""
    executor = executor_for(cluster)
    executor.open()
    digests = [data_digest([sample]) for sample in samples]
    everyone = executor.gather(digests)
    if all(d == digests for d in everyone):
        got: dict[int, Score] = {}
        for i, score in scores_on_cluster(cluster, search, data, samples, digests):
            got[i] = score
            tick()
        return [got[i] for i in range(len(samples))], samples
    shares = RankShares(executor, samples, [len(d) for d in everyone])
    own: list[Score] | None = []
    failure = mine = None
    try:
        for sample in samples:
            own.append(search.score(sample))
            tick()
    except Exception as exc:  # any error: the other ranks stop with it rather than wait for this one
        own, failure, mine = None, ("error", type(exc).__name__, str(exc)), exc
    gathered = executor.gather((own, failure))
    if mine is not None:
        raise mine
    for r, (_, error) in enumerate(gathered):
        if error:
            raise_remote(error, executor.where(r))
    return [gathered[r][0][i] for r, i in shares.order], shares
