"""``qir tune`` / ``qir.tune``: the ``tune`` pass (:mod:`qir.passes.tune`) on a float or calibrated
model, and its files.

::

    report = tune("model.onnx", "calib/", "eval/", "cosine>=0.99", march="nash-e", save_dir="tuned")
    report.reached, report.verification.agrees, report.final.mean    # a TuneReport

A float model is calibrated first (the march's pipeline, ``method``) and that calibrated model is
written too (``calibrated_model.onnx``): the reproducing commands start from it. Files in
``save_dir`` (planned and checked before any work, never replaced without ``overwrite``):

- ``tuned_model.onnx``: the tuned calibrated model (``qir.load`` reads it back exactly);
- ``tuned_model_qdq.onnx``: the emitted QDQ model, as verified;
- ``tune_report.{txt,json,html}``, ``tune_curve.png``, ``tune_history.csv``, and with the viz
  extra ``model_explorer/{precision,tune_sensitivity}.json`` (:mod:`qir.tools.reports.tune`);
- ``reproduce/{int8,int16,fp16,float}.txt`` (the nodes whose mode changed) and
  ``reproduce/commands.sh``: the ``qir set-mode`` / ``qir emit`` commands that rebuild both
  models from the calibrated one, into ``reproduce/``;
- ``tune_journal.jsonl``: every configuration's score as it is measured. ``resume=True``
  (``--resume``) reads it back and measures only what is missing (the file must come from the
  same model, evaluation data, target and march); like the engine's results file, it is the
  one file a resumed run continues.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from qir.api import as_ir, load
from qir.errors import InputError
from qir.files import JsonlStore
from qir.graph import QIR
from qir.passes import get_pass
from qir.passes.lib.latency_table import read_latency_table
from qir.passes.tune import checked_samples
from qir.passes.tune.report import TuneReport
from qir.passes.tune.space import DEFAULT_PRICE
from qir.passes.tune.target import parse_target
from qir.passes.tune.transforms import DEFAULT_TRANSFORMS
from qir.runtimes.engine.results import data_digest, fingerprint
from qir.runtimes.ort.backend import thread_limit
from qir.tools.emit import write_model
from qir.tools.reports import tune as tune_report
from qir.tools.reports.output import Outputs

__all__ = ["tune", "Journal", "reproduce_commands", "MODES", "JOURNAL"]

MODES = ("int8", "int16", "fp16", "float")
JOURNAL = "tune_journal.jsonl"
#: The calibrated model the transforms stage made (the commands' start when it kept any).
TRANSFORMED = "transformed_model.onnx"


class Journal(JsonlStore):
    """Scores by configuration key, appended to a ``.jsonl`` file as they are measured (the first
    line a header naming the analysis); with ``resume`` the saved scores of the same analysis are
    read back, and a file of another analysis is an error."""

    FIELD = "score"
    NOUN = "the journal"

    def __init__(self, path: Path, analysis: str, *, resume: bool) -> None:
        super().__init__(path)
        header = {"qir_tune_journal": 1, "analysis": analysis}
        if resume and self.path.exists():
            lines = self.path.read_text().splitlines()
            if not lines or json.loads(lines[0]).get("analysis") != analysis:
                raise InputError(f"{self.path} holds another tuning run (other model, evaluation data, target or "
                                 "march); use another folder, or --force to start over")
            self._read(lines[1:])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(header) + "\n" + "".join(self._line(k, v) for k, v in self.data.items()))
        tmp.replace(self.path)


def _load(model: Any, input_shapes: Any) -> QIR:
    if isinstance(model, QIR):
        return model.clone()
    if isinstance(model, (str, Path)):
        return load(model, input_shapes=input_shapes)
    return as_ir(model)


def _calibrate(ir: QIR, calib_data: Any, march: str, method: str, percentile: float) -> QIR:
    from qir.passes import PassManager

    PassManager([get_pass("fold-bn"), get_pass("fuse", march=march), get_pass("insert-calibration", march=march),
                 get_pass("calibrate", data=calib_data, method=method, percentile=percentile)]).run(ir)
    return ir


def reproduce_commands(calibrated: QIR, tuned: QIR, source: Path, out: Outputs, first: Sequence[str] = ()) -> list[str]:
    """Write ``reproduce/<mode>.txt`` (the calibration nodes whose mode changed) and
    ``reproduce/commands.sh``, and return its commands: ``first`` (the ``qir calibrate --fixes``
    that rebuilds a transformed ``source``), then the ``qir set-mode`` / ``qir emit`` commands that
    turn ``source`` (the calibrated model) into ``reproduce/tuned_model.onnx`` and
    ``reproduce/tuned_model_qdq.onnx``."""
    folder = out.path("reproduce").resolve()
    model, qdq = folder / "tuned_model.onnx", folder / "tuned_model_qdq.onnx"
    changed: dict[str, list[str]] = {m: [] for m in MODES}
    thresholds = []
    for c in tuned.calibrations():
        before = calibrated.calibration(c.name)
        if c.mode is not before.mode:
            changed[c.mode.value].append(c.name)
        if c.fixed and not (before.fixed and np.array_equal(before.threshold, c.threshold)):
            thresholds.append((c.name, float(np.max(c.threshold))))
    commands, current = list(first), Path(source).resolve()
    for mode, names in changed.items():
        if names:
            out.write_text(f"reproduce/{mode}.txt", "".join(n + "\n" for n in names))
            commands.append(f"qir set-mode {shlex.quote(str(current))} -o {shlex.quote(str(model))} --from-file "
                            f"{shlex.quote(str(folder / (mode + '.txt')))} --mode {mode} --force")
            current = model
    for name, value in thresholds:
        commands.append(f"qir set-mode {shlex.quote(str(current))} -o {shlex.quote(str(model))} --nodes "
                        f"{shlex.quote(name)} --threshold {value!r} --force")
        current = model
    if current != model:  # nothing changed: the tuned model is the calibrated one
        commands.append(f"qir set-mode {shlex.quote(str(current))} -o {shlex.quote(str(model))} --role activation "
                        "--mode int8 --force")
    commands.append(f"qir emit {shlex.quote(str(model))} -o {shlex.quote(str(qdq))} --force")
    out.write_text("reproduce/commands.sh", "#!/bin/sh\nset -e\n" + "\n".join(commands) + "\n")
    return commands


def tune(model: Any, calib_data: Any, eval_data: Any, target: Any, *, march: str = "nash-e", allow_float: bool = False,
         method: str = "max", percentile: float = 99.99, save_dir: str | Path | None = None, overwrite: bool = False,
         resume: bool = False, input_shapes: Any = None, eval_num: int | None = None, threads: int | None = None,
         sensitivity_samples: int | str | None = None, integer: bool = True, check_data: Any = None,
         latency_table: str | Path | None = None, transforms: Sequence[str] | None = DEFAULT_TRANSFORMS,
         price: str = DEFAULT_PRICE, progress: bool = True) -> TuneReport:
    """Tune ``model`` (a float or calibrated model: file, ModelProto or QIR, not changed) to the
    cheapest configuration of ``march`` that meets ``target`` on ``eval_data`` (see the module
    docstring and :mod:`qir.passes.tune`). Returns the pass's report (without the ONNX model),
    with ``files`` (what was written) and ``commands``."""
    target = parse_target(target)
    table = read_latency_table(latency_table) if latency_table is not None else None
    ir = _load(model, input_shapes)
    needs_calibration = not ir.calibrations()
    own_calibrated = needs_calibration or not isinstance(model, (str, Path))  # the commands need it in a file
    out = None
    if save_dir is not None:
        out = Outputs(save_dir, overwrite=overwrite)
        out.plan("tuned_model.onnx", "tuned_model_qdq.onnx", TRANSFORMED, *tune_report.files(),
                 *(f"reproduce/{m}.txt" for m in MODES), "reproduce/commands.sh")
        out.plan(JOURNAL, replace=resume)
        if own_calibrated:
            out.plan("calibrated_model.onnx")
        out.check()
    eval_samples = checked_samples(ir, eval_data, eval_num)  # data that does not fit: an error before any work
    check_samples = None if check_data is None else checked_samples(ir, check_data, what="the check data")
    if needs_calibration:
        with thread_limit(threads):
            _calibrate(ir, calib_data, march, method, percentile)
    calibrated = ir.clone()
    store = None
    if out is not None:
        analysis = fingerprint(ir, [], len(eval_samples), [target.text, march, allow_float, "tune-2", price, *(transforms or ())],
                               data_digest(eval_samples))
        store = Journal(out.path(JOURNAL), analysis, resume=resume)
        out.adopt(JOURNAL)
    tuner = get_pass("tune", target=target, eval_data=eval_samples, calib_data=calib_data, march=march,
                      allow_float=allow_float, threads=threads, sensitivity_samples=sensitivity_samples, integer=integer,
                      check_data=check_samples, store=store, progress=progress, latency_table=table,
                     transforms=transforms, price=price)
    result = tuner(ir)
    ir, report = result.ir, result.report
    emitted = None
    if report.verification is not None:  # (the emitted model is not part of the report)
        emitted, report.verification = report.verification.model, replace(report.verification, model=None)
    if out is None:
        return report
    if own_calibrated:
        source = out.write("calibrated_model.onnx", lambda tmp: _save(calibrated, tmp))
    else:
        source = Path(model)
    rebuilt = []
    if tuner.transformed is not None:  # the search worked on a transformed (or split) model: the commands start there
        source = out.write(TRANSFORMED, lambda tmp: _save(tuner.transformed, tmp))
        calibrated = tuner.transformed
        kept_split = bool((report.split or {}).get("kept"))  # (no command splits a value: start from the file)
        chosen = (report.transforms or {}).get("chosen")
        if chosen and not kept_split and isinstance(model, (str, Path)) and needs_calibration \
                and isinstance(calib_data, (str, Path)):
            source = out.path("reproduce").resolve() / TRANSFORMED  # (rebuilt there by the first command)
            rebuilt = [f"qir calibrate {shlex.quote(str(Path(model).resolve()))} "
                       f"{shlex.quote(str(Path(calib_data).resolve()))} -o {shlex.quote(str(source))} --march {march} "
                       f"--method {method} --fixes {shlex.quote(','.join(chosen))} --force"]
    files = [out.write("tuned_model.onnx", lambda tmp: _save(ir, tmp))]
    if emitted is None:
        from qir.io.qdq_export import export_qdq

        emitted = export_qdq(ir)
    files.append(write_model(emitted, "tuned_model_qdq.onnx", outputs=out))
    report.commands = reproduce_commands(calibrated, ir, source, out, first=rebuilt)
    from qir.tools.reports.graph_panel import ModelGraph

    files += tune_report.write_report(report, out, ModelGraph.from_ir(ir), {c.name: c.mode.value for c in ir.calibrations()})
    report.files = [str(p) for p in files]
    return report


def _save(ir: QIR, tmp: Path) -> None:
    import onnx

    from qir.io.onnx_export import export_onnx

    onnx.save(export_onnx(ir), str(tmp))
