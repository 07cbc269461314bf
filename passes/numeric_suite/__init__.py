"""Numeric-suite comparisons (the jobs of PyTorch's Numeric Suite tutorial) on any float/quantized pair.

Each function takes two models: two ``torch.nn.Module`` (an eager model and its
``torch.ao``-quantized version: done by :mod:`qir.passes.numeric_suite.torch_hooks`, with qir's own hooks and the
same results as ``torch.ao.ns._numeric_suite``), or anything :func:`qir.api.as_ir` imports (a
float ONNX model and a calibrated or QDQ model; ``float_model=None`` compares a calibrated
model run in float with itself fake-quantized). Every entry is ``{"float": [...], "quantized":
[...], "sqnr_db": [...]}`` (lists over the inputs; one array each for weights), with SQNR
``20·log10(‖f‖ / ‖f − q‖)`` (:func:`qir.metrics.sqnr_db`).

On IRs:

- :func:`compare_weights`: per weight calibration node, keyed ``<op name>.weight`` (or
  ``.input<slot>``): the float weight (the float model's array at the same op and slot when
  that op has the same output and no BatchNorm after it, i.e. nothing was folded into the
  quantized one, and the same shape; else the quantized model's own weight before its
  quantizer) vs that weight after the quantizer. Entries are keyed by op name, not module
  path (several ops can share one module).
- :func:`compare_model_outputs`: the output of every layer (a fusion group counts once),
  matched by value name (:mod:`.layer_compare`), on each input.
- :func:`compare_model_stub`: each quantized layer fed the float model's inputs through its own
  quantizers (the shadow ``f(Q(x_float))``) vs the float layer: its own error, without the error
  inherited from upstream.

A sample on which the float model's outputs hold NaN or Inf is left out of the layer comparisons
with a warning naming it (the report's ``left_out``: ``{"<sample>": why}``), as the engine and the
bad-case search do: its SQNR would score only what is finite. None left is an InputError.

The pass returns the comparisons and writes nothing; :mod:`qir.tools.reports.numeric_suite`
writes ``numeric_suite.txt`` / ``.json`` (the :func:`summary` of each).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from qir.api import as_ir
from qir.errors import InputError
from qir.execution import Runtime
from qir.graph import QIR
from qir.io.torch_import import is_torch_module as _is_torch
from qir.kinds import NodeKind
from qir.metrics import sqnr_db
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.lib.layer_run import LayerRun, NonFiniteBaseline, compared_ops, run_layers, shadow_outputs
from qir.records import OpRecord
from qir.runtimes.numerics import apply_calibration

__all__ = ["NumericSuitePass", "InputComparison",
           "compare_weights", "compare_model_outputs", "compare_model_stub", "compare_on_inputs",
           "summary"]

logger = logging.getLogger(__name__)


def _key(op: OpRecord, k: int = 0) -> str:
    return op.name if k == 0 else f"{op.name}[{k}]"


def compare_weights(float_model: Any, quantized_model: Any) -> dict[str, dict]:
    """Per quantized weight: float vs quantized array and SQNR (see the module docstring).
    Two PyTorch models (or their state dicts) go to :func:`qir.passes.numeric_suite.torch_hooks.compare_weights`."""
    if _is_torch(quantized_model) or isinstance(quantized_model, dict):
        from qir.passes.numeric_suite.torch_hooks import compare_weights as torch_weights

        sd = [m if isinstance(m, dict) else m.state_dict() for m in (float_model, quantized_model)]
        return torch_weights(*sd)
    q_ir = as_ir(quantized_model)
    f_ir = None if float_model is None else as_ir(float_model)
    aliases = q_ir.meta.get("value_aliases", {})
    found = {}
    for cal in q_ir.calibrations("weight"):
        w = np.asarray(q_ir.weight_array(cal.input))
        quant = apply_calibration(cal, w)
        for op, slot in ((r, s) for r, s in q_ir.uses(cal.output) if isinstance(r, OpRecord)):
            flt = w
            f_op = f_ir.node(op.name) if f_ir is not None and f_ir.has_node(op.name) else None
            if isinstance(f_op, OpRecord) and _same_function(f_ir, f_op, op, aliases):
                v = f_op.inputs[slot] if slot < len(f_op.inputs) else ""
                if v and f_ir.value(v).kind is NodeKind.WEIGHT and f_ir.weight_array(v).shape == w.shape:
                    flt = np.asarray(f_ir.weight_array(v))
            key = f"{_key(op)}.{'weight' if slot == 1 else f'input{slot}'}"
            found[key] = {"float": flt.astype(np.float32), "quantized": quant.astype(np.float32),
                          "sqnr_db": sqnr_db(flt, quant)}
    if not found:
        raise InputError("the quantized model has no weight calibration node to compare")
    return found


def _same_function(f_ir, f_op: OpRecord, q_op: OpRecord, aliases: dict) -> bool:
    """The float op computes what the quantized op does: same output names, no BatchNorm folded
    into the quantized op (by qir's fold-bn, or by a quantizer that renamed nothing)."""
    if f_op.outputs[:1] != q_op.outputs[:1] or any(o in aliases for o in q_op.outputs):
        return False
    readers = f_ir.consumers(f_op.outputs[0])
    return not any(isinstance(r, OpRecord) and r.op_type == "BatchNormalization" for r in readers)


def _pair(float_model: Any, quantized_model: Any) -> tuple:
    """(baseline, analysis) for :func:`qir.passes.lib.layer_run.run_layers`, imported once."""
    q_ir = as_ir(quantized_model)
    return (q_ir, None) if float_model is None else (as_ir(float_model), q_ir)


def _inputs(inputs: Iterable[dict]) -> list[dict]:
    inputs = list(inputs)
    if not inputs or not all(isinstance(x, dict) for x in inputs):
        raise InputError("give the inputs as one or more {input name: array} samples")
    return inputs


def _layer_runs(pair: tuple, inputs: Iterable[dict], runtime: str,
                left_out: dict[int, str] | None) -> Iterator[LayerRun]:
    """Both models layer by layer on each input; an input on which the float model's outputs
    hold NaN or Inf is left out (a warning names it; ``left_out[i]`` says why), as the engine and
    the bad-case search do: its layers would score only what is finite. None left: InputError."""
    inputs = _inputs(inputs)
    skipped = {} if left_out is None else left_out
    for i, sample in enumerate(inputs):
        try:
            yield run_layers(*pair, sample, runtime=runtime)
        except NonFiniteBaseline as exc:
            skipped[i] = exc.note
            logger.warning("sample %d is left out of the numeric suite: the float model's outputs hold NaN or Inf "
                           "(%s), so no SQNR on it means anything", i, exc.note)
    if len(skipped) == len(inputs):
        raise InputError(f"every sample's float outputs hold NaN or Inf ({skipped[0]} on sample 0): nothing to "
                         "compare; check the data for NaN or infinite values")


def compare_model_outputs(float_model: Any, quantized_model: Any, *inputs: Any, allow_list=None,
                          runtime: str = Runtime.ORT, left_out: dict[int, str] | None = None) -> dict[str, dict]:
    """Matched layer outputs of both models on each input (see the module docstring);
    ``allow_list`` (IR: op types) restricts the layers. Inputs on which the float model's
    outputs hold NaN or Inf are left out, with a warning, into ``left_out`` (``{index: why}``)."""
    if _is_torch(quantized_model):
        from qir.passes.numeric_suite.torch_hooks import compare_model_outputs as torch_outputs

        return torch_outputs(float_model, quantized_model, *inputs, allow_list=allow_list)
    found: dict[str, dict] = {}
    pair = _pair(float_model, quantized_model)
    for run in _layer_runs(pair, inputs, runtime, left_out):
        for op in compared_ops(run.analysis, types=allow_list or ()):
            for k, v in enumerate(op.outputs):
                f, q = run.base(v), run.analy_values.get(v)
                if f is None or q is None or q.dtype.kind != "f" or f.shape != q.shape:
                    continue
                entry = found.setdefault(_key(op, k), {"float": [], "quantized": [], "sqnr_db": []})
                entry["float"].append(f), entry["quantized"].append(q), entry["sqnr_db"].append(sqnr_db(f, q))
    return found


def compare_model_stub(float_model: Any, quantized_model: Any, module_swap_list=None, *inputs: Any,
                       runtime: str = Runtime.ORT, left_out: dict[int, str] | None = None) -> dict[str, dict]:
    """Each quantized layer on the float model's inputs vs the float layer (see the module
    docstring). ``module_swap_list``: for PyTorch the module types to shadow (required); for an
    IR, op types (None: every layer with a quantized input). ``left_out`` as in
    :func:`compare_model_outputs`."""
    if _is_torch(quantized_model):
        from qir.passes.numeric_suite.torch_hooks import compare_model_stub as torch_stub

        return torch_stub(float_model, quantized_model, module_swap_list, *inputs)
    found: dict[str, dict] = {}
    pair = _pair(float_model, quantized_model)
    for run in _layer_runs(pair, inputs, runtime, left_out):
        shadows = shadow_outputs(run, compared_ops(run.analysis, types=module_swap_list or ()))
        for name, (full, _) in shadows.items():
            op = run.analysis.op(name)
            for k, v in enumerate(op.outputs):
                f = run.base(v)
                if f is None or k >= len(full) or np.asarray(full[k]).shape != f.shape:
                    continue
                entry = found.setdefault(_key(op, k), {"float": [], "quantized": [], "sqnr_db": []})
                entry["float"].append(f), entry["quantized"].append(full[k])
                entry["sqnr_db"].append(sqnr_db(f, full[k]))
    return found


def summary(results: dict[str, dict]) -> list[dict]:
    """``[{"name", "sqnr_db"}]``, the mean SQNR per entry, worst first (a table for reports)."""
    rows = []
    for name, entry in results.items():
        vals = np.atleast_1d(np.asarray(entry["sqnr_db"], np.float64))
        rows.append({"name": name, "sqnr_db": float(np.mean(vals)) if vals.size else float("nan")})
    return sorted(rows, key=lambda r: (r["sqnr_db"] != r["sqnr_db"], r["sqnr_db"]))


@register_pass
class NumericSuitePass(AnalysisPass):
    """``numeric-suite``: the Numeric Suite comparisons of ``float_model`` with the IR (the
    quantized model): ``weights`` always, ``outputs`` and ``stub`` on ``inputs`` when given
    (:func:`compare_on_inputs`, with ``left_out``)."""

    name = "numeric-suite"

    def __init__(self, float_model: Any, inputs: Iterable[dict] = (), *, runtime: str = Runtime.ORT) -> None:
        self.float_model, self.inputs, self.runtime = float_model, list(inputs), runtime

    def run(self, ir: QIR) -> PassResult:
        report: dict[str, Any] = {"weights": compare_weights(self.float_model, ir)}
        if self.inputs:
            report.update(compare_on_inputs(self.float_model, ir, self.inputs, runtime=self.runtime))
        return PassResult(ir, False, report)


@dataclass
class InputComparison(Report):
    """:func:`compare_on_inputs`: the matched layer ``outputs`` (:func:`compare_model_outputs`)
    and the ``stub`` comparison (:func:`compare_model_stub`), each ``{layer: {"float",
    "quantized", "sqnr_db"}}``; ``left_out`` (``{"<index>": why}``) when some inputs were."""

    outputs: dict[str, dict]
    stub: dict[str, dict]
    left_out: dict[str, str] | None = None

    optional = ("left_out",)


def compare_on_inputs(float_model: Any, quantized_model: Any, inputs: Iterable[dict[str, np.ndarray]], *,
                      runtime: str = Runtime.ORT) -> InputComparison:
    """Both comparisons on ``inputs``; an input whose float outputs hold NaN or Inf is left out
    once, with one warning, from both (the result's ``left_out``)."""
    inputs, left_out = _inputs(inputs), {}
    outputs = compare_model_outputs(float_model, quantized_model, *inputs, runtime=runtime, left_out=left_out)
    kept = [x for i, x in enumerate(inputs) if i not in left_out]
    stub = compare_model_stub(float_model, quantized_model, None, *kept, runtime=runtime)
    return InputComparison(outputs, stub, {str(i): why for i, why in left_out.items()} or None)
