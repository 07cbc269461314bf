"""The engine's results, and the results file it can resume from.

With an output directory, results are appended to ``engine_results.jsonl`` as they are
produced: a header line naming the analysis (its *fingerprint*: model, calibration, variants,
number of samples, the samples' content (:func:`data_digest`) and options), then one line per
(variant, sample). ``resume=True`` keeps the lines of the same analysis and the engine computes
only what is missing; a file of another analysis (other data included: the header also keeps
the data's digest, so the refusal can say so) is never mixed in, and an existing file is
overwritten only with ``force``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from qir import metrics as qmetrics
from qir.errors import InputError
from qir.graph import QIR
from qir.runtimes.engine.variants import Variant

__all__ = ["RESULTS_FILE", "EngineStats", "EngineResult", "ResultsFile", "data_digest", "fingerprint", "open_results",
           "ordered_rows", "SUMMED_STATS", "PEAK_STATS"]

logger = logging.getLogger(__name__)

RESULTS_FILE = "engine_results.jsonl"


#: The statistics a distributed evaluation sums over its workers, and those it takes the largest of.
SUMMED_STATS = ("steps_run", "segments_run", "whole_runs", "reference_seconds", "sessions", "spilled_bytes")
PEAK_STATS = ("peak_cache_bytes", "peak_rss_bytes")


@dataclass(frozen=True)
class EngineStats:
    """How an evaluation went: steps, segments and whole-model runs executed, seconds spent on the
    reference and in all, onnxruntime sessions built, the plan's steps and segments, the batch,
    the peak bytes the reference cache held, the bytes it spilled to disk and the process's peak
    RSS; on a cluster also the ``cluster`` and the number of ``shards`` (the work counts summed
    over the workers, the peaks their largest)."""

    steps_run: int
    segments_run: int
    whole_runs: int
    reference_seconds: float
    seconds: float
    sessions: int
    steps: int
    segments: int
    batch: int
    peak_cache_bytes: int
    spilled_bytes: int
    peak_rss_bytes: int
    cluster: str | None = None
    shards: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The statistics as JSON, in the order the engine has always written them (a cluster's:
        the summed ones, the peaks, then the driver's)."""
        if self.cluster is None:
            keys = [k for k in self.__dataclass_fields__ if k not in ("cluster", "shards")]
        else:
            keys = [*SUMMED_STATS, *PEAK_STATS, "seconds", "steps", "segments", "batch", "cluster", "shards"]
        return {k: getattr(self, k) for k in keys}


@dataclass
class EngineResult:
    """Metrics per (variant, sample, compared value), and how the work went.

    ``rows``: ``{"variant": name, "sample": i, "values": {value: {metric: number}}}``, with
    ``"ill_conditioned": {value: why}`` when the baseline of some compared values is near zero
    or constant on that sample (:func:`qir.metrics.ill_conditioned`; only looked for when a
    :data:`~qir.metrics.RELATIVE` metric is asked for).
    ``stats``: seconds, steps and segments executed, sessions built, peak bytes held by the
    reference cache, bytes spilled to disk and the process's peak RSS.
    ``left_out``: ``{sample: why}`` for the samples left out because their baseline holds NaN or
    ±Inf (they have no rows).

    Means (:meth:`per_variant`, :meth:`per_value`) skip NaN entries, and for the relative
    metrics (cosine similarity, SQNR) the ill-conditioned ones, unless that leaves nothing:
    then they are the only numbers there are, and the means keep them.
    """

    rows: list[dict]
    metrics: tuple[str, ...]
    compare: tuple[str, ...]
    stats: EngineStats | None = None
    left_out: dict[int, str] = field(default_factory=dict)

    def per_variant(self) -> dict[str, dict[str, float]]:
        """Each variant's metrics: mean over compared values per sample, then over samples, in
        the order variants were given (NaN and ill-conditioned entries skipped as the class
        docstring says)."""
        return {name: {m: _mean_over(rows, m) for m in self.metrics} for name, rows in self._by_variant().items()}

    def per_value(self, variant: str) -> dict[str, dict[str, float]]:
        """``{compared value: {metric: mean over samples}}`` of one variant (entries skipped as
        in :meth:`per_variant`)."""
        rows = self._by_variant().get(variant, [])
        return {value: {m: _mean_over(rows, m, value) for m in self.metrics} for value in self.compare}

    def per_sample(self, metric: str | None = None) -> dict[str, list[float]]:
        """Each variant's ``metric`` (default: the first) per sample, in sample order: the values
        :meth:`per_variant` averages (NaN where a sample has no number for it), so a bootstrap over
        samples (:mod:`qir.passes.lib.confidence`) reuses them rather than running anything again."""
        metric = metric or self.metrics[0]
        out = {}
        for name, rows in self._by_variant().items():
            rows = sorted(rows, key=lambda r: r["sample"])
            trusted = [_row_mean(row, metric, None, True) for row in rows]
            out[name] = trusted if any(x == x for x in trusted) else [_row_mean(row, metric, None, False) for row in rows]
        return out

    @property
    def ill_conditioned(self) -> dict[int, dict[str, str]]:
        """``{sample: {compared value: why}}`` for the samples whose baseline is ill-conditioned."""
        return {row["sample"]: row["ill_conditioned"] for row in self.rows if row.get("ill_conditioned")}

    def _by_variant(self) -> dict[str, list[dict]]:
        out: dict[str, list[dict]] = {}
        for row in self.rows:
            out.setdefault(row["variant"], []).append(row)
        return out

    def ranked(self, metric: str | None = None) -> list[tuple[str, dict[str, float]]]:
        """``per_variant`` sorted worst first by ``metric`` (default: the first metric)."""
        metric = metric or self.metrics[0]
        table = self.per_variant()
        return sorted(table.items(), key=lambda kv: qmetrics.worst_first(metric, kv[1][metric]))


def _row_mean(row: dict, metric: str, value: str | None, trusted: bool) -> float:
    """The mean of ``metric`` over one row's compared values (or just ``value``), NaN entries
    skipped; with ``trusted``, also the ill-conditioned values when ``metric`` is relative. NaN
    when nothing is left."""
    ill = (row.get("ill_conditioned") or {}) if trusted and metric in qmetrics.RELATIVE else {}
    numbers = [v[metric] for n, v in row["values"].items()
               if (value is None or n == value) and n not in ill and v[metric] == v[metric]]
    return float(np.mean(numbers)) if numbers else math.nan


def _mean_over(rows: list[dict], metric: str, value: str | None = None) -> float:
    """The mean over samples (``rows``) of :func:`_row_mean`: of the trusted per-sample means,
    else (none is a number) of all of them; NaN when there is no number at all."""
    for trusted in (True, False):
        numbers = [x for x in (_row_mean(row, metric, value, trusted) for row in rows) if x == x]
        if numbers:
            return float(np.mean(numbers))
    return math.nan


def data_digest(samples: Iterable[Mapping[str, Any]]) -> str:
    """A SHA-1 of the samples' content: per sample, each input's name, dtype, shape and raw bytes
    (hashed as they lie in memory, no per-element work). Two data sets with the same number of
    samples but another value anywhere get different digests."""
    h = hashlib.sha1()
    for sample in samples:
        for name in sorted(sample):
            a = np.ascontiguousarray(sample[name])
            h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
            h.update(memoryview(a).cast("B"))
    return h.hexdigest()


def fingerprint(ir: QIR, variants: Sequence[Variant], sample_count: int, options: Sequence[Any],
                data: str | None = None) -> str:
    """What makes two analyses the same: the model's name and node counts, every calibration
    node's mode and threshold (or scale), the variants, the number of samples, ``data`` (the
    samples' :func:`data_digest`) and ``options`` (whatever else changes the results, in a fixed
    order)."""
    h = hashlib.sha1()
    calib = [(c.name, c.mode.value, np.asarray(c.threshold if c.threshold is not None else c.scale,
                                                np.float64).round(9).tolist())
             for c in ir.calibrations()]
    parts = [ir.name, repr(ir.counts()), calib, [(v.name, v.items()) for v in variants], sample_count, data, *options]
    h.update(json.dumps(parts, default=str).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class ResultsFile:
    """Where rows go as they are produced (nowhere when ``path`` is None)."""

    path: Path | None

    def append(self, rows: Sequence[dict]) -> None:
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))


def open_results(out_dir: str | Path | None, analysis: str, variants: Sequence[Variant], sample_count: int, *,
                 resume: bool, force: bool, data: str | None = None) -> tuple[list[dict], ResultsFile]:
    """Start the results file of the analysis fingerprinted ``analysis`` (on samples whose
    :func:`data_digest` is ``data``) in ``out_dir``. With ``resume``, the rows it already holds
    for these variants and samples are kept (returned, and rewritten after a fresh header; a
    half-written last line is dropped). A file of another analysis is an error (naming the data
    when that is what differs), and so is an existing one without ``resume`` or ``force``."""
    if out_dir is None:
        if resume:
            raise InputError("resume needs the output directory of the interrupted analysis")
        return [], ResultsFile(None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS_FILE
    header = {"qir_engine_results": 1, "fingerprint": analysis, "data": data}
    rows: list[dict] = []
    if path.exists() and resume:
        rows = _saved_rows(path, analysis, data, variants, sample_count)
    elif path.exists() and not force:
        raise InputError(f"{path} already exists; pass --resume to continue that analysis or --force "
                         "to overwrite it")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
    tmp.replace(path)
    return rows, ResultsFile(path)


def _saved_rows(path: Path, analysis: str, data: str | None, variants: Sequence[Variant],
                sample_count: int) -> list[dict]:
    """The complete rows of ``path`` for these variants and samples, when it holds ``analysis``."""
    lines = path.read_text().splitlines()
    try:
        head = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        head = {}
    if head.get("fingerprint") != analysis and head.get("data", data) != data:
        raise InputError(f"{path} holds results of a different analysis, computed on other data (the samples' "
                         "content differs: another folder, changed files or another --data-num); resume with the "
                         "data of that run, use another output directory, or --force to start over")
    if head.get("fingerprint") != analysis:
        raise InputError(f"{path} holds results of a different analysis (other model, data, "
                         "variants or options); use another output directory, or --force to start over")
    rows = []
    for line in lines[1:]:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            logger.info("ignoring an incomplete line in %s (the run was interrupted)", path)
    known = {v.name for v in variants}
    return [r for r in rows if r.get("variant") in known and 0 <= r.get("sample", -1) < sample_count]


def ordered_rows(rows: list[dict], variants: Sequence[Variant]) -> list[dict]:
    """``rows`` in place, sorted by variant (in the order given) and sample, with the metric
    values stored as JSON strings ("nan", "inf") back as floats."""
    for row in rows:
        for v in row["values"].values():
            for m in v:
                v[m] = float(v[m])
    order = {v.name: i for i, v in enumerate(variants)}
    rows.sort(key=lambda r: (order.get(r["variant"], len(order)), r["sample"]))
    return rows
