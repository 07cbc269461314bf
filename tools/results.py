"""The typed results the tools share: a measured :class:`Fix` (:mod:`qir.tools.advice`), what
``qir runall`` (:func:`qir.tools.runall.runall`) gathers (:class:`RunallResults`) and the header
of its report (:class:`RunallHeader`). Here, below the advice, the run and the report writers
(:mod:`qir.tools.reports`), so each can name the types."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from qir.json_dump import JsonValue
from qir.passes.base import Report

__all__ = ["Fix", "RunallHeader", "RunallResults", "CompareSummary"]


@dataclass(kw_only=True)
class Fix(Report):
    """A candidate fix and what measuring it found: the ``changes`` (calibration node -> mode or
    ``@threshold``) or the method to ``recalibrate`` with, described as ``fix``; runall's advice
    also says its ``cause`` and ``why``, compare's advisor whether it ``helps`` and what was
    ``scored``. Measured: the output cosine ``before`` and ``after``, their difference ``gain``;
    a fix that helps gets its ``rank``, ``output`` file and ``command`` (runall's also ``text``, one
    line), a dropped one the ``reason``. Fields not set are left out of its JSON."""

    cause: str | None = None
    recalibrate: str | None = None
    changes: dict[str, str] | None
    fix: str
    why: str | None = None
    after: float | None = None
    before: float | None = None
    gain: float | None = None
    helps: bool | None = None
    scored: str | None = None
    rank: int | None = None
    command: str | None = None
    output: str | None = None
    text: str | None = None
    reason: str | None = None
    gain_low: float | None = None  # runall's advice: the gain's 95% bootstrap interval,
    gain_high: float | None = None
    rank_low: int | None = None  # its rank interval among the kept fixes,
    rank_high: int | None = None
    settled: bool | None = None  # the first fix: whether it is the stable top-1,
    peers: list[int] | None = None  # and if not, the fixes it is not told apart from

    optional = ("cause", "recalibrate", "why", "before", "after", "gain", "helps", "scored", "rank", "output",
                "command", "text", "reason", "gain_low", "gain_high", "rank_low", "rank_high", "settled", "peers")


@dataclass
class RunallHeader(Report):
    """What the report is about (:func:`header`); ``budget``: the line saying how many samples
    were analysed and why."""

    model: str
    calibration_method: str
    calibration_samples: int | None
    march: str
    data: str
    samples: int
    left_out: int
    runtime: str
    score_metric: str
    score: float
    calibration_nodes: int
    budget: str | None = None

    optional = ("budget",)


@dataclass
class RunallResults(Report):
    """Every step's results (:func:`runall`). The analyses' reports are kept as their JSON
    documents (``to_json()``; what ``runall_state.json`` holds, and a resumed run reads back):
    ``sensitivity`` (node type -> node sensitivity report), ``distribution`` and ``channelwise``
    (node -> its entry, with its plot), ``acc_error``, ``sensitivity_analysis``; then the measured
    ``advice`` and the fixes ``dropped``, ``notes``, the ``header``, the run's ``seconds`` and the
    ``index`` page written. ``quantizers``: each calibration node's role and the ops it feeds."""

    model: str
    headline: list[str]
    quantizers: dict[str, dict[str, Any]]
    sensitivity: dict[str, dict[str, Any]] = field(default_factory=dict)
    distribution: dict[str, dict[str, Any]] | None = None
    channelwise: dict[str, dict[str, Any]] | None = None
    acc_error: dict[str, Any] | None = None
    sensitivity_analysis: dict[str, Any] | None = None
    advice: list[Fix] | None = None
    dropped: list[Fix] | None = None
    notes: list[str] | None = None
    header: RunallHeader | None = None
    seconds: float | None = None
    index: str | None = None

    optional = ("distribution", "channelwise", "acc_error", "sensitivity_analysis", "advice", "dropped", "notes",
                "header", "seconds", "index")

    def update(self, found: Mapping[str, JsonValue]) -> None:
        """Take a step's results (``{field: value}``, as the step returned them or the state file
        holds them)."""
        names = {f.name for f in fields(self)}
        for key, value in found.items():
            if key not in names:
                raise KeyError(f"runall has no result {key!r}")
            setattr(self, key, value)


@dataclass(kw_only=True)
class CompareSummary(Report):
    """What ``qir compare`` (:func:`qir.tools.compat.quant_analysis.compare`) found, as
    ``compare.json`` holds it: the ``bad_case_index`` and the bad-case search (``bad_case``, its
    report less the per-sample values and inputs), how many ``layers`` were compared, the analysis
    model's ``output_cosine`` on the bad case, the per-layer values' size (``layer_values``), the
    ``advisor`` findings (each with its measured :class:`Fix`), ``consistency`` and ``sensitivity``
    when computed, the ``collapse`` of an output, each output's scores (``outputs``) and the
    ``headline``; ``index``, the page written (not in ``compare.json``)."""

    out_dir: str
    bad_case_index: int
    layers: int
    output_cosine: float | None
    bad_case: dict[str, Any] | None = None
    layer_values: dict[str, Any] | None = None
    advisor: list[dict[str, Any]] | None = None
    consistency: dict[str, Any] | None = None
    sensitivity: dict[str, list[dict[str, Any]]] | None = None
    collapse: dict[str, Any] | None
    outputs: list[dict[str, Any]]
    headline: list[str]
    index: str | None = None

    optional = ("bad_case", "layer_values", "advisor", "consistency", "sensitivity", "index")
