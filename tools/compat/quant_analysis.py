"""The QuantAnalysis workflow (horizon ``QuantAnalysis``): find the bad case, run both models on
it layer by layer, compare every layer with an advisor, rank ops by sensitivity.

::

    qa = QuantAnalysis("model.onnx", "calibrated.onnx", out_dir="qa")   # or analysis=None
    qa.auto_find_bad_case(data, num_steps=16, metric="L1")  # badcase.txt/.json/.npz
    qa.run()                                                 # layers/{baseline,analysis}/*.npy
    qa.compare_per_layer()                                   # compare_per_layer_out.*, advisor
    qa.sensitivity()                                         # sensitive_ops.txt/.json

``qir compare BASELINE ANALYSIS DATA -o OUT`` runs all four (:func:`compare`). Inside
``use_cluster(...)`` (:mod:`qir.runtimes.engine.cluster`; ``--cluster`` on the command line) the
bad-case search deals its samples, and the sensitivity and the advisor's measurements their
variants, to the cluster's workers; under torchrun every rank runs the workflow and rank 0 writes. A program
that made its own torch process group (``mp.spawn`` and ``dist.init_process_group``, QuantAnalysis'
multi-machine example) runs it on its ranks the same way (``cluster="local"``: one process alone),
and each rank may read its own share of the data (a ``DataLoader`` over a ``DistributedSampler``:
the bad case is the worst over all the shares). Horizon's keyword names are accepted:
``analysis_model_type``, ``device_ids`` (unused: qir computes on the CPU), ``data_generator``. The models are
anything :func:`qir.api.as_ir` takes, or PyTorch modules (a float model and its ``torch.ao``
fake-quant version, exported with the first sample once the data is known); ``analysis=None``
(on the command line: the same file twice) compares the baseline run in float with itself fake-quantized. Sensitivity toggles the
analysis model's calibration nodes, so it needs a calibrated (or QDQ-imported) analysis model.
Bad-case search and sensitivity replay the baseline's sort/top-k/arg-max indices unless
``replay_discrete=False`` (:mod:`qir.passes.lib.discrete`).

``level="integer"`` (with a ``march``; numpy runtime) runs the analysis model as that NPU computes
it in the bad-case search and the layer run (QuantAnalysis' "quantized" analysis model); the
sensitivity table stays fake quantization, which is what the integer level computes there too
(one op's quantizers alone leave it float inputs, so it runs in float). ``qa.consistency(march)``
(``consistency=True`` in :func:`compare`) adds fake quantization vs the integer level value by
value on the bad case (:mod:`qir.passes.consistency`; ``consistency_result.txt``/``.json``).

The computations are the passes' (:mod:`qir.passes.bad_case`, :mod:`qir.passes.layer_compare`,
:mod:`qir.passes.op_sensitivity`); this facade runs them in order and writes their reports
(:mod:`qir.tools.reports`), which is the only part that touches files. Each step checks the files
it writes before it runs (:class:`~qir.tools.reports.output.Outputs`; :func:`compare` checks them
all first): none may exist unless ``overwrite=True``; a file the same object wrote may be rewritten.
"""
from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from qir.api import as_ir
from qir.errors import InputError
from qir.execution import Execution, Level
from qir.io.torch_import import is_torch_module as _is_torch
from qir.passes import bad_case, layer_compare, op_sensitivity
from qir.passes.consistency import ConsistencyPass
from qir.passes.lib.layer_run import LayerRun, compared_ops, run_layers
from qir.passes.lib.model_pair import BAD_CASE_METRICS
from qir.runtimes.engine.cluster import Cluster, executor_for, program_cluster, use_cluster
from qir.tools.advice import measure_findings
from qir.tools.reports import bad_case as bad_case_report
from qir.tools.reports import consistency as consistency_report
from qir.tools.reports import headline, model_explorer
from qir.tools.reports import layer_compare as layer_report
from qir.tools.reports import op_sensitivity as sensitivity_report
from qir.tools.reports.compare import write_index
from qir.tools.reports.graph_panel import ModelGraph
from qir.tools.reports.output import Outputs
from qir.tools.reports.overlays import compare_keys, consistency_overlays
from qir.tools.results import CompareSummary

__all__ = ["QuantAnalysis", "compare", "metric_name"]

logger = logging.getLogger(__name__)


def metric_name(metric: str) -> str:
    """A bad-case metric name in any case (``COSINE`` → ``Cosine``)."""
    for name in BAD_CASE_METRICS:
        if name.lower() == str(metric).lower():
            return name
    raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(BAD_CASE_METRICS)}")


class QuantAnalysis:
    """Baseline vs analysis model (see the module docstring); every step writes into ``out_dir``."""

    def __init__(self, baseline_model: Any, analysis_model: Any = None, *,
                 post_process: Callable[[dict], dict] | None = None, out_dir: str | Path = "./qir_quant_analysis",
                 runtime: str | None = None, replay_discrete: bool = True, overwrite: bool = False,
                 level: str | None = None, march: str | None = None, analysis_model_type: str | None = None,
                 device_ids: Any = None, cluster: str | Cluster | None = None) -> None:
        """``analysis_model_type`` (horizon's name): ``fake_quant`` is ``level="fakequant"`` (the
        default), ``quantized`` ``level="integer"``. ``device_ids`` (horizon's: the rank's GPU) is
        accepted and unused: qir computes on the CPU. ``cluster``: where the steps run
        (:func:`qir.runtimes.engine.cluster.program_cluster`: by default the cluster of
        ``use_cluster``, else the program's own torch process group, whose ranks then all run
        this workflow; ``"local"``: this process alone)."""
        level = _model_type_level(analysis_model_type, level)
        self.runtime, self.level, self.march = _level_runtime(runtime, level), level, march
        del device_ids  # (horizon's GPU placement: nothing to place)
        self.cluster = program_cluster(cluster)
        self._torch = [m for m in (baseline_model, analysis_model) if _is_torch(m)]
        self._given = (baseline_model, analysis_model)
        if not self._torch:
            self._import(None)
        self.post_process, self.replay_discrete = post_process, replay_discrete
        self.out_dir = Path(self._rank_folder(out_dir))
        self.outputs = Outputs(self.out_dir, overwrite=overwrite)
        self.bad_cases: dict[int, dict[str, np.ndarray]] = {}
        self.chosen: int | None = None
        self.bad_case_values: dict[str, dict[str, list[float]]] = {}
        self.values: tuple[str, ...] = ()  # activations scored beside the outputs (auto_find_bad_case's values)
        self.layer_run: LayerRun | None = None
        self.keep_layers = True  # run() writes layers/ (compare(): only with keep_layers=True)
        self.report: dict[str, Any] = {}

    @property
    def analysis_ir(self):
        return self.baseline if self.analysis is None else self.analysis

    def _import(self, example: Mapping[str, np.ndarray] | None) -> None:
        """The models as IRs; a PyTorch module is exported with ``example`` (the first sample),
        so that happens once the data is known."""
        def one(model):
            if model is None or not _is_torch(model):
                return None if model is None else as_ir(model)
            import torch

            from qir.io.torch_import import from_torch

            return from_torch(model, {k: torch.from_numpy(np.asarray(v)) for k, v in example.items()})

        self.baseline, self.analysis = (one(m) for m in self._given)
        self._torch = []

    def _shared(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank of a torch cluster; else ``value``."""
        return executor_for(self.cluster).share(value) if self.cluster and self.cluster.kind == "torch" else value

    def _torch_samples(self, data: Any):
        """Samples for a PyTorch baseline, read by ``forward()``'s parameter names."""
        import inspect

        from qir.data import load_samples

        params = [p.name for p in inspect.signature(self._torch[0].forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        return load_samples(data, params)

    def _rank_folder(self, out_dir: str | Path) -> str | Path:
        """``out_dir``, or on a rank other than 0 of a torch cluster a temporary folder, removed
        with this object: every rank runs the analysis, rank 0 writes it."""
        if self.cluster is None or self.cluster.kind != "torch" or executor_for(self.cluster).driver:
            return out_dir
        folder = tempfile.mkdtemp(prefix="qir-rank-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        return folder

    # ----------------------------------------------------------------- bad case
    def auto_find_bad_case(self, data: Any = None, num_steps: int | None = None, metric: str = "L1", *,
                           data_generator: Any = None, values: Sequence[str] = ()) -> bad_case.BadCaseReport:
        """The worst sample per output and metric; writes ``badcase.txt``/``.json``/``.npz``.
        ``data_generator`` (horizon's name) is ``data``: anything :func:`qir.data.load_samples`
        reads, e.g. a ``DataLoader``, of which the first ``num_steps`` items are read, once. Under
        a torch cluster whose ranks each hold their own share (a ``DistributedSampler``), the
        shares are searched as one (:func:`qir.passes.bad_case.find_bad_cases`). ``values``: activations
        scored beside the outputs (qir's addition: a branch the outputs concatenate, e.g. class scores)."""
        data = _one_data(data, data_generator)
        metric = metric_name(metric)
        self.outputs.plan(*bad_case_report.FILES).check()
        if not isinstance(data, (str, Path, Mapping, Sequence, np.ndarray)):  # a loader or a generator: read once
            data = list(itertools.islice(data, num_steps) if num_steps else data)
        with use_cluster(self.cluster):
            if self._torch:  # every rank exports with the same sample, so holds the same IR
                self._import(self._shared(self._torch_samples(data)[0]))
            report = bad_case.find_bad_cases(self.baseline, self.analysis, data, num_steps=num_steps, metric=metric,
                                             values=values,
                                             post_process=self.post_process, runtime=self.runtime,
                                             replay_discrete=self.replay_discrete, level=self.level, march=self.march)
        bad_case_report.write_report(report, self.outputs)
        indices = {entry["index"] for entry in report.worst_output.values()}
        indices |= {i for per in report.bad_case.values() for i in per.values()}
        self.bad_cases = {i: report.data[i] for i in sorted(indices)}
        self.chosen = report.chosen
        self.bad_case_values = report.values  # (each output's metrics per sample: the headline's scores)
        self.values = tuple(values)  # (scored beside the outputs by the advisor's measured fixes too)
        self.report["bad_case"] = {k: v for k, v in report.to_json().items() if k != "values"}
        return report

    def set_bad_case(self, data: Mapping[str, np.ndarray]) -> None:
        """Use ``data`` (``{input name: array}``) as the bad case."""
        if not isinstance(data, Mapping) or not data:
            raise InputError("set_bad_case takes one sample: a dict {input name: array}")
        self.bad_cases, self.chosen = {0: {k: np.asarray(v) for k, v in data.items()}}, 0
        if self._torch:
            self._import(self.bad_cases[0])

    def save_bad_case(self, path: str | Path | None = None) -> Path:
        """The current bad case as ``.npz`` (default ``<out_dir>/badcase.npz``)."""
        out, name = (Outputs(overwrite=self.outputs.overwrite), path) if path else (self.outputs, "badcase.npz")
        return bad_case_report.save_bad_case(self._case(None), name, out.plan(name).check())

    def load_bad_case(self, filename: str | Path | None = None) -> None:
        """Read a bad case saved by ``auto_find_bad_case``/``save_bad_case``."""
        self.set_bad_case(bad_case_report.load_bad_case(filename or self.out_dir / "badcase.npz"))

    def _case(self, index: int | None) -> dict[str, np.ndarray]:
        if self.chosen is None:
            raise InputError("no bad case yet: call auto_find_bad_case, set_bad_case or load_bad_case first")
        if index is None:
            return self.bad_cases[self.chosen]
        if index not in self.bad_cases:
            raise InputError(f"sample {index} is not a bad case; choose one of {sorted(self.bad_cases)} "
                             "(see badcase.txt)")
        return self.bad_cases[index]

    # ------------------------------------------------------------ layer by layer
    def run(self, index: int | None = None) -> LayerRun:
        """Both models on the bad case (``index``: another bad case from ``badcase.txt``), every
        layer's values saved under ``<out_dir>/layers/`` as they are captured (and read back
        memory-mapped: a large model's layers need not fit in RAM), indexed by ``layers.json``; with
        ``keep_layers`` False (:func:`compare`'s default) in a temporary folder removed with this
        object instead. ``report["layer_values"]`` says which, and their size in bytes."""
        case = self._case(index)
        if not self.keep_layers:  # spilled to a temporary folder, removed with this object
            folder = tempfile.mkdtemp(prefix="qir-layers-")
            weakref.finalize(self, shutil.rmtree, folder, True)
            self.layer_run = run_layers(self.baseline, self.analysis, case, runtime=self.runtime, store=folder,
                                        level=self.level, march=self.march)
            self.report["layer_values"] = {"kept": False, "bytes": _folder_bytes(Path(folder))}
            return self.layer_run
        layers = self.outputs.sub("layers")
        layers.plan(*layer_report.layer_files(self.baseline, self.analysis)).check()
        self.layer_run = run_layers(self.baseline, self.analysis, case, runtime=self.runtime, store=layers.folder,
                                    level=self.level, march=self.march)
        layer_report.save_layers(self.layer_run, layers)
        self.report["layer_values"] = {"kept": True, "bytes": _folder_bytes(layers.folder)}
        return self.layer_run

    def compare_per_layer(self, prefixes: Iterable[str] = (), types: Iterable[str] = ()) -> list[dict]:
        """The per-layer table and the advisor (``compare_per_layer_out.*``, ``abnormal_layer_advisor.*``);
        each finding's fix is measured on the bad case first (:func:`qir.tools.advice.measure_findings`:
        ``fix`` with the output cosine before and after, and the command when it helps)."""
        self.outputs.plan(*layer_report.FILES).check()
        if self.layer_run is None:
            self.run()
        rows = layer_compare.compare_per_layer(self.layer_run, prefixes, types)
        findings = layer_compare.advise(self.layer_run, rows)
        with use_cluster(self.cluster):
            measure_findings(self.layer_run, findings, model_path=self._analysis_path(), runtime=self.runtime,
                             values=self.values)
        layer_report.write_report(rows, findings, self.outputs)
        self.report["advisor"] = findings
        return rows

    def _analysis_path(self) -> str | None:
        """The analysis model's file (the baseline's when it is compared with itself), if given as one."""
        baseline, analysis = self._given
        model = baseline if analysis is None else analysis
        return str(model) if isinstance(model, (str, Path)) else None

    # ------------------------------------------------------------- consistency
    def consistency(self, march: str | None = None, index: int | None = None) -> dict:
        """Fake quantization vs ``march``'s integer level (default: the analysis level's march, else
        nash-e), value by value, on the bad case (``index``: another one) for the analysis model
        (the baseline compared with itself): ``consistency_result.txt``/``.json``."""
        self.outputs.plan(*consistency_report.FILES).check()
        ir, case = self.analysis_ir, self._case(index)
        if not any(c.quantizes for c in ir.calibrations()):
            raise InputError("the analysis model has no quantized calibration node: fake quantization and the integer "
                             "level compute the same float model; compare a calibrated (or QDQ) model")
        found = ConsistencyPass([case], march or self.march or "nash-e").compare(ir)
        consistency_report.write_report(found, self.outputs)
        report = found.to_json()
        self.report["consistency"] = {"march": report["march"], "summary": report["summary"],
                                      "output_cosine": report["output_cosine"][0] if report["output_cosine"] else None}
        return report

    # ------------------------------------------------------------- sensitivity
    def sensitivity(self, metric: str = "L1", reverse: bool = False, threads: int | None = None, *,
                    reserve: bool | None = None) -> dict:
        """Per-op activation and weight sensitivity on the bad case (``sensitive_ops.txt``/``.json``);
        ``reverse`` (horizon spells it ``reserve``, also accepted) lists the least sensitive first."""
        reverse = reverse if reserve is None else reserve
        self.outputs.plan(*sensitivity_report.FILES).check()
        with use_cluster(self.cluster):
            report = op_sensitivity.op_sensitivity(self.analysis_ir, self._case(None), metric=metric_name(metric),
                                                   reverse=reverse, runtime=self.runtime, threads=threads,
                                                   replay_discrete=self.replay_discrete)
        sensitivity_report.write_report(report, self.outputs)
        doc = report.to_json()
        self.report["sensitivity"] = {out: rows[:10] for out, rows in doc["outputs"].items()}
        return doc


def _output_cosine(run: LayerRun) -> float | None:
    """The analysis model's output cosine against the baseline's on the layer run's sample, mean
    over the outputs both have."""
    from qir import metrics

    pairs = [(run.base(o), run.analy_values.get(o)) for o in run.analysis.outputs]
    got = [metrics.compute(["cosine-similarity"], a, b)["cosine-similarity"] for a, b in pairs
           if a is not None and b is not None]
    return float(np.mean(got)) if got else None


def _folder_bytes(folder: Path) -> int:
    """The size of the files under ``folder``."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _one_data(data: Any, data_generator: Any) -> Any:
    """The data given as ``data`` or (horizon's name) ``data_generator``: one of them."""
    if (data is None) == (data_generator is None):
        raise InputError("give the samples once: auto_find_bad_case(data) or auto_find_bad_case(data_generator=...)")
    return data if data is not None else data_generator


_MODEL_TYPES = {"fake_quant": Level.FAKEQUANT, "quantized": Level.INTEGER}  # horizon's analysis_model_type -> level


def _model_type_level(model_type: str | None, level: str | None) -> str:
    """The level from ``level`` or horizon's ``analysis_model_type`` (both: they must agree)."""
    if model_type is None:
        return level or Level.FAKEQUANT
    if model_type not in _MODEL_TYPES:
        raise InputError(f"unknown analysis_model_type {model_type!r}; choose fake_quant or quantized (the integer "
                         "level, with a march)")
    if level is not None and level != _MODEL_TYPES[model_type]:
        raise InputError(f"analysis_model_type={model_type!r} is level {_MODEL_TYPES[model_type]!r}, not {level!r}; "
                         "give one of them")
    return _MODEL_TYPES[model_type]


def _level_runtime(runtime: str | None, level: str) -> str:
    """The runtime of a comparison at ``level`` (:meth:`qir.execution.Execution.resolve`, with the
    levels the analysis model runs at)."""
    return Execution.resolve(runtime, level, levels=(Level.FAKEQUANT, Level.INTEGER), march_alone=True).runtime


def compare(baseline: Any, analysis: Any, data: Any, out_dir: str | Path, *, num_steps: int | None = None,
            metric: str = "L1", prefixes: Iterable[str] = (), types: Iterable[str] = (),
            sensitivity: bool = True, post_process: Callable[[dict], dict] | None = None,
            runtime: str | None = None, replay_discrete: bool = True, overwrite: bool = False,
            level: str = Level.FAKEQUANT, march: str | None = None, consistency: bool = False,
            keep_layers: bool = False, values: Sequence[str] = ()) -> CompareSummary:
    """The whole workflow; returns (and writes as ``compare.json``) a summary, and writes
    ``index.html`` (:mod:`qir.tools.reports.compare`). Every file it writes is checked first
    (PyTorch models: ``layers/`` when they are exported, before that step runs). The per-layer
    values (``layers/``: every value of both models, 119 MB on YOLOv8n at 320x320) are kept only
    with ``keep_layers``; the summary's ``layer_values`` says their size either way.
    ``level``/``march``: see the module docstring; ``consistency``: also
    :meth:`QuantAnalysis.consistency` on the bad case (``march``, default nash-e)."""
    qa = QuantAnalysis(baseline, analysis, post_process=post_process, out_dir=out_dir, runtime=runtime,
                       replay_discrete=replay_discrete, overwrite=overwrite, level=level, march=march)
    qa.keep_layers = keep_layers
    out = qa.outputs.plan(*bad_case_report.FILES, *layer_report.FILES, *sensitivity_report.FILES, "compare.json",
                          "index.html", *(consistency_report.FILES if consistency else ()),
                          *([] if qa._torch else model_explorer.files(compare_keys(qa.analysis_ir.outputs, consistency))))
    if keep_layers and not qa._torch:
        out.sub("layers").plan(*layer_report.layer_files(qa.baseline, qa.analysis))
    out.check()
    if not qa._torch:
        compared_ops(qa.analysis_ir, prefixes, types)  # a filter matching nothing fails now, not later
    logger.info("bad-case search")
    qa.auto_find_bad_case(data, num_steps=num_steps, metric=metric, values=values)
    logger.info("layer by layer on sample %s", qa.chosen)
    qa.run()
    rows = qa.compare_per_layer(prefixes, types)
    checked = None
    if consistency:
        logger.info("fake quantization vs the integer level on sample %s", qa.chosen)
        checked = qa.consistency()
    every_op = None  # every op's sensitivity rows per output, for the graph (the summary keeps the top 10)
    if sensitivity:
        if any(c.quantizes for c in qa.analysis_ir.calibrations()):
            logger.info("sensitivity")
            every_op = qa.sensitivity(metric)["outputs"]
        else:
            logger.warning("the analysis model has no quantized calibration node: no sensitivity table")
    collapse = headline.collapse_of(qa.report["bad_case"].get("collapsed"), layer_compare.collapse_start(rows))
    scores = headline.output_scores(qa.bad_case_values)
    summary = CompareSummary(out_dir=str(out_dir), bad_case_index=qa.chosen, layers=len(rows),
                             output_cosine=_output_cosine(qa.layer_run), **qa.report,
                             collapse=collapse.to_json() if collapse else None, outputs=[s.to_json() for s in scores],
                             # lines the terminal and index.html show first: a collapsed output, then each output worst first
                             headline=headline.headline_lines(collapse, scores, qa.report["bad_case"]["samples"]))
    out.write_json("compare.json", "qir.compare", summary)
    graph = None if qa._torch else ModelGraph.from_ir(qa.analysis_ir)  # the graph panel, Model Explorer's node data
    extra = consistency_overlays(checked["rows"], graph) if checked and graph else []
    summary.index = str(write_index(summary, rows, out, graph, extra, every_op))
    return summary
