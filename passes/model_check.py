"""``model-check``: what in a model will not deploy as the user expects (horizon ``check_qat_model``).

Sections of the report, each a list of findings (``{"kind", "node", "detail"}``) or rows:

1. **unfused**: a chain of the march's fusion patterns (Conv→Add→Relu, Conv→Relu, ...) with a
   calibration node on a value inside it (quantized although the fused NPU kernel never writes
   it: run ``fuse`` before ``insert-calibration``), and Conv/Gemm→BatchNormalization pairs
   that ``fold-bn`` did not fold.
2. **shared**: weights read by more than one op as a quantized weight input (a float constant in
   a slot that gets a weight calibration node, :func:`~qir.passes.insert_calibration.quantizes_weight`:
   those ops share one quantization of it; int64 shape constants and float constants that ops
   read as data are not findings), and (for models from PyTorch) modules called 0 or more than
   once in one forward pass.
3. **config**: per general node, the mode of every calibration node feeding it (``data`` inputs
   and ``weight`` inputs, with axis), its output's mode (the calibration nodes reading it, or
   ``float``) and the calibration method.
4. **unusual**: fixed thresholds; (input, weight) dtype pairs the march's GEMMs do not take;
   activation dtypes the op does not take on the march; fp16 where the march has no native fp16
   form; model outputs left in a quantized (not high-precision) mode.

The pass returns the report and writes nothing; :mod:`qir.tools.reports.model_check` writes
``model_check_result.txt`` / ``.json`` and :func:`qir.tools.model_check.check_model` does both.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from qir.graph import QIR
from qir.kinds import CalibMode, NodeKind
from qir.passes.base import AnalysisPass, PassResult, Report, register_pass
from qir.passes.insert_calibration import quantizes_weight
from qir.passes.lib.fusion import META_KEY, match_pattern
from qir.records import CalibRecord, OpRecord
from qir.runtimes.march import OpClass, get_profile, op_class

__all__ = ["ModelCheckPass", "ModelCheckReport"]

logger = logging.getLogger(__name__)

_DTYPE = {CalibMode.INT8: "int8", CalibMode.INT16: "int16", CalibMode.FP16: "fp16", CalibMode.FLOAT: "float"}


def _feeding(ir: QIR, op: OpRecord) -> list[tuple[int, CalibRecord | None]]:
    """``(input index, calibration node or None)`` for each used input of ``op``."""
    out = []
    for i, v in enumerate(op.inputs):
        if v:
            p = ir.producer(v)
            out.append((i, p if isinstance(p, CalibRecord) else None))
    return out


@dataclass
class ModelCheckReport(Report):
    """The findings for ``march``: ``unfused`` patterns, ``shared`` weights and modules, the per-op
    ``config`` table and ``unusual`` settings (one row dict each, as ``model_check_result.json``
    holds them)."""

    march: str
    unfused: list[dict[str, Any]]
    shared: list[dict[str, Any]]
    config: list[dict[str, Any]]
    unusual: list[dict[str, Any]]


@register_pass
class ModelCheckPass(AnalysisPass):
    """Static checks of a (calibrated) model against a march (see the module docstring)."""

    name = "model-check"

    def __init__(self, march: str = "nash-e") -> None:
        self.profile = get_profile(march)
        self.options = {"march": self.profile.name}

    def run(self, ir: QIR) -> PassResult:
        return PassResult(ir, False, ModelCheckReport(self.profile.name, self._unfused(ir), self._shared(ir),
                                                      self._config(ir), self._unusual(ir)))

    # ------------------------------------------------------------------ sections
    def _unfused(self, ir: QIR) -> list[dict]:
        found = []
        patterns = sorted((tuple(p) for p in self.profile.fusions), key=len, reverse=True)
        for op in ir.ops():
            if META_KEY in op.meta:
                continue
            for pattern in patterns:
                members = match_pattern(ir, op, pattern)
                quantized_inside = members and any(
                    isinstance(r, CalibRecord) for m in members[:-1] for r in ir.consumers(m.outputs[0]))
                if quantized_inside:
                    found.append({"kind": "unfused pattern", "node": op.name,
                                  "detail": f"{'→'.join(pattern)} ({', '.join(m.name for m in members)}) is one "
                                            f"kernel on {self.profile.name}; run the fuse pass "
                                            f"(fuse{{march={self.profile.name}}}) so its inner values are not quantized"})
                    break
            if op.op_type in ("Conv", "Gemm", "ConvTranspose", "MatMul"):
                bn = [r for r in ir.consumers(op.outputs[0]) if isinstance(r, OpRecord)
                      and r.op_type == "BatchNormalization"]
                if bn:
                    found.append({"kind": "unfolded batchnorm", "node": op.name,
                                  "detail": f"{op.op_type} → BatchNormalization ({bn[0].name}) is not folded; "
                                            "run fold-bn before calibration"})
        return found

    @staticmethod
    def _shared(ir: QIR) -> list[dict]:
        found = []
        for w in ir.weights():
            # the weight itself and its calibration nodes' outputs: what ops read it as
            values = [w.name] + [c.output for c in ir.consumers(w.name) if isinstance(c, CalibRecord)]
            readers = {r.name for v in values for r, slot in ir.uses(v)
                       if isinstance(r, OpRecord) and quantizes_weight(r, slot, w.dtype)}
            if len(readers) > 1 and w.data is not None and w.data.size > 1:
                found.append({"kind": "shared weight", "node": w.name,
                              "detail": f"read by {len(readers)} ops ({', '.join(sorted(readers)[:5])}); they share "
                                        "one quantization of it"})
        for module, calls in sorted(ir.meta.get("torch_call_warnings", {}).items()):
            what = "never called" if calls == 0 else f"called {calls} times in one forward pass"
            found.append({"kind": "shared module" if calls else "unused module", "node": module,
                          "detail": f"PyTorch module {what}" + ("; its ops share calibration" if calls > 1 else "")})
        return found

    @staticmethod
    def _config(ir: QIR) -> list[dict]:
        rows = []
        for op in ir.ops():
            data, weights = [], []
            for i, cal in _feeding(ir, op):
                value = op.inputs[i]
                if ir.value(value).kind is NodeKind.WEIGHT:
                    continue  # a raw weight read without calibration (bias, shape constant)
                entry = {"input": i, "mode": _DTYPE[cal.mode] if cal else "float"}
                if cal is not None and cal.axis is not None:
                    entry["axis"] = cal.axis
                is_weight = cal is not None and ir.value(cal.input).kind is NodeKind.WEIGHT
                (weights if is_weight else data).append(entry)
            readers = [r for r in ir.consumers(op.outputs[0]) if isinstance(r, CalibRecord)] if op.outputs else []
            methods = sorted({c.meta.get("calibration", {}).get("method") for _, c in _feeding(ir, op)
                              if c is not None and c.meta.get("calibration")} - {None})
            rows.append({"node": op.name, "op_type": op.op_type, "module": op.module, "inputs": data,
                         "weights": weights, "output": sorted({_DTYPE[c.mode] for c in readers}) or ["float"],
                         "method": methods})
        return rows

    def _unusual(self, ir: QIR) -> list[dict]:
        prof, found = self.profile, []
        for cal in ir.calibrations():
            if cal.fixed:
                found.append({"kind": "fixed threshold", "node": cal.name,
                              "detail": f"threshold {cal.threshold} is fixed: calibration will not change it"})
            if cal.output in ir.outputs and cal.mode in (CalibMode.INT8, CalibMode.INT16):
                found.append({"kind": "output not high precision", "node": cal.name,
                              "detail": f"model output {cal.output!r} is quantized to {_DTYPE[cal.mode]}; keep "
                                        "outputs in float (set-mode --mode float)"})
        for op in ir.ops():
            feeding = [(i, c) for i, c in _feeding(ir, op) if c is not None]
            acts = [(i, c) for i, c in feeding if ir.value(c.input).kind is not NodeKind.WEIGHT]
            weights = [c for _, c in feeding if ir.value(c.input).kind is NodeKind.WEIGHT]
            if op_class(op.op_type) is OpClass.GEMM and acts and weights:
                a, w = _DTYPE[acts[0][1].mode], _DTYPE[weights[0].mode]
                if "float" not in (a, w) and not prof.allows_gemm(a, w):
                    found.append({"kind": "gemm dtype pair", "node": op.name,
                                  "detail": f"{op.op_type} with {a} input and {w} weight is not a {prof.name} GEMM "
                                            "configuration"})
            elif op.op_type == "MatMul" and len(acts) == 2:
                a, b = (_DTYPE[c.mode] for _, c in acts)
                if "float" not in (a, b) and not prof.allows_matmul(a, b):
                    found.append({"kind": "matmul dtype pair", "node": op.name,
                                  "detail": f"MatMul of {a} × {b} activations is not supported on {prof.name}"})
            for i, cal in acts:
                mode = _DTYPE[cal.mode]
                if mode == "fp16" and prof.fp16_support(op.op_type) != "native":
                    lacks = "does not have" if prof.fp16_support(op.op_type) == "none" else "does not guarantee"
                    found.append({"kind": "fp16 not native", "node": op.name,
                                  "detail": f"{cal.name} feeds {op.op_type} in fp16, which {prof.name} {lacks}"})
                elif mode in ("int8", "int16") and op_class(op.op_type) is not OpClass.GEMM \
                        and mode not in prof.allowed_act_dtypes(op.op_type, i):
                    found.append({"kind": "activation dtype", "node": op.name,
                                  "detail": f"{cal.name} gives {op.op_type} input {i} {mode}; {prof.name} takes "
                                            f"{', '.join(prof.allowed_act_dtypes(op.op_type, i)) or 'no quantized input'}"})
        return found
