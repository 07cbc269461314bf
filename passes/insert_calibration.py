"""``insert-calibration``: put quantizers where the march quantizes (docs/architecture.md, "The IR", "Runtimes")."""
from __future__ import annotations

import logging

import numpy as np

from qir.graph import QIR
from qir.kinds import CalibMode, CalibRole, NodeKind
from qir.naming import fresh_name
from qir.passes.base import Pass, PassResult, register_pass
from qir.passes.lib.fusion import inside_fusion
from qir.records import CalibRecord, OpRecord
from qir.runtimes.march import OpClass, get_profile, op_class

__all__ = ["InsertCalibrationPass", "weight_axis", "calibration_name", "quantizes_weight"]

logger = logging.getLogger(__name__)

GEMM_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def weight_axis(op: OpRecord, slot: int, rank: int) -> int | None:
    """The output-channel axis of the constant in input ``slot`` of a GEMM op (None: per tensor).

    Conv: 0. ConvTranspose: 1 (W is C_in × C_out/group × k...). Gemm: B is K×N (axis 1) or,
    with transB, N×K (axis 0); a constant A gets per-row axis 0 (1 with transA). MatMul: a
    constant B (..., K, N) → its last axis; a constant A (..., M, K) → axis rank-2.
    """
    t = op.op_type
    if t == "Conv" and slot == 1:
        return 0
    if t == "ConvTranspose" and slot == 1:
        return 1
    if t == "Gemm":
        if slot == 1:
            return 0 if op.attrs.get("transB", 0) else 1
        if slot == 0:
            return 1 if op.attrs.get("transA", 0) else 0
    if t == "MatMul":
        if slot == 1:
            return rank - 1 if rank >= 2 else None
        if slot == 0:
            return rank - 2 if rank >= 2 else None
    return None


def quantizes_weight(op: OpRecord, slot: int, dtype: str | None) -> bool:
    """Does a constant of ``dtype`` in input ``slot`` of ``op`` get a WEIGHT calibration node
    (rule 1 of :class:`InsertCalibrationPass`)? Only float constants read by a GEMM op, bias
    slots (input 2 of Conv, ConvTranspose and Gemm) excepted; int64 shape constants never."""
    if not _is_float(dtype) or op_class(op.op_type) is not OpClass.GEMM:
        return False
    return not (op.op_type in ("Conv", "ConvTranspose", "Gemm") and slot == 2)


def calibration_name(ir: QIR, value: str) -> str:
    """Deterministic, unique name of the calibration node on ``value``: ``<value>_calib``."""
    return fresh_name(f"{value}_calib", _RunningNodes(ir), sep="")


class _RunningNodes:
    """``name in _RunningNodes(ir)``: is ``name`` taken by an op or calibration node?"""

    def __init__(self, ir: QIR) -> None:
        self.ir = ir

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.ir.has_node(name)


def _is_float(dtype: str | None) -> bool:
    return dtype is None or np.dtype(dtype).kind == "f"


@register_pass
class InsertCalibrationPass(Pass):
    """Insert calibration nodes (uncalibrated, mode from the march's defaults).

    Rules:

    1. Weights: the float constant inputs of GEMM ops (Conv, ConvTranspose, Gemm, MatMul) get
       one per-output-channel WEIGHT calibration node each (axis from :func:`weight_axis`);
       biases stay float (int32 on the NPU).
    2. Activations: every float activation read by a compute op (any op class but ``shape``)
       gets one per-tensor ACTIVATION calibration node, shared by all its compute readers;
       shape-only ops (Reshape, Concat, Transpose, ...) pass values through unquantized.
    3. Values inside a fusion group (see ``fuse``) and values already calibrated are skipped;
       ``inputs=False`` skips graph inputs; ``outputs=True`` also quantizes graph outputs.
    4. Names are ``<value>_calib``; each node's ``feeds`` lists the ops it serves.
    """

    name = "insert-calibration"

    def __init__(self, march: str = "generic", *, inputs: bool = True, outputs: bool = False) -> None:
        self.profile = get_profile(march)
        self.inputs, self.outputs = bool(inputs), bool(outputs)
        self.options = {"march": self.profile.name, "inputs": self.inputs, "outputs": self.outputs}

    def run(self, ir: QIR) -> PassResult:
        act_mode = CalibMode(self.profile.default_act_dtype)
        weight_mode = CalibMode(self.profile.default_weight_dtype)
        added: dict[str, list[str]] = {"weight": [], "activation": []}
        for op in ir.ops():
            cls = op_class(op.op_type)
            if cls is OpClass.SHAPE:
                continue
            for slot in range(len(op.inputs)):
                value = ir.node(op.name).inputs[slot]  # as rewired so far (an op may read a value twice)
                if not value or not _is_float(ir.value(value).dtype):
                    continue
                rec = ir.value(value)
                if rec.kind is NodeKind.WEIGHT:
                    if not quantizes_weight(op, slot, rec.dtype):
                        continue
                    rank = len(rec.shape or ())
                    uses = [(r.name, s) for r, s in ir.uses(value)
                            if isinstance(r, OpRecord) and op_class(r.op_type) is OpClass.GEMM]
                    cal = ir.insert_calibration(value, calibration_name(ir, value), role=CalibRole.WEIGHT,
                                                mode=weight_mode, uses=uses,
                                                axis=weight_axis(op, slot, rank))
                    added["weight"].append(cal.name)
                elif self._wants_activation(ir, value):
                    uses = [(r.name, s) for r, s in ir.uses(value)
                            if isinstance(r, OpRecord) and op_class(r.op_type) is not OpClass.SHAPE]
                    cal = ir.insert_calibration(value, calibration_name(ir, value),
                                                role=CalibRole.ACTIVATION, mode=act_mode, uses=uses)
                    added["activation"].append(cal.name)
        if self.outputs:
            for value in list(ir.outputs):
                if not _is_float(ir.value(value).dtype) or isinstance(ir.producer(value), CalibRecord):
                    continue
                existing = next((r for r in ir.consumers(value) if isinstance(r, CalibRecord)), None)
                if existing is not None:  # also read by ops: the output takes their quantized value
                    ir.set_outputs([existing.output if o == value else o for o in ir.outputs])
                    continue
                cal = ir.insert_calibration(value, calibration_name(ir, value), mode=act_mode,
                                            uses=[], rewire_outputs=True)
                added["activation"].append(cal.name)
        total = len(added["weight"]) + len(added["activation"])
        if total:
            ir.meta["march"] = self.profile.name  # kept in the saved model (reports name it)
        logger.info("inserted %d weight and %d activation calibration node(s)",
                    len(added["weight"]), len(added["activation"]))
        return PassResult(ir, bool(total), {"inserted": added})

    def _wants_activation(self, ir: QIR, value: str) -> bool:
        if isinstance(ir.producer(value), CalibRecord):
            return False  # already quantized
        if value in ir.inputs and not self.inputs:
            return False
        return not inside_fusion(ir, value)
