"""``qir runall``: every debugger analysis in the order hmct's ``runall`` uses, then one
self-contained ``index.html``.

Steps and folders under ``save_dir`` (defaults as hmct's ``runall`` documents them):

1. ``node_sensitivity/``: node sensitivity per node type (default: weight, then activation),
   ``sensitivity_of_<type>.{txt,csv,json}``.
2. ``data_distribution/``: distributions of ``dis_nodes_list``, default the 5 most sensitive
   nodes of each type.
3. ``channelwise_distribution/``: per-channel box plots of ``cw_nodes_list``, default the same
   calibration nodes.
4. ``accumulate_error/``: accumulated-error curves, default ``quantize_node=["weight", "activation"]``.
5. ``sensitivity_analysis/``: recovery as the sensitive nodes are raised.

Then the advice (:mod:`qir.tools.advice`): candidate fixes read off those results (clipping ->
a fixed threshold, rounding -> int16, outlier channels, spread error -> several quantizers or
another calibration method), each measured on the engine on the same samples before it is shown;
those that help, with complete ``qir set-mode`` / ``qir pipeline`` commands, go to ``index.html``,
the log and ``advice.json`` (schema ``qir.advice`` v1, with the ones tried and dropped).

``index.html`` (written by ``qir.tools.reports.runall``) embeds every plot (base64 PNG, no
network needed), the top of each table and that advice, under a header (:func:`header`: the
model file, its calibration method and march where the model records them, the data, the
number of samples, the runtime and the float-vs-quantized output cosine). Quantizers are named
with the ops they feed and ops with their quantizers. The passes compute; the writers of
``qir.tools.reports`` write each step's files.
Every file it may write (:func:`plan_files`) is checked before step 1: none may exist unless
``overwrite=True`` (``--force``), and nothing is created before the analyses have read the data.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from qir.execution import Runtime
from qir.tools.advice import Advice, Fix, advise
from qir.tools.results import RunallHeader, RunallResults

__all__ = ["runall", "plan_files", "check_choices", "header", "notes", "sample_count", "STATE", "RunallHeader",
           "RunallResults"]

logger = logging.getLogger(__name__)

TOP = 5


def headline_for(ir, data, data_num: int | None, runtime: str, log=print) -> list[str]:
    """The lines the report shows (and ``log`` says) first: an output the quantized model collapses
    on some sample, then each output's cosine, worst first (:mod:`qir.tools.reports.headline`),
    from the float and fake-quantized runs of the analysed samples (the bad-case search's)."""
    from qir.passes.bad_case import find_bad_cases
    from qir.tools.reports import headline

    report = find_bad_cases(ir, None, data, num_steps=data_num, runtime=runtime)
    lines = headline.headline_lines(headline.collapse_of(report.get("collapsed"), None),
                                    headline.output_scores(report["values"]), report["samples"])
    for line in lines:
        log(line)
    return lines


def with_output_node(ir, output_node: str | None):
    """``ir``, or one clear error before any work for an ``output_node`` it does not have; runall takes
    hmct's flags, so an output folder given as ``-o`` lands here: the message says where it goes."""
    from qir.errors import NotFoundError, did_you_mean

    if output_node is not None and not (ir.has_node(output_node) or ir.has_value(output_node)):
        raise NotFoundError(did_you_mean(output_node, [r.name for r in ir.runnables()], "output node")
                            + " (runall takes hmct's flags: -o/--output-node is the node whose output is compared; "
                              "the output folder is -s/--save-dir)")
    return ir


def runall(model_or_file, calibrated_data, save_dir="./debug_result/", ns_metrics="cosine-similarity",
           output_node=None, node_type=None, data_num=1, verbose=False, interested_nodes=None,
           dis_nodes_list=None, cw_nodes_list=None, axis=None, quantize_node=None, non_quantize_node=None,
           ae_metric="cosine-similarity", average_mode=False, pick_threshold=0.999, sensitive_nodes=None,
           *, runtime: str = Runtime.ORT, progress: bool = True, log=print, overwrite: bool = False,
           model_path: str | None = None, time_budget: float | None = None, resume: bool = False) -> RunallResults:
    """Run the five analyses, measure the advice and write ``index.html`` and ``advice.json``;
    returns every step's results. ``save_dir`` is a folder or a
    :class:`~qir.tools.reports.output.Outputs` (the demo's). ``model_path``: the file the IR was
    read from, when ``model_or_file`` is an IR (the advice's commands name it). ``data_num=None``:
    every sample, or with ``time_budget`` (seconds) as many as fit it (:func:`sample_count`); the
    first line logged says how many. ``resume``: continue an interrupted run in ``save_dir``
    (:class:`_State`): the steps it finished are read back, the others run again."""
    from qir.api import as_ir
    from qir.tools.reports.graph_panel import ModelGraph
    from qir.tools.reports.output import as_outputs
    from qir.tools.reports.runall import write_index

    ir = with_output_node(as_ir(model_or_file, calibrated=True), output_node)
    metrics = [ns_metrics] if isinstance(ns_metrics, str) else list(ns_metrics)
    types = [node_type] if isinstance(node_type, str) else list(node_type or ["weight", "activation"])
    out = plan_files(as_outputs(save_dir, overwrite=overwrite), ir, types, dis_nodes_list, cw_nodes_list,
                     ae_metric, resume=resume, quantize_node=quantize_node, non_quantize_node=non_quantize_node)
    state = _State(out, resume)
    check_choices(ir, calibrated_data, dis_nodes_list, cw_nodes_list, axis, quantize_node, non_quantize_node,
                  sensitive_nodes)
    if model_path is None and not hasattr(model_or_file, "calibrations"):
        model_path = str(model_or_file)
    data_num, first = sample_count(ir, calibrated_data, data_num, time_budget, runtime)
    log(first)
    state._start({"model": model_path or ir.name, "data": str(calibrated_data), "data_num": data_num, "types": types,
                 "metrics": metrics, "output_node": output_node, "runtime": str(runtime)})
    results = RunallResults(model_path or ir.name, headline_for(ir, calibrated_data, data_num, runtime, log),
                            {c.name: {"role": c.role.value, "feeds": list(c.feeds)} for c in ir.calibrations()})
    started = time.perf_counter()
    kw = dict(data_num=data_num, runtime=runtime)
    opts = dict(types=types, metrics=metrics, output_node=output_node, verbose=verbose,
                interested_nodes=interested_nodes, dis_nodes_list=dis_nodes_list, cw_nodes_list=cw_nodes_list,
                axis=axis, quantize_node=quantize_node, non_quantize_node=non_quantize_node, ae_metric=ae_metric,
                average_mode=average_mode, pick_threshold=pick_threshold, sensitive_nodes=sensitive_nodes)
    steps = _Steps(ir, calibrated_data, out, kw, opts, progress, log)
    for k, (title, step) in enumerate(steps.all(), 1):
        state._run(k, title, step, results, log)
    measured = advise(ir, results, calibrated_data, model_path=model_path, pick_threshold=pick_threshold,
                      progress=progress, **kw)
    results.advice, results.dropped = measured.advice, measured.dropped
    results.notes = measured.notes + notes(results)
    results.header = header(ir, model_path, calibrated_data, measured, runtime)
    results.header.budget = first
    results.seconds = round(time.perf_counter() - started, 2)
    out.write_json("advice.json", "qir.advice", {"header": results.header, "advice": results.advice,
                                                 "dropped": results.dropped, "notes": results.notes,
                                                 "confidence": measured.confidence})
    _log_advice(results, log)
    results.index = str(write_index(results, out, ModelGraph.from_ir(ir)))  # with the graph panel
    state.finish()
    log(f"report: {results.index}")
    return results


STEPS = 5


class _Steps:
    """The five analyses, each a callable ``step(results) -> {key: result}`` that logs its line
    ``[k/5] ...`` and writes its files (see the module docstring)."""

    def __init__(self, ir, data, out, kw: dict[str, Any], opts: dict[str, Any], progress: bool, log) -> None:
        self.ir, self.data, self.out, self.kw, self.o, self.progress, self.log = ir, data, out, kw, opts, progress, log

    def all(self) -> list[tuple[str, Any]]:
        return [("node sensitivity", self._sensitivity), ("data distributions", self._distribution),
                ("channel-wise distributions", self._channelwise), ("accumulated error", self._acc_error),
                ("sensitivity analysis", self._sensitivity_analysis)]

    def _sensitivity(self, results: RunallResults) -> dict[str, Any]:
        from qir.passes.node_sensitivity import NodeSensitivityPass
        from qir.tools.reports import node_sensitivity

        o, found = self.o, {}
        self.log(f"[1/{STEPS}] node sensitivity: " + ", ".join(o["types"]))
        for nt in o["types"]:
            report = NodeSensitivityPass(self.data, o["metrics"], output_node=o["output_node"], node_type=nt,
                                         interested_nodes=o["interested_nodes"], progress=self.progress,
                                         **self.kw).analyse(self.ir)
            node_sensitivity.write_report(report, self.out.sub("node_sensitivity"), stem=f"sensitivity_of_{nt}")
            if o["verbose"]:
                self.log(node_sensitivity.format_table(report).rstrip())
            found[nt] = {**report.to_json(), "engine": report.engine}
        return {"sensitivity": found}

    def _top(self, results: RunallResults) -> list[str]:
        return [r["node"] for nt in self.o["types"] if nt != "node" for r in results.sensitivity[nt]["rows"][:TOP]]

    def _distribution(self, results: RunallResults) -> dict[str, Any]:
        from qir.passes.distribution import DistributionPass
        from qir.tools.reports import distribution

        nodes = list(self.o["dis_nodes_list"] or self._top(results))
        self.log(f"[2/{STEPS}] data distributions: {len(nodes)} node(s)")
        return {"distribution": distribution.write_report(DistributionPass(self.data, nodes, **self.kw)(self.ir),
                                                          self.out.sub("data_distribution")).to_json()["nodes"]
                if nodes else {}}

    def _channelwise(self, results: RunallResults) -> dict[str, Any]:
        from qir.passes.channelwise import ChannelwisePass
        from qir.tools.reports import channelwise

        cals = {c.name for c in self.ir.calibrations()}
        nodes = list(self.o["cw_nodes_list"] or [n for n in self._top(results) if self.ir.has_node(n) and n in cals])
        self.log(f"[3/{STEPS}] channel-wise distributions: {len(nodes)} node(s)")
        return {"channelwise": channelwise.write_report(
            ChannelwisePass(self.data, nodes, axis=self.o["axis"], **self.kw)(self.ir),
            self.out.sub("channelwise_distribution")).to_json()["nodes"] if nodes else {}}

    def _acc_error(self, results: RunallResults) -> dict[str, Any]:
        from qir.passes.acc_error import AccErrorPass
        from qir.tools.reports import acc_error

        o = self.o
        qn = acc_quantize(o["quantize_node"], o["non_quantize_node"])
        self.log(f"[4/{STEPS}] accumulated error")
        acc = AccErrorPass(self.data, qn, non_quantize_node=o["non_quantize_node"], metric=o["ae_metric"],
                           average_mode=o["average_mode"], progress=self.progress, **self.kw)(self.ir).report
        acc_error.write_report(acc, self.out.sub("accumulate_error"))
        return {"acc_error": acc.to_json()}  # (the results are what runall_state.json holds: JSON)

    def _sensitivity_analysis(self, results: RunallResults) -> dict[str, Any]:
        from qir.passes.sensitivity_analysis import SensitivityAnalysisPass
        from qir.tools.reports import sensitivity_analysis as sensitivity_report

        self.log(f"[5/{STEPS}] sensitivity analysis")
        sa = SensitivityAnalysisPass(self.data, "cosine-similarity", pick_threshold=self.o["pick_threshold"],
                                     sensitive_nodes=self.o["sensitive_nodes"], progress=self.progress,
                                     **self.kw)(self.ir).report
        sensitivity_report.write_report(sa, self.out.sub("sensitivity_analysis"))
        return {"sensitivity_analysis": sa.to_json()}


STATE = "runall_state.json"


class _State:
    """``runall_state.json``: what a run was asked (model, data, samples, ...) and the results of
    the steps it finished, written after each step, ``finished`` at the end. ``resume`` reads it
    back: finished steps are not run again; every file of the run may then be replaced (an
    interrupted step's partial files included). Without ``resume``, an earlier run's files are
    refused as every command's are, with a word on ``--resume``."""

    def __init__(self, out, resume: bool) -> None:
        from qir.errors import OutputError

        self.out, self.resume = out, resume
        self.path = out.path(STATE)
        self.saved: dict[str, Any] = {}
        if resume and self.path.exists():
            import json

            self.saved = json.loads(self.path.read_text())
        try:
            out.check()
        except OutputError as exc:
            if resume or not self.path.exists():
                raise
            raise OutputError(f"{exc} (an earlier runall wrote them: --resume continues it)") from exc

    def _start(self, asked: dict[str, Any]) -> None:
        from qir.errors import InputError
        from qir.json_dump import jsonable

        asked = jsonable(asked)
        if self.saved and self.saved.get("asked") != asked:
            diff = ", ".join(k for k in asked if self.saved.get("asked", {}).get(k) != asked[k])
            raise InputError(f"the run in {self.out.folder} was asked something else ({diff} differ); "
                             "give the same arguments to --resume it, or --force to start over")
        self.doc = {"asked": asked, "steps": dict(self.saved.get("steps") or {}), "finished": False}

    def _run(self, k: int, title: str, step, results: RunallResults, log) -> None:
        """Step ``k``: read back when the resumed run finished it, else run it and save its results."""
        from qir.json_dump import jsonable

        saved = self.doc["steps"].get(str(k))
        if saved is not None:
            log(f"[{k}/{STEPS}] {title}: finished by the interrupted run, read back from {STATE}")
            results.update(saved)
            return
        found = step(results)
        results.update(found)
        self.doc["steps"][str(k)] = jsonable(found)
        self.out.write_json(STATE, "qir.runall_state", self.doc)

    def finish(self) -> None:
        self.out.write_json(STATE, "qir.runall_state", dict(self.doc, finished=True))


def sample_count(ir, data, data_num: int | None, budget: float | None, runtime: str) -> tuple[int | None, str]:
    """How many samples runall analyses, and the first line it logs saying so: ``data_num`` when
    given; else all of them, or with a ``budget`` (seconds) as many as fit it, estimated from one
    timed run of the quantized model times the runs the analyses make per sample (one per
    calibration node and per op, and a few more)."""
    from qir.api import run
    from qir.data import model_samples

    samples = model_samples(ir, data)
    total = len(samples)
    if data_num is not None:
        n = min(data_num, total)
        return n, f"runall: analysing {n} of {total} sample(s) (-dn/--data-num {data_num})"
    if budget is None:
        return total, f"runall: analysing all {total} sample(s)"
    run(ir, samples[0], runtime=runtime)  # the first run builds the session
    t0 = time.perf_counter()
    run(ir, samples[0], runtime=runtime)
    each = (time.perf_counter() - t0) * ((len(ir.calibrations()) + len(ir.ops())) / 3 + 20)  # engine runs share work
    n = max(1, min(total, int(budget // max(each, 1e-9))))
    fit = "all of them fit" if n == total else "as many as fit"
    return n, (f"runall: analysing {n} of {total} sample(s): {fit} the time budget of {budget:g} s (about "
               f"{each:.2g} s each; -dn N to choose)")


def _log_advice(results: RunallResults, log) -> None:
    """The advice as lines: each kept fix, then what was tried and dropped."""
    h = results.header
    log(f"what to try next ({h.score_metric} now {h.score:.5f}, measured on {h.samples} sample(s)):")
    for fix in results.advice:
        log(f"- {fix.text}")
    if not results.advice:
        log("- no fix tried helps (see advice.json)")
    for fix in results.dropped:
        log(f"  tried and dropped ({fix.reason}): {fix.fix} for {_changed(fix)}: {fix.after:.5f}")
    for note in results.notes:
        log(f"  note: {note}")


def _changed(fix: Fix) -> str:
    names = sorted(fix.changes or {})
    if not names:
        return "every quantizer"
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def header(ir, model_path: str | None, data, measured: Advice, runtime: str) -> RunallHeader:
    """What the report is about: the model file, its calibration method and march (as the model
    records them), the data, the samples used and left out, the runtime, and the score of the
    model as it is (output cosine vs float, mean over samples)."""
    calibration = ir.meta.get("calibration") or {}
    return RunallHeader(str(model_path) if model_path else f"IR {ir.name!r} (in memory)",
                        calibration.get("method") or "not recorded in the model", calibration.get("samples"),
                        ir.meta.get("march") or "not recorded in the model",
                        str(data) if isinstance(data, (str, Path)) else "samples given in memory",
                        measured.samples, measured.left_out, runtime, measured.metric, measured.before,
                        len(ir.calibrations()))


def check_choices(ir, data, dis_nodes_list=None, cw_nodes_list=None, axis=None, quantize_node=None,
                  non_quantize_node=None, sensitive_nodes=None) -> None:
    """The user's node lists and axis, checked against ``ir`` before step 1 (each step's pass
    checks its own; a bad name in step 5 must not end the run after four steps wrote files)."""
    from qir.passes.acc_error import AccErrorPass
    from qir.passes.channelwise import ChannelwisePass
    from qir.passes.distribution import DistributionPass
    from qir.passes.sensitivity_analysis import SensitivityAnalysisPass

    if dis_nodes_list:
        DistributionPass(data, dis_nodes_list).check(ir)
    if cw_nodes_list:
        ChannelwisePass(data, cw_nodes_list, axis=axis).check(ir)
    elif axis is not None:  # the default nodes come from step 1: some must take the axis
        ranks = [len(ir.value(c.input).shape or ()) for c in ir.calibrations()]
        if ranks and not any(-r <= axis < r for r in ranks):
            from qir.errors import InputError
            raise InputError(f"axis {axis} is out of range for every calibration node's input "
                             f"(ranks {sorted(set(ranks))})")
    if quantize_node is not None or non_quantize_node is not None:
        AccErrorPass(data, quantize_node, non_quantize_node=non_quantize_node).check(ir)
    if sensitive_nodes:
        SensitivityAnalysisPass(data, sensitive_nodes=sensitive_nodes).check(ir)


def acc_quantize(quantize_node, non_quantize_node):
    """Step 4's ``quantize_node``: the user's, else weights then activations (hmct's default)."""
    return quantize_node if quantize_node is not None or non_quantize_node is not None else ["weight", "activation"]


def plan_files(out, ir, node_types: list[str], dis_nodes_list=None, cw_nodes_list=None,
               ae_metric: str = "cosine-similarity", *, resume: bool = False, quantize_node=None,
               non_quantize_node=None):
    """Plan on ``out`` (an :class:`~qir.tools.reports.output.Outputs`) every file :func:`runall`
    may write, and return it. The default nodes of steps 2 and 3 are the most sensitive ones, known
    only after step 1, so every calibration node of the analysed roles is planned for them.
    ``resume``: they may replace the files of the interrupted run being continued. With the viz
    extra, the Model Explorer node data of every overlay (an accumulated-error curve per variant
    of ``quantize_node``/``non_quantize_node``, as step 4 takes them)."""
    from qir.passes.acc_error import AccErrorPass
    from qir.tools.reports import acc_error, channelwise, distribution, model_explorer, node_sensitivity
    from qir.tools.reports import sensitivity_analysis as sensitivity_report
    from qir.tools.reports.overlays import runall_keys

    candidates = [c.name for c in ir.calibrations() if c.role.value in node_types]
    r = {"replace": resume}
    for nt in node_types:
        out.sub("node_sensitivity").plan(*node_sensitivity.files(f"sensitivity_of_{nt}"), **r)
    dis_nodes, cw_nodes = list(dis_nodes_list or candidates), list(cw_nodes_list or candidates)
    if dis_nodes:
        out.sub("data_distribution").plan(*distribution.files(dis_nodes), **r)
    if cw_nodes:
        out.sub("channelwise_distribution").plan(*channelwise.files(cw_nodes), **r)
    out.sub("accumulate_error").plan(*acc_error.files(ae_metric), **r)
    out.sub("sensitivity_analysis").plan(*sensitivity_report.FILES, **r)
    if model_explorer.available():  # node data beside the report (every overlay of its graph panel)
        qn = acc_quantize(quantize_node, non_quantize_node)
        curves = AccErrorPass((), qn, non_quantize_node=non_quantize_node).curve_names(ir)  # (names only: no data)
        out.plan(*model_explorer.files(runall_keys(node_types, curves)), **r)
    return out.plan("advice.json", "index.html", STATE, **r)


def notes(results: RunallResults) -> list[str]:
    """Observations that are not fixes: whether weights or activations cost more at the output."""
    acc = results.acc_error or {}
    curves = acc.get("curves", {})
    w, a = curves.get("only_weight_calibrated"), curves.get("only_activation_calibrated")
    if not (w and a and acc.get("metric") == "cosine-similarity"):
        return []
    lw, la = (next((v for v in reversed(c) if v is not None), None) for c in (w, a))
    if lw is None or la is None:
        return []
    worse = "weights" if lw < la else "activations"
    return [f"At the output, quantizing only the weights gives cosine {lw:.5f} and only the activations "
            f"{la:.5f}: the {worse} cost more."]
